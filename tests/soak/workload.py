"""The client side of the randomized run: three workflows, a recording target that is
sometimes slow, failing or hanging, and a sender of webhooks (with deliberate duplicate
deliveries) and reads.

Every target URL is /t/<workflow>/<step>/<n>/<execution id>, so the checker can tell from
the target's log which step of which execution sent what. The target decides each answer
from a hash of (seed, workflow, step, n, how many times it saw that path), not from a
shared RNG, so a replay of a seed gets the same answers whatever the thread timing."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

from tests.soak.history import RecordingClient
from tests.soak.pressure import BURST, BURST_DELAY_S
from tests.support.target import Received, Reply, Target

# (workflow, step) whose first request for every N-th n is refused 422 (a failure, not
# retried): features.CHILD's POST, so one child in four fails, its parent fails, and the
# operator's retry_parent gives the parent a second round with a new child.
REFUSED_FIRST = {("childed", "book"): 4}
# The priorities orders' webhooks ask for (None: none given).
PRIORITIES = (None, None, 0, -50, 20, 100)
# Seconds an http_request waits for an answer; a hang lasts longer, so it times out.
REQUEST_TIMEOUT_S = 2
HANG_S = 5.0
# Values Python parses but cannot load back once PostgreSQL has stored them: in UTC they
# fall in year 0 (already due) and year 10000 (never due).
POISONED_UNTIL = ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00")


def _url(target: Target, workflow: str, step: str) -> str:
    return f"{target.url}/t/{workflow}/{step}/{{{{ input.n }}}}/{{{{ execution.id }}}}"


def _http(
    target: Target,
    workflow: str,
    step: str,
    method: str,
    *,
    after: tuple[str, ...] = (),
    retries: int | None = None,
    keyed: bool = False,
    json: Any = None,
    when: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An http_request step; `keyed` adds an idempotency_key, which makes a POST safe."""
    request: dict[str, Any] = {
        "method": method,
        "url": _url(target, workflow, step),
        "timeout_s": REQUEST_TIMEOUT_S,
    }
    if keyed:
        request["idempotency_key"] = f"{{{{ execution.id }}}}-{step}"
    if json is not None:
        request["json"] = json
    spec: dict[str, Any] = {"id": step, "type": "http_request", "request": request}
    if when is not None:
        spec["when"] = when
    if after:
        spec["depends_on"] = list(after)
    if retries is not None:
        spec["retry"] = {"max_attempts": retries, "initial_interval_s": 0.2}
    return spec


def definitions(target: Target) -> dict[str, dict[str, Any]]:
    """orders: a chain with an unsafe POST, a delay and a conditional keyed POST;
    fanout: parallel branches (unsafe POST, conditional keyed POST) joined by a transform;
    timed: a delay until a time from the webhook body, then a POST conditional on a GET."""
    orders = [
        _http(target, "orders", "lookup", "GET", retries=5),
        _http(
            target,
            "orders",
            "charge",
            "POST",
            after=("lookup",),
            json={"total": "{{ lookup.body.total }}"},
        ),
        {"id": "pause", "type": "delay", "duration_s": 1, "depends_on": ["charge"]},
        {
            "id": "shape",
            "type": "transform",
            "depends_on": ["pause"],
            "output": {"charge": "{{ charge.body.id }}", "n": "{{ input.n }}"},
        },
        _http(
            target,
            "orders",
            "notify",
            "POST",
            after=("shape",),
            retries=5,
            keyed=True,
            json="{{ shape }}",
            when={"path": "input.notify", "op": "eq", "value": True},
        ),
    ]
    fanout = [
        _http(target, "fanout", "fetch", "GET", retries=4),
        _http(target, "fanout", "debit", "POST", after=("fetch",), json={"n": "{{ input.n }}"}),
        _http(
            target,
            "fanout",
            "audit",
            "POST",
            after=("fetch",),
            retries=4,
            keyed=True,
            json={"n": "{{ input.n }}"},
            when={"path": "input.big", "op": "eq", "value": True},
        ),
        {
            "id": "join",
            "type": "transform",
            "depends_on": ["debit", "audit"],
            "output": {"debit": "{{ debit.body.id }}", "n": "{{ input.n }}"},
        },
        _http(target, "fanout", "report", "PUT", after=("join",), retries=4, json="{{ join }}"),
    ]
    timed = [
        {"id": "hold", "type": "delay", "until": "{{ input.until }}"},
        _http(target, "timed", "probe", "GET", after=("hold",), retries=3),
        _http(
            target,
            "timed",
            "settle",
            "POST",
            after=("probe",),
            json={"n": "{{ input.n }}"},
            when={"path": "probe.body.go", "op": "eq", "value": True},
        ),
    ]
    found = {
        key: {"name": key, "trigger": {"webhook": {"auth": "none"}}, "steps": steps}
        for key, steps in (("orders", orders), ("fanout", fanout), ("timed", timed))
    }
    # Priorities (docs/contract.md#priority): orders' from its body, fanout's fixed.
    found["orders"]["priority"] = "{{ input.p }}"
    found["fanout"]["priority"] = -10
    return found


@dataclass(frozen=True)
class TargetPath:
    """/t/<workflow>/<step>/<n>/<execution id>, parsed."""

    workflow: str
    step: str
    n: int
    execution_id: str

    @classmethod
    def parse(cls, path: str) -> TargetPath | None:
        # A map item's step is its row id, lines[3].reserve: its brackets may come encoded.
        parts = unquote(path.split("?")[0]).strip("/").split("/")
        if len(parts) != 5 or parts[0] != "t":
            return None
        return cls(parts[1], parts[2], int(parts[3]), parts[4])


# The outbound-limited host (features.py, workflow `metered`) is down for OUTAGE_S of
# every OUTAGE_EVERY_S while the nemesis runs: its circuit opens, probes, closes again.
OUTAGE_S, OUTAGE_EVERY_S = 8.0, 20.0
# Workflow `throttled`'s host (features.py) keeps a clock THROTTLE_SKEW_S behind and
# answers each execution's first request 429 with Retry-After an HTTP-date
# THROTTLE_RETRY_S after its own Date: read against the response's Date it is a hold
# capped at the limit's max_hold_s; read against a worker's clock it would be nothing.
THROTTLE_SKEW_S, THROTTLE_RETRY_S = -3600.0, 30.0


def _throttled(occurrence: int) -> Reply | None:
    """The `throttled` host's answer to its first request of an execution."""
    if occurrence > 0:
        return None
    now = time.time() + THROTTLE_SKEW_S
    headers = {
        "Date": formatdate(now, usegmt=True),
        "Retry-After": formatdate(now + THROTTLE_RETRY_S, usegmt=True),
    }
    return Reply(status=429, headers=headers, json={"error": "slow down"})


def target_script(
    seed: int, slow: float, fail: float, hang: float, quiet: threading.Event | None = None
) -> Callable[[Received], Reply]:
    """Answers: mostly fast 200s; `slow` share 0.3-1.8 s late, `fail` share 503, `hang`
    share answers only after the step's timeout has passed. Until `quiet` is set the
    metered host has its outages (503 to every request)."""
    seen: dict[str, int] = {}
    lock = threading.Lock()
    started = time.time()

    def script(req: Received) -> Reply:
        where = TargetPath.parse(req.path)
        if where is None:
            return Reply(status=404, json={"error": "no such path"})
        if (
            where.workflow == "metered"
            and where.step == "call"
            and not (quiet is not None and quiet.is_set())
            and (req.at - started) % OUTAGE_EVERY_S < OUTAGE_S
        ):
            return Reply(status=503, json={"error": "outage"})
        base = f"{where.workflow}/{where.step}/{where.n}"
        with lock:
            occurrence = seen.get(base, 0)
            seen[base] = occurrence + 1
        if where.workflow == "throttled" and (throttled := _throttled(occurrence)):
            return throttled
        every = REFUSED_FIRST.get((where.workflow, where.step))
        if every and where.n % every == 0 and occurrence == 0:
            return Reply(status=422, json={"error": "refused"})
        if where.workflow == BURST:
            return Reply(json={"id": f"{base}_{occurrence}"}, delay_s=BURST_DELAY_S)
        digest = hashlib.sha256(f"{seed}:{base}:{occurrence}".encode()).digest()
        roll = int.from_bytes(digest[:8], "big") / 2**64
        jitter = digest[8] / 255
        body = {
            "id": f"{where.step}_{where.n}_{occurrence}",
            "total": where.n,
            "go": where.n % 3 != 0,
        }
        if roll < hang:
            return Reply(json=body, delay_s=HANG_S)
        if roll < hang + fail:
            return Reply(status=503, json={"error": "busy"}, delay_s=0.05 * jitter)
        if roll < hang + fail + slow:
            return Reply(json=body, delay_s=0.3 + 1.5 * jitter)
        return Reply(json=body, delay_s=0.05 * jitter)

    return script


def recorded(
    script: Callable[[Received], Reply], replies: dict[int, Reply]
) -> Callable[[Received], Reply]:
    """The script, remembering each reply by id() of its request (the target keeps every
    request, so ids stay unique): the checker needs how long each one was held."""

    def wrapped(req: Received) -> Reply:
        reply = script(req)
        replies[id(req)] = reply
        return reply

    return wrapped


# A sender's patience (issue 23): the run's own PostgreSQL outages last up to 8 s (plus
# the pools' reconnect), so a sender that gives up after 2 s never delivers what fell in
# one. A real sender (Stripe, GitHub, Standard Webhooks senders) retries with backoff for
# much longer; this one retries for SEND_BUDGET_S with exponential backoff and jitter, the
# same Idempotency-Key every time, and waits at least what a 429/503's Retry-After asks.
# A delivery still not accepted after the budget is a violation (webhook_executions).
SEND_BUDGET_S = 40.0
BACKOFF_FIRST_S = 0.2
BACKOFF_CAP_S = 5.0
# Answers a sender tries again: none at all, 429 (slow down), and 5xx.
RETRIED = frozenset({None, 429})


def retry_after(response: Any) -> float | None:
    """Seconds a 429/503 asked to wait (Retry-After in delta-seconds), or None."""
    if response is None or response.status_code not in (429, 503):
        return None
    value = response.headers.get("Retry-After")
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None


def backoff(tries: int, rng: random.Random) -> float:
    """Exponential backoff with equal jitter: half the step fixed, half random."""
    step = min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2**tries)
    return step / 2 + rng.uniform(0, step / 2)


def patient(
    key: str,
    attempt: Callable[[], tuple[int | None, Any]],
    done: Callable[[int | None], bool],
    budget_s: float = SEND_BUDGET_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[float]:
    """Call `attempt` (one delivery: its status and response) until `done(status)`, a
    status a sender does not retry (4xx but 429), or `budget_s` has passed; the waits it
    slept. The jitter comes from the key (not a shared RNG), so a replay draws the same
    waits. `sleep` and `clock` are for the unit tests."""
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    deadline = clock() + budget_s
    waits: list[float] = []
    while True:
        status, response = attempt()
        if done(status) or not (status in RETRIED or (status is not None and status >= 500)):
            return waits
        wait = max(backoff(len(waits), rng), retry_after(response) or 0.0)
        if clock() + wait > deadline:
            return waits
        waits.append(wait)
        sleep(wait)


@dataclass
class Delivery:
    """What the API answered to every delivery of one webhook key."""

    workflow: str
    body: dict[str, Any]
    answers: list[tuple[int | None, str | None]] = field(default_factory=list)
    # (sent, answered) wall-clock times of each answer above.
    times: list[tuple[float, float]] = field(default_factory=list)

    @property
    def accepted(self) -> set[str]:
        return {eid for status, eid in self.answers if status == 202 and eid}


class Workload:
    """Sends webhooks (some twice, in parallel or later, to either API) and reads."""

    def __init__(
        self,
        client: RecordingClient,
        api_bases: list[str],
        rng: random.Random,
        *,
        rate: float,
        duplicates: float,
        poison: float,
    ) -> None:
        self.client = client
        self.api_bases = api_bases
        self.rng = rng
        self.rate = rate
        self.duplicates = duplicates
        self.poison = poison
        self.deliveries: dict[str, Delivery] = {}
        self.duplicate_deliveries = 0
        self.poisoned = 0
        self.reads = 0
        self._lock = threading.Lock()

    def accepted(self) -> dict[str, str]:
        """Webhook key → the execution its first 202 named."""
        with self._lock:
            return {
                key: next(eid for status, eid in d.answers if status == 202 and eid)
                for key, d in self.deliveries.items()
                if d.accepted
            }

    def run(self, stop: threading.Event) -> None:
        """Send until `stop`; then wait for every delivery in flight to be answered."""
        with ThreadPoolExecutor(32, thread_name_prefix="soak-send") as pool:
            n = 0
            while not stop.wait(self.rng.expovariate(self.rate)):
                if self.rng.random() < 0.2:
                    self.read(pool)
                    continue
                self.webhook(pool, n)
                n += 1

    def webhook(self, pool: ThreadPoolExecutor, n: int) -> None:
        """One new event; every random choice is made here, on the workload's own thread."""
        rng = self.rng
        workflow = rng.choices(["orders", "fanout", "timed"], weights=[4, 3, 2])[0]
        body: dict[str, Any] = {"n": n}
        if workflow == "orders":
            body["notify"] = rng.random() < 0.6
            # PRIORITIES' None: no `p` at all (priority 0).
            if (p := rng.choice(PRIORITIES)) is not None:
                body["p"] = p
        elif workflow == "fanout":
            body["big"] = rng.random() < 0.5
        else:
            until = datetime.now(UTC) + timedelta(seconds=rng.uniform(0.2, 3.0))
            poisoned = rng.random() < self.poison
            body["until"] = until.isoformat()
            if poisoned:
                self.poisoned += 1
                body["until"] = POISONED_UNTIL[rng.randrange(len(POISONED_UNTIL))]
        key = f"soak-{n}"
        with self._lock:
            self.deliveries[key] = Delivery(workflow, body)
        first = rng.randrange(len(self.api_bases))
        pool.submit(self.deliver, key, first, 0.0)
        if rng.random() < self.duplicates:
            self.duplicate_deliveries += 1
            other = (first + 1) % len(self.api_bases)
            later = 0.0 if rng.random() < 0.5 else rng.uniform(0.2, 5.0)
            pool.submit(self.deliver, key, other, later)

    def deliver(self, key: str, api: int, after_s: float) -> None:
        """POST the webhook with its Idempotency-Key until the API accepts it, as a real
        sender does (patient(): backoff with jitter, Retry-After, a 40 s budget)."""
        time.sleep(after_s)
        delivery = self.deliveries[key]
        url = f"{self.api_bases[api]}/hooks/{delivery.workflow}"

        def attempt() -> tuple[int | None, Any]:
            sent = time.time()
            r = self.client.request(
                "webhook",
                "POST",
                url,
                auth=False,
                json=delivery.body,
                headers={"Idempotency-Key": key},
            )
            eid = None
            if r is not None and r.status_code == 202:
                eid = r.json().get("execution_id")
            with self._lock:
                delivery.answers.append((r.status_code if r is not None else None, eid))
                delivery.times.append((sent, time.time()))
            return (r.status_code if r is not None else None), r

        patient(key, attempt, lambda status: status == 202)

    def read(self, pool: ThreadPoolExecutor) -> None:
        """A GET of one execution, or of one page of a status filter."""
        self.reads += 1
        base = self.api_bases[self.rng.randrange(len(self.api_bases))]
        accepted = sorted(self.accepted().values())
        if accepted and self.rng.random() < 0.7:
            url = f"{base}/api/v1/executions/{self.rng.choice(accepted)}"
        else:
            status = self.rng.choice(["running", "waiting", "needs_attention", "failed"])
            url = f"{base}/api/v1/executions?status={status}&limit=20"
        pool.submit(self.client.request, "read", "GET", url)
