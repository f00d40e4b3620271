"""The checker: after the quiet period it reads the target's log, the history and the
database, and lists every broken promise of docs/contract.md#delivery with enough detail to debug
it.

Categories (each violation names one):
- duplicate_unsafe_request: a POST without Idempotency-Key reached the target twice where
  no operator asked for it. The operator log splits each step's timeline: a retry
  accepted while the step was `failed` or `unknown` allows one more send from the moment
  the operator looked (a retry while it was `cancelled` or `succeeded` allows none); a
  resolve allows none until the next such retry. So a send by a worker that lost its
  lease after the step was settled counts too, even when the total looks right;
- stale_send: a request reached the target after the attempt it belonged to had ended
  (its lease recovered by a reaper, or its result written): a worker sent it without
  owning the step any more — nothing fenced the request itself. Not one when the
  attempt's worker was frozen (SIGSTOP) after the attempt began and the request arrived
  the moment it ran again: the freeze landed between the fence, which found the lease
  its own, and the first byte — a gap no check inside a process can close (only the
  receiver could, by checking the token). Those are counted (`sent_after_freeze`), and
  the attempt says `unknown` or a repeat-safe step was retried, as docs/contract.md#safe-to-repeat
  allows. A missing fence still shows: the nemesis's slow senders stall with no freeze at all;
- step_succeeded_twice: two attempts of one step with outcome succeeded;
- success_without_request: a succeeded HTTP attempt the target never saw;
- keyed_request_changed_key: one step's retries carried different Idempotency-Keys;
- webhook_executions: an accepted webhook without exactly one execution, replays that
  named different executions, executions nobody was told about, deliveries never accepted
  (the run's sender is patient, as real ones are: workload.patient retries for 40 s with
  backoff, so only an intake down longer than that leaves one);
- not_settled: an execution neither terminal nor needs_attention at the end (a parent
  `waiting` on a child in needs_attention waits for an operator too:
  docs/contract.md#child-workflows);
- unknown_not_visible: a step in `unknown` whose execution GET ?status=needs_attention
  does not list;
- running_without_owner: a step still `running` whose owner is gone, whose lease has
  expired, or whose attempt has been in flight longer than any request can take;
- worker_not_recovered: a worker that was not consuming again soon after the faults healed;
- drain_stuck: a worker that did not finish its SIGTERM drain in time at the very end;
- map_output: a succeeded map step (docs/contract.md#map) whose items' POSTs did not each succeed
  exactly once, or whose output is not the items in input order with the answer the
  target gave each (or the operator's resolve);
- map_parallel_exceeded: more items of one execution's map in flight at the target than
  its max_parallel;
- child_round / child_output / child_left_running / child_post_twice: child workflows
  (docs/contract.md#child-workflows) — a round of a parent's workflow step (its fencing token) that
  started no child or two, or a child not of its parent's key `child:<parent>:<step>:<round>`; a
  succeeded step whose output is not its round's child's output (the child's last step,
  holding an answer the target gave the child, or the operator's resolve); a child still
  live (not terminal, no cancel requested) under a cancelled or failed parent or after a
  later round replaced it; a child whose one unsafe POST was sent twice unasked;
- group_event / group_input / group_not_started: debounce and batch
  (docs/contract.md#debounce-batch) — an accepted event recorded in no group, in two, or in another
  than its 202 named; a group whose execution's input is not its events (debounce: the last one plus
  `debounced`; batch: every one, in order, at most max_items); an event in two batches; a group
  never started;
- frozen_lock_uncovered / frozen_lock_outlived_timeout / frozen_execution_late: a worker
  frozen at an arbitrary moment for longer than the database timeout (nemesis
  freeze_anywhere; docs/contract.md#frozen-processes) had a session holding a lock `active` waiting
  for it or `idle` (no server timeout covers either), still held a lock after the timeout,
  or its own executions were not stopped within the bound after their cancel;
- api_5xx / api_no_answer: an API answer of 500 or more, or none at all (the API processes
  are never faulted). One exception: while the nemesis runs, a 503 service-unavailable
  problem is the honest answer of an API whose database did not answer in time — a row
  it needs is locked by a worker whose link is blackholed — and is allowed; after the
  quiet period began, any 5xx is a violation;
- event_* / attribute_mismatch / failure_group_*: keyed events, search attributes and
  failure groups, checked by tests/soak/promises.py (its docstring lists them).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.soak.cluster import Cluster
from tests.soak.features import (
    CALL,
    CHILD,
    CHILD_POST,
    GROUPED,
    LIMITED,
    MAP_PARALLEL,
    MAP_POST,
    MAP_STEP,
    METERED,
    PARENT,
    PARTNER,
    Features,
    ancestors,
)
from tests.soak.history import Fault, History, OperatorAction, RecordingClient
from tests.soak.keyed_events import EventSender
from tests.soak.promises import Promises
from tests.soak.servers import Servers
from tests.soak.workload import HANG_S, REQUEST_TIMEOUT_S, TargetPath, Workload
from tests.support.target import Received, Reply, Target

SETTLED = ("succeeded", "failed", "cancelled", "needs_attention")
TERMINAL = ("succeeded", "failed", "cancelled")
MAP_WORKFLOW = "mapped"
# About how long the run's old sender kept trying (5 answers, 0.3 s apart): a figure.
OLD_BUDGET_S = 2.0
RESEND_ASKED = ("failed", "unknown")
# Lines printed per category; the rest are counted (history.jsonl has them all).
SHOWN = 25
# A request held back by a freeze leaves as soon as its worker runs again: it arrives
# within this long after the SIGCONT (a loaded machine included) or it is no such case.
SENT_AFTER_RESUME_S = 1.0
# Clock slack between the history's records and the moments they stand for: a SIGSTOP
# lands just after its record, a SIGCONT just before its own.
RECORD_SLACK_S = 0.05
# Between two clocks of this host (the database's now(), time.time() of the harness) and
# the moments they stand for (a 202 is received a little after its commit).
CLOCK_SLACK_S = 0.05
# Rate at the target: requests arrive up to this much later than their admission (a
# restarted slow sender stalls up to 1.8 s between claim and send; a loaded machine).
RATE_SLACK_S = 2.0
# Recovery bound (issue 23 item 1), in seconds during which the servers were up and some
# other worker could work: a lease (2 s) to run out, a reaper pass (every lease), the
# recovery's own transactions, on a 2-core machine shared with 7 other sessions. The
# fault test (test_frozen_lock_holder) holds 12 s on a quieter run; the old behaviour
# (never, while a worker stayed frozen) is unbounded.
RECOVERY_BOUND_S = 20.0
# The workers' own line once their services run (flowforge/worker/supervisor.py): from
# then on a restarted worker can recover others' steps (its log says when, exactly).
STARTED_LINE = '"msg": "worker started"'
# The workers restarted at the quiet period need this long to start consuming; a server
# this long to be reconnected to by every pool after it is back.
RESTART_S = 6.0
RECONNECT_S = 6.0
# A freeze with at least this much time in which others could work must see progress.
FROZEN_PROGRESS_S = 8.0

STEPS = """
SELECT s.execution_id::text AS execution_id, s.step_id, s.type, s.status, s.fencing_token,
       s.lease_owner, s.lease_expires_at, s.lease_expires_at < now() AS lease_expired,
       e.status AS execution_status, w.key AS workflow
FROM steps s JOIN executions e ON e.id = s.execution_id JOIN workflows w ON w.id = e.workflow_id
"""
ATTEMPTS = """
SELECT execution_id::text AS execution_id, step_id, attempt, fencing_token, worker, outcome,
       error, http_status, extract(epoch FROM now() - started_at) AS age_s,
       extract(epoch FROM started_at)::float AS started,
       extract(epoch FROM finished_at)::float AS finished
FROM attempts ORDER BY id
"""
# Seconds from recovering a lost lease to the next attempt of the step: how long a takeover
# took once the reaper saw the lease run out (a figure, not a verdict; back-off included).
TAKEOVERS = """
SELECT a.execution_id::text AS execution_id,
       extract(epoch FROM n.started_at - a.finished_at)::float AS s
FROM attempts a
JOIN LATERAL (SELECT started_at FROM attempts n
              WHERE n.execution_id = a.execution_id AND n.step_id = a.step_id AND n.id > a.id
              ORDER BY n.id LIMIT 1) n ON true
WHERE a.outcome = 'lost_lease'
ORDER BY s
"""
# An execution paused because a step's retries ran out under `on_exhausted: pause`
# (docs/contract.md#pause) waits for an operator to resume or fail it, as one in needs_attention
# does; the nemesis resumes those it finds when the quiet period begins, and one whose retries run
# out after that is left to the operator. A parent `waiting` on a child that waits for an
# operator (docs/contract.md#child-workflows) waits for one too: it is as settled as its child (the
# newest of its step's children).
EXHAUSTED = "{e}.status = 'paused' AND {e}.pause_reason = 'exhausted'"
WAITS_ON_OPERATOR = f"""
({EXHAUSTED.format(e="e")}) OR (e.status = 'waiting' AND EXISTS (
    SELECT 1 FROM executions c
    WHERE c.parent_id = e.id
      AND (c.status = 'needs_attention' OR ({EXHAUSTED.format(e="c")}))
      AND NOT EXISTS (SELECT 1 FROM executions n
                      WHERE n.parent_id = e.id AND n.parent_step = c.parent_step
                        AND n.created_at > c.created_at)))
"""
EXECUTIONS = f"""
SELECT e.id::text AS id, e.idempotency_key, e.status, e.input::text AS input, w.key AS workflow,
       e.input ->> 'k' AS k, e.replay_of::text AS replay_of, e.replay_from,
       extract(epoch FROM e.created_at)::float AS created,
       extract(epoch FROM e.finished_at)::float AS finished,
       e.parent_id::text AS parent_id, e.parent_step,
       e.cancel_requested_at IS NOT NULL AS cancel_requested, e.priority,
       ({WAITS_ON_OPERATOR}) AS waits_on_operator
FROM executions e JOIN workflows w ON w.id = e.workflow_id
"""
TICKS = """
SELECT w.key AS workflow, t.outcome, count(*) AS n, count(DISTINCT t.tick_at) AS instants
FROM schedule_ticks t JOIN workflows w ON w.id = t.workflow_id GROUP BY 1, 2 ORDER BY 1, 2
"""
# The map step's row and the step after it, with their outputs (docs/contract.md#map).
MAP_ROWS = """
SELECT s.execution_id::text AS execution_id, s.step_id, s.status, s.output::text AS output
FROM steps s JOIN executions e ON e.id = s.execution_id JOIN workflows w ON w.id = e.workflow_id
WHERE w.key = %(workflow)s AND s.step_id = ANY(%(steps)s)
"""
# The steps of the child workflow's parents and children (docs/contract.md#child-workflows), with
# their outputs.
CHILD_STEPS = """
SELECT s.execution_id::text AS execution_id, s.step_id, s.status, s.fencing_token,
       s.output::text AS output
FROM steps s JOIN executions e ON e.id = s.execution_id JOIN workflows w ON w.id = e.workflow_id
WHERE w.key = ANY(%(workflows)s)
"""
# Debounce and batch (docs/contract.md#debounce-batch): every group, and every event recorded in
# one.
GROUPS = """
SELECT g.id, w.key AS workflow, g.kind, g.group_key, g.status, g.execution_id::text AS execution_id,
       g.events, g.reason
FROM intake_groups g JOIN workflows w ON w.id = g.workflow_id ORDER BY g.id
"""
GROUP_EVENTS = """
SELECT id, group_id, idempotency_key, body::text AS body,
       extract(epoch FROM received_at)::float AS received
FROM intake_group_events ORDER BY id
"""
# Every change of an outbound circuit, logged by a trigger the run installs (CIRCUIT_LOG).
CIRCUITS = """
SELECT key, circuit, extract(epoch FROM at)::float AS at FROM soak_circuit_log ORDER BY id
"""
# When each attempt row was written (CLAIM_LOG): the instant of its admission.
CLAIMS = """
SELECT execution_id, step_id, attempt, extract(epoch FROM at)::float AS at FROM soak_claim_log
"""
# Installed by the run on its own database: an exact record of every circuit change, in
# commit order of the row lock (each change holds the key's row lock until it commits);
# and of the instant each attempt row was written. A claim writes its attempt while it
# holds the row lock of each of its keys, so that instant orders it exactly among the
# circuit's changes. The attempt's own started_at does not: it is the claim
# transaction's now(), when it began — before it waited for the execution's lock, the
# key's, or a frozen worker — and a claim admitted after a probe closed the circuit could
# carry a started_at from while it was still open (seed 2323).
CIRCUIT_LOG = """
CREATE TABLE soak_circuit_log (id bigserial PRIMARY KEY, key text, circuit text,
                               at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION soak_circuit_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' OR NEW.circuit IS DISTINCT FROM OLD.circuit THEN
    INSERT INTO soak_circuit_log (key, circuit) VALUES (NEW.key, NEW.circuit);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER soak_circuit_log AFTER INSERT OR UPDATE ON outbound_limits
FOR EACH ROW EXECUTE FUNCTION soak_circuit_log();
CREATE TABLE soak_claim_log (execution_id text, step_id text, attempt int,
                             at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION soak_claim_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO soak_claim_log (execution_id, step_id, attempt)
  VALUES (NEW.execution_id::text, NEW.step_id, NEW.attempt);
  RETURN NEW;
END $$;
CREATE TRIGGER soak_claim_log AFTER INSERT ON attempts
FOR EACH ROW EXECUTE FUNCTION soak_claim_log();
"""
# Sessions whose transaction has been open a while: who holds the locks everyone waits on.
LONG_TRANSACTIONS = """
SELECT pid, client_port, state, wait_event_type, wait_event,
       round(extract(epoch FROM now() - xact_start)) AS xact_s, left(query, 120) AS query
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND xact_start < now() - interval '10 seconds'
ORDER BY xact_start
"""
# Unsettled executions plus running steps; and the steps that ended, whose growth is
# progress too: a map of hundreds of items drains one item at a time (its item rows made
# as they start), and counted as one execution with two running steps it showed no new
# low for minutes (seed 3913: 240 items, still going at ~1.3 items/s when the wait gave up).
UNSETTLED = f"""
SELECT (SELECT count(*) FROM executions e
        WHERE status <> ALL(%(settled)s) AND NOT ({WAITS_ON_OPERATOR}))
     + (SELECT count(*) FROM steps WHERE status = 'running'),
       (SELECT count(*) FROM steps WHERE status NOT IN ('pending', 'ready', 'running', 'waiting'))
"""


@dataclass(frozen=True)
class Violation:
    category: str
    detail: str


@dataclass(frozen=True)
class Settling:
    """How the quiet wait went: seconds until everything settled (None: it did not),
    how much was unsettled when it began, and what was left when it ended."""

    seconds: float | None
    backlog: int
    left: int


def settle(database_url: str, stall_s: float, cap_s: float) -> Settling:
    """Wait until every execution is settled and no step runs.

    A backlog drains at whatever pace the machine allows, so the wait goes on for as long
    as the count of unsettled work keeps reaching new lows or steps keep ending; it gives
    up once `stall_s` passed without either (something is stuck: a stall bound above the reconcile
    interval lets the reconciler catch a lost wake-up first) or after `cap_s` in all.
    """
    started = time.monotonic()
    backlog: int | None = None
    lowest, lowest_at, ended = 0, started, 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            row = conn.execute(UNSETTLED, {"settled": list(SETTLED)}).fetchone()
            unsettled, now_ended = (int(row[0]), int(row[1])) if row is not None else (0, 0)
            now = time.monotonic()
            if backlog is None:
                backlog, lowest, ended = unsettled, unsettled, now_ended
            if unsettled == 0:
                return Settling(round(now - started, 1), backlog, 0)
            if unsettled < lowest or now_ended > ended:
                lowest, lowest_at, ended = min(lowest, unsettled), now, now_ended
            if now - lowest_at > stall_s or now - started > cap_s:
                return Settling(None, backlog, unsettled)
            time.sleep(0.5)


@dataclass(frozen=True)
class Freeze:
    """One SIGSTOP of one worker, on the wall clock: recorded before the signal was sent,
    and the SIGCONT that ended it (the nemesis's own, or the heal's at the quiet period)."""

    worker: str
    stopped: float
    resumed: float


def freezes(faults: Iterable[Fault], wall_started: float) -> list[Freeze]:
    """The freezes the nemesis caused; one never resumed (its worker was killed) is left
    out, as a killed worker sends nothing."""
    faults = list(faults)
    quiet = min((f.at for f in faults if f.op == "quiet"), default=None)
    found = []
    for i, fault in enumerate(faults):
        if fault.op != "pause":
            continue
        later = (f for f in faults[i + 1 :] if f.target == fault.target and f.op == "resume")
        resumed = next((f.at for f in later), quiet)
        if resumed is not None:
            found.append(Freeze(fault.target, wall_started + fault.at, wall_started + resumed))
    return found


def sent_after_freeze(
    worker: str, attempt_started: float, arrived: float, frozen: Iterable[Freeze]
) -> bool:
    """Whether a request that arrived after its attempt ended was held back by a freeze of
    its own worker: one that began after the attempt's claim (so the fence, which would
    refuse after any long freeze, had already passed) and ended just before it arrived."""
    return any(
        f.worker == worker
        and f.stopped >= attempt_started - RECORD_SLACK_S
        and f.resumed - RECORD_SLACK_S <= arrived <= f.resumed + SENT_AFTER_RESUME_S
        for f in frozen
    )


def unasked_sends(
    actions: list[OperatorAction], execution_id: str, step_id: str, sends: list[float]
) -> list[float]:
    """The sends of one unsafe step (wall-clock times, sorted) beyond what the operator
    asked for. Before any operator action one send is allowed; a retry accepted while the
    step was failed or unknown allows one more from the moment the operator looked; a
    resolve allows none until the next such retry."""

    def opens(a: OperatorAction) -> bool:
        if a.execution_id != execution_id:
            return False
        if a.action == "retry":
            return a.status == 202 and a.steps_before.get(step_id) in RESEND_ASKED
        return a.action == "resolve" and a.status == 200 and a.step_id == step_id

    # (from when, sends allowed from then on)
    boundaries = sorted((a.wall, 1 if a.action == "retry" else 0) for a in actions if opens(a))
    allowed, used, extra = 1, 0, []
    for sent in sends:
        while boundaries and boundaries[0][0] <= sent:
            allowed, used = boundaries.pop(0)[1], 0
        used += 1
        if used > allowed:
            extra.append(sent)
    return extra


class Checker:
    """Reads everything once, then runs each check over what it read."""

    def __init__(
        self,
        cluster: Cluster,
        client: RecordingClient,
        history: History,
        workload: Workload,
        target: Target,
        features: Features | None = None,
        replies: dict[int, Reply] | None = None,
        servers: Servers | None = None,
        published: dict[str, dict[str, Any]] | None = None,
        events: EventSender | None = None,
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.history = history
        self.workload = workload
        self.target = target
        self.features = features
        self.replies = replies or {}
        self.servers = servers
        self.published = published or {}
        self.events = events
        self.promises: Promises | None = None
        self.figures_extra: dict[str, Any] = {}
        self.violations: list[Violation] = []
        self.sent_after_freeze = 0
        self.held_back: set[int] = set()  # id() of the requests counted in sent_after_freeze
        # The target's log first, then the database: a claim commits its attempt row
        # before the request leaves, so every request read here has its attempt in what
        # is read next. The other order, while something still runs, pairs a new request
        # with an older attempt of its step and reports a stale send that never was.
        requests = [(TargetPath.parse(r.path), r) for r in list(self.target.received)]
        with psycopg.connect(cluster.database_url, autocommit=True, row_factory=dict_row) as conn:
            self.steps = conn.execute(STEPS).fetchall()
            self.attempts = conn.execute(ATTEMPTS).fetchall()
            self.executions = conn.execute(EXECUTIONS).fetchall()
            self.sessions = conn.execute(LONG_TRANSACTIONS).fetchall()
            takeovers = conn.execute(TAKEOVERS).fetchall()
            self.ticks = conn.execute(TICKS).fetchall()
            self.map_rows = conn.execute(
                MAP_ROWS, {"workflow": MAP_WORKFLOW, "steps": [MAP_STEP, "total"]}
            ).fetchall()
            self.child_rows = conn.execute(CHILD_STEPS, {"workflows": [PARENT, CHILD]}).fetchall()
            self.groups = conn.execute(GROUPS).fetchall()
            self.group_events = conn.execute(GROUP_EVENTS).fetchall()
            try:
                self.circuits = conn.execute(CIRCUITS).fetchall()
                claims = conn.execute(CLAIMS).fetchall()
            except psycopg.errors.UndefinedTable:
                self.circuits, claims = [], []
        self.claimed_at = {(c["execution_id"], c["step_id"], c["attempt"]): c["at"] for c in claims}
        # Retention deletes finished `brief` executions (features.py): their requests are
        # counted, not judged (nothing of them is left to compare with).
        stored = {e["id"] for e in self.executions}
        self.requests = [
            (where, r)
            for where, r in requests
            if where is None or where.workflow != "brief" or where.execution_id in stored
        ]
        self.retained_requests = len(requests) - len(self.requests)
        # An operator's cancel and later retry is no takeover: leave those executions out.
        touched = {a.execution_id for a in history.actions}
        self.metered_executions = {e["id"] for e in self.executions if e["workflow"] == "metered"}
        self.takeovers = [float(t["s"]) for t in takeovers if t["execution_id"] not in touched]

    def fail(self, category: str, detail: str) -> None:
        self.violations.append(Violation(category, detail))

    def attempts_of(self, execution_id: str, step_id: str) -> str:
        rows = [
            f"#{a['attempt']} token {a['fencing_token']} {a['worker']} "
            f"{a['outcome'] or 'in flight'} {a['http_status'] or ''} {a['error'] or ''}".strip()
            for a in self.attempts
            if a["execution_id"] == execution_id and a["step_id"] == step_id
        ]
        return "; ".join(rows) or "no attempts"

    def operator_on(self, execution_id: str) -> str:
        rows = [
            f"t={a.at} {a.action}{' ' + a.step_id if a.step_id else ''}"
            f"{' ' + a.outcome if a.outcome else ''} -> {a.status} "
            f"(before: {a.steps_before})"
            for a in self.history.actions
            if a.execution_id == execution_id
        ]
        return "; ".join(rows) or "none"

    def when(self, wall: float) -> float:
        return round(wall - self.history.wall_started, 2)

    # ---- the checks ----------------------------------------------------------------

    def check_unsafe_requests(self) -> None:
        """No POST without an Idempotency-Key reached the target unless someone asked."""
        unsafe: dict[tuple[str, str], list[float]] = {}
        for where, req in self.requests:
            if where and req.method == "POST" and "idempotency-key" not in req.headers:
                unsafe.setdefault((where.execution_id, where.step), []).append(req.at)
        for (eid, sid), sends in sorted(unsafe.items()):
            extra = unasked_sends(self.history.actions, eid, sid, sorted(sends))
            if extra:
                self.fail(
                    "duplicate_unsafe_request",
                    f"execution {eid} step {sid}: sent at t={[self.when(t) for t in sorted(sends)]}"
                    f", not asked for at t={[self.when(t) for t in extra]}; attempts: "
                    f"{self.attempts_of(eid, sid)}; operator: {self.operator_on(eid)}",
                )

    def check_keyed_requests(self) -> None:
        """Every try of a keyed request carried the same Idempotency-Key."""
        keys: dict[tuple[str, str], set[str]] = {}
        for where, req in self.requests:
            key = req.headers.get("idempotency-key")
            if where and key is not None:
                keys.setdefault((where.execution_id, where.step), set()).add(key)
        for (eid, sid), seen in sorted(keys.items()):
            if len(seen) > 1:
                self.fail(
                    "keyed_request_changed_key", f"execution {eid} step {sid}: {sorted(seen)}"
                )

    def check_successes(self) -> None:
        """At most one succeeded attempt per step, and the target saw every HTTP one."""
        sent = {(where.execution_id, where.step) for where, _ in self.requests if where}
        succeeded = Counter(
            (a["execution_id"], a["step_id"]) for a in self.attempts if a["outcome"] == "succeeded"
        )
        http_steps = {
            (s["execution_id"], s["step_id"]) for s in self.steps if s["type"] == "http_request"
        }
        for (eid, sid), count in sorted(succeeded.items()):
            if count > 1:
                self.fail(
                    "step_succeeded_twice",
                    f"execution {eid} step {sid}: {count} succeeded attempts: "
                    f"{self.attempts_of(eid, sid)}; operator: {self.operator_on(eid)}",
                )
            if (eid, sid) in http_steps and (eid, sid) not in sent:
                self.fail(
                    "success_without_request",
                    f"execution {eid} step {sid}: {self.attempts_of(eid, sid)}",
                )

    def check_stale_sends(self) -> None:
        """Every request must fall inside its attempt: after the claim that started it
        (attempts.started_at) and before that attempt ended (finished_at, which is written
        only after the response came back, or when a reaper recovered the lease)."""
        by_step: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for a in self.attempts:
            by_step.setdefault((a["execution_id"], a["step_id"]), []).append(a)
        frozen = freezes(self.history.faults, self.history.wall_started)
        for where, req in self.requests:
            if where is None:
                continue
            attempts = by_step.get((where.execution_id, where.step), [])
            current = [a for a in attempts if a["started"] <= req.at]
            if not current:
                problem = "before any attempt of the step had started"
            elif current[-1]["finished"] is not None and current[-1]["finished"] < req.at:
                a = current[-1]
                if sent_after_freeze(a["worker"], a["started"], req.at, frozen):
                    self.sent_after_freeze += 1
                    self.held_back.add(id(req))
                    continue
                problem = (
                    f"{req.at - a['finished']:.2f}s after attempt #{a['attempt']} (token "
                    f"{a['fencing_token']}, {a['worker']}) had ended as {a['outcome']}"
                )
            else:
                continue
            self.fail(
                "stale_send",
                f"{req.method} execution {where.execution_id} step {where.step} arrived at "
                f"t={self.when(req.at)}, {problem}; attempts: "
                f"{self.attempts_of(where.execution_id, where.step)}; "
                f"operator: {self.operator_on(where.execution_id)}",
            )

    def check_webhooks(self) -> None:
        by_key: dict[str, list[str]] = {}
        for e in self.executions:
            by_key.setdefault(e["idempotency_key"], []).append(e["id"])
        for key, delivery in sorted(self.workload.deliveries.items()):
            named = delivery.accepted
            if not named:
                self.fail(
                    "webhook_executions", f"{key}: never accepted, answers {delivery.answers}"
                )
                continue
            if len(named) > 1:
                self.fail("webhook_executions", f"{key}: 202s named {sorted(named)}")
            if sorted(by_key.get(key, [])) != sorted(named):
                self.fail(
                    "webhook_executions",
                    f"{key}: answered {sorted(named)}, database has {by_key.get(key, [])}",
                )
        sent = set(self.workload.deliveries) | set(self.features.sent if self.features else ())
        for key in sorted(k for k in set(by_key) - sent if k and k.startswith("soak-")):
            self.fail("webhook_executions", f"execution {by_key[key]} for unsent key {key!r}")
        if self.features is not None:
            self.check_feature_webhooks(by_key)
            self.check_source_routing()

    def check_source_routing(self) -> None:
        """Every 202 of one source delivery names the same executions, whatever event
        header each try carried: the identity is per source and delivery."""
        assert self.features is not None
        for delivery, source in sorted(self.features.sources.items()):
            routings = {tuple(sorted(ids)) for status, ids in source.answers if status == 202}
            if len(routings) > 1:
                self.fail("source_routing", f"{delivery} ({source.event}): 202s named {routings}")

    def check_feature_webhooks(self, by_key: dict[str, list[str]]) -> None:
        """Each feature webhook: one execution per key when answered 202, none when
        refused 429 (max_queued) and never answered 202."""
        assert self.features is not None
        for key, (workflow, _, attempts) in sorted(self.features.sent.items()):
            named = {t.execution_id for t in attempts if t.status == 202 and t.execution_id}
            # A grouped event's key is its group event's, not an execution's: check_groups.
            stored = sorted(by_key.get(key, [])) if workflow not in GROUPED else sorted(named)
            if len(named) > 1 or (named and sorted(named) != stored):
                self.fail(
                    "webhook_executions",
                    f"{workflow} {key}: 202s named {sorted(named)}, database has {stored}",
                )
            elif not named and any(t.status == 429 for t in attempts) and stored:
                self.fail(
                    "webhook_executions", f"{workflow} {key}: refused 429 but database has {stored}"
                )
            elif not named and not any(t.status == 429 for t in attempts):
                self.fail(
                    "webhook_executions",
                    f"{workflow} {key}: never accepted: {[t.status for t in attempts]}",
                )

    def check_settled(self) -> None:
        steps_by_execution: dict[str, dict[str, str]] = {}
        for s in self.steps:
            steps_by_execution.setdefault(s["execution_id"], {})[s["step_id"]] = s["status"]
        for e in self.executions:
            if e["status"] not in SETTLED and not e["waits_on_operator"]:
                self.fail(
                    "not_settled",
                    f"{e['workflow']} execution {e['id']} is {e['status']}; input {e['input']}; "
                    f"steps {steps_by_execution.get(e['id'])}; "
                    f"operator: {self.operator_on(e['id'])}",
                )

    def check_unknown_visible(self) -> None:
        listed: set[str] = set()
        base = self.cluster.api_bases[0]
        cursor = ""
        while True:
            url = f"{base}/api/v1/executions?status=needs_attention&limit=200{cursor}"
            r = self.client.request("checker", "GET", url)
            if r is None or r.status_code != 200:
                self.fail("unknown_not_visible", f"listing needs_attention failed: {url}")
                return
            page = r.json()
            listed.update(item["id"] for item in page["items"])
            if not page["next_cursor"]:
                break
            cursor = f"&cursor={page['next_cursor']}"
        for s in self.steps:
            if s["status"] == "unknown" and s["execution_id"] not in listed:
                self.fail(
                    "unknown_not_visible",
                    f"{s['workflow']} execution {s['execution_id']} ({s['execution_status']}) "
                    f"step {s['step_id']} is unknown; attempts: "
                    f"{self.attempts_of(s['execution_id'], s['step_id'])}; "
                    f"operator: {self.operator_on(s['execution_id'])}",
                )

    def check_readable(self) -> None:
        """GET every execution once, across both APIs: everything stored must load again
        (an answer of 500 here is reported by check_api)."""
        bases = self.cluster.api_bases
        for index, e in enumerate(self.executions):
            base = bases[index % len(bases)]
            self.client.request("checker", "GET", f"{base}/api/v1/executions/{e['id']}")

    def check_running(self) -> None:
        live = self.cluster.live_worker_ids()
        # No request can take longer than its hang plus its timeout plus a lease or two.
        longest = HANG_S + REQUEST_TIMEOUT_S + 2 * self.cluster.lease_s
        for s in self.steps:
            if s["status"] != "running":
                continue
            flight = [
                a
                for a in self.attempts
                if a["execution_id"] == s["execution_id"]
                and a["step_id"] == s["step_id"]
                and a["fencing_token"] == s["fencing_token"]
                and a["outcome"] is None
            ]
            age = max((float(a["age_s"]) for a in flight), default=None)
            reasons = []
            if s["lease_owner"] not in live:
                reasons.append(f"owner {s['lease_owner']} is not a live worker")
            if s["lease_expired"]:
                reasons.append(f"lease expired at {s['lease_expires_at']}")
            if age is None:
                reasons.append(f"no attempt in flight for token {s['fencing_token']}")
            elif age > longest:
                reasons.append(f"attempt in flight for {age:.0f}s (> {longest:.0f}s)")
            if reasons:
                self.fail(
                    "running_without_owner",
                    f"{s['workflow']} execution {s['execution_id']} step {s['step_id']} "
                    f"(token {s['fencing_token']}, owner {s['lease_owner']}): "
                    f"{'; '.join(reasons)}; live workers {sorted(live)}; attempts: "
                    f"{self.attempts_of(s['execution_id'], s['step_id'])}",
                )

    def check_api(self) -> None:
        quiet = min((f.at for f in self.history.faults if f.op == "quiet"), default=None)
        for call in self.history.calls:
            if (
                call.status == 503
                and quiet is not None
                and call.at < quiet
                and ("service-unavailable" in (call.body or ""))
            ):
                continue
            if call.status is None:
                where = f"t={call.at} {call.who} {call.method} {call.url}"
                self.fail("api_no_answer", f"{where}: {call.error}")
            elif call.status >= 500:
                self.fail(
                    "api_5xx",
                    f"t={call.at} {call.who} {call.method} {call.url} -> {call.status}: "
                    f"{(call.body or '').strip()[:300]}",
                )

    # ---- issues 23, 26-28: checks over the whole timeline, faults included ------------

    def _held(self, req: Received) -> tuple[float, float]:
        """When a request was in flight at the target: from its arrival until its answer,
        or until its worker gave up waiting (the request timeout)."""
        reply = self.replies.get(id(req))
        delay = reply.delay_s if reply is not None else REQUEST_TIMEOUT_S
        return req.at, req.at + min(delay, REQUEST_TIMEOUT_S)

    @staticmethod
    def most_at_once(spans: list[tuple[float, float, str]]) -> tuple[int, float, list[str]]:
        """The most distinct owners (executions) in flight together, when, and who."""
        spans = [span for span in spans if span[1] > span[0]]  # an empty span holds nothing
        events = sorted(
            [(start, 1, owner) for start, _, owner in spans]
            + [(end, 0, owner) for _, end, owner in spans]
        )
        live: Counter[str] = Counter()
        best, when, who = 0, 0.0, []
        for at, starts, owner in events:
            if starts:
                live[owner] += 1
            else:
                live[owner] -= 1
                if live[owner] <= 0:
                    del live[owner]
            if len(live) > best:
                best, when, who = len(live), at, sorted(live)
        return best, when, who

    def check_limits(self) -> None:
        """A workflow's concurrency (per key) and an outbound limit's concurrency and rate
        were never exceeded at the recording target, faults or not. A request a freeze
        held back past its attempt (sent_after_freeze) is left out: it is the gap no
        process can close, counted apart."""
        key_of = {e["id"]: (e["workflow"], e["k"]) for e in self.executions}
        spans: dict[tuple[str, str | None], list[tuple[float, float, str]]] = {}
        metered: list[tuple[float, float, str]] = []
        arrivals: list[float] = []
        for where, req in self.requests:
            if where is None or id(req) in self.held_back:
                continue
            start, end = self._held(req)
            if where.workflow in LIMITED and where.workflow in self.published:
                group = key_of.get(where.execution_id, (where.workflow, None))
                spans.setdefault(group, []).append((start, end, where.execution_id))
            if (where.workflow, where.step) == METERED:
                metered.append((start, end, f"{where.execution_id}#{len(metered)}"))
                arrivals.append(req.at)
        for (workflow, key), group in sorted(spans.items(), key=str):
            limit = LIMITED[workflow][0]
            most, when, who = self.most_at_once(group)
            if most > limit:
                self.fail(
                    "limit_exceeded",
                    f"{workflow} key {key}: {most} executions in flight at the target at "
                    f"t={self.when(when)} (limit {limit}): {who}",
                )
        most, when, who = self.most_at_once(metered)
        if most > PARTNER["concurrency"]:
            spans_then = [
                f"{owner} t={self.when(a)}-{self.when(b)}"
                for a, b, owner in metered
                if a <= when <= b
            ]
            self.fail(
                "limit_exceeded",
                f"outbound partner: {most} requests in flight at t={self.when(when)} "
                f"(concurrency {PARTNER['concurrency']}): {spans_then}; attempts: "
                + " | ".join(self.attempts_of(owner.split("#")[0], METERED[1]) for owner in who),
            )
        arrivals.sort()
        rate, burst = PARTNER["rate_per_s"], PARTNER["burst"]
        for i, first in enumerate(arrivals):
            for j in range(i + burst, len(arrivals)):
                span = arrivals[j] - first
                if span > 60:
                    break
                if j - i + 1 > burst + rate * (span + RATE_SLACK_S):
                    self.fail(
                        "limit_exceeded",
                        f"outbound partner: {j - i + 1} requests arrived within {span:.2f}s "
                        f"from t={self.when(first)} (rate {rate}/s, burst {burst})",
                    )
                    return

    def check_circuits(self) -> None:
        """No request through a key while its circuit was open, except the one probe:
        every attempt of a metered step claimed between the change to `open` and the
        next change must be that probe (the next change then being to half-open). A
        claim's instant is when its attempt row was written (CLAIM_LOG), not the
        attempt's started_at (its transaction's start)."""
        by_key: dict[str, list[tuple[str, float]]] = {}
        for row in self.circuits:
            by_key.setdefault(row["key"], []).append((row["circuit"], row["at"]))
        claimed = sorted(
            (
                self.claimed_at.get((a["execution_id"], a["step_id"], a["attempt"]), a["started"]),
                a["execution_id"],
            )
            for a in self.attempts
            if a["step_id"] == METERED[1] and a["execution_id"] in self.metered_executions
        )
        self.figures_extra["circuit_opened"] = sum(
            1 for changes in by_key.values() for state, _ in changes if state == "open"
        )
        for key, changes in by_key.items():
            found = self.claimed_while_open(changes, claimed, exact=bool(self.claimed_at))
            for at, (state, until), inside in found:
                self.fail(
                    "request_while_circuit_open",
                    f"circuit {key} open from t={self.when(at)} to "
                    f"t={self.when(until) if state else 'the end'} (then {state}): "
                    f"{len(inside)} attempts claimed in it: {inside}",
                )

    @staticmethod
    def claimed_while_open(
        changes: list[tuple[str, float]], claimed: list[tuple[float, str]], exact: bool
    ) -> list[tuple[float, tuple[str | None, float], list[str]]]:
        """The spans of one key's circuit from a change to `open` to its next change
        (state, instant) with claims (instant, execution) in them. `exact`: the instants
        are when the attempt rows were written, and the probe's is written after its own
        change to half-open, so none is allowed; otherwise (started_at, a run without
        the claim log) the one probe is, when the next change is to half-open."""
        found = []
        for index, (state, at) in enumerate(changes):
            if state != "open":
                continue
            nxt: tuple[str | None, float] = (
                changes[index + 1] if index + 1 < len(changes) else (None, float("inf"))
            )
            inside = [eid for instant, eid in claimed if at < instant < nxt[1]]
            if len(inside) > (1 if nxt[0] == "half_open" and not exact else 0):
                found.append((at, nxt, inside))
        return found

    def check_ticks(self) -> None:
        """A schedule's tick instant fires at most once (docs/contract.md#schedules), whatever was
        faulted."""
        for t in self.ticks:
            if t["outcome"] == "fired" and t["n"] != t["instants"]:
                self.fail(
                    "tick_fired_twice",
                    f"{t['workflow']}: {t['n']} fired ticks for {t['instants']} instants",
                )

    def check_replays(self) -> None:
        """A replay never runs or sends again what is upstream of its step
        (docs/contract.md#replay)."""
        sent = {(where.execution_id, where.step) for where, _ in self.requests if where}
        replays = 0
        for e in self.executions:
            if not e["replay_of"] or not e["replay_from"]:
                continue
            replays += 1
            definition = self.published.get(e["workflow"])
            if definition is None:
                continue
            for sid in sorted(ancestors(definition, e["replay_from"])):
                if (e["id"], sid) in sent:
                    self.fail(
                        "replay_resent",
                        f"{e['workflow']} execution {e['id']} (replay of {e['replay_of']} "
                        f"from {e['replay_from']}) sent upstream step {sid} again",
                    )
        self.figures_extra["replays"] = replays

    def check_paused(self) -> None:
        """Nothing paused made progress: no attempt of a paused execution (or of any
        execution of a paused workflow) was claimed after the pause was answered and
        before its resume was asked for."""
        workflow_of = {e["id"]: e["workflow"] for e in self.executions}
        actions = sorted(self.history.actions, key=lambda a: a.wall)
        windows: list[tuple[str, str, float, float]] = []
        for i, a in enumerate(actions):
            if a.action not in ("pause_workflow", "pause_execution") or a.status != 200:
                continue
            kind = a.action.removeprefix("pause_")
            lift = next(
                (
                    b.wall
                    for b in actions[i + 1 :]
                    if b.action == f"resume_{kind}" and b.execution_id == a.execution_id
                ),
                float("inf"),
            )
            if a.answered is not None:
                windows.append((kind, a.execution_id, a.answered, lift))
        self.figures_extra["pauses"] = len(windows)
        for a in self.attempts:
            for kind, name, begun, lifted in windows:
                whose = (
                    a["execution_id"] if kind == "execution" else workflow_of.get(a["execution_id"])
                )
                if whose == name and begun < a["started"] < lifted:
                    self.fail(
                        "paused_progressed",
                        f"{kind} {name} paused from t={self.when(begun)} to "
                        f"t={self.when(lifted) if lifted < float('inf') else 'the end'}: "
                        f"execution {a['execution_id']} step {a['step_id']} attempt "
                        f"#{a['attempt']} claimed at t={self.when(a['started'])}",
                    )

    def _deliveries(self) -> dict[str, list[tuple[float, float, int | None, bool]]]:
        """Every webhook key's attempts: (sent, answered, status, created-by-this-202)."""
        found: dict[str, list[tuple[float, float, int | None, bool]]] = {}
        for key, d in self.workload.deliveries.items():
            found[key] = [
                (sent, answered, status, status == 202)
                for (status, _), (sent, answered) in zip(d.answers, d.times, strict=False)
            ]
        if self.features is not None:
            for key, (_, _, attempts) in self.features.sent.items():
                found[key] = [
                    (t.sent, t.answered, t.status, t.status == 202 and not t.replayed)
                    for t in attempts
                ]
        return found

    def check_accepted_5xx(self) -> None:
        """No accepted event was answered 5xx (or not at all): an execution created while
        a delivery of its key was being answered 5xx, and by no delivery answered 202,
        is an event the sender was told to send again although it was taken."""
        created = {e["idempotency_key"]: e for e in self.executions}
        for key, attempts in sorted(self._deliveries().items()):
            e = created.get(key)
            if e is None:
                continue
            at = e["created"]
            within = [a for a in attempts if a[0] - CLOCK_SLACK_S <= at <= a[1] + CLOCK_SLACK_S]
            if any(a[3] for a in within):
                continue
            bad = [a for a in within if a[2] is None or a[2] >= 500]
            if bad:
                self.fail(
                    "accepted_event_5xx",
                    f"{key}: execution {e['id']} created at t={self.when(at)} while its "
                    f"delivery was answered {[a[2] for a in bad]}",
                )

    def check_maps(self) -> None:
        """The map step (docs/contract.md#map): a succeeded map has every item's POST succeeded
        exactly once, and its output lists the items in input order, each with the answer
        the target gave that item (or the operator's resolve); no more than max_parallel
        items of one execution were in flight at the target at once, faults or not
        (unsafe POSTs sent twice are check_unsafe_requests')."""
        by_execution = {e["id"]: e for e in self.executions if e["workflow"] == MAP_WORKFLOW}
        rows = {(r["execution_id"], r["step_id"]): r for r in self.map_rows}
        succeeded = Counter(
            (a["execution_id"], a["step_id"]) for a in self.attempts if a["outcome"] == "succeeded"
        )
        answered: dict[tuple[str, str], set[str]] = {}
        spans: dict[str, list[tuple[float, float, str]]] = {}
        for where, req in self.requests:
            if where is None or where.workflow != MAP_WORKFLOW:
                continue
            reply = self.replies.get(id(req))
            if reply is not None and reply.status == 200 and isinstance(reply.json, dict):
                answered.setdefault((where.execution_id, where.step), set()).add(
                    str(reply.json.get("id"))
                )
            if id(req) not in self.held_back:
                start, end = self._held(req)
                spans.setdefault(where.execution_id, []).append((start, end, where.step))
        resolved = {
            (a.execution_id, a.step_id)
            for a in self.history.actions
            if a.action == "resolve" and a.status == 200 and a.outcome == "succeeded"
        }
        items_run = 0
        for eid, e in sorted(by_execution.items()):
            lines = json.loads(e["input"]).get("lines", [])
            row = rows.get((eid, MAP_STEP))
            items_run += len(lines)
            if row is None or row["status"] != "succeeded":
                continue
            output = json.loads(row["output"]) if row["output"] else None
            problems = []
            if not isinstance(output, list) or len(output) != len(lines):
                problems.append(f"output {output!r} is not one entry per item ({len(lines)})")
            else:
                for index, (line, got) in enumerate(zip(lines, output, strict=True)):
                    sid = f"{MAP_STEP}[{index}].{MAP_POST}"
                    if succeeded[(eid, sid)] != 1 and (eid, sid) not in resolved:
                        problems.append(f"item {index}: {succeeded[(eid, sid)]} succeeded POSTs")
                    given = answered.get((eid, sid), set())
                    if (eid, sid) in resolved:
                        given = given | {"resolved"}
                    if not isinstance(got, dict) or got.get("sku") != line["sku"]:
                        problems.append(f"item {index}: output {got!r} is not item {line!r}")
                    elif str(got.get("got")) not in given:
                        problems.append(
                            f"item {index}: output {got!r} is no answer the target gave "
                            f"({sorted(given)})"
                        )
            total = rows.get((eid, "total"))
            if (
                total is not None
                and total["status"] == "succeeded"
                and not problems
                and json.loads(total["output"]) != {"lines": output}
            ):
                problems.append(f"total {total['output']} is not the map's output")
            if problems:
                self.fail(
                    "map_output",
                    f"execution {eid} ({len(lines)} items): {'; '.join(problems)}; "
                    f"operator: {self.operator_on(eid)}",
                )
        for eid, group in sorted(spans.items()):
            most, when, who = self.most_at_once(group)
            if most > MAP_PARALLEL:
                self.fail(
                    "map_parallel_exceeded",
                    f"execution {eid}: {most} items in flight at the target at "
                    f"t={self.when(when)} (max_parallel {MAP_PARALLEL}): {who}; attempts: "
                    + " | ".join(self.attempts_of(eid, sid) for sid in who),
                )
        self.figures_extra["map"] = {
            "executions": len(by_execution),
            "items": items_run,
            "succeeded": sum(
                1
                for eid in by_execution
                if (r := rows.get((eid, MAP_STEP))) is not None and r["status"] == "succeeded"
            ),
        }

    def check_groups(self) -> None:
        """Debounce and batch (docs/contract.md#debounce-batch): every accepted event is recorded in
        exactly one group, the one whose execution its 202 named; that group started its one
        execution, whose input is what docs/contract.md#debounce-batch says (debounce: the group's
        last event plus `debounced`, the count of the others, of that key; batch: `events[]`, every
        event of the group in arrival order, at most max_items); no event is in two
        executions, and none recorded was answered only 5xx."""
        if self.features is None:
            return
        sent = {
            key: (workflow, body, attempts)
            for key, (workflow, body, attempts) in self.features.sent.items()
            if workflow in GROUPED
        }
        groups = {g["id"]: g for g in self.groups}
        events_of: dict[int, list[dict[str, Any]]] = {}
        rows_of_key: dict[str, list[dict[str, Any]]] = {}
        for ev in self.group_events:
            events_of.setdefault(ev["group_id"], []).append(ev)
            rows_of_key.setdefault(ev["idempotency_key"], []).append(ev)
        executions = {e["id"]: e for e in self.executions}
        for key, (workflow, body, attempts) in sorted(sent.items()):
            named = {t.execution_id for t in attempts if t.status == 202 and t.execution_id}
            rows = rows_of_key.get(key, [])
            # Recorded while a delivery of it was answered 5xx (or not at all), and by
            # none answered 202 first-hand: an accepted event the sender was told to
            # send again (as check_accepted_5xx, with the event's received_at).
            for row in rows[:1]:
                at = row["received"]
                within = [
                    t
                    for t in attempts
                    if t.sent - CLOCK_SLACK_S <= at <= t.answered + CLOCK_SLACK_S
                ]
                took = any(t.status == 202 and not t.replayed for t in within)
                bad = [t.status for t in within if t.status is None or t.status >= 500]
                if bad and not took:
                    self.fail(
                        "accepted_event_5xx",
                        f"{workflow} {key}: recorded in group {row['group_id']} at "
                        f"t={self.when(at)} while its delivery was answered {bad}",
                    )
            if not named:
                continue  # never accepted: check_feature_webhooks
            if len(rows) != 1:
                self.fail(
                    "group_event",
                    f"{workflow} {key} (named {sorted(named)}): recorded {len(rows)} times, "
                    f"in groups {[r['group_id'] for r in rows]}",
                )
                continue
            group = groups.get(rows[0]["group_id"])
            if group is None or {group["execution_id"]} != named:
                self.fail(
                    "group_event",
                    f"{workflow} {key}: answered {sorted(named)}, recorded in group {group}",
                )
            elif json.loads(rows[0]["body"]) != body:
                self.fail("group_event", f"{workflow} {key}: recorded {rows[0]['body']}")
        counted: Counter[str] = Counter()
        for gid, group in sorted(groups.items()):
            if group["workflow"] not in GROUPED:
                continue
            kind, options = GROUPED[group["workflow"]]
            counted[f"{kind} groups"] += 1
            events = events_of.get(gid, [])
            counted[f"{kind} events"] += len(events)
            bodies = [json.loads(ev["body"]) for ev in events]
            e = executions.get(group["execution_id"])
            where = f"{group['workflow']} group {gid} (key {group['group_key']!r})"
            if group["status"] != "started" or e is None:
                self.fail(
                    "group_not_started",
                    f"{where}: {group['status']} {group['reason'] or ''}, execution "
                    f"{group['execution_id']} {'missing' if e is None else e['status']}",
                )
                continue
            if len(events) != group["events"]:
                self.fail("group_event", f"{where}: counts {group['events']}, has {len(events)}")
            data = json.loads(e["input"])
            if kind == "batch":
                expected = {"events": bodies}
                if len(bodies) > options["max_items"]:
                    self.fail("group_event", f"{where}: {len(bodies)} events > max_items")
            else:
                expected = {**bodies[-1], "debounced": len(bodies) - 1} if bodies else {}
                keys = {b.get("k") for b in bodies}
                if keys != {group["group_key"]}:
                    self.fail("group_event", f"{where}: events of keys {sorted(map(str, keys))}")
            if data != expected:
                self.fail(
                    "group_input",
                    f"{where}: execution {e['id']} input {data}, its events make {expected}",
                )
        # Across executions: an event in two of them is an event run twice.
        seen: Counter[str] = Counter()
        for e in self.executions:
            if e["workflow"] in GROUPED and GROUPED[e["workflow"]][0] == "batch":
                for item in json.loads(e["input"]).get("events", []):
                    seen[json.dumps(item, sort_keys=True)] += 1
        for item, times in sorted(seen.items()):
            if times > 1:
                self.fail("group_event", f"batched event {item} is in {times} executions")
        self.figures_extra["groups"] = dict(counted)

    def check_children(self) -> None:
        """Child workflows (docs/contract.md#child-workflows): every round of a parent's workflow
        step (a fencing token that ended in an attempt, or the one it waits in) has exactly one
        child, under the key of that round; a succeeded step's output is its round's child's
        output, which holds an answer the target gave that child (or the operator's
        resolve); under a cancelled or failed parent, or once a later round replaced it, no
        child is left live (each is terminal or has its cancel requested); no child sent
        its one unsafe POST twice unless an operator asked (its retry, as
        check_unsafe_requests counts). The soak's child workflow has no limit, no schema
        and is always published, so a round is never refused before its child exists."""
        parents = {e["id"]: e for e in self.executions if e["workflow"] == PARENT}
        children: dict[str, list[dict[str, Any]]] = {}
        for e in self.executions:
            if e["workflow"] != CHILD:
                continue
            if e.get("parent_id") is None:
                self.fail("child_round", f"{CHILD} execution {e['id']} has no parent")
            else:
                children.setdefault(e["parent_id"], []).append(e)
        rows = {(r["execution_id"], r["step_id"]): r for r in self.child_rows}
        ended: dict[str, list[dict[str, Any]]] = {}
        for a in self.attempts:
            if a["execution_id"] in parents and a["step_id"] == CALL and a["outcome"]:
                ended.setdefault(a["execution_id"], []).append(a)
        answered: dict[str, set[str]] = {}
        sends: dict[str, list[float]] = {}
        for where, req in self.requests:
            if where is None or (where.workflow, where.step) != (CHILD, CHILD_POST):
                continue
            if req.method == "POST" and "idempotency-key" not in req.headers:
                sends.setdefault(where.execution_id, []).append(req.at)
            reply = self.replies.get(id(req))
            if reply is not None and reply.status == 200 and isinstance(reply.json, dict):
                answered.setdefault(where.execution_id, set()).add(str(reply.json.get("id")))
        for act in self.history.actions:
            resolved = act.action == "resolve" and act.status == 200 and act.outcome == "succeeded"
            if resolved and act.step_id == CHILD_POST:
                answered.setdefault(act.execution_id, set()).add("resolved")
        figures: Counter[str] = Counter(parents=len(parents))
        for pid, parent in sorted(parents.items()):
            problems: list[str] = []
            wrong: list[str] = []  # of the output
            live: list[str] = []
            prefix = f"child:{pid}:{CALL}:"
            by_round: dict[int, list[dict[str, Any]]] = {}
            for c in children.get(pid, []):
                key = c["idempotency_key"] or ""
                if c["parent_step"] != CALL or not key.startswith(prefix):
                    problems.append(f"child {c['id']} of step {c['parent_step']} has key {key!r}")
                    continue
                by_round.setdefault(int(key[len(prefix) :]), []).append(c)
            figures["children"] += len(children.get(pid, []))
            figures["rounds > 1"] += len(by_round) > 1
            step = rows.get((pid, CALL))
            rounds = {int(a["fencing_token"]) for a in ended.get(pid, [])}
            if step is not None and step["status"] == "waiting":
                rounds.add(int(step["fencing_token"]))
                named = json.loads(step["output"]) if step["output"] else None
                mine = [c["id"] for c in by_round.get(int(step["fencing_token"]), [])]
                if not isinstance(named, dict) or [named.get("execution_id")] != mine:
                    problems.append(f"step waits on {named!r}, its round's children are {mine}")
            for token in sorted(rounds | set(by_round)):
                found = by_round.get(token, [])
                if (token in rounds and len(found) != 1) or len(found) > 1:
                    problems.append(f"round {token}: children {[c['id'] for c in found]}")
            newest = max(by_round, default=None)
            for token, found in by_round.items():
                over = parent["status"] in ("cancelled", "failed") or token != newest
                for c in found:
                    if over and c["status"] not in TERMINAL and not c["cancel_requested"]:
                        live.append(f"{c['id']} (round {token}) is {c['status']}")
            won = [a for a in ended.get(pid, []) if a["outcome"] == "succeeded"]
            if step is not None and step["status"] == "succeeded" and won:
                figures["succeeded"] += 1
                token = int(won[-1]["fencing_token"])
                found = by_round.get(token, [])
                child = found[0] if len(found) == 1 else None
                last = rows.get((child["id"], "shape")) if child is not None else None
                output = json.loads(step["output"]) if step["output"] else None
                if child is None or child["status"] != "succeeded" or last is None:
                    problems.append(
                        f"step succeeded in round {token}, whose child is "
                        f"{child and (child['id'], child['status'])}"
                    )
                elif output != json.loads(last["output"] or "null"):
                    wrong.append(
                        f"step output {output!r} is not child {child['id']}'s {last['output']}"
                    )
                elif not isinstance(output, dict) or str(output.get("booking")) not in (
                    given := answered.get(child["id"], set())
                ):
                    wrong.append(
                        f"output {output!r} is no answer child {child['id']} was given "
                        f"({sorted(given)})"
                    )
            for category, found_problems in (("child_round", problems), ("child_output", wrong)):
                if found_problems:
                    self.fail(
                        category,
                        f"{PARENT} execution {pid} ({parent['status']}): "
                        f"{'; '.join(found_problems)}; attempts: {self.attempts_of(pid, CALL)}; "
                        f"operator: {self.operator_on(pid)}",
                    )
            if live:
                self.fail(
                    "child_left_running",
                    f"{PARENT} execution {pid} ({parent['status']}): {'; '.join(live)}; "
                    f"operator: {self.operator_on(pid)}",
                )
        for cid, sent in sorted(sends.items()):
            extra = unasked_sends(self.history.actions, cid, CHILD_POST, sorted(sent))
            if extra:
                self.fail(
                    "child_post_twice",
                    f"{CHILD} execution {cid}: {CHILD_POST} sent at "
                    f"t={[self.when(t) for t in sorted(sent)]}; attempts: "
                    f"{self.attempts_of(cid, CHILD_POST)}; operator: {self.operator_on(cid)}",
                )
        self.figures_extra["children"] = dict(figures)

    def check_false_unknown(self) -> None:
        """No false unknown: every `unknown` attempt has a request the target may have
        seen — one that arrived after the attempt began — or a worker that died (was
        SIGKILLed) after it began and so could not say that it never sent it."""
        killed: dict[str, float] = {}
        for f in self.history.faults:
            if f.op in ("kill", "thaw"):
                killed.setdefault(f.target, self.history.wall_started + f.at)
        arrived: dict[tuple[str, str], list[float]] = {}
        for where, req in self.requests:
            if where:
                arrived.setdefault((where.execution_id, where.step), []).append(req.at)
        for a in self.attempts:
            if a["outcome"] != "unknown":
                continue
            seen = arrived.get((a["execution_id"], a["step_id"]), [])
            if any(t >= a["started"] - CLOCK_SLACK_S for t in seen):
                continue
            death = killed.get(a["worker"])
            if death is not None and death >= a["started"] - CLOCK_SLACK_S:
                continue
            self.fail(
                "false_unknown",
                f"execution {a['execution_id']} step {a['step_id']} attempt #{a['attempt']} "
                f"({a['worker']}, never killed) is unknown but the target never saw it: "
                f"{a['error']}",
            )

    def _unavailable(self, exclude_slot: str | None = None) -> list[tuple[float, float]]:
        """Wall-clock intervals in which no worker (but `exclude_slot`) could recover
        anything: a server outage (plus RECONNECT_S), or every other worker killed (until
        its successor logged that it started), stopped, frozen, or cut from PostgreSQL."""
        w0 = self.history.wall_started
        end = w0 + max((f.at for f in self.history.faults), default=0.0) + 3600
        down = self.down_spans(self.history.faults, w0, end, self.worker_starts())
        slots = {f"soak-w{s.index}" for s in self.cluster.slots} - {exclude_slot}
        bounds = sorted({t for spans in down.values() for span in spans for t in span})
        gaps: list[tuple[float, float]] = []
        for lo, hi in itertools.pairwise(bounds):
            mid = (lo + hi) / 2
            if all(any(a <= mid < b for a, b in down.get(s, [])) for s in slots):
                gaps.append((lo, hi))
        if self.servers is not None:
            gaps.extend((a, b + RECONNECT_S) for a, b, _ in self.servers.outages)
        return sorted(gaps)

    def worker_starts(self) -> dict[str, float]:
        """When each worker process (soak-wS.G) logged that it started: its services
        (the reaper among them) run from then on."""
        found: dict[str, float] = {}
        for log in self.cluster.logs.glob("worker-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if STARTED_LINE in line:
                    found[f"soak-w{log.stem.removeprefix('worker-')}"] = datetime.fromisoformat(
                        json.loads(line)["ts"]
                    ).timestamp()
                    break
        return found

    @staticmethod
    def down_spans(
        faults: Iterable[Fault], w0: float, end: float, started: dict[str, float]
    ) -> dict[str, list[tuple[float, float]]]:
        """Per worker slot, the wall-clock spans in which its worker could not act: from a
        kill (or a freeze, which ends in one) until its successor logged that it started
        (`started`, per process; one that never did never could), from a pause until its
        resume, from a link fault until its heal. A resume does not revive a process
        killed while it was paused; a successor paused or killed before it started adds
        no working time. Seed 2324's successors mostly died within 1-5 s of their start,
        before their first log line; counting each as working 6 s after its restart made
        95 s with no worker running look like 20 s in which others could act."""
        down: dict[str, list[tuple[float, float]]] = {}
        opened: dict[tuple[str, str], float] = {}
        for f in faults:
            slot = f.target.split(".")[0]
            at = w0 + f.at
            if f.target == "server":
                continue  # server outages: Servers.outages
            link_fault = f.op.startswith("pg_") and f.op != "pg_heal"
            if f.op in ("kill", "freeze"):
                opened.setdefault((slot, "proc"), at)
            elif f.op == "pause":
                opened.setdefault((slot, "stop"), at)
            elif link_fault:
                opened.setdefault((slot, f.op), at)
            elif f.op == "restart":
                began = opened.pop((slot, "proc"), None)
                if began is None:
                    continue
                if f.target in started:
                    down.setdefault(slot, []).append((began, max(at, started[f.target])))
                else:
                    opened[(slot, "proc")] = began  # it never started
            elif f.op == "resume":
                began = opened.pop((slot, "stop"), None)
                if began is not None:
                    down.setdefault(slot, []).append((began, at))
            elif f.op == "pg_heal":
                for name in [k for k in opened if k[0] == slot and k[1].startswith("pg_")]:
                    down.setdefault(slot, []).append((opened.pop(name), at))
            elif f.op == "quiet":
                for name, began in list(opened.items()):
                    down.setdefault(name[0], []).append((began, at + RESTART_S))
                opened.clear()
        for name, began in opened.items():
            down.setdefault(name[0], []).append((began, end))
        return down

    @staticmethod
    def deadline(start: float, bound: float, gaps: list[tuple[float, float]]) -> float:
        """The moment `bound` seconds of available time have passed since `start`."""
        at, left = start, bound
        for lo, hi in gaps:
            if hi <= at:
                continue
            if lo > at + left:
                break
            left -= max(lo - at, 0.0)
            at = max(hi, at)
        return at + left

    def check_priorities(self) -> None:
        """docs/contract.md#priority: an execution shows the priority its definition gave it
        when it was created (orders': its input's `p`, absent is 0; fanout's: -10), under
        every fault (replays and retries keep it: they are the same definitions)."""
        wanted = {"fanout": lambda _: -10, "orders": lambda given: given.get("p") or 0}
        shown: Counter[int] = Counter()
        for e in self.executions:
            if e["workflow"] not in wanted:
                continue
            given = json.loads(e["input"]) if e["input"] else {}
            expected = wanted[e["workflow"]](given if isinstance(given, dict) else {})
            shown[e["priority"]] += 1
            if e["priority"] != expected:
                self.fail(
                    "priority",
                    f"{e['workflow']} execution {e['id']}: priority {e['priority']}, "
                    f"its input asks {expected}",
                )
        self.figures_extra["priorities"] = dict(sorted(shown.items()))

    def check_frozen(self) -> None:
        """What the nemesis's watcher found while a worker was frozen anywhere."""
        kinds = ("frozen_lock_uncovered", "frozen_lock_outlived_timeout", "frozen_execution_late")
        for f in self.history.faults:
            if f.op in kinds:
                self.fail(f.op, f"{f.target} at t={f.at:.1f}s: {f.detail}")
        owned = [f for f in self.history.faults if f.op == "frozen_owns"]
        self.figures_extra["frozen_anywhere_own_executions"] = sum(
            len(f.detail.split()) for f in owned
        )

    def check_recovery(self) -> None:
        """Recovery within a bound while others could work (issue 23 item 1): a killed
        worker's attempts in flight are ended (by a reaper) within RECOVERY_BOUND_S of
        time in which some other worker could act and the servers were up — while
        another worker is frozen inside a unit of work too. And during every freeze the
        others made progress: attempts were claimed or finished by other workers."""
        gaps = self._unavailable()
        late = 0
        recovered: list[float] = []
        for f in self.history.faults:
            if f.op not in ("kill", "thaw"):
                continue
            killed = self.history.wall_started + f.at
            for a in self.attempts:
                if a["worker"] != f.target or a["started"] >= killed:
                    continue
                if a["finished"] is not None and a["finished"] <= killed:
                    continue
                deadline = self.deadline(killed, RECOVERY_BOUND_S, gaps)
                if a["finished"] is not None:
                    recovered.append(a["finished"] - killed)
                if a["finished"] is None or a["finished"] > deadline:
                    late += 1
                    ended = "never" if a["finished"] is None else f"t={self.when(a['finished'])}"
                    self.fail(
                        "recovery_late",
                        f"execution {a['execution_id']} step {a['step_id']} of {f.target} "
                        f"(killed at t={self.when(killed)}) ended {ended}, "
                        f"bound t={self.when(deadline)}",
                    )
        recovered.sort()
        self.figures_extra["recovery_s"] = {
            "count": len(recovered),
            "median": round(recovered[len(recovered) // 2], 1) if recovered else None,
            "max": round(recovered[-1], 1) if recovered else None,
        }
        freezes_seen = 0
        for i, f in enumerate(self.history.faults):
            if f.op != "freeze":
                continue
            freezes_seen += 1
            began = self.history.wall_started + f.at
            thaw = next(
                (
                    g
                    for g in self.history.faults[i + 1 :]
                    if g.op == "thaw" and g.target == f.target
                ),
                None,
            )
            ended = self.history.wall_started + (thaw.at if thaw else self.history.now())
            gaps_without = self._unavailable(exclude_slot=f.target.split(".")[0])
            available = (
                ended
                - began
                - sum(max(0.0, min(b, ended) - max(a, began)) for a, b in gaps_without)
            )
            others = [
                a
                for a in self.attempts
                if a["worker"] != f.target
                and (
                    began < a["started"] < ended
                    or (a["finished"] is not None and began < a["finished"] < ended)
                )
            ]
            if available >= FROZEN_PROGRESS_S and not others:
                self.fail(
                    "no_progress_while_frozen",
                    f"{f.target} frozen t={self.when(began)}-{self.when(ended)}: "
                    f"{available:.0f}s in which others could work, no attempt claimed or ended",
                )
        self.figures_extra["freezes"] = freezes_seen

    def run(self, unhealthy: dict[str, str]) -> list[Violation]:
        """Every check on what was read; the violations in category order."""
        for worker, reason in unhealthy.items():
            self.fail("worker_not_recovered", f"{worker} after the heal: {reason}")
        self.check_unsafe_requests()
        self.check_stale_sends()
        self.check_keyed_requests()
        self.check_successes()
        self.check_webhooks()
        self.check_settled()
        self.check_unknown_visible()
        self.check_running()
        self.check_readable()
        self.check_api()
        self.check_limits()
        self.check_circuits()
        self.check_replays()
        self.check_ticks()
        self.check_paused()
        self.check_accepted_5xx()
        self.check_maps()
        self.check_groups()
        self.check_children()
        self.check_false_unknown()
        self.check_recovery()
        self.check_frozen()
        self.check_priorities()
        # This round's promises: keyed events, search attributes, failure groups.
        self.promises = Promises(self, self.events)
        self.promises.run()
        return self.violations

    def diagnostics(self) -> list[str]:
        """Not verdicts: long-open database transactions, and which worker (through which
        proxy) or other process holds each, for debugging stuck runs."""
        owners: dict[int, str] = {}
        for slot in self.cluster.slots:
            for port in slot.pg.upstream_ports():
                owners[port] = f"{slot.worker_id} ({'alive' if slot.alive else 'dead'})"
        return [
            f"long transaction: pid {s['pid']} of {owners.get(s['client_port'], 'not a worker')}"
            f" {s['state']} {s['wait_event_type']}/{s['wait_event']} for {s['xact_s']}s: "
            f"{' '.join(str(s['query']).split())}"
            for s in self.sessions
        ]

    def figures(self) -> dict[str, Any]:
        """What the run covered, and how noisy the workers' logs were."""
        takeovers = self.takeovers
        levels: Counter[str] = Counter()
        for log in self.cluster.logs.glob("worker-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                for level in ("error", "warning"):
                    if f'"level": "{level}"' in line:
                        levels[level] += 1
        return {
            "executions": dict(Counter(e["status"] for e in self.executions)),
            "unknown_steps": sum(1 for s in self.steps if s["status"] == "unknown"),
            "attempt_outcomes": dict(Counter(a["outcome"] or "in flight" for a in self.attempts)),
            "target_requests": len(self.requests),
            "sent_after_freeze": self.sent_after_freeze,
            "webhook_keys": len(self.workload.deliveries),
            "accepted_after_old_budget": self.patience(),
            "duplicate_deliveries": self.workload.duplicate_deliveries,
            "poisoned_delays": self.workload.poisoned,
            "api_calls": len(self.history.calls),
            "faults": dict(Counter(f.op for f in self.history.faults)),
            "operator_actions": dict(
                Counter(f"{a.action} {a.status}" for a in self.history.actions)
            ),
            "worker_log_lines": dict(levels),
            **self.feature_figures(),
            "takeover_s": {
                "count": len(takeovers),
                "median": round(takeovers[len(takeovers) // 2], 1) if takeovers else None,
                "max": round(takeovers[-1], 1) if takeovers else None,
            },
        }

    def patience(self) -> dict[str, Any]:
        """Deliveries accepted only after refusals (5xx, 429, no answer) spanning more
        than OLD_BUDGET_S, about what the old sender (5 tries, 0.3 s apart) gave up after,
        and the longest wait for a 202 from the first try."""
        late, longest = 0, 0.0
        tries = [
            [
                (status, sent, answered)
                for (status, _), (sent, answered) in zip(d.answers, d.times, strict=False)
            ]
            for d in self.workload.deliveries.values()
        ]
        if self.features is not None:
            tries += [
                [(t.status, t.sent, t.answered) for t in a]
                for _, _, a in self.features.sent.values()
            ]
        for answers in tries:
            ok = [i for i, (status, _, _) in enumerate(answers) if status == 202]
            if ok:
                late += ok[0] > 0 and answers[ok[0]][1] - answers[0][1] > OLD_BUDGET_S
                longest = max(longest, answers[ok[0]][2] - answers[0][1])
        return {"count": late, "longest_s": round(longest, 1)}

    def feature_figures(self) -> dict[str, Any]:
        """What the run covered of the features (issues 23, 26-28)."""
        figures: dict[str, Any] = dict(self.figures_extra)
        by_workflow = Counter(e["workflow"] for e in self.executions)
        figures["executions_by_workflow"] = dict(sorted(by_workflow.items()))
        figures["schedule_ticks"] = {
            f"{t['workflow']} {t['outcome']}": int(t["n"]) for t in self.ticks
        }
        figures["wait_steps"] = dict(
            Counter(s["status"] for s in self.steps if s["step_id"] == "approval")
        )
        if self.features is not None:
            figures["refused_429"] = self.features.refused_429
            figures["resumes"] = dict(self.features.resumes)
            brief_ok = {eid for status, eid in self.features.brief if status == 202 and eid}
            present = {e["id"] for e in self.executions if e["workflow"] == "brief"}
            figures["retention_deleted"] = len(brief_ok - present)
            figures["source_deliveries"] = len(self.features.sources)
        if self.promises is not None:
            figures.update(self.promises.figures())
        if self.servers is not None:
            figures["server_outages"] = dict(Counter(op for _, _, op in self.servers.outages))
        return figures


def report(violations: list[Violation]) -> str:
    """Every violation, grouped by category, SHOWN lines per category at most."""
    lines = []
    by_category: dict[str, list[Violation]] = {}
    for v in violations:
        by_category.setdefault(v.category, []).append(v)
    for category, found in by_category.items():
        lines.append(f"VIOLATION {category}: {len(found)}")
        lines.extend(f"  {v.detail}" for v in found[:SHOWN])
        if len(found) > SHOWN:
            lines.append(f"  ... and {len(found) - SHOWN} more (see history.jsonl and the logs)")
    return "\n".join(lines)
