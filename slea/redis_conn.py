"""Redis connections from the run config, and riding out a Redis that goes away.

The password never lives in YAML: it comes from an environment variable or a mounted file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redis

from slea.config import ConfigError, RedisConfig

T = TypeVar("T")

TRANSIENT_ERRORS = (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)


def redis_password(cfg: RedisConfig) -> str | None:
    if cfg.password_file:
        path = Path(cfg.password_file)
        if not path.is_file():
            raise ConfigError(f"redis.password_file '{path}' does not exist")
        return path.read_text().strip() or None
    if cfg.password_env:
        return os.environ.get(cfg.password_env) or None
    return None


def connect(cfg: RedisConfig, url: str | None = None) -> redis.Redis:
    """A client for `url` (default cfg.url) with AUTH and TLS from the config; bytes in, bytes out."""
    url = url or cfg.url
    if not url:
        raise ConfigError("redis.url is not set and no embedded server was started")
    options: dict[str, object] = {
        "socket_timeout": cfg.socket_timeout_s + cfg.block_ms / 1000,
        "socket_connect_timeout": cfg.socket_timeout_s,
        "health_check_interval": 30,
        "decode_responses": False,
    }
    password = redis_password(cfg)
    if password:
        options["password"] = password
    if cfg.username:
        options["username"] = cfg.username
    if url.startswith("rediss://"):
        options["ssl_cert_reqs"] = "required" if cfg.tls_verify else "none"
        if cfg.tls_ca_file:
            options["ssl_ca_certs"] = cfg.tls_ca_file
    return redis.Redis.from_url(url, **options)


class RedisUnavailable(RuntimeError):
    """Redis stayed unreachable for longer than redis.reconnect_max_s."""


class RedisBackpressure(RuntimeError):
    """Redis refused a write because it reached maxmemory (policy noeviction): a consumer group is
    behind and the stream cannot be trimmed. Retrying does not help; freeing the consumer does."""


def with_reconnect(
    call: Callable[[], T],
    *,
    max_wait_s: float,
    on_retry: Callable[[], None] = lambda: None,
    what: str = "a write",
) -> T:
    """Run `call`, retrying on connection errors with capped exponential backoff; a write Redis
    refuses for being full raises RedisBackpressure naming `what` (retrying would not help).

    redis-py reconnects lazily on the next command, so retrying the call is the reconnect.
    A call that half-succeeded before the connection broke (a pipelined XADD batch) may be
    repeated; every consumer is idempotent on (episode_id, step), so that is safe.
    """
    deadline = time.monotonic() + max_wait_s
    delay = 0.05
    while True:
        try:
            return call()
        except redis.exceptions.OutOfMemoryError as exc:  # Redis's "OOM command not allowed ..." reply
            raise RedisBackpressure(
                f"Redis is full (maxmemory reached, policy noeviction) and refused {what}: a consumer group is "
                f"behind, so the stream cannot be trimmed. Check the consumers (runbook: SleaRedisMemoryNearLimit, "
                f"SleaConsumerStalled). ({exc})"
            ) from None
        except TRANSIENT_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise RedisUnavailable(f"Redis unreachable for {max_wait_s:.0f}s: {exc}") from exc
            on_retry()
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
