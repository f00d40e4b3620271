"""The checks of this round's promises in the randomized run (issues 39, 44), run by
checker.Checker after the quiet period on what the database holds at the end:

- event_consumed_twice / event_wrong_output / event_lost / event_answer
  (docs/contract.md#events; the sender is tests/soak/keyed_events.py): a waiting step took
  more events than it had rounds, or an event of another name or key; a wait step that
  succeeded by an event does not hold exactly its last consumed event's payload, or
  succeeded with none taken; an event acknowledged (200/202: it and its offer had
  committed) before the final round of its order's wait timed out (the round's
  started_at + timeout_s, both the database's clock, as the wait's own check is) and never
  taken by that step, where no operator but a retry touched the execution — the wait was
  open, or opened later with the event kept, so it had to take it; a redelivery that named
  another event, or any answer but 200/202 (409: the same identity changed);
- attribute_mismatch (docs/contract.md#search-attributes): an execution of a workflow that
  declares `attributes` whose attribute rows are not its input's values (replays and
  re-ingests included);
- failure_group_missing / failure_group_count (docs/contract.md#failure-groups): a failed or
  needs_attention execution with a failed or unknown step the engine recorded (no operator
  resolve or wait fail on it) not linked to a group of its own workflow; a group counting
  fewer failures than the executions linked to it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from tests.soak.keyed_events import (
    AWAIT_TIMEOUT_S,
    AWAITED,
    EVENT_NAME,
    WAIT_STEP,
    EventSender,
    SentEvent,
)

if TYPE_CHECKING:
    from tests.soak.checker import Checker

# The event sender's clock (time.time()) against PostgreSQL's now(): one machine.
CLOCK_SLACK_S = 0.25
WAIT_ENDS = ("wait.resumed", "wait.timed_out", "wait.completed", "wait.failed")
WAIT_ROUNDS = f"""
SELECT e.id::text AS execution_id, e.status AS execution_status, e.input ->> 'order_id' AS key,
       e.cancel_requested_at IS NOT NULL AS cancel_requested, s.status, s.output,
       extract(epoch FROM s.started_at)::float AS opened,
       (SELECT v.kind FROM execution_events v
        WHERE v.execution_id = e.id AND v.step_id = s.step_id
          AND v.kind IN ({", ".join(f"'{k}'" for k in WAIT_ENDS)})
        ORDER BY v.id DESC LIMIT 1) AS ended_by
FROM executions e JOIN workflows w ON w.id = e.workflow_id
JOIN steps s ON s.execution_id = e.id AND s.step_id = %(step)s
WHERE w.key = %(workflow)s
"""
CONSUMPTIONS = """
SELECT c.execution_id::text AS execution_id, c.step_id, c.event_id::text AS event_id,
       v.name, v.key, v.delivery_id, v.payload
FROM event_consumptions c JOIN events v ON v.id = c.event_id
ORDER BY c.consumed_at, c.event_id
"""
ATTRIBUTES = "SELECT execution_id::text AS execution_id, name, value FROM execution_attributes"
FAILED_EXECUTIONS = """
SELECT e.id::text AS id, w.key AS workflow, e.status, e.workflow_id, e.failure_group_id,
       g.workflow_id AS group_workflow_id
FROM executions e JOIN workflows w ON w.id = e.workflow_id
LEFT JOIN failure_groups g ON g.id = e.failure_group_id
WHERE e.status IN ('failed', 'needs_attention')
  AND EXISTS (SELECT 1 FROM steps s WHERE s.execution_id = e.id
              AND s.status IN ('failed', 'unknown'))
"""
GROUP_COUNTS = """
SELECT g.id, w.key AS workflow, g.step_id, g.count, count(e.id) AS linked
FROM failure_groups g JOIN workflows w ON w.id = g.workflow_id
LEFT JOIN executions e ON e.failure_group_id = g.id
GROUP BY g.id, w.key
"""
# Operator actions that end a step or an execution by hand: what the engine did not record.
BY_HAND = frozenset({"resolve", "fail_wait", "complete"})


class Promises:
    """Reads what the three checks need, once; each check adds its violations."""

    def __init__(self, checker: Checker, sender: EventSender | None) -> None:
        self.checker = checker
        self.sender = sender
        with psycopg.connect(
            checker.cluster.database_url, autocommit=True, row_factory=dict_row
        ) as conn:
            self.rounds = conn.execute(
                WAIT_ROUNDS, {"workflow": AWAITED, "step": WAIT_STEP}
            ).fetchall()
            self.consumed = conn.execute(CONSUMPTIONS).fetchall()
            self.attributes = conn.execute(ATTRIBUTES).fetchall()
            self.failed = conn.execute(FAILED_EXECUTIONS).fetchall()
            self.group_counts = conn.execute(GROUP_COUNTS).fetchall()
        self.actions: dict[str, list[Any]] = defaultdict(list)
        for action in checker.history.actions:
            self.actions[action.execution_id].append(action)

    def run(self) -> None:
        if self.sender is not None:
            self.check_events()
        self.check_attributes()
        self.check_failure_groups()

    def _retries(self, execution_id: str) -> int:
        return sum(
            1
            for a in self.actions[execution_id]
            if a.action == "retry" and a.status is not None and a.status < 300
        )

    def check_events(self) -> None:
        assert self.sender is not None
        fail = self.checker.fail
        by_step: dict[str, list[dict[str, Any]]] = defaultdict(list)
        keys = {r["execution_id"]: r["key"] for r in self.rounds}
        for c in self.consumed:
            by_step[f"{c['execution_id']}/{c['step_id']}"].append(c)
            if c["name"] != EVENT_NAME or keys.get(c["execution_id"]) != c["key"]:
                fail(
                    "event_consumed_twice",
                    f"{c['execution_id']} {c['step_id']} took {c['name']} {c['key']!r}"
                    f" (its key: {keys.get(c['execution_id'])!r})",
                )
        for delivery, event in sorted(self.sender.events.items()):
            ids = {t.event_id for t in event.tries if t.event_id}
            odd = [t.status for t in event.tries if t.status not in (200, 202, None)]
            if len(ids) > 1 or [s for s in odd if s < 500]:
                fail("event_answer", f"{delivery} {event.key}: ids {sorted(ids)}, answers {odd}")
        for r in self.rounds:
            self._check_round(r, by_step[f"{r['execution_id']}/{WAIT_STEP}"])

    def _check_round(self, r: dict[str, Any], taken: list[dict[str, Any]]) -> None:
        fail, eid = self.checker.fail, r["execution_id"]
        if len(taken) > 1 + self._retries(eid):
            fail(
                "event_consumed_twice",
                f"{eid} {WAIT_STEP} took {[c['delivery_id'] for c in taken]} in"
                f" {1 + self._retries(eid)} round(s); operator: {self.checker.operator_on(eid)}",
            )
        touched = any(a.action != "retry" for a in self.actions[eid])
        by_event = r["ended_by"] == "wait.resumed"
        if r["status"] == "succeeded" and (by_event or not touched):
            if not taken:
                fail("event_wrong_output", f"{eid} {WAIT_STEP} succeeded without an event")
            elif r["output"] != taken[-1]["payload"]:
                fail(
                    "event_wrong_output",
                    f"{eid} {WAIT_STEP} output {r['output']!r}, took"
                    f" {taken[-1]['delivery_id']} {taken[-1]['payload']!r}",
                )
        assert self.sender is not None
        if touched or r["cancel_requested"]:
            return
        for delivery, margin in lost_events(r, taken, self.sender.events):
            event = self.sender.events[delivery]
            fail(
                "event_lost",
                f"{eid} {r['key']}: event {delivery} acknowledged {margin:.2f}s before its"
                f" wait's timeout (t={self.checker.when(event.acked or 0.0)}), not taken;"
                f" tries {event.tries}; operator: {self.checker.operator_on(eid)}",
            )

    def check_attributes(self) -> None:
        """Each execution of a workflow declaring attributes has exactly its input's."""
        declared = {
            key: d["attributes"] for key, d in self.checker.published.items() if d.get("attributes")
        }
        stored: dict[str, dict[str, str]] = defaultdict(dict)
        for a in self.attributes:
            stored[a["execution_id"]][a["name"]] = a["value"]
        for e in self.checker.executions:
            templates = declared.get(e["workflow"])
            if templates is None:
                continue
            body = json.loads(e["input"]) if e["input"] else {}
            want = {}
            for name, template in templates.items():
                field = template.strip("{} ").removeprefix("input.")
                value = body.get(field) if isinstance(body, dict) else None
                if value not in (None, ""):
                    want[name] = value if isinstance(value, str) else json.dumps(value)
            if stored.get(e["id"], {}) != want:
                fail_on = "a replay" if e["replay_of"] else "an execution"
                self.checker.fail(
                    "attribute_mismatch",
                    f"{fail_on} {e['id']} of {e['workflow']}: stored {stored.get(e['id'])},"
                    f" input says {want}",
                )

    def check_failure_groups(self) -> None:
        for e in self.failed:
            if any(a.action in BY_HAND for a in self.actions[e["id"]]):
                continue
            if e["failure_group_id"] is None or e["group_workflow_id"] != e["workflow_id"]:
                self.checker.fail(
                    "failure_group_missing",
                    f"{e['status']} {e['workflow']} {e['id']}: group {e['failure_group_id']}"
                    f" (of workflow id {e['group_workflow_id']}, its own {e['workflow_id']});"
                    f" operator: {self.checker.operator_on(e['id'])}",
                )
        for g in self.group_counts:
            if g["count"] < g["linked"]:
                self.checker.fail(
                    "failure_group_count",
                    f"group {g['id']} ({g['workflow']} {g['step_id']!r}) counts {g['count']},"
                    f" {g['linked']} executions link to it",
                )

    def figures(self) -> dict[str, Any]:
        """What the run covered of them."""
        found: dict[str, Any] = {
            "event_waits": dict(
                Counter(f"{r['status']} {r['ended_by'] or '-'}" for r in self.rounds)
            ),
            "event_consumptions": len(self.consumed),
            "attribute_rows": len(self.attributes),
            "failure_groups": len(self.group_counts),
            "failed_grouped": sum(1 for e in self.failed if e["failure_group_id"] is not None),
        }
        if self.sender is not None:
            found["event_moments"] = self.moments()
            found["events_sent"] = {
                "events": len(self.sender.events),
                "acked": sum(1 for e in self.sender.events.values() if e.acked is not None),
                "redeliveries": self.sender.redeliveries,
                "orphans": self.sender.orphans,
            }
        return found

    def moments(self) -> dict[str, int]:
        """When each order's events were acknowledged against its wait's last round:
        before it opened (lookback), while open, within a second of the timeout (racing
        it), after the timeout."""
        assert self.sender is not None
        rounds = {r["key"]: r["opened"] for r in self.rounds if r["opened"] is not None}
        found: Counter[str] = Counter()
        for event in self.sender.events.values():
            opened, acked = rounds.get(event.key), event.acked
            if opened is None or acked is None:
                continue
            closes = opened + AWAIT_TIMEOUT_S
            found[
                "before_open"
                if acked < opened
                else "racing_timeout"
                if abs(acked - closes) < 1.0
                else "while_open"
                if acked < closes
                else "after_timeout"
            ] += 1
        return dict(sorted(found.items()))


def lost_events(
    r: dict[str, Any], taken: list[dict[str, Any]], events: dict[str, SentEvent]
) -> list[tuple[str, float]]:
    """The events of a wait's key acknowledged more than CLOCK_SLACK_S before its final
    round timed out (opened + AWAIT_TIMEOUT_S, both the database's clock) that no round
    of the step took, with how long before: when its final round did time out. An event
    acknowledged had committed and been offered; one acknowledged before the wait opened
    was kept, so the opening wait had to take it."""
    if r["ended_by"] != "wait.timed_out" or r["status"] != "failed" or r["opened"] is None:
        return []
    closes = r["opened"] + AWAIT_TIMEOUT_S
    took = {c["delivery_id"] for c in taken}
    found = []
    for delivery, event in sorted(events.items()):
        acked = event.acked
        if event.key != r["key"] or delivery in took or acked is None:
            continue
        if acked + CLOCK_SLACK_S < closes:
            found.append((delivery, closes - acked))
    return found
