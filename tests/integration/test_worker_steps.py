"""Every step type and the DAG rules: run in the test's process (`in_process`, the API app
and the worker's executor), and through real bin/api and bin/worker processes where the
point is concurrency or the broker (delays are woken by the timer scan `wait` runs)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pika
import psycopg
import pytest

from tests.support.api import Api, step
from tests.support.definitions import transform, unsigned
from tests.support.inprocess import InProcess
from tests.support.processes import Process, wait_for
from tests.support.target import Received, Reply, Target


@pytest.fixture
def client(api: str, api_key: str, workers: Callable[..., Process]) -> Api:
    workers()
    return Api(api, api_key)


def test_templates_keep_json_types_and_render_text_inside_strings(
    in_process: InProcess, target: Target
) -> None:
    target.script = lambda r: Reply(json={"id": 7, "tags": ["a", "b"], "ok": True})
    in_process.publish(
        "types",
        unsigned(
            [
                {
                    "id": "get",
                    "type": "http_request",
                    "request": {"method": "GET", "url": f"{target.url}/items/{{{{ input.name }}}}"},
                },
                {
                    "id": "shape",
                    "type": "transform",
                    "depends_on": ["get"],
                    "output": {
                        "id": "{{ get.body.id }}",
                        "tags": "{{ get.body.tags }}",
                        "ok": "{{ get.body.ok }}",
                        "text": "id={{ get.body.id }} tags={{ get.body.tags }}",
                        "first": "{{ get.body.tags.0 }}",
                        "missing_null": "{{ input.nothing }}",
                    },
                },
                {
                    "id": "post",
                    "type": "http_request",
                    "depends_on": ["shape"],
                    "request": {
                        "method": "POST",
                        "url": f"{target.url}/sink",
                        "json": {"shape": "{{ shape }}", "n": "{{ input.n }}"},
                        "headers": {"X-Count": "{{ input.n }}"},
                    },
                },
            ]
        ),
    )
    eid = in_process.start("types", {"name": "a/b c", "n": 3, "nothing": None})
    done = in_process.wait(eid)
    assert done["status"] == "succeeded", done
    assert step(done, "shape")["output"] == {
        "id": 7,
        "tags": ["a", "b"],
        "ok": True,
        "text": 'id=7 tags=["a","b"]',
        "first": "a",
        "missing_null": None,
    }
    assert target.received[0].path == "/items/a%2Fb%20c"
    sink = target.requests_to("/sink")[0]
    assert sink.json() == {"shape": step(done, "shape")["output"], "n": 3}
    assert sink.headers["x-count"] == "3"
    assert sink.headers["content-type"] == "application/json"


def test_parallel_branches_overlap_and_the_join_waits_for_both(client: Api, target: Target) -> None:
    target.script = lambda r: Reply(json={"path": r.path}, delay_s=1.0)
    client.publish(
        "fan",
        unsigned(
            [
                {
                    "id": "left",
                    "type": "http_request",
                    "request": {"method": "GET", "url": f"{target.url}/l"},
                },
                {
                    "id": "right",
                    "type": "http_request",
                    "request": {"method": "GET", "url": f"{target.url}/r"},
                },
                {
                    "id": "join",
                    "type": "transform",
                    "depends_on": ["left", "right"],
                    "output": ["{{ left.body.path }}", "{{ right.body.path }}"],
                },
            ]
        ),
    )
    done = client.wait(client.start("fan", {}))
    assert step(done, "join")["output"] == ["/l", "/r"]
    first, second = sorted(target.received, key=lambda r: r.at)
    assert second.at - first.at < 0.9, "the branches ran one after the other"
    assert step(done, "join")["started_at"] >= max(
        step(done, "left")["finished_at"], step(done, "right")["finished_at"]
    )


def test_false_conditions_skip_and_skips_propagate(in_process: InProcess) -> None:
    over_100 = {"path": "a.total", "op": "gt", "value": 100}
    in_process.publish(
        "skip",
        unsigned(
            [
                transform("a", {"total": "{{ input.total }}"}),
                transform("big", "big", after=("a",), when=over_100),
                {"id": "after_big", "type": "transform", "depends_on": ["big"], "output": 1},
                {"id": "either", "type": "transform", "depends_on": ["a", "big"], "output": 2},
                {
                    "id": "vip",
                    "type": "transform",
                    "depends_on": ["a"],
                    "when": {"path": "input.tier", "op": "in", "value": ["gold", "vip"]},
                    "output": "vip",
                },
            ]
        ),
    )
    done = in_process.wait(in_process.start("skip", {"total": 50, "tier": "gold"}))
    statuses = {s["id"]: s["status"] for s in done["steps"]}
    assert statuses == {
        "a": "succeeded",
        "big": "skipped",
        "after_big": "skipped",
        "either": "succeeded",
        "vip": "succeeded",
    }
    assert done["status"] == "succeeded"


def test_delays_wait_in_the_database_then_continue(
    in_process: InProcess, db: psycopg.Connection
) -> None:
    until = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    in_process.publish(
        "delay",
        unsigned(
            [
                {"id": "pause", "type": "delay", "duration_s": 1},
                {
                    "id": "until",
                    "type": "delay",
                    "until": "{{ input.at }}",
                    "depends_on": ["pause"],
                },
                {"id": "after", "type": "transform", "depends_on": ["until"], "output": "done"},
            ]
        ),
    )
    eid = in_process.start("delay", {"at": until})
    waiting = in_process.wait(eid, "waiting", timeout=10)
    assert step(waiting, "pause")["status"] == "waiting"
    assert step(waiting, "pause")["wake_at"] is not None
    done = in_process.wait(eid)
    assert done["status"] == "succeeded"
    assert step(done, "after")["output"] == "done"
    assert step(done, "until")["finished_at"] >= until


@pytest.mark.parametrize(
    "at",
    [
        "9999-12-31T23:59:59-23:00",  # Python holds it; in UTC it is year 10000
        "0001-01-01T00:00:00+05:00",  # in UTC it is 1 BC
        "10000-01-01T00:00:00Z",
        "294276-01-01T00:00:00Z",  # PostgreSQL's last year: it would store it
        "9999-12-31T23:59:59 tomorrow",
    ],
)
def test_a_delay_until_beyond_what_can_be_stored_fails_its_step_and_nothing_else(
    at: str, in_process: InProcess, target: Target
) -> None:
    in_process.publish(
        "far",
        unsigned(
            [
                {"id": "sleep", "type": "delay", "until": "{{ input.at }}"},
                {
                    "id": "ping",
                    "type": "http_request",
                    "request": {"method": "GET", "url": f"{target.url}/ping"},
                },
            ]
        ),
    )
    eid = in_process.start("far", {"at": at})
    done = in_process.wait(eid, timeout=30)
    assert done["status"] == "failed", done
    sleep = step(done, "sleep")
    assert sleep["status"] == "failed"
    assert sleep["wake_at"] is None
    assert "until" in sleep["error"] and at in sleep["error"], sleep["error"]
    r = in_process.post(f"/api/v1/executions/{eid}/cancel")
    assert (r.status_code, r.json()["status"]) == (200, "failed"), r.text
    # The worker goes on with everything else.
    fine = in_process.start("far", {"at": "2000-01-01T00:00:00Z"})
    assert in_process.wait(fine, timeout=30)["status"] == "succeeded"


def test_retries_back_off_and_record_every_attempt(in_process: InProcess, target: Target) -> None:
    answers = iter([Reply(status=503), Reply(status=503), Reply(json={"fine": True})])
    target.script = lambda r: next(answers)
    in_process.publish(
        "retry",
        unsigned(
            [
                {
                    "id": "get",
                    "type": "http_request",
                    "request": {"method": "GET", "url": target.url},
                    "retry": {
                        "max_attempts": 5,
                        "initial_interval_s": 0.4,
                        "backoff_coefficient": 2,
                    },
                },
            ]
        ),
    )
    done = in_process.wait(in_process.start("retry", {}))
    assert done["status"] == "succeeded"
    attempts = step(done, "get")["attempts"]
    assert [(a["outcome"], a["http_status"]) for a in attempts] == [
        ("failed", 503),
        ("failed", 503),
        ("succeeded", 200),
    ]
    times = [r.at for r in target.received]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.2 and times[2] - times[1] >= 0.4  # jitter keeps >= half
    kinds = [e["kind"] for e in done["events"] if e["step"] == "get"]
    assert kinds.count("step.waiting") == 2


def test_unsafe_requests_are_not_retried_but_idempotency_keys_make_them_safe(
    in_process: InProcess, target: Target
) -> None:
    target.script = lambda r: Reply(status=503)
    in_process.publish(
        "unsafe",
        unsigned(
            [
                {
                    "id": "post",
                    "type": "http_request",
                    "request": {"method": "POST", "url": f"{target.url}/plain", "json": {}},
                    "retry": {"max_attempts": 3, "initial_interval_s": 0.1},
                },
            ]
        ),
    )
    in_process.publish(
        "keyed",
        unsigned(
            [
                {
                    "id": "post",
                    "type": "http_request",
                    "request": {
                        "method": "POST",
                        "url": f"{target.url}/keyed",
                        "json": {},
                        "idempotency_key": "{{ execution.id }}-post",
                    },
                    "retry": {"max_attempts": 3, "initial_interval_s": 0.1},
                },
            ]
        ),
    )
    plain = in_process.wait(in_process.start("unsafe", {}))
    keyed_id = in_process.start("keyed", {})
    keyed = in_process.wait(keyed_id)
    assert plain["status"] == "failed" and len(target.requests_to("/plain")) == 1
    assert keyed["status"] == "failed" and len(target.requests_to("/keyed")) == 3
    assert {r.headers["idempotency-key"] for r in target.requests_to("/keyed")} == {
        f"{keyed_id}-post"
    }


def test_a_request_that_never_left_is_retried_even_when_unsafe(in_process: InProcess) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    in_process.publish(
        "refused",
        unsigned(
            [
                {
                    "id": "post",
                    "type": "http_request",
                    "request": {
                        "method": "POST",
                        "url": f"http://127.0.0.1:{closed_port}/",
                        "json": {},
                    },
                    "retry": {"max_attempts": 2, "initial_interval_s": 0.1},
                },
            ]
        ),
    )
    done = in_process.wait(in_process.start("refused", {}))
    attempts = step(done, "post")["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "failed"]
    assert "not sent" in attempts[0]["error"]
    assert done["status"] == "failed"


def test_a_failed_step_fails_the_execution_and_cancels_what_cannot_run(
    in_process: InProcess, target: Target
) -> None:
    target.script = lambda r: Reply(status=404, json={"error": "no such order"})
    in_process.publish(
        "fail",
        unsigned(
            [
                {
                    "id": "get",
                    "type": "http_request",
                    "request": {"method": "GET", "url": target.url},
                    "retry": {"max_attempts": 1},
                },
                {"id": "after", "type": "transform", "depends_on": ["get"], "output": 1},
                {"id": "later", "type": "delay", "duration_s": 3600, "depends_on": ["after"]},
            ]
        ),
    )
    done = in_process.wait(in_process.start("fail", {}))
    assert done["status"] == "failed"
    assert {s["id"]: s["status"] for s in done["steps"]} == {
        "get": "failed",
        "after": "cancelled",
        "later": "cancelled",
    }
    assert step(done, "get")["output"]["body"] == {"error": "no such order"}
    assert step(done, "get")["error"] == "HTTP 404 from GET request"


def test_a_wakeup_delivered_twice_runs_the_step_once(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    amqp_url: str,
    amqp_prefix: str,
    db: psycopg.Connection,
) -> None:
    client = Api(api, api_key)
    gate: list[Received] = []
    target.script = lambda r: (gate.append(r), Reply(json={"n": len(gate)}, delay_s=0.5))[1]
    client.publish(
        "twice",
        unsigned(
            [
                {
                    "id": "get",
                    "type": "http_request",
                    "request": {"method": "GET", "url": target.url},
                },
            ]
        ),
    )
    workers()
    eid = client.start("twice", {})
    wait_for(lambda: target.received, message="the first request")
    broker = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = broker.channel()
    for _ in range(3):
        channel.basic_publish(
            amqp_prefix, "step", json.dumps({"execution_id": eid, "step_id": "get"}).encode()
        )
    broker.close()
    done = client.wait(eid)
    assert done["status"] == "succeeded"
    assert len(target.received) == 1
    assert len(step(done, "get")["attempts"]) == 1
    wait_for(
        lambda: db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0,
        message="the outbox to drain",
    )
