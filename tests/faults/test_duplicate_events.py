"""Case 2: the same event twice, at the same time.

Promise: twenty identical webhooks racing through real HTTP into a multi-process
gunicorn create exactly one execution (a unique constraint decides, not a
check-then-insert); the same key with a different body is a 409; a signed redelivery
with the same `webhook-id` returns the same execution — and the effect runs once.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import requests

from tests.faults.helpers import StartWorker, is_problem, scalar, signed_headers
from tests.support.api import Api
from tests.support.definitions import http, workflow
from tests.support.target import Target

RACERS = 20


def _race(base: str, key: str, body: bytes) -> list[requests.Response]:
    """RACERS threads released together by a barrier, each with its own connection."""
    barrier = threading.Barrier(RACERS)

    def one(_: int) -> requests.Response:
        with requests.Session() as session:
            barrier.wait(timeout=10)
            return session.post(
                f"{base}/hooks/orders",
                data=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": key},
                timeout=30,
            )

    with ThreadPoolExecutor(RACERS) as pool:
        return list(pool.map(one, range(RACERS)))


def test_twenty_parallel_duplicates_make_one_execution_and_one_request(
    api4: str, api_key: str, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    client = Api(api4, api_key)
    client.publish(
        "orders",
        workflow(http("notify", "POST", f"{target.url}/notify", json="{{ input }}")),
    )
    workers()
    body = json.dumps({"order": "A-1", "total": 250}).encode()

    answers = _race(api4, "order-A-1", body)

    assert [r.status_code for r in answers] == [202] * RACERS, [r.text for r in answers]
    ids = {r.json()["execution_id"] for r in answers}
    assert len(ids) == 1
    replays = [r.headers.get("Idempotent-Replayed") for r in answers]
    assert replays.count("true") == RACERS - 1
    assert scalar(db, "SELECT count(*) FROM executions") == 1
    (eid,) = ids
    assert client.wait(eid)["status"] == "succeeded"
    assert len(target.requests_to("/notify")) == 1

    changed = client.hook(
        "orders", None, raw=body.replace(b"250", b"251"), headers={"Idempotency-Key": "order-A-1"}
    )
    assert is_problem(changed, 409), changed.text
    whitespace = client.hook(
        "orders", None, raw=body + b" ", headers={"Idempotency-Key": "order-A-1"}
    )
    assert is_problem(whitespace, 409), whitespace.text
    assert scalar(db, "SELECT count(*) FROM executions") == 1


def test_signed_redelivery_with_the_same_webhook_id_returns_the_same_execution(
    client: Api, db: psycopg.Connection, workers: StartWorker, target: Target
) -> None:
    client.publish(
        "signed",
        workflow(
            http("notify", "POST", f"{target.url}/notify", json="{{ input }}"), auth="signature"
        ),
    )
    created = client.post("/api/v1/workflows/signed/webhook-secrets")
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    workers()
    body = b'{"event": "order.paid", "order": "B-7"}'

    first = client.hook("signed", None, raw=body, headers=signed_headers(secret, "msg_1", body))
    assert first.status_code == 202, first.text
    # The sender did not see our answer and delivers again: new timestamp, new signature.
    again = client.hook("signed", None, raw=body, headers=signed_headers(secret, "msg_1", body))
    assert again.status_code == 202, again.text
    assert again.json()["execution_id"] == first.json()["execution_id"]
    assert again.headers.get("Idempotent-Replayed") == "true"

    other = b'{"event": "order.paid", "order": "B-8"}'
    reused = client.hook("signed", None, raw=other, headers=signed_headers(secret, "msg_1", other))
    assert is_problem(reused, 409), reused.text
    forged = client.hook(
        "signed", None, raw=body, headers=signed_headers("whsec_" + "A" * 32, "msg_2", body)
    )
    assert is_problem(forged, 401), forged.text

    assert scalar(db, "SELECT count(*) FROM executions") == 1
    assert client.wait(first.json()["execution_id"])["status"] == "succeeded"
    assert len(target.requests_to("/notify")) == 1
