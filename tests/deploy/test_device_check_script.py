"""scripts/device_check.sh, the air-gapped node's check, as far as it runs without a GPU: the dry run
lists each probe with its timeout and each carried file with its size, and refuses a carry that is
incomplete, holds a second version, or would send more than the 64 MiB a node can be sent; the
run, with a stand-in Python for the node's, installs the carry, runs every probe under its timeout
and the check's deadline, and writes summary.json (the probes themselves run on a CPU in
tests/driver/test_device_check.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from k8s_render import REPO

# What the node lacks and the learner imports, at constraints.txt's pins, as `--fetch` names them.
CARRIED = {
    "deepspeed": ".tar.gz", "pydantic": "-py3-none-any.whl",
    "pydantic_core": "-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "annotated-types": "-py3-none-any.whl", "typing-inspection": "-py3-none-any.whl",
    "typing_extensions": "-py3-none-any.whl", "redis": "-py3-none-any.whl", "hjson": "-py3-none-any.whl",
}  # fmt: skip


def pinned(name: str) -> str:
    pattern = "[-_]".join(map(re.escape, re.split(r"[-_]", name)))
    return re.search(rf"^{pattern}==(\S+)", (REPO / "constraints.txt").read_text(), re.MULTILINE | re.IGNORECASE)[1]


def carry(folder: Path, sizes: dict[str, int] | None = None) -> Path:
    """Stand-ins for the carried files (the names `--fetch` saves), of the given sizes (sparse)."""
    folder.mkdir()
    for name, suffix in CARRIED.items():
        stem = f"{name.replace('-', '_')}-{pinned(name)}"
        with (folder / (stem + suffix)).open("wb") as file:
            file.truncate((sizes or {}).get(name, 1000))
    return folder


def device_check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/device_check.sh", *args], cwd=REPO, env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_dry_run_shows_each_probe_its_timeout_and_what_it_carries(tmp_path):
    result = device_check("--dry-run", env={"DEVICE_CARRY": str(carry(tmp_path / "carry"))})
    assert result.returncode == 0, result.stdout + result.stderr
    probes = re.findall(r"^\s+\d+\s+(\S+)\s+(\d+) s\s", result.stdout, re.MULTILINE)
    assert probes == [("cuda", "120"), ("install", "240"), ("learner_step", "240"), ("engine_and_handoff", "180")]
    assert "under a 540 s deadline" in result.stdout
    for name in CARRIED:
        assert f"{name.replace('-', '_')}-{pinned(name)}" in result.stdout, name
    assert "--no-index" in result.stdout and "DS_BUILD_OPS=0" in result.stdout  # nothing fetched on the node
    assert re.search(r"0\.01 MiB\s+carried in all", result.stdout)  # 8 files of 1000 bytes
    together = float(re.search(r"([\d.]+) MiB\s+together, of 64 MiB", result.stdout)[1])
    assert 0 < together < 64
    assert 'carry ["' in result.stdout, "it says how to run it through the device tool"


def test_a_carry_over_64_mib_is_refused(tmp_path):
    result = device_check("--dry-run", env={"DEVICE_CARRY": str(carry(tmp_path / "carry", {"deepspeed": 65 << 20}))})
    assert result.returncode == 1
    assert "over the 64 MiB a node can be sent" in result.stderr


def test_a_missing_or_second_version_is_refused_saying_what_to_do(tmp_path):
    folder = carry(tmp_path / "carry")
    next(folder.glob("redis-*")).unlink()
    (folder / "pydantic-2.0.0-py3-none-any.whl").write_bytes(b"")
    result = device_check("--dry-run", env={"DEVICE_CARRY": str(folder)})
    assert result.returncode == 1
    assert f"lacks redis=={pinned('redis')}" in result.stderr and "--fetch" in result.stderr
    assert "pydantic-2.0.0-py3-none-any.whl is not what constraints.txt pins" in result.stderr
    # On the node, the same refusal comes before anything runs.
    refused = device_check(str(tmp_path / "out"), env={"DEVICE_CARRY": str(folder)})
    assert refused.returncode == 2 and not (tmp_path / "out").exists()


NODE = """case "$*" in
  *"pip install"*) echo "installing $*" ;;
  *"device_check learner_step"*) echo '{"tokens_per_s": 5000.0, "checks": {"finite": true}}' > "$SLEA_CHECK_FIGURES" ;;
  *"device_check engine_and_handoff"*) echo "PYTHONPATH=$PYTHONPATH"; echo "RuntimeError: the engine's cause" >&2; exit 1 ;;
esac
exit 0
"""


def test_on_the_node_every_probe_runs_and_the_summary_says_how_each_went(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n" + NODE)
    python.chmod(0o755)
    env = {"DEVICE_CARRY": str(carry(tmp_path / "carry")), "PYTHON": str(python)}
    result = device_check(str(tmp_path / "out"), env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert [(p["name"], p["status"]) for p in summary["probes"]] == [
        ("cuda", "passed"), ("install", "passed"), ("learner_step", "passed"), ("engine_and_handoff", "failed"),
    ]  # fmt: skip
    install, learner, engine = summary["probes"][1:]
    assert learner["figures"] == {"tokens_per_s": 5000.0, "checks": {"finite": True}}
    assert "RuntimeError: the engine's cause" in engine["tail"]
    assert "PYTHONPATH=/tmp/slea-device-site:" in engine["tail"], "the carry's install comes first on the path"
    log = (tmp_path / "out" / install["log"]).read_text()
    assert "--no-index" in log and str(tmp_path / "carry") in log
    files = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert files == [
        "1-install.log", "2-learner_step.log", "3-engine_and_handoff.log", "environment.txt", "summary.json",
    ]  # fmt: skip
    assert result.stdout.rstrip().endswith("}"), "summary.json is printed last"


def test_a_probe_past_the_deadline_is_stopped_and_the_rest_skipped(tmp_path):
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\ncase "$*" in *learner_step*) echo "stepping"; sleep 60 ;; esac\nexit 0\n')
    python.chmod(0o755)
    env = {
        "DEVICE_CARRY": str(carry(tmp_path / "carry")), "PYTHON": str(python),
        "DEVICE_CHECK_DEADLINE_S": "4", "CHECK_MIN_LEFT_S": "1",
    }  # fmt: skip
    result = device_check(str(tmp_path / "out"), env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    statuses = {probe["name"]: probe["status"] for probe in summary["probes"]}
    assert statuses["learner_step"] == "timeout" and statuses["engine_and_handoff"] == "skipped"
    assert "stepping" in summary["probes"][2]["tail"]
    assert summary["probes"][3]["reason"] == "under 1 s of the check's 4 s deadline was left"
    assert summary["seconds"] < 30
