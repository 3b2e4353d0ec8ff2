"""rediss:// end to end against a real redis-server with TLS on, a CA made here, an ACL user and
the password from a file: the system's own client (slea.redis_conn.connect) writes and reads the
stream over TLS, and refuses a server its CA did not sign."""

from __future__ import annotations

import datetime
import ipaddress

import numpy as np
import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from slea.config import RedisConfig
from slea.embedded_redis import EmbeddedRedis
from slea.ports import free_port
from slea.records import StepRecord
from slea.redis_conn import connect
from slea.streams import StreamConsumer, StreamProducer

PASSWORD = "tls-test-password"


def _certificate(subject: str, key, issuer_name, issuer_key, *, ca: bool):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write_ca(directory, name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(name, key, None, key, ca=True)
    path = directory / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """redis-server with a TLS port (server certificate from a test CA), the default user off and
    the ACL user `slea` limited to slea:tls:* keys."""
    directory = tmp_path_factory.mktemp("tls")
    ca_key, ca_cert, ca_path = _write_ca(directory, "slea-test-ca")
    _other_key, _other_cert, other_ca_path = _write_ca(directory, "another-ca")
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _certificate("localhost", server_key, ca_cert.subject, ca_key, ca=False)
    (directory / "server.crt").write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (directory / "password").write_text(PASSWORD + "\n")  # as a mounted Secret file may end
    tls_port = free_port()
    server = EmbeddedRedis(
        directory / "data",
        appendonly=False,
        extra_args=[
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(directory / "server.crt"),
            "--tls-key-file",
            str(directory / "server.key"),
            "--tls-ca-cert-file",
            str(ca_path),
            "--tls-auth-clients",
            "no",
            "--user",
            *f"slea on >{PASSWORD} resetkeys ~slea:tls:* resetchannels -@all +@stream +@read +@write +ping +hello "
            "+multi +exec".split(),
        ],
    ).start()
    redis.Redis(port=server.port).acl_setuser("default", enabled=False)  # the ready-check used it; now off
    yield {
        "url": f"rediss://127.0.0.1:{tls_port}/0",
        "plain_port": server.port,
        "ca": str(ca_path),
        "other_ca": str(other_ca_path),
        "password_file": str(directory / "password"),
    }
    server.stop()


def _config(tls_redis, **changes) -> RedisConfig:
    values = {
        "url": tls_redis["url"],
        "username": "slea",
        "password_env": None,
        "password_file": tls_redis["password_file"],
        "tls_ca_file": tls_redis["ca"],
    }
    return RedisConfig(**{**values, **changes})


def test_stream_round_trip_over_tls_as_the_acl_user(tls_redis):
    client = connect(_config(tls_redis))
    assert client.ping()
    stream = "slea:tls:steps"
    reader = StreamConsumer(client, stream, group="learner", consumer="l0", dead_letter_key="slea:tls:dead")
    record = StepRecord(
        "tls",
        "task",
        "pick",
        "alfworld",
        "group",
        "episode",
        0,
        "You are in the kitchen.",
        prompt_ids=np.arange(8, dtype=np.int32),
        response_ids=np.arange(3, dtype=np.int32),
        response_logprobs=np.full(3, -0.5, dtype=np.float32),
    )
    (entry_id,) = StreamProducer(client, stream).send([record])
    (delivery,) = reader.read(count=8, block_ms=100)
    assert delivery.entry_id == entry_id and delivery.record.anchor_obs == "You are in the kitchen."
    reader.ack([entry_id])
    with pytest.raises(redis.exceptions.NoPermissionError):  # the ACL user sees only its run's keys
        client.set("other:key", b"x")


def test_a_server_certificate_from_another_ca_is_refused(tls_redis):
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        connect(_config(tls_redis, tls_ca_file=tls_redis["other_ca"])).ping()


def test_plaintext_and_the_default_user_are_refused(tls_redis):
    with pytest.raises(redis.ConnectionError):  # a plaintext client on the TLS port
        connect(_config(tls_redis, url=tls_redis["url"].replace("rediss://", "redis://"), socket_timeout_s=2)).ping()
    with pytest.raises(redis.AuthenticationError):  # the default user is off
        connect(_config(tls_redis, username=None)).ping()
