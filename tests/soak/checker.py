"""The checker: after the quiet period it reads the target's log, the history and the
database, and lists every broken promise of SPEC §7 with enough detail to debug it.

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
  the attempt says `unknown` or a repeat-safe step was retried, as SPEC §7 allows. A
  missing fence still shows: the nemesis's slow senders stall with no freeze at all;
- step_succeeded_twice: two attempts of one step with outcome succeeded;
- success_without_request: a succeeded HTTP attempt the target never saw;
- keyed_request_changed_key: one step's retries carried different Idempotency-Keys;
- webhook_executions: an accepted webhook without exactly one execution, replays that
  named different executions, executions nobody was told about, deliveries never accepted;
- not_settled: an execution neither terminal nor needs_attention at the end;
- unknown_not_visible: a step in `unknown` whose execution GET ?status=needs_attention
  does not list;
- running_without_owner: a step still `running` whose owner is gone, whose lease has
  expired, or whose attempt has been in flight longer than any request can take;
- worker_not_recovered: a worker that was not consuming again soon after the faults healed;
- drain_stuck: a worker that did not finish its SIGTERM drain in time at the very end;
- api_5xx / api_no_answer: an API answer of 500 or more, or none at all (the API processes
  are never faulted). One exception: while the nemesis runs, a 503 service-unavailable
  problem is the honest answer of an API whose database did not answer in time — a row
  it needs is locked by a worker whose link is blackholed — and is allowed; after the
  quiet period began, any 5xx is a violation.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.soak.cluster import Cluster
from tests.soak.history import Fault, History, OperatorAction, RecordingClient
from tests.soak.workload import HANG_S, REQUEST_TIMEOUT_S, TargetPath, Workload
from tests.support.target import Target

SETTLED = ("succeeded", "failed", "cancelled", "needs_attention")
RESEND_ASKED = ("failed", "unknown")
# Lines printed per category; the rest are counted (history.jsonl has them all).
SHOWN = 25
# A request held back by a freeze leaves as soon as its worker runs again: it arrives
# within this long after the SIGCONT (a loaded machine included) or it is no such case.
SENT_AFTER_RESUME_S = 1.0
# Clock slack between the history's records and the moments they stand for: a SIGSTOP
# lands just after its record, a SIGCONT just before its own.
RECORD_SLACK_S = 0.05

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
EXECUTIONS = """
SELECT e.id::text AS id, e.idempotency_key, e.status, e.input::text AS input, w.key AS workflow
FROM executions e JOIN workflows w ON w.id = e.workflow_id
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
UNSETTLED = """
SELECT (SELECT count(*) FROM executions WHERE status <> ALL(%(settled)s))
     + (SELECT count(*) FROM steps WHERE status = 'running')
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
    as the count of unsettled work keeps reaching new lows; it gives up once `stall_s`
    passed without a new low (something is stuck: a stall bound above the reconcile
    interval lets the reconciler catch a lost wake-up first) or after `cap_s` in all.
    """
    started = time.monotonic()
    backlog: int | None = None
    lowest, lowest_at = 0, started
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            row = conn.execute(UNSETTLED, {"settled": list(SETTLED)}).fetchone()
            unsettled = int(row[0]) if row is not None else 0
            now = time.monotonic()
            if backlog is None:
                backlog = lowest = unsettled
            if unsettled == 0:
                return Settling(round(now - started, 1), backlog, 0)
            if unsettled < lowest:
                lowest, lowest_at = unsettled, now
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
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.history = history
        self.workload = workload
        self.target = target
        self.violations: list[Violation] = []
        self.sent_after_freeze = 0
        # The target's log first, then the database: a claim commits its attempt row
        # before the request leaves, so every request read here has its attempt in what
        # is read next. The other order, while something still runs, pairs a new request
        # with an older attempt of its step and reports a stale send that never was.
        self.requests = [(TargetPath.parse(r.path), r) for r in list(self.target.received)]
        with psycopg.connect(cluster.database_url, autocommit=True, row_factory=dict_row) as conn:
            self.steps = conn.execute(STEPS).fetchall()
            self.attempts = conn.execute(ATTEMPTS).fetchall()
            self.executions = conn.execute(EXECUTIONS).fetchall()
            self.sessions = conn.execute(LONG_TRANSACTIONS).fetchall()
            takeovers = conn.execute(TAKEOVERS).fetchall()
        # An operator's cancel and later retry is no takeover: leave those executions out.
        touched = {a.execution_id for a in history.actions}
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
        for key in sorted(set(by_key) - set(self.workload.deliveries)):
            self.fail("webhook_executions", f"execution {by_key[key]} for unsent key {key!r}")

    def check_settled(self) -> None:
        steps_by_execution: dict[str, dict[str, str]] = {}
        for s in self.steps:
            steps_by_execution.setdefault(s["execution_id"], {})[s["step_id"]] = s["status"]
        for e in self.executions:
            if e["status"] not in SETTLED:
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
            "duplicate_deliveries": self.workload.duplicate_deliveries,
            "poisoned_delays": self.workload.poisoned,
            "api_calls": len(self.history.calls),
            "faults": dict(Counter(f.op for f in self.history.faults)),
            "operator_actions": dict(
                Counter(f"{a.action} {a.status}" for a in self.history.actions)
            ),
            "worker_log_lines": dict(levels),
            "takeover_s": {
                "count": len(takeovers),
                "median": round(takeovers[len(takeovers) // 2], 1) if takeovers else None,
                "max": round(takeovers[-1], 1) if takeovers else None,
            },
        }


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
