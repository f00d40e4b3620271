"""Outbound limits shared by every worker through PostgreSQL (docs/contract.md#outbound-limits).

A limited http_request is admitted in its claim transaction, under the row lock of each
of its keys (outbound_limits), so every worker sees every other's requests: never a
per-process counter. What is checked, in order:

- held: a 429/503 with Retry-After from the key's host holds the key until then;
- concurrency: the key's requests in flight (outbound_slots) are below its concurrency;
- circuit: an open circuit makes its steps wait until its cool-down ends; then one probe
  goes (half-open) and its result closes or reopens it;
- rate: the generic cell rate algorithm (GCRA). Each admitted request moves the key's
  theoretical arrival time `tat` on by 1/rate; a request may leave at
  max(now, tat - (burst - 1)/rate). In any interval of T seconds at most
  burst + rate·T requests leave. A request whose place is later keeps it (a reserved
  wait): it wakes at that instant, so N waiting steps cost about N wake-ups, not N per
  token. What leaves is checked by a second GCRA over the instants requests were
  actually admitted (`sent_tat`), with a tolerance of its own (DEPARTURE_JITTER_S): steps
  woken late cannot all leave together. Strict spacing there (no tolerance) turned every
  clump of steps that one pass of a timer scanner woke into one departure per wake-up
  round trip: 22/s for a limit of 50/s. In any interval of T seconds at most
  burst + rate·(T + DEPARTURE_JITTER_S) requests leave (52 in a second at 50/s, burst 1).

A step that may not leave yet stays `ready` with a wake time (limit_waits): no attempt,
no failure, and its executor thread goes back at once. A reserved place is woken by the
worker that recorded it, in-process at that instant (worker/places.py), with the timer
scanner as the fallback LOCAL_GRACE_S later; other waits get the scanner's wake-up when
the time comes; a slot freed at a checkpoint wakes the oldest step that waits for it at
once.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from flowforge.domain.definitions import (
    MAX_HOLD_S,
    Circuit,
    LimitSpec,
)
from flowforge.domain.model import CircuitState, LimitReason
from flowforge.store.db import one

# A wait for a slot of a full concurrency is woken by the checkpoint that frees one; this
# is the poll behind it, for a slot whose worker died (its slot ends by itself at `until`).
CONCURRENCY_POLL_S = 1.0
# A slot outlives its attempt's timeout by the lease and this much: past that its worker
# is gone (or the checkpoint is), and the reaper recovers the step.
SLOT_MARGIN_S = 5.0
# A place this close is taken now: less than the wake-up would cost.
NOW_S = 0.005
# How far the actual departures of a key may run ahead of strict spacing (at least its
# burst allows that much anyway): steps that one pass of the timer scanner woke arrive
# together. 50 ms let 56 reach a target in one second at 50/s (the wire adds its own
# bunching); 20 ms kept it at 52 and still lifted the achieved rate.
DEPARTURE_JITTER_S = 0.02
# Over how many instants, 1/rate apart, the requests the departure check holds back at
# once are spread (by a hash of the step): all at the one instant the check allows next,
# one left there and the rest were held back again, and again — 2,000-3,700 extra claims
# under the key's lock for 600 requests at 50/s. A few instants, not a schedule of their
# own: one (held_tat, tried) piled the held-back steps up seconds ahead.
HELD_SPREAD = 4

# The key's row, created on first use and locked (ON CONFLICT DO UPDATE locks and returns
# it), with the database's clock once the lock is ours: clock_timestamp(), not now(),
# which is when the transaction began — before it waited for the lock, so a stale `now`
# would let tat fall behind and admit a burst.
LOCK_KEY = """
INSERT INTO outbound_limits AS l (owner, key) VALUES (%(owner)s, %(key)s)
ON CONFLICT (owner, key) DO UPDATE SET updated_at = now()
RETURNING l.tat, l.sent_tat, l.held_until, l.circuit, l.opened_until, l.probe, clock_timestamp()
"""
# The key's slots in flight, read by a statement of its own once the row lock is ours: a
# subquery of LOCK_KEY would read with the snapshot that statement began with — from
# before the holder it waited for committed its slot — and admit one too many (soak
# seeds 11, 2311).
IN_FLIGHT = """
SELECT count(*) FROM outbound_slots WHERE owner = %(owner)s AND key = %(key)s AND until > now()
"""
MY_WAIT = """
SELECT owner, key, reason, wake_at, reserved FROM limit_waits
WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
"""
MOVE_TAT = "UPDATE outbound_limits SET tat = %(tat)s WHERE owner = %(owner)s AND key = %(key)s"
SENT = """
UPDATE outbound_limits SET sent_tat = %(sent_tat)s WHERE owner = %(owner)s AND key = %(key)s
"""
TAKE_SLOT = """
INSERT INTO outbound_slots (execution_id, step_id, owner, key, until)
VALUES (%(execution_id)s, %(step_id)s, %(owner)s, %(key)s,
        now() + make_interval(secs => %(hold_s)s))
ON CONFLICT (execution_id, step_id, owner, key) DO UPDATE SET until = EXCLUDED.until
"""
ADMITTED = """
DELETE FROM limit_waits WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
"""
WAIT = """
INSERT INTO limit_waits (execution_id, step_id, owner, key, reason, wake_at, reserved)
VALUES (%(execution_id)s, %(step_id)s, %(owner)s, %(key)s, %(reason)s, %(wake_at)s,
        %(reserved)s)
ON CONFLICT (execution_id, step_id) DO UPDATE
SET owner = EXCLUDED.owner, key = EXCLUDED.key, reason = EXCLUDED.reason,
    wake_at = EXCLUDED.wake_at, reserved = EXCLUDED.reserved, woken = false,
    since = CASE WHEN (limit_waits.owner, limit_waits.key, limit_waits.reason)
                      = (EXCLUDED.owner, EXCLUDED.key, EXCLUDED.reason)
                 THEN limit_waits.since ELSE now() END
"""
# At the checkpoint: the step's slots end, and for each key the oldest step waiting for a
# slot of it wakes now.
RELEASE = """
WITH freed AS (
    DELETE FROM outbound_slots
    WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
    RETURNING owner, key
), next AS (
    SELECT DISTINCT ON (w.owner, w.key) w.execution_id, w.step_id
    FROM limit_waits w JOIN freed f ON f.owner = w.owner AND f.key = w.key
    WHERE w.reason = 'concurrency' AND NOT w.woken
    ORDER BY w.owner, w.key, w.since
)
UPDATE limit_waits w SET wake_at = now()
FROM next WHERE w.execution_id = next.execution_id AND w.step_id = next.step_id
"""
PROBE = """
UPDATE outbound_limits SET circuit = 'half_open', probe = %(probe)s,
       opened_until = now() + make_interval(secs => %(until_s)s), updated_at = now()
WHERE owner = %(owner)s AND key = %(key)s
"""
# At the checkpoint of a request through a key with a circuit: a success closes it; a
# failure (no connection, no response, a 5xx) counts, in a row within window_s, and the
# one that reaches `failures` — or a failed probe — opens it for cool_down_s.
CIRCUIT_SUCCEEDED = """
WITH closed AS (
    UPDATE outbound_limits
    SET circuit = 'closed', failures = 0, first_failure_at = NULL, opened_until = NULL,
        probe = NULL, updated_at = now()
    WHERE owner = %(owner)s AND key = %(key)s AND (circuit <> 'closed' OR failures > 0)
    RETURNING owner, key
)
UPDATE limit_waits SET wake_at = now()
WHERE (owner, key) IN (SELECT owner, key FROM closed) AND reason = 'circuit' AND NOT woken
"""
CIRCUIT_FAILED = """
WITH counted AS (
    SELECT owner, key, circuit,
           CASE WHEN first_failure_at IS NULL
                     OR first_failure_at < now() - make_interval(secs => %(window_s)s)
                THEN 1 ELSE failures + 1 END AS failures,
           CASE WHEN first_failure_at IS NULL
                     OR first_failure_at < now() - make_interval(secs => %(window_s)s)
                THEN now() ELSE first_failure_at END AS first_failure_at
    FROM outbound_limits WHERE owner = %(owner)s AND key = %(key)s FOR UPDATE
), opens AS (
    SELECT *, circuit = 'half_open' OR (circuit = 'closed' AND failures >= %(failures)s)
              AS opens
    FROM counted
)
UPDATE outbound_limits l
SET failures = o.failures, first_failure_at = o.first_failure_at,
    circuit = CASE WHEN o.opens THEN 'open' ELSE l.circuit END,
    opened_until = CASE WHEN o.opens THEN now() + make_interval(secs => %(cool_down_s)s)
                        ELSE l.opened_until END,
    probe = CASE WHEN o.opens THEN NULL ELSE l.probe END,
    updated_at = now()
FROM opens o WHERE l.owner = o.owner AND l.key = o.key
"""
# For operators: the limits whose circuit is not closed or that a Retry-After holds, with
# the owning workflow's key (none for the operator's own); `workflows` (keys) narrows
# them to a scoped API key's workflows, which never see the operator's limits.
OPEN_OR_HELD = """
SELECT l.owner, w.key, l.key, l.circuit, l.failures, l.opened_until, l.probe, l.updated_at,
       CASE WHEN l.held_until > now() THEN l.held_until END,
       CASE WHEN l.held_until > now() THEN l.held_reason END
FROM outbound_limits l
LEFT JOIN workflows w
       ON w.id = CASE WHEN l.owner ~ '^[0-9]+$' THEN l.owner::bigint END
WHERE (l.circuit <> 'closed' OR l.held_until > now())
  AND (%(workflows)s::text[] IS NULL OR w.key = ANY(%(workflows)s::text[]))
ORDER BY w.key NULLS FIRST, l.owner, l.key
"""
# The owner of a workflow's limits: its id, as outbound_limits.owner spells it.
WORKFLOW_OWNER = "SELECT id::text FROM workflows WHERE key = %(workflow)s"
# An operator closes a circuit and ends a hold (they know the host is back): the steps
# waiting for either wake now.
CLEAR = """
WITH cleared AS (
    UPDATE outbound_limits
    SET circuit = 'closed', failures = 0, first_failure_at = NULL, opened_until = NULL,
        probe = NULL, held_until = NULL, held_reason = NULL, updated_at = now()
    WHERE owner = %(owner)s AND key = %(key)s
      AND (circuit <> 'closed' OR held_until > now())
    RETURNING owner, key
), woken AS (
    UPDATE limit_waits SET wake_at = now()
    WHERE (owner, key) IN (SELECT owner, key FROM cleared)
      AND reason IN ('circuit', 'held') AND NOT woken
)
SELECT key FROM cleared
"""
# A 429/503 with Retry-After holds the key for every execution through it, never
# shortening a hold; the caller has already capped `seconds` (hold()).
HOLD = """
INSERT INTO outbound_limits AS l (owner, key, held_until, held_reason)
VALUES (%(owner)s, %(key)s, now() + make_interval(secs => %(seconds)s), %(reason)s)
ON CONFLICT (owner, key) DO UPDATE
SET held_until = greatest(l.held_until, EXCLUDED.held_until),
    held_reason = CASE WHEN l.held_until IS NULL OR l.held_until < EXCLUDED.held_until
                       THEN EXCLUDED.held_reason ELSE l.held_reason END,
    updated_at = now()
RETURNING held_until
"""
# A dated Retry-After whose response carried no usable Date: its seconds from now by the
# database's clock, never the worker's (docs/contract.md, "Outbound limits").
SECONDS_UNTIL = "SELECT greatest(0, extract(epoch FROM %(at)s - now()))::float8"
# A reserved place is woken by the worker that recorded it, in-process, at its place
# (worker/places.py); the timer scanner wakes it only once it is this much overdue — its
# worker died or stopped, or the local claim failed. Longer than a local claim takes on a
# loaded machine (p99 under 2 s at load average 15), so the two rarely both wake a step
# (a duplicate is harmless anyway: the claim decides).
LOCAL_GRACE_S = 3.0
# For the timer scanner: the due waits' wake-ups (for steps still ready), in the same
# statement as their rows are marked woken (the relay is notified after the commit). A
# woken row keeps a rate wait's place until its step is admitted; rows whose step went
# away are dropped after a while.
WAKE_LIMITED = """
WITH due AS (
    UPDATE limit_waits w SET woken = true
    WHERE (w.execution_id, w.step_id) IN (
        SELECT execution_id, step_id FROM limit_waits
        WHERE NOT woken AND wake_at <= now()
          AND (NOT reserved OR wake_at <= now() - make_interval(secs => %(grace_s)s))
        ORDER BY wake_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING w.execution_id, w.step_id
), wakeups AS (
    {insert_wakeups}
    SELECT d.execution_id, d.step_id FROM due d
    JOIN steps s ON s.execution_id = d.execution_id AND s.step_id = d.step_id
    WHERE s.status = 'ready'
), forgotten AS (
    DELETE FROM limit_waits WHERE woken AND wake_at < now() - interval '10 minutes'
), ended AS (
    DELETE FROM outbound_slots WHERE until < now() - interval '10 minutes'
)
SELECT count(*) FROM due
"""
# When the scanner's next pass is due for a wait: reserved places are their workers' own
# (the fallback for them is found by the pass every MAX_SLEEP); limit_waits_unreserved.
NEXT_LIMITED = """
SELECT extract(epoch FROM min(wake_at)) - extract(epoch FROM now())
FROM limit_waits WHERE NOT woken AND NOT reserved
"""
# What an execution's steps wait for, for the API, the CLI and the console.
WAITING_ON_LIMITS = """
SELECT w.step_id, w.owner, w.key, w.reason, w.wake_at, w.since, l.held_until, l.held_reason
FROM limit_waits w
JOIN steps s ON s.execution_id = w.execution_id AND s.step_id = w.step_id AND s.status = 'ready'
LEFT JOIN outbound_limits l ON l.owner = w.owner AND l.key = w.key
WHERE w.execution_id = %(execution_id)s
ORDER BY w.step_id
"""


# Owners no workflow id spells (outbound_limits.owner): the operator's per-host limits and
# the limits the operator shares between named workflows.
HOST = "host"
SHARED = "shared"


@dataclass(frozen=True, order=True)
class LimitKey:
    """Whose limit and which (docs/reference/security.md, "Who owns a limit"): the owner is
    a workflow's id, HOST or SHARED, a column no template reaches; a sender's data only
    ever chooses the name within its workflow's own."""

    owner: str
    name: str

    @property
    def label(self) -> str:
        """How the history, the API, the CLI and the console show it: a workflow's own
        limit by its name, the operator's as host:NAME or shared:NAME."""
        return f"{self.owner}:{self.name}" if self.owner in (HOST, SHARED) else self.name

    def params(self) -> dict[str, str]:
        """The statements' parameters for this key."""
        return {"owner": self.owner, "key": self.name}


@dataclass(frozen=True)
class Wait:
    """Why a step may not leave yet, and until when."""

    key: LimitKey
    reason: LimitReason
    until: datetime
    reserved: bool = False
    # Seconds from the admission's clock reading to `until`: when to wake the scanner.
    in_s: float = 0.0
    # Whether it differs from the step's previous wait: then it goes in the history.
    new: bool = True


def admit(
    conn: psycopg.Connection,
    execution_id: str,
    step_id: str,
    limits: Sequence[tuple[LimitKey, LimitSpec]],
    hold_s: float,
) -> Wait | None:
    """Admit the step's request through every one of its limits, or say why it waits.

    Runs in the claim's transaction; an admitted request holds a slot of each key with a
    concurrency until the checkpoint releases it (or `hold_s` passes)."""
    ids = {"execution_id": execution_id, "step_id": step_id}
    me = f"{execution_id}/{step_id}"
    probes: list[LimitKey] = []  # keys of open circuits whose cool-down ended
    mine = conn.execute(MY_WAIT, ids).fetchone()
    reserved_until: datetime | None = mine[3] if mine is not None and mine[4] else None
    # Sorted, so that two steps with the same keys never lock them in opposite orders.
    ordered = sorted(dict(limits).items())
    states = {}
    for key, spec in ordered:
        row = one(conn.execute(LOCK_KEY, key.params()))
        tat, sent_tat, held_until, circuit, opened_until, probe, now = row
        in_flight = 0
        if spec.concurrency is not None:
            in_flight = one(conn.execute(IN_FLIGHT, key.params()))[0]
        states[key] = (spec, tat, sent_tat)
        if held_until is not None and held_until > now:
            return _wait(conn, ids, mine, Wait(key, LimitReason.HELD, held_until), now)
        if spec.circuit is not None and circuit != CircuitState.CLOSED:
            if opened_until is not None and opened_until > now and probe != me:
                # Open until its cool-down ends; or half-open with another step's probe
                # out, whose success wakes the waiters (a poll behind it, in case).
                until = opened_until
                if circuit == CircuitState.HALF_OPEN:
                    until = min(until, now + timedelta(seconds=CONCURRENCY_POLL_S))
                return _wait(conn, ids, mine, Wait(key, LimitReason.CIRCUIT, until), now)
            probes.append(key)
        if spec.concurrency is not None and in_flight >= spec.concurrency:
            until = now + timedelta(seconds=CONCURRENCY_POLL_S)
            return _wait(conn, ids, mine, Wait(key, LimitReason.CONCURRENCY, until), now)
    soon = now + timedelta(seconds=NOW_S)
    if mine is not None and reserved_until is not None and reserved_until > soon:
        # Woken early (a duplicate or the reconciler's wake-up): the place stands.
        place = Wait(LimitKey(mine[0], mine[1]), LimitReason.RATE, reserved_until, True)
        return _wait(conn, ids, mine, place, now)
    latest: Wait | None = None
    for key, (spec, tat, sent_tat) in states.items():
        if spec.rate_per_s is None:
            continue
        interval = timedelta(seconds=1 / spec.rate_per_s)
        tau = (spec.burst - 1) * interval
        if reserved_until is None:
            # A place in the key's schedule, kept by this step even while it waits.
            place = max(now, tat - tau)
            conn.execute(MOVE_TAT, {**key.params(), "tat": max(tat, now) + interval})
        else:
            place = now
        # The schedule spreads the waiting steps' wake-ups; what actually leaves is held
        # to the rate too: steps woken late (a slow scanner, broker or database) would
        # otherwise leave together, faster than the rate.
        leaves = sent_tat - max(tau, timedelta(seconds=DEPARTURE_JITTER_S))
        if leaves > place and leaves > soon:
            # Held back: the steps held back together wake spread over HELD_SPREAD
            # instants 1/rate apart, not all at the one instant the check allows next.
            leaves += (zlib.crc32(me.encode()) % HELD_SPREAD) * interval
        place = max(place, leaves)
        if place > soon and (latest is None or place > latest.until):
            latest = Wait(key, LimitReason.RATE, place, reserved=True)
    if latest is not None:
        return _wait(conn, ids, mine, latest, now)
    _let_through(conn, ids, mine, states, probes, hold_s, now)
    return None


def _let_through(
    conn: psycopg.Connection,
    ids: Mapping[str, str],
    mine: Any,
    states: Mapping[LimitKey, tuple[LimitSpec, datetime, datetime]],
    probes: Sequence[LimitKey],
    hold_s: float,
    now: datetime,
) -> None:
    """Record an admitted request on every key it passed: the probe of each circuit
    whose cool-down ended, its departure on each rate, its slot of each concurrency."""
    me = f"{ids['execution_id']}/{ids['step_id']}"
    for key in probes:
        # The one probe of a circuit whose cool-down ended: half-open until its result,
        # or until its attempt could have ended (then another probe may go).
        conn.execute(PROBE, {**key.params(), "probe": me, "until_s": hold_s + SLOT_MARGIN_S})
    for key, (spec, _tat, sent_tat) in states.items():
        if spec.rate_per_s is not None:
            leaves = max(sent_tat, now) + timedelta(seconds=1 / spec.rate_per_s)
            conn.execute(SENT, {**key.params(), "sent_tat": leaves})
    for key, (spec, _tat, _now) in states.items():
        if spec.concurrency is not None:
            conn.execute(TAKE_SLOT, {**ids, **key.params(), "hold_s": hold_s + SLOT_MARGIN_S})
    if mine is not None:
        conn.execute(ADMITTED, ids)


def _wait(
    conn: psycopg.Connection, ids: Mapping[str, str], mine: Any, wait: Wait, now: datetime
) -> Wait:
    """Record the wait (its wake-up comes from the timer scanner)."""
    new = mine is None or tuple(mine[:3]) != (wait.key.owner, wait.key.name, wait.reason.value)
    in_s = (wait.until - now).total_seconds()
    conn.execute(
        WAIT,
        {
            **ids,
            **wait.key.params(),
            "reason": wait.reason.value,
            "wake_at": wait.until,
            "reserved": wait.reserved,
        },
    )
    return dataclasses.replace(wait, new=new, in_s=in_s)


def release(conn: psycopg.Connection, execution_id: str, step_id: str) -> None:
    """End the step's slots (at its checkpoint) and wake the next step waiting for one."""
    conn.execute(RELEASE, {"execution_id": execution_id, "step_id": step_id})


def failed_for_circuit(http_status: int | None, kind: str, error: str | None) -> bool:
    """Whether a request's outcome counts against its circuits: a 5xx, or no answer at all
    (no connection, no response). Not a request kept home by its own worker (a lease not
    confirmed in time, an internal error) or refused by the address guard."""
    if http_status is not None:
        return http_status >= 500
    text = error or ""
    mine = text.startswith(
        ("not sent: lease", "not sent: internal", "may have been sent: internal")
    )
    return kind in ("retry", "unknown") and not mine


def record_result(
    conn: psycopg.Connection, circuits: Sequence[tuple[LimitKey, Circuit]], failed: bool
) -> None:
    """Count a request's result in the circuits of its keys (at its checkpoint)."""
    for key, circuit in circuits:
        if failed:
            params = {
                **key.params(),
                "failures": circuit.failures,
                "window_s": circuit.window_s,
                "cool_down_s": circuit.cool_down_s,
            }
            conn.execute(CIRCUIT_FAILED, params)
        else:
            conn.execute(CIRCUIT_SUCCEEDED, key.params())


def open_or_held(
    conn: psycopg.Connection, workflows: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Every limit whose circuit is open or half-open or that a Retry-After holds, for
    the API, the CLI and the console; `workflows`: only those workflows' own limits (a
    scoped API key's view)."""
    scope = list(workflows) if workflows is not None else None
    rows = conn.execute(OPEN_OR_HELD, {"workflows": scope}).fetchall()
    return [
        {
            "key": LimitKey(owner, key).label,
            "workflow": workflow,
            "state": state,
            "failures": failures,
            "until": until.isoformat() if until else None,
            "probe": probe,
            "since": since.isoformat(),
            "held_until": held_until.isoformat() if held_until else None,
            "held_reason": held_reason,
        }
        for (
            owner,
            workflow,
            key,
            state,
            failures,
            until,
            probe,
            since,
            held_until,
            held_reason,
        ) in rows
    ]


def find_key(conn: psycopg.Connection, key: str, workflow: str | None) -> LimitKey | None:
    """The limit an operator names: a workflow's own limit by its name and the workflow,
    the operator's as host:NAME or shared:NAME. None: no such workflow or spelling (a NUL
    is neither: it is no text PostgreSQL can store)."""
    if "\x00" in key or (workflow is not None and "\x00" in workflow):
        return None
    if workflow is not None:
        row = conn.execute(WORKFLOW_OWNER, {"workflow": workflow}).fetchone()
        return LimitKey(row[0], key) if row is not None else None
    owner, colon, name = key.partition(":")
    if colon and owner in (HOST, SHARED) and name:
        return LimitKey(owner, name)
    return None


def clear(conn: psycopg.Connection, key: LimitKey) -> bool:
    """Close a limit's circuit and end its hold by hand (an operator knows the host is
    back): the steps waiting for either wake now. False if neither was in force."""
    return conn.execute(CLEAR, key.params()).fetchone() is not None


def hold(
    conn: psycopg.Connection, key: LimitKey, seconds: float, reason: str, max_hold_s: float
) -> datetime | None:
    """Hold `key` for every execution through it for `seconds` (a 429/503's Retry-After),
    at most `max_hold_s` (docs/contract.md, "Outbound limits"); None: the limit takes no
    holds."""
    seconds = min(seconds, max_hold_s, MAX_HOLD_S)
    if seconds <= 0:
        return None
    (until,) = one(conn.execute(HOLD, {**key.params(), "seconds": seconds, "reason": reason}))
    return until


def seconds_until(conn: psycopg.Connection, at: datetime) -> float:
    """Seconds from the database's now to `at` (0 if past): a dated Retry-After that came
    without a usable Date header."""
    return float(one(conn.execute(SECONDS_UNTIL, {"at": at}))[0])


def waiting_on_limits(conn: psycopg.Connection, execution_id: str) -> list[dict[str, Any]]:
    """What each of an execution's ready steps waits for: key, reason, until when, since."""
    rows = conn.execute(WAITING_ON_LIMITS, {"execution_id": execution_id}).fetchall()
    return [
        {
            "step": step_id,
            "key": LimitKey(owner, key).label,
            "reason": reason,
            "until": wake_at.isoformat(),
            "since": since.isoformat(),
            "held_until": held_until.isoformat() if held_until else None,
            "held_reason": held_reason,
        }
        for step_id, owner, key, reason, wake_at, since, held_until, held_reason in rows
    ]
