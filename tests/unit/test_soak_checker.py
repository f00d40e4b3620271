"""The randomized run's rules (tests/soak/checker.py): which sends of an unsafe request an
operator asked for, which late sends a freeze explains, what the map and debounce/batch
checks report, and how patient the run's webhook sender is. A checker that miscounts
would hide duplicates or cry wolf."""

from __future__ import annotations

import json
import random
from typing import Any

from tests.soak.checker import (
    SENT_AFTER_RESUME_S,
    Checker,
    Freeze,
    freezes,
    sent_after_freeze,
    unasked_sends,
)
from tests.soak.features import Attempt
from tests.soak.history import Fault, OperatorAction
from tests.soak.nemesis import WorkTime
from tests.soak.workload import (
    BACKOFF_CAP_S,
    BACKOFF_FIRST_S,
    SEND_BUDGET_S,
    TargetPath,
    backoff,
    patient,
    retry_after,
)
from tests.support.target import Received, Reply

EID = "01a23100-0000-7000-8000-000000000000"


def _action(wall: float, action: str, before: str, status: int | None = None) -> OperatorAction:
    code = status if status is not None else (202 if action == "retry" else 200)
    step = "charge" if action == "resolve" else None
    return OperatorAction(
        0.0, wall, action, EID, code, step_id=step, steps_before={"charge": before}
    )


def test_one_send_needs_no_operator() -> None:
    assert unasked_sends([], EID, "charge", [1.0]) == []


def test_a_second_send_nobody_asked_for_is_reported() -> None:
    assert unasked_sends([], EID, "charge", [1.0, 2.0]) == [2.0]


def test_a_retry_of_an_unknown_or_failed_step_allows_one_more_send() -> None:
    for before in ("unknown", "failed"):
        assert unasked_sends([_action(1.5, "retry", before)], EID, "charge", [1.0, 2.0]) == []
        assert unasked_sends([_action(1.5, "retry", before)], EID, "charge", [1.0, 2, 3]) == [3]


def test_a_retry_of_a_cancelled_step_asks_for_nothing() -> None:
    assert unasked_sends([_action(1.5, "retry", "cancelled")], EID, "charge", [1.0, 2.0]) == [2.0]


def test_a_refused_retry_asks_for_nothing() -> None:
    refused = _action(1.5, "retry", "unknown", status=409)
    assert unasked_sends([refused], EID, "charge", [1.0, 2.0]) == [2.0]


def test_after_a_resolve_no_send_is_asked_for_until_the_next_retry() -> None:
    resolved = _action(1.5, "resolve", "unknown")
    # The step was never sent before it was reaped; a worker sent it after the resolve.
    assert unasked_sends([resolved], EID, "charge", [2.0]) == [2.0]
    retried = _action(3.0, "retry", "failed")
    assert unasked_sends([resolved, retried], EID, "charge", [1.0, 4.0]) == []


def test_a_retry_counts_from_when_the_operator_looked() -> None:
    # A stale send between the look and the retry's own send: two sends, one allowed.
    assert unasked_sends([_action(1.5, "retry", "unknown")], EID, "charge", [1.0, 1.6, 2.0]) == [
        2.0
    ]


def test_other_executions_do_not_count() -> None:
    other = OperatorAction(0.0, 1.5, "retry", "another", 202, steps_before={"charge": "unknown"})
    assert unasked_sends([other], EID, "charge", [1.0, 2.0]) == [2.0]


# ---- stale sends and freezes (seed 204: a SIGSTOP between the fence and the first byte) --


def _fault(at: float, op: str, target: str) -> Fault:
    return Fault(at, op, target)


def test_a_freeze_is_paired_with_its_resume_or_else_the_heal() -> None:
    faults = [
        _fault(1.0, "pause", "w1"),
        _fault(2.0, "pause", "w2"),
        _fault(3.0, "resume", "w1"),
        _fault(9.0, "quiet", "all"),
    ]
    assert freezes(faults, 100.0) == [Freeze("w1", 101.0, 103.0), Freeze("w2", 102.0, 109.0)]


def test_a_request_arriving_as_its_frozen_worker_resumes_is_no_stale_send() -> None:
    frozen = [Freeze("w1", 10.0, 13.0)]
    # claimed at 9.9, frozen at 10.0 (past the fence), sent the moment it ran again
    assert sent_after_freeze("w1", 9.9, 13.02, frozen)


def test_a_freeze_before_the_claim_or_of_another_worker_excuses_nothing() -> None:
    frozen = [Freeze("w1", 10.0, 13.0)]
    assert not sent_after_freeze("w1", 11.0, 13.02, frozen)  # claimed while frozen: no
    assert not sent_after_freeze("w2", 9.9, 13.02, frozen)


def test_a_request_long_after_the_resume_is_still_a_stale_send() -> None:
    frozen = [Freeze("w1", 10.0, 13.0)]
    assert not sent_after_freeze("w1", 9.9, 13.0 + SENT_AFTER_RESUME_S + 0.5, frozen)
    assert not sent_after_freeze("w1", 9.9, 12.0, frozen)  # while still frozen: not ours


def test_most_at_once_counts_owners_not_requests() -> None:
    # Two requests of one execution overlap: one owner; a third execution joins at 1.5.
    spans = [(0.0, 2.0, "a"), (1.0, 3.0, "a"), (1.5, 2.5, "b"), (3.5, 4.0, "c")]
    assert Checker.most_at_once(spans) == (2, 1.5, ["a", "b"])


def test_spans_that_touch_do_not_overlap() -> None:
    assert Checker.most_at_once([(0.0, 1.0, "a"), (1.0, 2.0, "b")])[0] == 1


def test_the_recovery_deadline_skips_time_nobody_could_work() -> None:
    assert Checker.deadline(10.0, 20.0, []) == 30.0
    # Down 15-25 (10 s): the bound stretches by that much; a gap before the kill counts not.
    assert Checker.deadline(10.0, 20.0, [(0.0, 5.0), (15.0, 25.0)]) == 40.0
    # A gap already in progress at the kill counts from the kill on.
    assert Checker.deadline(10.0, 20.0, [(5.0, 12.0)]) == 32.0
    # A gap that begins after the deadline changes nothing.
    assert Checker.deadline(10.0, 20.0, [(31.0, 50.0)]) == 30.0


def test_an_empty_span_holds_nothing() -> None:
    # An answer at once (no delay): its end sorts before its start; it must not stay live.
    assert Checker.most_at_once([(1.0, 1.0, "a"), (2.0, 3.0, "b")])[0] == 1


def test_a_claim_admitted_after_the_probe_closed_the_circuit_is_no_violation() -> None:
    # Seed 2323: open at 184.52, the probe's claim turns it half-open at 189.56 and writes
    # its attempt just after; its success closes it at 189.80; a claim whose transaction
    # began at 189.54 (its attempt's started_at) waited and was admitted at 189.85.
    changes = [("closed", 100.0), ("open", 184.52), ("half_open", 189.56), ("closed", 189.80)]
    written = [(189.57, "probe"), (189.85, "after")]
    assert Checker.claimed_while_open(changes, written, exact=True) == []
    # Judged by started_at instead, both fell inside the open span: the false report.
    started = [(189.50, "probe"), (189.54, "after")]
    assert Checker.claimed_while_open(changes, started, exact=False) == [
        (184.52, ("half_open", 189.56), ["probe", "after"])
    ]


def test_a_claim_written_while_the_circuit_is_open_is_reported() -> None:
    changes = [("open", 10.0), ("half_open", 13.0), ("open", 14.0)]
    # Written before the probe's change to half-open: admitted while open.
    assert Checker.claimed_while_open(changes, [(12.0, "early"), (13.01, "probe")], True) == [
        (10.0, ("half_open", 13.0), ["early"])
    ]
    # By started_at the probe may fall inside (its transaction began before its change).
    assert Checker.claimed_while_open(changes, [(12.9, "probe")], exact=False) == []
    # Open to the end (no probe yet): nothing may be claimed.
    assert Checker.claimed_while_open(changes, [(15.0, "late")], exact=False) == [
        (14.0, (None, float("inf")), ["late"])
    ]


def test_a_restarted_worker_counts_from_its_start_and_a_dead_one_never() -> None:
    faults = [
        _fault(10.0, "kill", "soak-w1.1"),
        _fault(11.0, "restart", "soak-w1.2"),  # paused and killed before it started
        _fault(12.0, "pause", "soak-w1.2"),
        _fault(15.0, "kill", "soak-w1.2"),
        _fault(15.5, "resume", "soak-w1.2"),  # SIGCONT to the dead process revives nothing
        _fault(16.0, "restart", "soak-w1.3"),  # logged that it started at 19.0
        _fault(25.0, "pause", "soak-w1.3"),
        _fault(27.0, "resume", "soak-w1.3"),
    ]
    spans = Checker.down_spans(faults, 0.0, 100.0, {"soak-w1.3": 19.0})
    assert sorted(spans["soak-w1"]) == [(10.0, 19.0), (12.0, 15.5), (25.0, 27.0)]
    # One that never started stays down to the end.
    assert Checker.down_spans(faults[:2], 0.0, 100.0, {}) == {"soak-w1": [(10.0, 100.0)]}


class _Answer:
    """A stand-in for a requests.Response: a status and headers (no network here)."""

    def __init__(self, status: int, retry_after: str | None = None) -> None:
        self.status_code = status
        self.headers = {"Retry-After": retry_after} if retry_after is not None else {}


class _Clock:
    """A clock the sender's sleeps advance (no real waiting in a unit test)."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _send(
    statuses: list[int | None], budget_s: float, retry_after: str | None = None
) -> tuple[list[float], list[float]]:
    """patient() against answers in this order (the last one repeats): the times of the
    tries and the waits between them."""
    clock, calls = _Clock(), []

    def attempt() -> tuple[int | None, Any]:
        calls.append(clock.now)
        status = statuses[min(len(calls) - 1, len(statuses) - 1)]
        return status, (_Answer(status, retry_after) if status is not None else None)

    waits = patient(
        "k", attempt, lambda s: s == 202, budget_s, sleep=clock.sleep, clock=lambda: clock.now
    )
    return calls, waits


def test_the_sender_retries_outages_until_accepted() -> None:
    # Seed 2323 again: five 503s in about 2 s while PostgreSQL was down 6.9 s; the old
    # sender (5 tries, 0.3 s apart) had given up long before it came back.
    calls, _ = _send([503, None, 503, 503, 503, 503, 503, 202], budget_s=40.0)
    assert len(calls) == 8 and calls[-1] > 6.9


def test_the_sender_gives_up_after_its_budget_so_the_checker_sees_it() -> None:
    calls, waits = _send([503], budget_s=SEND_BUDGET_S)
    assert calls[-1] <= SEND_BUDGET_S < calls[-1] + BACKOFF_CAP_S
    assert len(calls) > 8 and max(waits) <= BACKOFF_CAP_S


def test_the_sender_does_not_retry_a_client_error() -> None:
    calls, _ = _send([400, 202], budget_s=40.0)
    assert len(calls) == 1


def test_the_sender_waits_what_retry_after_asks() -> None:
    calls, waits = _send([429, 503, 202], budget_s=40.0, retry_after="3")
    assert len(calls) == 3 and waits[0] >= 3.0 and waits[1] >= 3.0
    assert retry_after(_Answer(503, "2")) == 2.0 and retry_after(_Answer(500, "2")) is None


def test_the_backoff_grows_to_its_cap_with_jitter() -> None:
    rng = random.Random(1)
    waits = [backoff(n, rng) for n in range(12)]
    assert waits[0] <= BACKOFF_FIRST_S and max(waits) <= BACKOFF_CAP_S
    assert waits[-1] >= BACKOFF_CAP_S / 2


# ---- the map and debounce/batch checks, on made-up records -------------------------


class _History:
    wall_started = 0.0
    actions: list[OperatorAction] = []


def _checker(**fields: Any) -> Checker:
    """A Checker over given records (what __init__ would read from the run)."""
    checker = Checker.__new__(Checker)
    checker.violations, checker.figures_extra, checker.held_back = [], {}, set()
    checker.history = _History()  # type: ignore[assignment]
    checker.replies, checker.requests, checker.attempts, checker.features = {}, [], [], None
    for name, value in fields.items():
        setattr(checker, name, value)
    return checker


def _item_request(index: int, at: float, answer: str) -> tuple[Any, Any, Any]:
    path = f"/t/mapped/lines%5B{index}%5D.reserve/1/{EID}"
    req = Received("POST", path, {}, b"{}", at)
    return TargetPath.parse(path), req, Reply(json={"id": answer}, delay_s=0.5)


def _map_run(order: list[int], starts: list[float]) -> Checker:
    sent = [_item_request(i, at, f"a{i}") for i, at in zip(range(3), starts, strict=True)]
    output = [{"sku": f"s{i}", "got": f"a{i}"} for i in order]
    return _checker(
        executions=[
            {
                "id": EID,
                "workflow": "mapped",
                "input": json.dumps({"lines": [{"sku": f"s{i}"} for i in range(3)]}),
            }
        ],
        map_rows=[
            {
                "execution_id": EID,
                "step_id": "lines",
                "status": "succeeded",
                "output": json.dumps(output),
            }
        ],
        attempts=[
            {
                "execution_id": EID,
                "step_id": f"lines[{i}].reserve",
                "outcome": "succeeded",
                "attempt": 1,
                "fencing_token": 1,
                "worker": "w",
                "http_status": 200,
                "error": None,
            }
            for i in range(3)
        ],
        requests=[(where, req) for where, req, _ in sent],
        replies={id(req): reply for _, req, reply in sent},
    )


def test_a_map_in_order_within_max_parallel_is_clean() -> None:
    checker = _map_run([0, 1, 2], [0.0, 0.1, 0.7])
    checker.check_maps()
    assert checker.violations == []
    assert checker.figures_extra["map"] == {"executions": 1, "items": 3, "succeeded": 1}


def test_a_map_output_out_of_order_and_three_items_at_once_are_reported() -> None:
    checker = _map_run([1, 0, 2], [0.0, 0.1, 0.2])
    checker.check_maps()
    assert sorted(v.category for v in checker.violations) == [
        "map_output",
        "map_parallel_exceeded",
    ]


class _Features:
    def __init__(self, sent: dict[str, Any]) -> None:
        self.sent = sent


def _group_run(recorded: list[tuple[int, str]], inputs: dict[str, Any]) -> Checker:
    """Two accepted batch events (n 1 and 2) named execution B; `recorded` lists the group
    event rows (group id, key); `inputs` each execution's input."""
    sent = {
        f"k{n}": ("batched", {"n": n, "k": "a"}, [Attempt(0.0, 0.1, 202, "B", False)])
        for n in (1, 2)
    }
    return _checker(
        features=_Features(sent),
        groups=[
            {
                "id": 1,
                "workflow": "batched",
                "kind": "batch",
                "group_key": "",
                "status": "started",
                "execution_id": "B",
                "events": 2,
                "reason": None,
            },
        ],
        group_events=[
            {
                "id": i,
                "group_id": gid,
                "idempotency_key": key,
                "body": json.dumps(sent[key][1]),
                "received": 0.05,
            }
            for i, (gid, key) in enumerate(recorded)
        ],
        executions=[
            {"id": eid, "workflow": "batched", "input": json.dumps(data)}
            for eid, data in inputs.items()
        ],
    )


def test_every_accepted_event_in_its_one_batch_is_clean() -> None:
    events = {"events": [{"n": 1, "k": "a"}, {"n": 2, "k": "a"}]}
    checker = _group_run([(1, "k1"), (1, "k2")], {"B": events})
    checker.check_groups()
    assert checker.violations == []


def test_an_event_lost_or_in_two_batches_is_reported() -> None:
    events = {"events": [{"n": 1, "k": "a"}, {"n": 2, "k": "a"}]}
    checker = _group_run([(1, "k1")], {"B": events, "C": {"events": [{"n": 1, "k": "a"}]}})
    checker.check_groups()
    found = sorted(v.category for v in checker.violations)
    # k2 recorded nowhere; the group counts 2 but holds 1, and its input is not its events;
    # event 1 in two executions.
    assert found.count("group_event") == 3 and "group_input" in found, found


# ---- child workflows (docs/contract.md#child-workflows) ------------------------------------------

PID = "01a23100-0000-7000-8000-0000000000aa"


def _child(cid: str, token: int, status: str, *, cancel: bool = False) -> dict[str, Any]:
    return {
        "id": cid,
        "workflow": "childed",
        "status": status,
        "parent_id": PID,
        "parent_step": "call",
        "idempotency_key": f"child:{PID}:call:{token}",
        "cancel_requested": cancel,
    }


def _child_run(
    parent: str,
    children: list[dict[str, Any]],
    call: tuple[str, int, Any],
    ended: list[tuple[int, str]],
    *,
    shape: Any = None,
    posts: int = 1,
) -> Checker:
    """A `parented` execution with status `parent` whose step `call` is (status, token,
    output), its attempts `ended` (token, outcome), the children given, child c1's last
    step output `shape`, and `posts` unsafe POSTs of c1 answered book_1_<i>."""
    sent = []
    for i in range(posts):
        path = "/t/childed/book/1/c1"
        req = Received("POST", path, {}, b"{}", 1.0 + i)
        sent.append((TargetPath.parse(path), req, Reply(json={"id": f"book_1_{i}"})))
    status, token, output = call
    rows = [
        {
            "execution_id": PID,
            "step_id": "call",
            "status": status,
            "fencing_token": token,
            "output": json.dumps(output),
        },
        {
            "execution_id": "c1",
            "step_id": "shape",
            "status": "succeeded",
            "fencing_token": 0,
            "output": json.dumps(shape),
        },
    ]
    attempt = {"worker": None, "http_status": None, "error": None, "attempt": 1}
    return _checker(
        executions=[
            {
                "id": PID,
                "workflow": "parented",
                "status": parent,
                "parent_id": None,
                "parent_step": None,
                "idempotency_key": "soak-f1",
                "cancel_requested": parent == "cancelled",
            },
            *children,
        ],
        child_rows=rows,
        attempts=[
            {**attempt, "execution_id": PID, "step_id": "call", "fencing_token": t, "outcome": o}
            for t, o in ended
        ],
        requests=[(where, req) for where, req, _ in sent],
        replies={id(req): reply for _, req, reply in sent},
    )


def _one_child_succeeded(output: dict[str, Any], shape: dict[str, Any]) -> Any:
    """A succeeded parent whose step took `output` from its one succeeded child, which
    shaped `shape` from the target's answer."""
    return _child_run(
        "succeeded",
        [_child("c1", 0, "succeeded")],
        ("succeeded", 0, output),
        [(0, "succeeded")],
        shape=shape,
    )


def test_a_parent_that_took_its_one_childs_output_is_clean() -> None:
    out = {"sku": "sku-1", "booking": "book_1_0"}
    checker = _one_child_succeeded(out, shape=out)
    checker.check_children()
    assert checker.violations == []
    assert checker.figures_extra["children"] == {
        "parents": 1,
        "children": 1,
        "rounds > 1": 0,
        "succeeded": 1,
    }


def test_a_retried_parent_has_one_child_per_round_and_the_old_one_ended() -> None:
    # Round 0's child failed, the operator retried the parent: round 1 waits on c2.
    checker = _child_run(
        "waiting",
        [_child("c1", 0, "failed"), _child("c2", 1, "running")],
        ("waiting", 1, {"execution_id": "c2", "workflow": "childed", "version": 1}),
        [(0, "failed")],
    )
    checker.check_children()
    assert checker.violations == []
    assert checker.figures_extra["children"]["rounds > 1"] == 1


def test_a_round_with_two_children_or_none_is_reported() -> None:
    twice = _child_run(
        "failed",
        [_child("c1", 0, "failed"), _child("c2", 0, "failed")],
        ("failed", 0, None),
        [(0, "failed")],
    )
    twice.check_children()
    assert [v.category for v in twice.violations] == ["child_round"]
    none = _child_run("failed", [], ("failed", 0, None), [(0, "failed")])
    none.check_children()
    assert [v.category for v in none.violations] == ["child_round"]


def test_an_output_that_is_not_the_childs_is_reported() -> None:
    mine = {"sku": "sku-1", "booking": "book_1_0"}
    other = _one_child_succeeded({"sku": "sku-1", "booking": "book_1_7"}, shape=mine)
    other.check_children()
    assert [v.category for v in other.violations] == ["child_output"]
    # The child's own output, but no answer the target gave it.
    made_up = {"sku": "sku-1", "booking": "book_1_7"}
    invented = _one_child_succeeded(made_up, shape=made_up)
    invented.check_children()
    assert [v.category for v in invented.violations] == ["child_output"]


def test_a_cancelled_parent_with_a_live_child_is_reported_unless_its_cancel_was_asked() -> None:
    left = _child_run("cancelled", [_child("c1", 0, "needs_attention")], ("cancelled", 0, None), [])
    left.check_children()
    assert [v.category for v in left.violations] == ["child_left_running"]
    asked = _child_run(
        "cancelled",
        [_child("c1", 0, "needs_attention", cancel=True)],
        ("cancelled", 0, None),
        [],
    )
    asked.check_children()
    assert asked.violations == []


def test_a_child_that_posted_twice_unasked_is_reported() -> None:
    checker = _child_run(
        "failed", [_child("c1", 0, "failed")], ("failed", 0, None), [(0, "failed")], posts=2
    )
    checker.check_children()
    assert [v.category for v in checker.violations] == ["child_post_twice"]


class _Sources:
    def __init__(self, **sources: Any) -> None:
        self.sources = sources


def test_a_source_delivery_routed_twice_differently_is_reported() -> None:
    from tests.soak.features import SourceDelivery

    same = SourceDelivery("push", {}, [(202, ["a", "b"]), (503, []), (202, ["b", "a"])])
    rerouted = SourceDelivery("push", {}, [(202, ["a"]), (202, ["c"])])
    checker = _checker(features=_Sources(same=same, rerouted=rerouted))
    checker.check_source_routing()
    assert [(v.category, v.detail.split(" ")[0]) for v in checker.violations] == [
        ("source_routing", "rerouted")
    ]


def test_a_frozen_workers_bound_counts_only_time_in_which_others_could_work() -> None:
    # Seed 3912: a frozen worker's cancelled executions were judged late after 23 s of
    # wall time of which every other worker was killed, stopped or starting for 8.
    now = [0.0]
    working = [True]
    budget = WorkTime(10.0, lambda: working[0], clock=lambda: now[0])
    for _ in range(8):  # 4 s of work
        now[0] += 0.5
        assert budget.left()
    working[0] = False
    for _ in range(16):  # 8 s in which no one else could work: not counted
        now[0] += 0.5
        assert budget.left()
    working[0] = True
    for _ in range(11):  # 5.5 s more: 9.5 s of work in all
        now[0] += 0.5
        assert budget.left()
    now[0] += 1.0
    assert not budget.left()
