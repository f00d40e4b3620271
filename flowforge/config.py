"""Every FLOWFORGE_* setting, parsed once at start-up so a bad value fails fast."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from flowforge.errors import FlowForgeError


class ConfigError(FlowForgeError):
    """A FLOWFORGE_* environment variable has an unusable value."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")
    return value


@dataclass(frozen=True)
class Settings:
    """Runtime configuration shared by the API, the worker and the CLI."""

    database_url: str = "postgresql://localhost/flowforge"
    amqp_url: str = "amqp://guest:guest@localhost:5672/%2F"
    amqp_prefix: str = "flowforge"
    worker_concurrency: int = 8
    lease_seconds: float = 60.0
    http_allow: str = ""
    max_body_bytes: int = 1_048_576
    reconcile_seconds: float = 30.0
    db_pool_size: int = 4
    # Server-side statement and idle-transaction timeout of pooled connections; a reply
    # is awaited this long plus a margin, a free pool connection this long.
    db_timeout_seconds: float = 15.0
    webhook_rate: float = 0.0
    worker_id: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the environment; defaults work against local PostgreSQL and RabbitMQ."""
        env = os.environ if env is None else env
        return cls(
            database_url=env.get("FLOWFORGE_DATABASE_URL") or cls.database_url,
            amqp_url=env.get("FLOWFORGE_AMQP_URL") or cls.amqp_url,
            amqp_prefix=env.get("FLOWFORGE_AMQP_PREFIX") or cls.amqp_prefix,
            worker_concurrency=_int(env, "FLOWFORGE_WORKER_CONCURRENCY", cls.worker_concurrency),
            lease_seconds=_float(env, "FLOWFORGE_LEASE_SECONDS", cls.lease_seconds),
            http_allow=env.get("FLOWFORGE_HTTP_ALLOW", ""),
            max_body_bytes=_int(env, "FLOWFORGE_MAX_BODY_BYTES", cls.max_body_bytes),
            reconcile_seconds=_float(env, "FLOWFORGE_RECONCILE_SECONDS", cls.reconcile_seconds),
            db_pool_size=_int(env, "FLOWFORGE_DB_POOL_SIZE", cls.db_pool_size),
            db_timeout_seconds=_float(env, "FLOWFORGE_DB_TIMEOUT_SECONDS", cls.db_timeout_seconds),
            webhook_rate=_float(env, "FLOWFORGE_WEBHOOK_RATE", cls.webhook_rate),
            worker_id=env.get("FLOWFORGE_WORKER_ID") or f"{socket.gethostname()}:{os.getpid()}",
        )
