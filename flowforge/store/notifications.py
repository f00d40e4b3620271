"""Operational notifications (docs/contract.md#notifications): endpoints, the events the
triggers of sql/0060 record for them, the coalesced messages and their attempts.

An event is written by a trigger in the transaction of the state change it reports, so an
execution never waits on a receiver and no event is lost with a crash. The triggers run
only while some endpoint is enabled (`sync_triggers`): a deployment with no subscription
pays no trigger, no query and no insert on its failure path. Events of one endpoint are
gathered into one message per coalescing window, so a burst of a thousand failures is a
handful of messages that count them and show a few.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import psycopg

from flowforge.domain.model import NotifyKind, NotifyShape
from flowforge.errors import ClientError, Conflict, NotFound
from flowforge.store.db import one
from flowforge.store.flowcontrol import IN_QUEUE
from flowforge.trust import sealing, signatures


class NotifyKeyMissing(sealing.EncryptionKeyMissing):
    """FLOWFORGE_NOTIFY_KEY (or the systemd credential notify_key) is not set, so an
    endpoint's secret can be neither sealed nor opened."""

    title = "Notify key missing"
    detail = "notification endpoints are unavailable: this server has no FLOWFORGE_NOTIFY_KEY"


class EndpointInvalid(ClientError):
    """The endpoint cannot be saved as sent."""

    status = 422
    title = "Invalid notification endpoint"


# The event kinds an endpoint may subscribe to, each recorded by a trigger of sql/0060
# (failure_group.opened: of sql/0063).
KINDS = tuple(kind.value for kind in NotifyKind)
SHAPES = tuple(NotifyShape)
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")  # whole (fullmatch: no newline after it)
URL = re.compile(r"^https?://[^\s/]+")
MAX_URL = 2048
# The newest messages an endpoint's page shows (its delivery history).
HISTORY = 50
# What one message shows of its events; the rest are counted only.
SAMPLES = 20
# Retries after a failed attempt, in seconds (Standard Webhooks' schedule: 5 s, 5 min,
# 30 min, 2 h, 5 h, 10 h, 10 h), each with up to a fifth more of jitter; a Retry-After
# sent by the receiver wins, up to RETRY_AFTER_MAX_S.
BACKOFF_S = (5, 300, 1800, 7200, 18000, 36000, 36000)
RETRY_AFTER_MAX_S = 86_400.0
# The triggers of sql/0060 and their tables, switched together.
TRIGGERS = (
    "ALTER TABLE executions {} TRIGGER notify_execution",
    "ALTER TABLE steps {} TRIGGER notify_step",
    "ALTER TABLE outbound_limits {} TRIGGER notify_circuit",
    # sql/0063: a failure group opened (new, or resolved and recurring).
    "ALTER TABLE failure_groups {} TRIGGER notify_failure_group_new",
    "ALTER TABLE failure_groups {} TRIGGER notify_failure_group_reopened",
)
# Enabling an endpoint wakes the notifiers, which sleep while none is (the relay's LISTEN
# connection hears it for them); delivered at commit.
WAKE_CHANNEL = "flowforge_notify"
LISTEN_WAKE = f"LISTEN {WAKE_CHANNEL}"
WAKE = f"SELECT pg_notify('{WAKE_CHANNEL}', '')"
TRIGGER_LOCK = "SELECT pg_advisory_xact_lock(hashtext('flowforge.notify_triggers'))"
ANY_ENABLED = "SELECT EXISTS (SELECT 1 FROM notify_endpoints WHERE disabled_at IS NULL)"
TRIGGERS_ON = """
SELECT tgenabled <> 'D' FROM pg_trigger
WHERE tgname = 'notify_execution' AND tgrelid = 'executions'::regclass
"""

WORKFLOW_ID = "SELECT id FROM workflows WHERE key = %(workflow)s"
INSERT_ENDPOINT = """
INSERT INTO notify_endpoints (name, url, shape, kinds, workflow_id)
VALUES (%(name)s, %(url)s, %(shape)s, %(kinds)s, %(workflow_id)s)
ON CONFLICT (name) DO NOTHING
RETURNING id
"""
# The secret of an endpoint (a standard one's whsec_ secret, a Slack one's URL) sealed
# under FLOWFORGE_NOTIFY_KEY for its row (sql/0067); a Slack URL is shown masked.
SEAL_ENDPOINT = """
UPDATE notify_endpoints SET sealed = %(sealed)s, secret = NULL, url = %(url)s WHERE id = %(id)s
"""
# Rows from before sql/0067, sealed by bin/migrate (seal_clear), locked against a race.
CLEAR_ENDPOINTS = """
SELECT id, shape, url, secret FROM notify_endpoints WHERE sealed IS NULL ORDER BY id FOR UPDATE
"""
SEALED_TABLE = "notify_endpoints"
ENDPOINT_COLUMNS = """
e.id, e.name, e.url, e.shape, e.kinds, w.key AS workflow, e.created_at, e.disabled_at,
e.disabled_reason, e.failing_since
"""
LIST_ENDPOINTS = f"""
SELECT {ENDPOINT_COLUMNS} FROM notify_endpoints e LEFT JOIN workflows w ON w.id = e.workflow_id
ORDER BY e.name
"""
GET_ENDPOINT = f"""
SELECT {ENDPOINT_COLUMNS} FROM notify_endpoints e LEFT JOIN workflows w ON w.id = e.workflow_id
WHERE e.name = %(name)s
"""
DELIVERIES = """
SELECT id, events, payload->>'type' AS type, status, attempts, last_status, last_error,
       created_at, delivered_at, next_at
FROM notify_deliveries WHERE endpoint_id = %(id)s ORDER BY created_at DESC LIMIT %(limit)s
"""
ENABLE = """
UPDATE notify_endpoints SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL
WHERE name = %(name)s RETURNING id
"""
# Disabling drops what waits for it: a message kept for days would report stale news.
DISABLE = """
WITH disabled AS (
    UPDATE notify_endpoints SET disabled_at = coalesce(disabled_at, now()),
                                disabled_reason = %(reason)s
    WHERE id = %(id)s RETURNING id
), dropped AS (
    DELETE FROM notify_pending WHERE endpoint_id = (SELECT id FROM disabled)
), given_up AS (
    UPDATE notify_deliveries SET status = 'failed'
    WHERE endpoint_id = (SELECT id FROM disabled) AND status = 'pending'
)
SELECT id FROM disabled
"""
DELETE_ENDPOINT = "DELETE FROM notify_endpoints WHERE name = %(name)s RETURNING id"

# The worker's side. Endpoints with events waiting whose window has passed.
DUE_ENDPOINTS = """
SELECT e.id FROM notify_endpoints e
WHERE e.disabled_at IS NULL
  AND (e.last_batch_at IS NULL OR e.last_batch_at <= now() - %(window_s)s * interval '1 second')
  AND EXISTS (SELECT 1 FROM notify_pending p WHERE p.endpoint_id = e.id)
ORDER BY e.id LIMIT 100
"""
LOCK_ENDPOINT = """
SELECT name FROM notify_endpoints WHERE id = %(id)s AND disabled_at IS NULL FOR UPDATE SKIP LOCKED
"""
TAKE_PENDING = """
WITH taken AS (DELETE FROM notify_pending WHERE endpoint_id = %(id)s RETURNING *)
SELECT t.kind, w.key AS workflow, t.execution_id, t.detail, t.at
FROM taken t LEFT JOIN workflows w ON w.id = t.workflow_id ORDER BY t.id
"""
INSERT_DELIVERY = """
WITH batched AS (UPDATE notify_endpoints SET last_batch_at = now() WHERE id = %(id)s)
INSERT INTO notify_deliveries (endpoint_id, payload, events)
VALUES (%(id)s, %(payload)s, %(events)s)
"""
# Due messages, claimed for `claim_s` so another worker's notifier leaves them alone
# while this one sends; a crash mid-send leaves them due again after it.
CLAIM_DUE = """
WITH due AS (
    SELECT d.id FROM notify_deliveries d
    WHERE d.status = 'pending' AND d.next_at <= now()
      AND d.endpoint_id <> ALL (%(busy)s::bigint[])
    ORDER BY d.next_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE notify_deliveries d SET next_at = now() + %(claim_s)s * interval '1 second',
                               attempts = d.attempts + 1
FROM due, notify_endpoints e
WHERE d.id = due.id AND e.id = d.endpoint_id
RETURNING d.id, d.endpoint_id, d.payload, d.created_at, d.attempts, e.url, e.shape, e.secret,
          e.sealed
"""
DELIVERED = """
WITH ok AS (
    UPDATE notify_deliveries SET status = 'delivered', delivered_at = now(),
                                 last_status = %(status)s, last_error = NULL
    WHERE id = %(id)s
)
UPDATE notify_endpoints SET failing_since = NULL WHERE id = %(endpoint_id)s
"""
# A failed attempt: tried again at `retry_s`, or given up after the last of BACKOFF_S;
# the endpoint's failing_since says how long it has failed, for `disable_after_s`.
FAILED = """
WITH endpoint AS (
    UPDATE notify_endpoints SET failing_since = coalesce(failing_since, now())
    WHERE id = %(endpoint_id)s
    RETURNING failing_since <= now() - %(disable_after_s)s * interval '1 second' AS too_long
)
UPDATE notify_deliveries SET
    last_status = %(status)s, last_error = %(error)s,
    status = CASE WHEN %(retry_s)s::float8 IS NULL THEN 'failed' ELSE 'pending' END,
    next_at = now() + coalesce(%(retry_s)s::float8, 0) * interval '1 second'
WHERE id = %(id)s
RETURNING (SELECT too_long FROM endpoint)
"""
# A queue.full crossing re-arms once its queue holds fewer than half its bound, or once
# the workflow's newest version bounds it differently (its crossing is another one).
REARM = f"""
DELETE FROM notify_queue_alarms a
WHERE 2 * (SELECT count(*) FROM (SELECT 1 FROM executions
                                 WHERE workflow_id = a.workflow_id AND {IN_QUEUE}
                                 LIMIT a.bound) q) < a.bound
   OR a.bound IS DISTINCT FROM (
       SELECT (v.definition #>> '{{concurrency,max_queued}}')::numeric::int
       FROM workflows w
       JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.latest_version
       WHERE w.id = a.workflow_id)
"""
# Finished messages are kept HISTORY_DAYS, then forgotten in batches (the notifier, hourly).
HISTORY_DAYS = 30
FORGET = """
DELETE FROM notify_deliveries
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM notify_deliveries
    WHERE status <> 'pending' AND created_at < now() - %(days)s * interval '1 day'
    LIMIT 1000))
"""


@dataclass(frozen=True)
class Message:
    """One claimed delivery: what to send, where, and how to sign it."""

    id: str
    endpoint_id: int
    payload: dict[str, Any]
    created_at: datetime
    attempts: int
    url: str
    shape: str
    secret: str | None
    sealed: bytes | None

    def opened(self, key: bytes | None) -> tuple[str, str | None]:
        """Where to send and what to sign with: the sealed secret opened with
        FLOWFORGE_NOTIFY_KEY (a Slack endpoint's is its URL), or a row's clear values
        until bin/migrate sealed them."""
        if self.sealed is None:
            return self.url, self.secret
        if key is None:
            raise NotifyKeyMissing
        value = sealing.unseal(key, self.sealed, 0, self.endpoint_id, SEALED_TABLE)
        return (value, None) if self.shape == NotifyShape.SLACK else (self.url, value)

    @property
    def message_id(self) -> str:
        """The id a receiver deduplicates on: the same for every attempt of one message."""
        return "msg_" + self.id.replace("-", "")


def create(
    conn: psycopg.Connection,
    *,
    name: str,
    url: str,
    shape: str,
    kinds: list[str],
    workflow: str | None,
    key: bytes | None,
) -> dict[str, Any]:
    """Save an endpoint and switch the triggers on; the answer holds its signing secret,
    shown this once (docs/contract.md#notifications). The secret (a Slack endpoint's URL)
    is stored sealed under `key` only."""
    _check(name, url, shape, kinds)
    if key is None:
        raise NotifyKeyMissing
    workflow_id = None
    if workflow is not None:
        row = conn.execute(WORKFLOW_ID, {"workflow": workflow}).fetchone()
        if row is None:
            raise EndpointInvalid(f"no workflow is named {workflow!r}")
        workflow_id = row[0]
    secret = signatures.new_secret() if shape == "standard" else None
    with conn.transaction():
        # A Slack URL is the secret: never written in clear, not even in the row version
        # the seal below replaces (the table's files, backups and WAL would keep it).
        shown = mask(url) if shape == NotifyShape.SLACK else url
        params: dict[str, Any] = {"name": name, "url": shown, "shape": shape}
        params |= {"kinds": sorted(set(kinds)), "workflow_id": workflow_id}
        row = conn.execute(INSERT_ENDPOINT, params).fetchone()
        if row is None:
            raise Conflict(f"a notification endpoint is already named {name!r}")
        _seal(conn, key, row[0], shape, url, secret)
        sync_triggers(conn)
    return get(conn, name) | {"secret": secret}


def _seal(
    conn: psycopg.Connection,
    key: bytes | None,
    endpoint_id: int,
    shape: str,
    url: str,
    secret: str | None,
) -> None:
    """Store an endpoint's secret sealed for its row: a standard one's signing secret, a
    Slack one's URL (which is all it takes to post there), then shown masked."""
    slack = shape == NotifyShape.SLACK
    value = url if slack else secret
    assert value is not None, "a standard endpoint always has its secret"
    sealed = sealing.seal(key, value, 0, endpoint_id, SEALED_TABLE)
    shown = mask(url) if slack else url
    conn.execute(SEAL_ENDPOINT, {"id": endpoint_id, "sealed": sealed, "url": shown})


def mask(url: str) -> str:
    """A Slack webhook URL as shown after its creation: scheme, host and port; the rest
    (userinfo, path, query, fragment: wherever its secret is) hidden."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "/…"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}/…" if host else "/…"


def rotate(
    conn: psycopg.Connection, name: str, key: bytes | None, url: str | None = None
) -> dict[str, Any]:
    """A new signing secret for a standard endpoint (shown this once), or a new URL for a
    Slack one; the old stops at once, and messages still pending are sent with the new."""
    endpoint = get(conn, name)
    if key is None:
        raise NotifyKeyMissing
    if url is not None:
        check_url(url)
    # Which one the endpoint takes depends on its shape, not on the request: a conflict.
    slack = endpoint["shape"] == NotifyShape.SLACK
    if slack and url is None:
        raise Conflict(f"{name!r} is a Slack endpoint: rotate it with its new URL (url)")
    if not slack and url is not None:
        raise Conflict(f"{name!r} is a standard endpoint: its secret is rotated, not its URL")
    secret = None if slack else signatures.new_secret()
    with conn.transaction():
        _seal(conn, key, endpoint["id"], endpoint["shape"], url or endpoint["url"], secret)
    return get(conn, name) | ({} if slack else {"secret": secret})


def seal_clear(conn: psycopg.Connection, key: bytes | None) -> int:
    """Seal every endpoint stored before sql/0067 (bin/migrate, on every run); return how
    many. With such rows and no key this raises NotifyKeyMissing and changes nothing."""
    with conn.transaction():
        rows = conn.execute(CLEAR_ENDPOINTS).fetchall()
        if rows and key is None:
            raise NotifyKeyMissing
        for endpoint_id, shape, url, secret in rows:
            _seal(conn, key, endpoint_id, shape, url, secret)
    if rows:
        # The clear values live on in dead row versions until the table is rewritten.
        conn.execute("VACUUM FULL notify_endpoints")
    return len(rows)


def check_url(url: object) -> None:
    """An endpoint's URL: http(s), bounded, and without user:password@, which the
    address guard refuses at every send (accepted, it could never be delivered to)."""
    if not isinstance(url, str) or not URL.match(url) or len(url) > MAX_URL:
        raise EndpointInvalid(f"url: an http(s) URL of at most {MAX_URL} characters")
    try:
        netloc = urlsplit(url).netloc
    except ValueError:  # an unbalanced [ of an IPv6 host, say
        raise EndpointInvalid("url: not a URL (its host does not parse)") from None
    if "@" in netloc:
        raise EndpointInvalid("url: no user or password before the host (user:password@)")


def _check(name: str, url: str, shape: str, kinds: list[str]) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise EndpointInvalid("name: lowercase letters, digits, - and _, at most 64")
    check_url(url)
    if shape not in SHAPES:
        raise EndpointInvalid(f"shape: one of {', '.join(SHAPES)}")
    if not isinstance(kinds, list) or not kinds or not all(k in KINDS for k in kinds):
        raise EndpointInvalid(f"kinds: a non-empty list of {', '.join(KINDS)}")


def sync_triggers(conn: psycopg.Connection) -> None:
    """Run the triggers of sql/0060 exactly while some endpoint is enabled. ALTER TABLE
    waits for the transactions writing those tables, so the wait is bounded (lock_timeout):
    an endpoint that cannot switch them on is not saved (503, try again)."""
    conn.execute(TRIGGER_LOCK)
    (wanted,) = one(conn.execute(ANY_ENABLED))
    if wanted:
        conn.execute(WAKE)
    if one(conn.execute(TRIGGERS_ON))[0] == wanted:
        return
    conn.execute("SET LOCAL lock_timeout = '5s'")
    for statement in TRIGGERS:
        conn.execute(statement.format("ENABLE" if wanted else "DISABLE"))


def any_enabled(conn: psycopg.Connection) -> bool:
    """Whether some endpoint is enabled: the notifier's one question while none is."""
    return bool(one(conn.execute(ANY_ENABLED))[0])


def list_endpoints(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every endpoint, without its secret."""
    return [_endpoint(row) for row in conn.execute(LIST_ENDPOINTS).fetchall()]


def get(conn: psycopg.Connection, name: str, deliveries: int = 0) -> dict[str, Any]:
    """One endpoint and its newest `deliveries` messages (its delivery history)."""
    row = conn.execute(GET_ENDPOINT, {"name": name}).fetchone()
    if row is None:
        raise NotFound(f"no notification endpoint is named {name!r}")
    found = _endpoint(row)
    if deliveries:
        rows = conn.execute(DELIVERIES, {"id": row[0], "limit": deliveries}).fetchall()
        found["deliveries"] = [_delivery(r) for r in rows]
    return found


def _endpoint(row: tuple[Any, ...]) -> dict[str, Any]:
    keys = ("id", "name", "url", "shape", "kinds", "workflow", "created_at", "disabled_at")
    found = dict(zip(keys, row[:8], strict=True))
    found["disabled_reason"], found["failing_since"] = row[8], row[9]
    found["enabled"] = row[7] is None
    return found


def _delivery(row: tuple[Any, ...]) -> dict[str, Any]:
    keys = ("id", "events", "type", "status", "attempts", "last_status", "last_error")
    found = dict(zip(keys, row[:7], strict=True))
    found["id"] = "msg_" + str(row[0]).replace("-", "")
    found["created_at"], found["delivered_at"] = row[7], row[8]
    found["next_at"] = row[9] if row[3] == "pending" else None
    return found


def enable(conn: psycopg.Connection, name: str) -> dict[str, Any]:
    """Turn a disabled endpoint back on (by hand: nothing re-enables one by itself)."""
    with conn.transaction():
        if conn.execute(ENABLE, {"name": name}).fetchone() is None:
            raise NotFound(f"no notification endpoint is named {name!r}")
        sync_triggers(conn)
    return get(conn, name)


def disable(conn: psycopg.Connection, name: str, reason: str = "operator") -> dict[str, Any]:
    """Turn an endpoint off: its waiting events and messages are dropped."""
    endpoint = get(conn, name)
    with conn.transaction():
        conn.execute(DISABLE, {"id": endpoint["id"], "reason": reason})
        sync_triggers(conn)
    return get(conn, name)


def delete(conn: psycopg.Connection, name: str) -> None:
    """Remove an endpoint with its history. It is disabled first, in a transaction of its
    own: deleting the row while switching the triggers off would hold its row lock while
    waiting for the writers of executions, one of which may be recording an event for it
    (a KEY SHARE on that row): a deadlock."""
    disable(conn, name, reason="deleted")
    with conn.transaction():
        if conn.execute(DELETE_ENDPOINT, {"name": name}).fetchone() is None:
            raise NotFound(f"no notification endpoint is named {name!r}")


def coalesce(conn: psycopg.Connection, window_s: float) -> int:
    """Turn each due endpoint's waiting events into one message; return how many."""
    made = 0
    for (endpoint_id,) in conn.execute(DUE_ENDPOINTS, {"window_s": window_s}).fetchall():
        with conn.transaction():
            locked = conn.execute(LOCK_ENDPOINT, {"id": endpoint_id}).fetchone()
            if locked is None:
                continue
            events = conn.execute(TAKE_PENDING, {"id": endpoint_id}).fetchall()
            if not events:
                continue
            payload = batch_payload(locked[0], events)
            params = {"id": endpoint_id, "payload": json.dumps(payload), "events": len(events)}
            conn.execute(INSERT_DELIVERY, params)
            made += 1
    return made


def forget(conn: psycopg.Connection) -> int:
    """Delete one batch of finished messages older than HISTORY_DAYS; return how many."""
    return conn.execute(FORGET, {"days": HISTORY_DAYS}).rowcount


def batch_payload(endpoint: str, events: list[tuple[Any, ...]]) -> dict[str, Any]:
    """The message of one window: every event counted by kind, the first SAMPLES shown."""
    kinds = Counter(row[0] for row in events)
    samples = [
        {
            "kind": kind,
            "workflow": workflow,
            "execution_id": str(execution) if execution else None,
            "detail": detail,
            "at": at.isoformat(),
        }
        for kind, workflow, execution, detail, at in events[:SAMPLES]
    ]
    return {
        "type": next(iter(kinds)) if len(kinds) == 1 else "notification.batch",
        "timestamp": events[-1][4].isoformat(),
        "data": {
            "endpoint": endpoint,
            "count": len(events),
            "kinds": dict(kinds),
            "events": samples,
            "omitted": max(0, len(events) - SAMPLES),
        },
    }


def claim_due(
    conn: psycopg.Connection, limit: int, claim_s: float, busy: list[int] | None = None
) -> list[Message]:
    """Take up to `limit` due messages for this notifier to send (one transaction), none
    of the endpoints in `busy` (this notifier is still sending to them)."""
    params = {"limit": limit, "claim_s": claim_s, "busy": busy or []}
    with conn.transaction():
        rows = conn.execute(CLAIM_DUE, params).fetchall()
    return [Message(str(row[0]), *row[1:]) for row in rows]


def rearm_queues(conn: psycopg.Connection) -> int:
    """Forget the queue.full crossings of queues now below half their bound, so that the
    next crossing is news again (hysteresis); return how many."""
    return conn.execute(REARM).rowcount


def delivered(conn: psycopg.Connection, message: Message, status: int) -> None:
    """A 2xx came back: the message is done and the endpoint no longer failing."""
    with conn.transaction():
        conn.execute(
            DELIVERED, {"id": message.id, "endpoint_id": message.endpoint_id, "status": status}
        )


def failed(
    conn: psycopg.Connection,
    message: Message,
    *,
    status: int | None,
    error: str,
    retry_after_s: float | None,
    disable_after_s: float,
) -> str | None:
    """Record a failed attempt and schedule the next; a 410 Gone, or failing for longer
    than `disable_after_s`, disables the endpoint. Returns the reason it was disabled."""
    retry_s = next_retry(message.attempts, retry_after_s)
    params = {"id": message.id, "endpoint_id": message.endpoint_id, "status": status}
    params |= {"error": error[:500], "retry_s": retry_s, "disable_after_s": disable_after_s}
    with conn.transaction():
        (too_long,) = one(conn.execute(FAILED, params))
        reason = "gone" if status == 410 else "failing" if too_long else None
        if reason is not None:
            conn.execute(DISABLE, {"id": message.endpoint_id, "reason": reason})
            sync_triggers(conn)
    return reason


def next_retry(attempts: int, retry_after_s: float | None) -> float | None:
    """Seconds until the next attempt after `attempts` failed ones, or None: give up."""
    if attempts > len(BACKOFF_S):
        return None
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.0), RETRY_AFTER_MAX_S)
    base = BACKOFF_S[attempts - 1]
    return base + random.uniform(0, base / 5)
