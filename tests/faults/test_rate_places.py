"""A step with a reserved place in a rate limit's schedule (docs/contract.md#outbound-limits) is
woken at that place by the worker that placed it, in-process (worker/places.py), never through the
outbox, the relay and the broker: a backlog in the queue, or the broker itself, can no
longer make it miss its place. When that worker dies, any other worker's timer scanner
wakes what it left behind, and the limit still holds."""

from __future__ import annotations

import psycopg

from tests.faults.helpers import StartWorker, logged, scalar, wait_logged
from tests.support.api import Api, step
from tests.support.definitions import workflow
from tests.support.faultproxy import FaultProxy
from tests.support.processes import wait_for
from tests.support.target import Target, most_in_any_second

RATE, COUNT = 2, 8
PLACED = "SELECT count(*) FROM limit_waits WHERE reserved AND NOT woken"
SUCCEEDED = "SELECT count(*) FROM executions WHERE status = 'succeeded'"


def _limited(client: Api, target: Target) -> list[str]:
    call = {
        "id": "call",
        "type": "http_request",
        "limit": "partner",
        "request": {"method": "GET", "url": f"{target.url}/rated/{{{{ input.n }}}}"},
    }
    definition = {
        **workflow(call),
        "limits": {"partner": {"rate_per_s": RATE, "burst": 1}},
    }
    client.publish("rated", definition)
    return [client.start("rated", {"n": n}) for n in range(COUNT)]


def _placed(db: psycopg.Connection, target: Target) -> bool:
    """Every execution either sent its request or holds a place (not yet woken)."""
    return scalar(db, PLACED) + len(_sent(target)) == COUNT


def _sent(target: Target) -> set[str]:
    """The executions whose request reached the target (by their input's n)."""
    return {r.path for r in target.requests_to("/rated/")}


def test_placed_steps_leave_at_their_places_while_the_broker_is_away(
    client: Api,
    db: psycopg.Connection,
    workers: StartWorker,
    target: Target,
    broker_proxy: FaultProxy,
    amqp_url: str,
) -> None:
    """Before: the wake-up at a place went timer scanner → outbox → relay → broker →
    consumer, so with the broker blackholed no placed step ever left (and under load each
    arrived a median 0.45 s late, behind whatever the queue held)."""
    worker = workers(FLOWFORGE_AMQP_URL=broker_proxy.url(amqp_url), FLOWFORGE_LEASE_SECONDS="10")
    wait_for(lambda: logged(worker, "relay connected to broker"), message="relay connected")
    ids = _limited(client, target)
    # 8 at 2/s: the places span 3.5 s; cut the broker once all are placed, early on.
    wait_for(lambda: _placed(db, target), timeout=30, message="every execution placed")
    sent_before = len(_sent(target))
    broker_proxy.blackhole()
    assert sent_before < COUNT, "all had left before the broker went away: nothing proved"
    wait_for(
        lambda: scalar(db, SUCCEEDED) == COUNT,
        timeout=30,
        message="the placed steps to leave and succeed with the broker blackholed",
    )
    arrivals = [r.at for r in target.requests_to("/rated/")]
    assert len(arrivals) == COUNT
    # Burst 1: at most RATE + 1 in any second, one more for a busy machine's scheduling.
    assert most_in_any_second(arrivals) <= RATE + 2
    assert max(arrivals) - min(arrivals) >= (COUNT - 1) / RATE - 0.3
    broker_proxy.restore()
    for eid in ids:
        attempts = step(client.execution(eid), "call")["attempts"]
        assert len(attempts) == 1, attempts


def test_the_places_of_a_killed_worker_are_woken_by_another(
    client: Api,
    db: psycopg.Connection,
    workers: StartWorker,
    target: Target,
) -> None:
    """The heap is only the fast path: the database keeps every wait, and the scanner of
    any worker wakes a place LOCAL_GRACE_S overdue. The rate still holds across the kill."""
    first = workers(FLOWFORGE_LEASE_SECONDS="10")
    _limited(client, target)
    wait_for(lambda: _placed(db, target), timeout=30, message="every execution placed")
    first.kill()
    left = COUNT - len(_sent(target))
    assert left > 0, "all had left before the kill: nothing proved"
    second = workers(FLOWFORGE_LEASE_SECONDS="10")
    wait_logged(second, "consuming")
    wait_for(
        lambda: scalar(db, SUCCEEDED) == COUNT,
        timeout=45,
        message="the killed worker's placed steps to be woken by the other one",
    )
    assert len(_sent(target)) == COUNT
    # A request the kill caught in flight is sent again (a GET is safe to repeat): it
    # went through the limit again, so it counts too.
    arrivals = [r.at for r in target.requests_to("/rated/")]
    assert most_in_any_second(arrivals) <= RATE + 2
