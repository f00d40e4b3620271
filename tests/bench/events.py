"""`bin/bench --phase events`: N executions waiting for an event (docs/contract.md#events)
receiving N events through POST /api/v1/events, against N plain webhooks.

Starts bin/api and bin/worker in a private database (tests/bench session). Events: N
executions of a workflow whose root is a wait for `bench.settled` with its own key, then
a transform, are started and left waiting; N events, one per key, are then sent from 16
threads. Webhooks: N webhooks of a workflow with one transform. Each figure is N over
the wall time from the first request to the last execution succeeded (and to the last
answer: the senders' rate). A figure, not a test: nothing is asserted.

    bin/bench --phase events [--events N]      (default 500; the documented run 10,000)

On the 2-core development machine shared with other sessions (2026-12-07): N = 10,000,
events 41/s, plain webhooks 80/s; N = 500, events 55/s, webhooks 109/s. An event costs
its record, the search for its waits and one unit of work per waiting execution (a lock,
a load, a save, each its own commit) where a webhook is one statement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from tests.bench.infra import BenchError
from tests.bench.session import Session
from tests.support.definitions import transform, workflow

SENDERS = 16
WAITING = workflow(
    {
        "id": "paid",
        "type": "wait",
        "event": "bench.settled",
        "key": "{{ input.k }}",
        "timeout_s": 3600,
    },
    transform("done", {"amount": "{{ paid.amount }}"}, after=("paid",)),
    name="Event waits",
)
PLAIN = workflow(transform("done", {"amount": "{{ input.amount }}"}), name="Plain webhooks")
SUCCEEDED = "SELECT count(*) FROM executions WHERE workflow_id = %s AND status = 'succeeded'"


def _until(s: Session, sql: str, params: Any, wanted: int, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while int(s.scalar(sql, params)) < wanted:
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _send_all(calls: list[Callable[[requests.Session], int]], wanted: int) -> float:
    """Every call from SENDERS threads, each with its own session; the seconds it took."""
    sessions = [requests.Session() for _ in range(SENDERS)]
    started = time.monotonic()
    with ThreadPoolExecutor(SENDERS) as pool:
        codes = list(pool.map(lambda n: calls[n](sessions[n % SENDERS]), range(len(calls))))
    if set(codes) != {wanted}:
        raise BenchError(f"answers {sorted(set(codes))}, not only {wanted}")
    return time.monotonic() - started


def _events(s: Session, n: int) -> dict[str, float]:
    flow = s.publish("ev", WAITING)
    hook = s.hook_url("ev")
    starts = [
        lambda http, k=k: http.post(hook, json={"k": f"k-{k}"}, timeout=60).status_code
        for k in range(n)
    ]
    _send_all(starts, 202)
    _until(s, "SELECT count(*) FROM event_waits", None, n, 600, "every wait to open")
    url = f"{s.api_url}/api/v1/events"
    auth = {"Authorization": f"Bearer {s.api_key}"}
    sends = [
        lambda http, k=k: (
            http.post(
                url,
                json={"name": "bench.settled", "key": f"k-{k}", "payload": {"amount": k}},
                headers=auth,
                timeout=60,
            ).status_code
        )
        for k in range(n)
    ]
    started = time.monotonic()
    sent_s = _send_all(sends, 202)
    _until(s, SUCCEEDED, (flow.workflow_id,), n, 600, "every waiting execution to succeed")
    return {"sent_per_s": n / sent_s, "done_per_s": n / (time.monotonic() - started)}


def _webhooks(s: Session, n: int) -> dict[str, float]:
    flow = s.publish("plain", PLAIN)
    hook = s.hook_url("plain")
    calls = [
        lambda http, k=k: http.post(hook, json={"amount": k}, timeout=60).status_code
        for k in range(n)
    ]
    started = time.monotonic()
    sent_s = _send_all(calls, 202)
    _until(s, SUCCEEDED, (flow.workflow_id,), n, 600, "every webhook's execution to succeed")
    return {"sent_per_s": n / sent_s, "done_per_s": n / (time.monotonic() - started)}


def run(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Events to N waiting executions, then N plain webhooks, on one API and one worker."""
    n = args.events
    started = time.monotonic()
    with Session.from_args(args) as s:
        s.start_api()
        s.start_worker()
        log(f"events: {n} waiting executions, {n} events")
        report: dict[str, Any] = {"n": n, "events": _events(s, n)}
        log(f"events: {n} plain webhooks")
        report["webhooks"] = _webhooks(s, n)
    report["duration_s"] = time.monotonic() - started
    return report


def table(report: dict[str, Any]) -> str:
    """The readable summary."""
    lines = [
        "",
        f"[events: N = {report['n']}, {SENDERS} senders, one bin/api and one bin/worker]",
        f"  {'':<34}{'sent/s':>10}{'done/s':>10}",
    ]
    for name, label in (
        ("events", "events to N waiting executions"),
        ("webhooks", "plain webhooks (one transform)"),
    ):
        r = report[name]
        lines.append(f"  {label:<34}{r['sent_per_s']:>10.0f}{r['done_per_s']:>10.0f}")
    lines.append(
        "  sent/s: the answers' rate; done/s: N over first request to last execution succeeded"
    )
    return "\n".join(lines)
