"""Events correlated by a business key (docs/contract.md#events) through real bin/api and
bin/worker: an order workflow charges (an HTTP step to a local target) and waits for
Stripe's payment_intent.succeeded for its own order, emitted by a Stripe-signed delivery
(signed with Stripe's own library) to the intake workflow; an event before its wait, a
redelivery, two waiters, a payload over the body limit; and events racing timeouts,
each wait ending exactly once. The rules one by one: tests/integration/test_event_rules.py.
One test, so the processes start once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import requests
import stripe

from tests.integration.test_cli_remote import ok, remote
from tests.support.api import Api, step
from tests.support.definitions import http, transform, unsigned
from tests.support.processes import Process
from tests.support.target import Target

WHSEC = "whsec_" + "k7Lm2Qx9Vt4Rb8Nw3Jy6Hd1Fs5Gp0Ce"
EVENT = "payment_intent.succeeded"

INTAKE = {
    "name": "Stripe intake",
    "trigger": {"webhook": {"auth": "stripe"}},
    "emits": {"event": EVENT, "key": "{{ input.data.object.metadata.order_id }}"},
    "steps": [{"id": "note", "type": "transform", "output": {"type": "{{ input.type }}"}}],
}


def orders(charge_url: str) -> dict[str, Any]:
    """Charge, then wait for the intake's payment_intent.succeeded of this order."""
    return unsigned(
        [
            http("charge", "POST", charge_url, json={"order": "{{ input.order_id }}"}),
            {
                "id": "paid",
                "type": "wait",
                "depends_on": ["charge"],
                "event": EVENT,
                "key": "{{ input.order_id }}",
                "from": "stripe-intake",
                "timeout_s": 120,
            },
            transform("done", {"intent": "{{ paid.data.object.id }}"}, after=("paid",)),
        ],
        name="Orders",
    )


def stripe_delivery(order_id: str, event_id: str) -> tuple[bytes, dict[str, str]]:
    """A payment_intent.succeeded event as Stripe sends it, signed by Stripe's library."""
    body = json.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": EVENT,
            "data": {"object": {"id": f"pi_{order_id}", "metadata": {"order_id": order_id}}},
        }
    )
    header = stripe.WebhookSignature.generate_signature_header(body, WHSEC)
    return body.encode(), {"Content-Type": "application/json", "Stripe-Signature": header}


RACE = unsigned(
    [
        {
            "id": "paid",
            "type": "wait",
            "event": "race.settled",
            "key": "{{ input.k }}",
            "lookback_s": 0,
            "timeout_s": 1,
            "on_timeout": "continue",
        }
    ],
    name="Race",
)
OUTCOMES = """
SELECT count(*) FILTER (WHERE kind = 'wait.resumed'),
       count(*) FILTER (WHERE kind = 'wait.timed_out'),
       (SELECT count(*) FROM event_consumptions c WHERE c.execution_id = %(id)s)
FROM execution_events WHERE execution_id = %(id)s
"""


def test_events_through_real_processes(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    db: psycopg.Connection,
) -> None:
    workers()
    client = Api(api, api_key)
    client.publish("stripe-intake", INTAKE)
    made = client.post("/api/v1/workflows/stripe-intake/webhook-secrets", {"value": WHSEC})
    assert made.status_code == 201, made.text
    client.publish("orders", orders(f"{target.url}/charge"))

    # After the wait opened: the Stripe delivery emits the event, the wait takes it.
    first = client.start("orders", {"order_id": "o-1"})
    client.until(
        lambda: step(client.execution(first), "paid")["status"] == "waiting", 30, "o-1 waits"
    )
    body, headers = stripe_delivery("o-1", "evt_o1")
    hooked = requests.post(f"{api}/hooks/stripe-intake", data=body, headers=headers, timeout=10)
    assert hooked.status_code == 202, hooked.text
    done = client.wait(first)
    assert done["status"] == "succeeded"
    assert step(done, "done")["output"] == {"intent": "pi_o-1"}
    assert [r.json() for r in target.received] == [{"order": "o-1"}]
    # Stripe's retry of the same event: the same execution, no new event.
    again = requests.post(f"{api}/hooks/stripe-intake", data=body, headers=headers, timeout=10)
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    listed = client.session.get(f"{api}/api/v1/events?name={EVENT}", timeout=10).json()
    assert [(e["key"], e["consumed_by"]) for e in listed["events"]] == [("o-1", 1)]
    # The same event sent through the API is not Stripe's: a wait with "from" ignores it.
    forged = client.post("/api/v1/events", {"name": EVENT, "key": "o-2", "payload": {}})
    assert forged.status_code == 202 and forged.json()["delivered"] == 0

    # Before the waits opened: kept, then taken by both orders waiting for o-2.
    body, headers = stripe_delivery("o-2", "evt_o2")
    assert requests.post(f"{api}/hooks/stripe-intake", data=body, headers=headers).ok
    pair = [client.start("orders", {"order_id": "o-2"}) for _ in range(2)]
    for eid in pair:
        assert step(client.wait(eid), "done")["output"] == {"intent": "pi_o-2"}

    # A payload over FLOWFORGE_MAX_BODY_BYTES: 413, nothing kept.
    big = {"name": "big", "key": "k", "payload": "x" * 2_000_000}
    assert client.post("/api/v1/events", big).status_code == 413
    assert client.session.get(f"{api}/api/v1/events?name=big").json() == {"events": []}

    # Events racing one-second timeouts: every wait ends once, by the event or the timeout.
    client.publish("race", RACE)
    racers = [client.start("race", {"k": f"r-{n}"}) for n in range(12)]
    for eid in racers:
        client.until(
            lambda eid=eid: step(client.execution(eid), "paid")["status"] != "pending",
            30,
            "the wait opens",
        )
    time.sleep(0.7)  # send around the timeouts: some events win, some come too late
    delivered = 0
    for n in range(12):
        sent = client.post(
            "/api/v1/events", {"name": "race.settled", "key": f"r-{n}", "payload": n}
        )
        assert sent.status_code == 202, sent.text
        delivered += sent.json()["delivered"]
    took = 0
    for n, eid in enumerate(racers):
        ended = client.wait(eid)
        assert ended["status"] == "succeeded"
        resumed, timed_out, consumed = db.execute(OUTCOMES, {"id": eid}).fetchone()
        output = step(ended, "paid")["output"]
        if output == n:
            assert (resumed, timed_out, consumed) == (1, 0, 1), eid
            took += 1
        else:
            assert output is None and (resumed, timed_out, consumed) == (0, 1, 0), eid
    assert took == delivered

    # The CLI, remotely: send, send again (a redelivery), list.
    args = ("events", "send", "cli.event", "k-1", "--payload", '{"a": 1}', "--id", "c-1")
    assert "taken by 0 waiting step(s)" in ok(remote(api, api_key, *args))
    assert "a redelivery" in ok(remote(api, api_key, *args))
    listed = json.loads(
        ok(remote(api, api_key, "events", "list", "--name", "cli.event", "--output", "json"))
    )
    assert [(e["key"], e["payload"]) for e in listed["events"]] == [("k-1", {"a": 1})]
