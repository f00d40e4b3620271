"""Every FLOWFORGE_* setting, parsed once at start-up so a bad value fails fast."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from flowforge.domain import operator_limits
from flowforge.domain.definitions import LimitSpec
from flowforge.domain.model import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_CHILD_DEPTH,
    DEFAULT_MAX_DESCENDANTS,
)
from flowforge.errors import ConfigError
from flowforge.trust import sealing, secret_bindings

__all__ = ["VARIABLES", "ConfigError", "Settings", "Variable"]

# Idempotency keys are remembered at least this long (docs/contract.md#idempotency,
# docs/contract.md#retention); see _key_hours.
DEFAULT_IDEMPOTENCY_KEY_HOURS = 24.0
MIN_IDEMPOTENCY_KEY_HOURS = 1.0
MAX_IDEMPOTENCY_KEY_HOURS = 87_600.0  # ten years, as a definition's retention_days


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


# Webhooks per second per workflow key and API process when FLOWFORGE_WEBHOOK_RATE is
# unset: far above what one sender of one integration sends, and below what one API
# process serves (~250/s on a 2-core box, docs/bench), so one flooded key — forged
# signatures included — cannot take a whole process from the others.
DEFAULT_WEBHOOK_RATE = 100


def _webhook_rate(env: Mapping[str, str]) -> float:
    """FLOWFORGE_WEBHOOK_RATE: a positive rate, or 0/unlimited for none (a Settings built
    in code, as the tests do, has none unless it says so)."""
    raw = env.get("FLOWFORGE_WEBHOOK_RATE", "").strip().lower()
    if raw in ("0", "unlimited"):
        return 0.0
    return _float(env, "FLOWFORGE_WEBHOOK_RATE", float(DEFAULT_WEBHOOK_RATE))


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


def _ageing(env: Mapping[str, str]) -> float:
    """FLOWFORGE_PRIORITY_AGEING_S: seconds of waiting worth one priority point; 0 (no
    priorities: oldest ready first) up to a day per point."""
    name = "FLOWFORGE_PRIORITY_AGEING_S"
    raw = env.get(name, "").strip()
    if not raw:
        return Settings.priority_ageing_s
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0 <= value <= 86_400:
        raise ConfigError(f"{name} must be seconds from 0 to 86400, got {raw}")
    return value


def _key_hours(env: Mapping[str, str]) -> float:
    """FLOWFORGE_IDEMPOTENCY_KEY_HOURS: how long a webhook's idempotency key is remembered.

    At least an hour: senders retry a failed delivery for minutes to days (Standard
    Webhooks, Stripe), so a shorter memory would turn an ordinary retry into a second
    execution — almost surely a mistake (minutes meant as hours) rather than a wish."""
    name = "FLOWFORGE_IDEMPOTENCY_KEY_HOURS"
    raw = env.get(name, "").strip()
    if not raw:
        return DEFAULT_IDEMPOTENCY_KEY_HOURS
    try:
        hours = float(raw)
    except ValueError:
        hours = float("nan")
    # Written so that nan fails too.
    if not MIN_IDEMPOTENCY_KEY_HOURS <= hours <= MAX_IDEMPOTENCY_KEY_HOURS:
        raise ConfigError(
            f"{name} must be a number of hours from {MIN_IDEMPOTENCY_KEY_HOURS:g} to "
            f"{MAX_IDEMPOTENCY_KEY_HOURS:g} (default {DEFAULT_IDEMPOTENCY_KEY_HOURS:g}); "
            f"got {raw!r}"
        )
    return hours


def _port(env: Mapping[str, str], name: str) -> int:
    """A TCP port, 0 (the default) for none."""
    port = _int(env, name, 0, minimum=0)
    if port > 65535:
        raise ConfigError(f"{name} must be a TCP port (1-65535, or 0 for none), got {port}")
    return port


def _key(env: Mapping[str, str], variable: str, credential: str, maker: str) -> bytes | None:
    """A 32-byte key from `variable`, else the systemd credential `credential`, else None;
    a malformed key stops start-up rather than failing on first use."""
    raw, source = env.get(variable, ""), variable
    credentials = env.get("CREDENTIALS_DIRECTORY")
    if not raw.strip() and credentials:
        path = Path(credentials) / credential
        if path.is_file():
            raw, source = path.read_text(encoding="ascii", errors="replace"), str(path)
    if not raw.strip():
        return None
    try:
        return sealing.parse_key(raw)
    except ValueError as exc:
        raise ConfigError(f"{source} {exc}; make one with: python -m {maker}") from None


def _encryption_key(env: Mapping[str, str]) -> bytes | None:
    """FLOWFORGE_ENCRYPTION_KEY, else the systemd credential encryption_key, else None."""
    return _key(env, "FLOWFORGE_ENCRYPTION_KEY", "encryption_key", "flowforge.trust.sealing")


def _notify_key(env: Mapping[str, str]) -> bytes | None:
    """FLOWFORGE_NOTIFY_KEY, else the systemd credential notify_key: seals the secrets of
    notification endpoints at rest (store/notifications.py). Not FLOWFORGE_ENCRYPTION_KEY:
    the worker, which signs and sends notifications, must hold this one and never that."""
    return _key(env, "FLOWFORGE_NOTIFY_KEY", "notify_key", "flowforge.trust.sealing")


def _resume_key(env: Mapping[str, str]) -> bytes | None:
    """FLOWFORGE_RESUME_KEY, else the systemd credential resume_key: signs resume URLs of
    wait steps (flowforge/trust/resume_tokens.py). The API checks them and the worker renders
    them."""
    return _key(env, "FLOWFORGE_RESUME_KEY", "resume_key", "flowforge.store.waits")


# FLOWFORGE_DATABASE_POOLER: what sits between FlowForge and PostgreSQL.
POOLERS = ("none", "transaction")


def _pooler(env: Mapping[str, str]) -> str:
    """FLOWFORGE_DATABASE_POOLER: `none` (default) or `transaction` for a PgBouncer (or
    another pooler) in transaction mode, which hands each transaction a different server
    session: FlowForge then prepares no statement on the server, sets its timeouts inside
    each transaction, and opens the connections that need a session (the relay's LISTEN,
    bin/migrate's advisory lock, the CLI) to FLOWFORGE_DATABASE_DIRECT_URL."""
    raw = env.get("FLOWFORGE_DATABASE_POOLER", "").strip().lower() or "none"
    if raw not in POOLERS:
        raise ConfigError(
            f"FLOWFORGE_DATABASE_POOLER must be one of {', '.join(POOLERS)}; got {raw!r}"
        )
    if raw == "transaction" and not env.get("FLOWFORGE_DATABASE_DIRECT_URL", "").strip():
        # Through the pooler LISTEN would hear nothing and the migration lock would be
        # released at once: better not to start than to run with both silently broken.
        raise ConfigError(
            "FLOWFORGE_DATABASE_POOLER=transaction needs FLOWFORGE_DATABASE_DIRECT_URL: a "
            "URL of PostgreSQL itself (not the pooler) for the relay's LISTEN and "
            "bin/migrate's advisory lock"
        )
    return raw


def _queue_type(env: Mapping[str, str]) -> str:
    """FLOWFORGE_AMQP_QUEUE_TYPE: the type of the steps and dead-letter queues FlowForge
    declares; quorum (default) survives the loss of a cluster node, classic does not."""
    raw = env.get("FLOWFORGE_AMQP_QUEUE_TYPE", "").strip().lower() or "quorum"
    if raw not in ("quorum", "classic"):
        raise ConfigError(f"FLOWFORGE_AMQP_QUEUE_TYPE must be quorum or classic; got {raw!r}")
    return raw


# synchronous_commit levels that wait for a synchronous standby (PostgreSQL's names).
SYNC_LEVELS = ("remote_write", "on", "remote_apply")


def _sync_level(env: Mapping[str, str], name: str) -> str:
    """FLOWFORGE_SYNC_UNSAFE_CLAIMS, FLOWFORGE_SYNC_INTAKE: the synchronous_commit level
    raised for one kind of transaction only (docs/howto/several-hosts.md); empty or `off`
    leaves the server's own setting."""
    raw = env.get(name, "").strip().lower()
    if raw in ("", "off"):
        return ""
    if raw not in SYNC_LEVELS:
        raise ConfigError(f"{name} must be off or one of {', '.join(SYNC_LEVELS)}; got {raw!r}")
    return raw


def _public_url(env: Mapping[str, str]) -> str | None:
    """FLOWFORGE_PUBLIC_URL: where callers reach the API, the base of resume URLs."""
    raw = env.get("FLOWFORGE_PUBLIC_URL", "").strip()
    if not raw:
        return None
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(
            "FLOWFORGE_PUBLIC_URL must be an http(s) URL without query or fragment, such as "
            f"https://flowforge.example.com; got {raw!r}"
        )
    return raw.rstrip("/")


@dataclass(frozen=True)
class Variable:
    """One environment variable as docs/reference/configuration.md lists it: `field` names
    the Settings field whose default it shows, else `default` says it in words."""

    name: str
    meaning: str
    field: str | None = None
    default: str = "—"
    read_by: str = "all"


# Every variable FlowForge reads, in the order a newcomer needs them. The reference page is
# generated from this list and Settings' defaults (python -m flowforge.cli.reference), and
# tests/unit/test_reference_docs.py fails when a FLOWFORGE_* name in the code is missing.
VARIABLES = (
    Variable("FLOWFORGE_DATABASE_URL", "PostgreSQL, as a libpq URL", "database_url"),
    Variable(
        "FLOWFORGE_DATABASE_POOLER",
        "`none`, or `transaction` when `FLOWFORGE_DATABASE_URL` is a transaction-mode "
        "PgBouncer: nothing is prepared on the server and timeouts are set in each "
        "transaction. `transaction` refuses to start without `FLOWFORGE_DATABASE_DIRECT_URL`",
        "database_pooler",
    ),
    Variable(
        "FLOWFORGE_DATABASE_DIRECT_URL",
        "PostgreSQL itself (not the pooler), for what needs a session of its own: the relay's "
        "LISTEN, `bin/migrate` and its advisory lock, the CLI on the box, the connection "
        "budget check",
        default="`FLOWFORGE_DATABASE_URL`",
    ),
    Variable(
        "FLOWFORGE_AMQP_URL",
        "RabbitMQ: one URL, or a comma-separated list of every node of a cluster (each "
        "connection tries them in a new random order; a comma inside a password is `%2C`)",
        "amqp_url",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_AMQP_PREFIX",
        "prefix of every exchange and queue name; give each installation on a shared broker "
        "its own",
        "amqp_prefix",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_AMQP_QUEUE_TYPE",
        "`quorum` (survives the loss of a cluster node) or `classic`: the type of the steps "
        "and dead-letter queues the worker declares; a queue that already exists keeps its type",
        "amqp_queue_type",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_SYNC_UNSAFE_CLAIMS",
        "`off`, or a `synchronous_commit` level (`remote_write`, `on`, `remote_apply`) the "
        "claim of a step unsafe to repeat commits with, in that transaction only: no unsafe "
        "request leaves on a claim a synchronous standby lacks",
        "sync_unsafe_claims",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_SYNC_INTAKE",
        "`off`, or a `synchronous_commit` level a webhook's acceptance is replicated with "
        "before its 202, in that transaction only: no 202 for a webhook a synchronous "
        "standby lacks",
        "sync_intake",
        read_by="api",
    ),
    Variable(
        "FLOWFORGE_HTTP_ALLOW",
        "comma list of hosts and CIDRs that `http_request` may reach although they are not "
        "global (loopback, private, link-local...)",
        "http_allow",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_ENCRYPTION_KEY",
        "32 bytes, base64url (`python -m flowforge.trust.sealing` makes one): seals webhook "
        "signing secrets at rest; or the systemd credential `encryption_key`. Not for the worker",
        read_by="api, migrate, cli",
    ),
    Variable(
        "FLOWFORGE_NOTIFY_KEY",
        "32 bytes, base64url (`python -m flowforge.trust.sealing` makes one), the same for API, "
        "worker and migrate: seals notification endpoints' signing secrets and Slack URLs at "
        "rest; or the systemd credential `notify_key`. Not FLOWFORGE_ENCRYPTION_KEY; without "
        "it no endpoint can be created or sent to",
        read_by="api, worker, migrate, cli",
    ),
    Variable(
        "FLOWFORGE_RESUME_KEY",
        "32 bytes, base64url (`python -m flowforge.store.waits` makes one), the same for API and "
        "worker: derives the resume tokens of `wait` steps; or the systemd credential "
        "`resume_key`. Changing it invalidates every resume URL handed out",
        read_by="api, worker",
    ),
    Variable(
        "FLOWFORGE_PUBLIC_URL",
        "where callers reach the API: the base of the resume URLs `{{ waits.STEP.url }}` "
        "renders; without it such a step fails saying so",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_WORKER_CONCURRENCY",
        "executor threads (and RabbitMQ prefetch) per worker",
        "worker_concurrency",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_WORKER_POOL_SIZE",
        "the most pooled PostgreSQL connections one worker opens, whatever its concurrency "
        "(at least 2; a third of them, one to three, are its background services' own); "
        "it opens one more for the relay's LISTEN",
        "worker_pool_size",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_OUTBOUND_LIMITS",
        'limits per host as JSON, e.g. `{"api.stripe.com": {"rate_per_s": 25, "burst": 50, '
        '"concurrency": 10}}` (`burst` defaults to 1; `rate_per_s` or `concurrency` needed): '
        "every `http_request` to that host counts against them, whatever the workflow; "
        "the bounds of a definition's limit apply (`max_hold_s` and `circuit` too)",
        default="none",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_SHARED_LIMITS",
        "limits the operator shares between named workflows, as JSON, e.g. "
        '`{"stripe-account": {"rate_per_s": 25, "workflows": ["billing", "refunds"]}}`: a '
        'workflow listed there opts in with the limit `{"shared": "stripe-account"}`; its '
        "bounds are the operator's, and a workflow not listed fails the request unsent",
        default="none",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_LEASE_SECONDS",
        "a running step's lease; the heartbeat renews it six times per lease, and a request "
        "leaves only within half a lease of the last renewal",
        "lease_seconds",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_PRIORITY_AGEING_S",
        "seconds of waiting worth one point of a workflow's `priority`: a ready "
        "step of priority p is claimed as if it had been ready p * this longer, so a higher "
        "priority goes first and a lower one still ages its way in. 0 turns priorities off "
        "(oldest ready first). The same on every worker",
        "priority_ageing_s",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_NOTIFY_WINDOW_S",
        "a notification endpoint gets at most one message per this many seconds; the events "
        "of a window are counted in one message (docs/contract.md#notifications)",
        "notify_window_s",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_NOTIFY_DISABLE_AFTER_S",
        "a notification endpoint failing for this long is disabled (a `410 Gone` at once)",
        "notify_disable_after_s",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_RECONCILE_SECONDS",
        "a `ready` step with no wake-up for this long is re-dispatched; under a backlog "
        "counted from the newest wake-up the consumer received, not from now",
        "reconcile_seconds",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_EVENT_LOOKBACK_S",
        "seconds an event (docs/contract.md#events) is kept for waits that open after it "
        "arrived, and listed: a wait step's `lookback_s` may only shorten it. Read by the API "
        "(an event's expiry), the worker (its housekeeping deletes expired events) and every "
        "process that advances executions",
        "event_lookback_s",
    ),
    Variable(
        "FLOWFORGE_MAX_CHILD_DEPTH",
        "how deep child workflows nest: a `workflow` step whose child would be "
        "deeper fails, saying so. An execution a webhook started is at depth 0. Read by "
        "every process that advances executions (the worker, and the API's operator actions)",
        "max_child_depth",
    ),
    Variable(
        "FLOWFORGE_MAX_DESCENDANTS",
        "how many child executions one root (the execution a webhook, tick or operator "
        "started) may have below it, all depths together: a `workflow` step that would start "
        "one more fails, saying so. Read by every process that advances executions",
        "max_descendants",
    ),
    Variable(
        "FLOWFORGE_IDEMPOTENCY_KEY_HOURS",
        "hours a webhook's idempotency key (`Idempotency-Key` or `webhook-id`) is remembered at "
        "least: a duplicate within them gets the original execution. 1 to 87600; the worker's "
        "housekeeping forgets older keys",
        "idempotency_key_hours",
    ),
    Variable(
        "FLOWFORGE_MAX_BODY_BYTES",
        "webhook and API body limit (keep nginx's `client_max_body_size` equal)",
        "max_body_bytes",
        read_by="api",
    ),
    Variable(
        "FLOWFORGE_WEBHOOK_RATE",
        "webhooks per second per workflow key (or source) per API process, bursts of one "
        "second's worth; beyond it 429 with `Retry-After`, before any database work. "
        "`0` or `unlimited` turns it off",
        default=str(DEFAULT_WEBHOOK_RATE),
        read_by="api",
    ),
    Variable(
        "FLOWFORGE_LIVE_WAITS",
        "how many of one `bin/api`'s sync workers may hold a console page's long poll for its "
        "execution's next change at once (each holds its worker up to 8 s); beyond it a poll "
        "is answered at once with `Retry-After: 20` and the page asks again then. Keep it "
        "well below `FLOWFORGE_API_WORKERS`; `0`: every page polls every 20 s",
        "live_waits",
        read_by="api",
    ),
    Variable(
        "FLOWFORGE_DB_POOL_SIZE", "connections per API process", "db_pool_size", read_by="api"
    ),
    Variable(
        "FLOWFORGE_DB_TIMEOUT_SECONDS",
        "server-side statement and idle-transaction timeout of pooled connections, and the "
        "wait for a free one; a reply is awaited this long plus 5 s. The API uses at most 5 s, "
        "so a stalled database answers 503 before gunicorn's 15 s worker timeout",
        "db_timeout_seconds",
    ),
    Variable(
        "FLOWFORGE_API_WORKERS",
        "gunicorn sync workers of `bin/api`",
        default="2 x CPUs + 1",
        read_by="api",
    ),
    Variable(
        "FLOWFORGE_METRICS_PORT",
        "the port of `bin/worker`'s own `/metrics` (0: none; each worker on a host needs its "
        "own); a taken port stops the worker with exit status 2. `bin/api` serves `/metrics` "
        "on its own listener",
        "metrics_port",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_METRICS_ADDRESS",
        "the address `bin/worker` serves `/metrics` on; `0.0.0.0` for a Prometheus on another host",
        "metrics_address",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_METRICS_TOKEN",
        "when set, `bin/api`'s `/metrics` answers only `Authorization: Bearer <this token>` "
        "(401 otherwise); give Prometheus the same value (`authorization.credentials`). "
        "Unset: `/metrics` is open to whoever reaches the API (the shipped nginx config "
        "denies it)",
        default="unset",
        read_by="api",
    ),
    Variable(
        "FLOWFORGE_WORKER_ID",
        "the worker's name in leases, attempts and logs; unique among running workers "
        "(liveness, and the release of leases no thread of it holds, rely on it)",
        default="host:pid",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_SECRET_<NAME>",
        "the value of `{{ secrets.name }}` (or the systemd credential "
        "`$CREDENTIALS_DIRECTORY/<name>`); only the worker reads values",
        read_by="worker",
    ),
    Variable(
        "FLOWFORGE_SECRET_<NAME>_WORKFLOWS",
        "comma list of the workflow keys that may use secret `name` (none without it); give "
        "API and worker the same",
        read_by="api, worker",
    ),
    Variable(
        "FLOWFORGE_LOG_LEVEL",
        "JSON-lines logs on stderr (gunicorn's access and error lines included)",
        default="INFO",
    ),
    Variable(
        "FLOWFORGE_API_URL",
        "`flowforge` goes through the HTTP API at this URL (as `--api URL`)",
        read_by="cli",
    ),
    Variable("FLOWFORGE_API_KEY", "the API key `flowforge` sends with `--api`", read_by="cli"),
    Variable(
        "FLOWFORGE_PAGER",
        "the pager `flowforge` shows output longer than the terminal through (on a terminal "
        "only; empty or `cat`: none; `--no-pager` for one command)",
        default="`$PAGER`, else `less` (with `LESS=FRX` unless `LESS` is set)",
        read_by="cli",
    ),
    Variable(
        "FLOWFORGE_SQL_DIR",
        "where `bin/migrate` finds its `NNNN_*.sql` files",
        default="the checkout's sql/",
        read_by="migrate",
    ),
    Variable(
        "FLOWFORGE_FAULTS",
        "test suite only: arms named fault points that kill or stall the process; refused at "
        "start-up unless `FLOWFORGE_TEST_MODE=1`",
    ),
    Variable(
        "FLOWFORGE_TEST_MODE",
        "`1` only in the test suite, which sets it; allows `FLOWFORGE_FAULTS`. Never set it in "
        "production",
    ),
)


@dataclass(frozen=True)
class Settings:
    """Runtime configuration shared by the API, the worker and the CLI."""

    database_url: str = "postgresql://localhost/flowforge"
    # FLOWFORGE_DATABASE_DIRECT_URL: PostgreSQL itself when database_url is a pooler's.
    database_direct_url: str = ""
    database_pooler: str = "none"
    amqp_url: str = "amqp://guest:guest@localhost:5672/%2F"
    amqp_prefix: str = "flowforge"
    # FLOWFORGE_AMQP_QUEUE_TYPE: quorum (replicated; the default) or classic.
    amqp_queue_type: str = "quorum"
    worker_concurrency: int = 8
    # FLOWFORGE_WORKER_POOL_SIZE: the most pooled PostgreSQL connections one bin/worker
    # opens, whatever its concurrency (executors hold one only around a claim and a
    # checkpoint, never during a request). A worker opens one more of its own, the relay's
    # LISTEN connection: budget worker_pool_size + 1 per worker against max_connections.
    worker_pool_size: int = 10
    lease_seconds: float = DEFAULT_LEASE_S
    http_allow: str = ""
    max_body_bytes: int = 1_048_576
    reconcile_seconds: float = 30.0
    notify_window_s: float = 10.0
    notify_disable_after_s: float = 5 * 86_400.0
    # FLOWFORGE_PRIORITY_AGEING_S: seconds of waiting worth one priority point
    # (docs/contract.md#priority).
    priority_ageing_s: float = 10.0
    # bin/api's pool per gunicorn worker: a sync worker holds one connection per request.
    db_pool_size: int = 1
    # Server-side statement and idle-transaction timeout of pooled connections; a reply
    # is awaited this long plus a margin, a free pool connection this long.
    db_timeout_seconds: float = 15.0
    webhook_rate: float = 0.0
    # FLOWFORGE_LIVE_WAITS: how many of one bin/api's sync workers may hold a live page's
    # long poll at once (docs/contract.md#live-progress); 0: every page polls.
    live_waits: int = 2
    worker_id: str = ""
    # Seals webhook signing secrets at rest (flowforge/trust/sealing.py); never printed.
    encryption_key: bytes | None = field(default=None, repr=False)
    # Seals notification endpoints' secrets (store/notifications.py); never printed.
    notify_key: bytes | None = field(default=None, repr=False)
    # Signs and checks resume URLs of wait steps (flowforge/trust/resume_tokens.py); never printed.
    resume_key: bytes | None = field(default=None, repr=False)
    # FLOWFORGE_PUBLIC_URL: the base of resume URLs; None refuses to render them.
    public_url: str | None = None
    test_mode: bool = False
    # bin/worker's own /metrics (FLOWFORGE_METRICS_PORT, 0 = none) and its bind address.
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    # FLOWFORGE_METRICS_TOKEN: the bearer token bin/api's /metrics asks for (None: open).
    metrics_token: str | None = field(default=None, repr=False)
    # FLOWFORGE_SECRET_<NAME>_WORKFLOWS: which workflows may use each step secret.
    secret_bindings: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # FLOWFORGE_OUTBOUND_LIMITS: the operator's outbound limits per host
    # (docs/contract.md#outbound-limits).
    host_limits: Mapping[str, LimitSpec] = field(default_factory=dict)
    # FLOWFORGE_SHARED_LIMITS: limits the operator shares between named workflows.
    shared_limits: Mapping[str, operator_limits.SharedLimit] = field(default_factory=dict)
    # FLOWFORGE_IDEMPOTENCY_KEY_HOURS: how long the worker's housekeeping keeps keys.
    idempotency_key_hours: float = DEFAULT_IDEMPOTENCY_KEY_HOURS
    # FLOWFORGE_MAX_CHILD_DEPTH (docs/contract.md#child-workflows); the engine reads it through
    # children.max_child_depth.
    max_child_depth: int = DEFAULT_MAX_CHILD_DEPTH
    # FLOWFORGE_EVENT_LOOKBACK_S (docs/contract.md#events); read through events.lookback_s.
    event_lookback_s: float = 86_400.0
    # FLOWFORGE_MAX_DESCENDANTS; the engine reads it through children.max_descendants.
    max_descendants: int = DEFAULT_MAX_DESCENDANTS
    # FLOWFORGE_SYNC_UNSAFE_CLAIMS, FLOWFORGE_SYNC_INTAKE: "" (the server's) or a level.
    sync_unsafe_claims: str = ""
    sync_intake: str = ""

    @property
    def direct_url(self) -> str:
        """Where connections that need a session of their own go: LISTEN, advisory locks."""
        return self.database_direct_url or self.database_url

    @property
    def behind_pooler(self) -> bool:
        """database_url is a transaction-mode pooler's (see _pooler)."""
        return self.database_pooler == "transaction"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the environment; defaults work against local PostgreSQL and RabbitMQ."""
        env = os.environ if env is None else env
        test_mode = env.get("FLOWFORGE_TEST_MODE", "") == "1"
        if env.get("FLOWFORGE_FAULTS", "").strip() and not test_mode:
            # Fault points kill or stall the process on purpose; outside the test suite
            # that is an outage waiting in an environment file, so refuse to start.
            raise ConfigError(
                "FLOWFORGE_FAULTS is set but FLOWFORGE_TEST_MODE is not 1: fault injection "
                "is for the test suite only; remove FLOWFORGE_FAULTS"
            )
        bindings = secret_bindings.parse(env)
        return cls(
            database_url=env.get("FLOWFORGE_DATABASE_URL") or cls.database_url,
            database_direct_url=env.get("FLOWFORGE_DATABASE_DIRECT_URL", "").strip(),
            database_pooler=_pooler(env),
            amqp_url=env.get("FLOWFORGE_AMQP_URL") or cls.amqp_url,
            amqp_prefix=env.get("FLOWFORGE_AMQP_PREFIX") or cls.amqp_prefix,
            amqp_queue_type=_queue_type(env),
            worker_concurrency=_int(env, "FLOWFORGE_WORKER_CONCURRENCY", cls.worker_concurrency),
            worker_pool_size=_int(
                env, "FLOWFORGE_WORKER_POOL_SIZE", cls.worker_pool_size, minimum=2
            ),
            lease_seconds=_float(env, "FLOWFORGE_LEASE_SECONDS", cls.lease_seconds),
            http_allow=env.get("FLOWFORGE_HTTP_ALLOW", ""),
            max_body_bytes=_int(env, "FLOWFORGE_MAX_BODY_BYTES", cls.max_body_bytes),
            reconcile_seconds=_float(env, "FLOWFORGE_RECONCILE_SECONDS", cls.reconcile_seconds),
            notify_window_s=_float(env, "FLOWFORGE_NOTIFY_WINDOW_S", cls.notify_window_s),
            notify_disable_after_s=_float(
                env, "FLOWFORGE_NOTIFY_DISABLE_AFTER_S", cls.notify_disable_after_s
            ),
            max_child_depth=_int(env, "FLOWFORGE_MAX_CHILD_DEPTH", cls.max_child_depth),
            event_lookback_s=_float(env, "FLOWFORGE_EVENT_LOOKBACK_S", cls.event_lookback_s),
            max_descendants=_int(env, "FLOWFORGE_MAX_DESCENDANTS", cls.max_descendants),
            priority_ageing_s=_ageing(env),
            db_pool_size=_int(env, "FLOWFORGE_DB_POOL_SIZE", cls.db_pool_size),
            db_timeout_seconds=_float(env, "FLOWFORGE_DB_TIMEOUT_SECONDS", cls.db_timeout_seconds),
            webhook_rate=_webhook_rate(env),
            live_waits=_int(env, "FLOWFORGE_LIVE_WAITS", cls.live_waits, minimum=0),
            worker_id=env.get("FLOWFORGE_WORKER_ID") or f"{socket.gethostname()}:{os.getpid()}",
            encryption_key=_encryption_key(env),
            notify_key=_notify_key(env),
            resume_key=_resume_key(env),
            public_url=_public_url(env),
            test_mode=test_mode,
            metrics_port=_port(env, "FLOWFORGE_METRICS_PORT"),
            metrics_address=env.get("FLOWFORGE_METRICS_ADDRESS", "").strip() or cls.metrics_address,
            metrics_token=env.get("FLOWFORGE_METRICS_TOKEN", "").strip() or None,
            secret_bindings=bindings,
            idempotency_key_hours=_key_hours(env),
            host_limits=operator_limits.parse_host_limits(env.get("FLOWFORGE_OUTBOUND_LIMITS", "")),
            shared_limits=operator_limits.parse_shared_limits(
                env.get("FLOWFORGE_SHARED_LIMITS", "")
            ),
            sync_unsafe_claims=_sync_level(env, "FLOWFORGE_SYNC_UNSAFE_CLAIMS"),
            sync_intake=_sync_level(env, "FLOWFORGE_SYNC_INTAKE"),
        )
