"""Closed by default (issue 22, item 6): a lone learner's process group opens no rendezvous port,
and the store the ranks of a multi-rank learner (and the weight group) meet on listens on its
host's address only. Before, a TCPStore given a port bound every interface."""

import json
import subprocess
import sys

from helpers import listening_addresses

from slea.weight_group import host_store, join_store

LONE_LEARNER = """
import json, os, psutil
from learner.engine import init_distributed
os.environ["MASTER_PORT"] = "1"  # a parent's leftover rendezvous port must not matter
print(json.dumps([init_distributed(), sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN})]))
"""


def test_a_lone_learner_forms_its_group_without_a_port_on_every_interface():
    result = subprocess.run([sys.executable, "-c", LONE_LEARNER], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    (rank, world_size), addresses = json.loads(result.stdout.strip().splitlines()[-1])
    assert (rank, world_size) == (0, 1)
    assert not {"0.0.0.0", "::"} & set(addresses), f"listening on every interface: {addresses}"


def test_the_rendezvous_store_listens_on_its_host_only_and_serves_the_other_ranks():
    store = host_store("127.0.0.1", 2, timeout_s=10)
    assert listening_addresses(store.port) == {"127.0.0.1"}
    joined = join_store("127.0.0.1", store.port, 2, timeout_s=10)
    joined.set("rank-1", "here")
    assert store.get("rank-1") == b"here"
