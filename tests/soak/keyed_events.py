"""Events correlated by a business key in the randomized run (issues 39, 44;
docs/contract.md#events): workflow `awaited` asks the target (a GET), then its wait step
`paid` waits up to AWAIT_TIMEOUT_S for event `payment.settled` keyed by its input's
order_id, then ships (a GET). The EventSender sends that workflow's webhooks and, for each
order, 0-2 events at random moments: before the webhook (a wait opening later takes it:
the lookback), or timed from the moment the target saw the order's `ask` (the wait opens
right after it; under faults that is seconds after the webhook, so timing from the
webhook would make nearly every event an early one): while the wait is open, racing its
timeout, an operator's cancel and the nemesis's kills, or after the timeout (a retried
wait takes it); some twice with the same id (a redelivery, through either API), and some
for keys nobody waits for.

Its input's order_id is also the workflow's search attribute (docs/contract.md#search-attributes);
the checks of all three of this round's promises (events, attributes, failure groups) are
in tests/soak/promises.py.

Its randomness comes from its own generator (seeded from the run's seed by soak.py), so the
draws of the other senders, the nemesis and the operator of a seed are what they were.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tests.soak.features import Features
from tests.soak.history import RecordingClient
from tests.soak.workload import TargetPath, _http, patient
from tests.support.target import Target

AWAITED, WAIT_STEP = "awaited", "paid"
EVENT_NAME = "payment.settled"
AWAIT_TIMEOUT_S = 5
# An early event's moment, in seconds before its order's webhook; a later one's, in seconds
# after the target saw the order's `ask` (the wait opens just after it): open, racing the
# timeout, late.
EARLY_S, AFTER_ASK_S, EARLY_SHARE = (0.0, 3.0), (0.0, AWAIT_TIMEOUT_S + 3.0), 0.3
# Half the later events aim at the timeout itself (the wait opens 0.05-0.5 s after the ask
# arrives): the race of an event and a timeout under the execution's row lock.
RACING_S, RACING_SHARE = (AWAIT_TIMEOUT_S - 0.5, AWAIT_TIMEOUT_S + 1.0), 0.5
REDELIVERY_SHARE, ORPHAN_SHARE = 0.3, 0.2


def awaited_definition(target: Target) -> dict[str, Any]:
    """The workflow whose wait step waits for its order's event; order_id is searchable."""
    return {
        "name": AWAITED,
        "trigger": {"webhook": {"auth": "none"}},
        "attributes": {"order_id": "{{ input.order_id }}"},
        "steps": [
            _http(target, AWAITED, "ask", "GET", retries=3),
            {
                "id": WAIT_STEP,
                "type": "wait",
                "depends_on": ["ask"],
                "event": EVENT_NAME,
                "key": "{{ input.order_id }}",
                "timeout_s": AWAIT_TIMEOUT_S,
            },
            _http(target, AWAITED, "ship", "GET", after=(WAIT_STEP,), retries=3),
        ],
    }


@dataclass
class EventTry:
    """One POST of an event: when sent and answered (wall clock), status, event id."""

    sent: float
    answered: float
    status: int | None
    event_id: str | None


@dataclass
class SentEvent:
    """One event (its delivery id) and every POST of it."""

    key: str
    payload: dict[str, Any]
    tries: list[EventTry] = field(default_factory=list)
    api: int = 0
    # Seconds after the first send to send it again (a redelivery), or None.
    again: float | None = None

    @property
    def acked(self) -> float | None:
        """When the first 200/202 came back: the event and its offer had committed."""
        done = [t.answered for t in self.tries if t.status in (200, 202)]
        return min(done) if done else None


class EventSender:
    """Sends `awaited` webhooks (through Features, so its webhook checks judge them) and
    the events for their orders."""

    def __init__(
        self,
        client: RecordingClient,
        api_bases: list[str],
        rng: random.Random,
        features: Features,
        target: Target,
        *,
        rate: float,
    ) -> None:
        self.target = target
        self.client = client
        self.api_bases = api_bases
        self.rng = rng
        self.features = features
        self.rate = rate
        self.events: dict[str, SentEvent] = {}
        self.orders: set[str] = set()
        self.orphans = 0
        self.redeliveries = 0
        # Events waiting for their order's `ask` at the target: n -> (delivery, seconds).
        self.after_ask: dict[int, list[tuple[str, float]]] = {}
        self._seen = 0
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        with ThreadPoolExecutor(24, thread_name_prefix="soak-events") as pool:
            self._pool = pool
            n = 500_000
            due = time.monotonic() + self.rng.expovariate(self.rate)
            while not stop.wait(0.1):
                if time.monotonic() >= due:
                    n += 1
                    self.order(pool, n)
                    due += self.rng.expovariate(self.rate)
                self.on_asks(pool)

    def on_asks(self, pool: ThreadPoolExecutor) -> None:
        """Send the events timed from an order's `ask` the target has seen since."""
        received = list(self.target.received)
        for req in received[self._seen :]:
            where = TargetPath.parse(req.path)
            if where is None or (where.workflow, where.step) != (AWAITED, "ask"):
                continue
            for delivery, after_s in self.after_ask.pop(where.n, []):
                pool.submit(self.send, delivery, None, req.at + after_s - time.time())
        self._seen = len(received)

    def order(self, pool: ThreadPoolExecutor, n: int) -> None:
        """One order: its webhook, and its events at random moments around it."""
        rng = self.rng
        key = f"ord-{n}"
        early, late = [], []
        for _ in range(rng.choice((0, 1, 1, 1, 2))):
            if rng.random() < EARLY_SHARE:
                early.append(rng.uniform(*EARLY_S))
            else:
                racing = rng.random() < RACING_SHARE
                late.append(rng.uniform(*(RACING_S if racing else AFTER_ASK_S)))
        start = max([0.0, *early])
        hook = f"soak-e{n}"
        self.orders.add(key)
        with self.features._lock:
            self.features.sent[hook] = (AWAITED, {"n": n, "order_id": key}, [])
        pool.submit(self.features.deliver, hook, rng.randrange(len(self.api_bases)), start)
        for before in early:
            self.plan(pool, key, start - before)
        for after_s in late:
            self.after_ask.setdefault(n, []).append((self.plan(pool, key, None), after_s))
        if rng.random() < ORPHAN_SHARE:
            self.orphans += 1
            self.plan(pool, f"nobody-{n}", rng.uniform(0.0, 3.0))

    def plan(self, pool: ThreadPoolExecutor, key: str, after_s: float | None) -> str:
        """One event for `key` (sent in `after_s`, or once its order's ask was seen when
        None), maybe redelivered; its delivery id. Every draw is made here, now."""
        rng = self.rng
        delivery = str(uuid.UUID(int=rng.getrandbits(128)))
        payload = {"order_id": key, "event": delivery, "amount": rng.randint(1, 10_000)}
        with self._lock:
            self.events[delivery] = SentEvent(key, payload, api=rng.randrange(len(self.api_bases)))
        if rng.random() < REDELIVERY_SHARE:
            self.redeliveries += 1
            self.events[delivery].again = 0.0 if rng.random() < 0.4 else rng.uniform(0.1, 6.0)
        if after_s is not None:
            pool.submit(self.send, delivery, None, after_s)
        return delivery

    def send(self, delivery: str, api: int | None, after_s: float) -> None:
        """POST /api/v1/events until an answer that is not a 5xx, as a patient sender; the
        first send (api None) schedules the redelivery it drew, through the other API."""
        time.sleep(max(after_s, 0.0))
        event = self.events[delivery]
        if api is None:
            api = event.api
            if event.again is not None and self._pool is not None:
                other = (api + 1) % len(self.api_bases)
                # Once the run stopped sending, the pool takes no more work: not sent.
                with contextlib.suppress(RuntimeError):
                    self._pool.submit(self.send, delivery, other, event.again)
        body = {"name": EVENT_NAME, "key": event.key, "payload": event.payload, "id": delivery}
        url = f"{self.api_bases[api]}/api/v1/events"

        def attempt() -> tuple[int | None, Any]:
            sent = time.time()
            r = self.client.request("event", "POST", url, json=body)
            status = r.status_code if r is not None else None
            event_id = None
            if status in (200, 202) and r is not None:
                event_id = r.json().get("id")
            with self._lock:
                event.tries.append(EventTry(sent, time.time(), status, event_id))
            return status, r

        patient(
            f"event-{delivery}-{api}", attempt, lambda s: s is not None and s < 500 and s != 429
        )
