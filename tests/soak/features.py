"""The features of the randomized run beyond plain steps (issues 23, 26-28): workflows with
concurrency limits (every `on_full`, `max_queued`, `start_within_s`, `deadline_s`),
schedules (every `overlap`), wait steps, retention, outbound limits with a circuit, a
signed source (GitHub preset) routing to two workflows, an archived workflow for
re-ingest, `retry.on_exhausted: pause`, a map step, debounce and batch, and a child
workflow (a `workflow` step, docs/contract.md#child-workflows). The Features sender runs beside the
Workload's: webhooks to these workflows and to the source, and resumes of wait steps
(from the resume URLs the target received: on time, late, twice, with another body).

Every URL is still /t/<workflow>/<step>/<n>/<execution id> (workload.py), so the
checker knows from the target's log who sent what."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.soak.history import RecordingClient
from tests.soak.pressure import BURST, BURST_SIZE
from tests.soak.workload import REFUSED_FIRST, _http, patient
from tests.support.target import Target

# A source's GitHub secret (a test value on a throwaway database).
SOURCE_SECRET = "soak-source-secret"
SOURCE = "inbox"
PARTNER = {"rate_per_s": 4, "burst": 4, "concurrency": 2}
CIRCUIT = {"failures": 3, "window_s": 10, "cool_down_s": 3}
# (workflow, the concurrency limit per key, on_full): checked at the target.
LIMITED = {
    "lim_queue": (2, "queue"),
    "lim_drop": (1, "drop_new"),
    "lim_oldest": (1, "cancel_oldest"),
    # A schedule's overlap is a slot of one (schedules.py), but for `allow`.
    "sched_skip": (1, "skip"),
    "sched_buffer": (1, "buffer_one"),
    "sched_cancel": (1, "cancel_other"),
}
OVERLAPS = {
    "sched_skip": "skip",
    "sched_buffer": "buffer_one",
    "sched_allow": "allow",
    "sched_cancel": "cancel_other",
}
SCHEDULE_EVERY_S = 3
WAIT_TIMEOUT_S = 6
RETENTION_DAYS = 0.0003  # 26 s
# Steps whose request goes through the outbound limit `partner` (workflow, step).
METERED = ("metered", "call")
# Workflow `throttled` (every third `metered` event, by its n: no draw of the run's rng):
# its target answers each execution's first request 429 with a dated Retry-After from a
# clock an hour behind (workload.THROTTLE), held for at most max_hold_s.
THROTTLED = ("throttled", "call")
QUOTA = {"concurrency": 2, "max_hold_s": 2}
# The map step (docs/contract.md#map) of workflow `mapped`: its items' unsafe POSTs, at most
# MAP_PARALLEL at once; items run `collect`, so every item runs whatever the others do.
MAP_STEP, MAP_POST, MAP_PARALLEL = "lines", "reserve", 2
MAP_ITEMS = (1, 6)
# One map in BIG_MAP_SHARE has many items (--map-items, issue 39: maps of thousands): more
# than a page of them, saved in round trips longer than libpq's 8 KB.
BIG_MAP_SHARE = 0.08
# Debounce and batch (docs/contract.md#debounce-batch): workflow, kind and its options. The
# debounced key is input.k; a batch is one group for the workflow.
GROUPED = {
    "debounced": ("debounce", {"key": "{{ input.k }}", "window_s": 1, "max_wait_s": 4}),
    "batched": ("batch", {"max_items": 4, "window_s": 2}),
}
# A child workflow (docs/contract.md#child-workflows): `parented` shapes its input, then its
# workflow step CALL starts a `childed` execution and waits for it. The child sends one unsafe POST
# (CHILD_POST, at /t/childed/book/<n>/<the child's execution id>: every child, of every
# round, is its own sender) and ends with a transform, whose output is the child's.
PARENT, CHILD, CALL, CHILD_POST = "parented", "childed", "call", "book"
assert (CHILD, CHILD_POST) in REFUSED_FIRST  # one child in four fails (workload.py)


def _wf(steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"trigger": {"webhook": {"auth": "none"}}, "steps": steps, **extra}


def feature_definitions(target: Target) -> dict[str, dict[str, Any]]:
    """Every feature workflow, by key."""
    until = {"id": "hold", "type": "delay", "until": "{{ input.until }}"}
    found: dict[str, dict[str, Any]] = {
        "lim_queue": _wf(
            [
                _http(target, "lim_queue", "call", "POST", retries=3, keyed=True, json={}),
                {**until, "depends_on": ["call"]},
            ],
            concurrency={"limit": 2, "key": "{{ input.k }}", "on_full": "queue", "max_queued": 12},
            start_within_s=25,
        ),
        "lim_drop": _wf(
            [
                _http(target, "lim_drop", "look", "GET", retries=3),
                {**until, "depends_on": ["look"]},
                _http(target, "lim_drop", "post", "POST", after=("hold",), json={}),
            ],
            concurrency={"limit": 1, "key": "{{ input.k }}", "on_full": "drop_new"},
        ),
        "lim_oldest": _wf(
            [
                _http(target, "lim_oldest", "look", "GET", retries=3),
                {**until, "depends_on": ["look"]},
                _http(target, "lim_oldest", "post", "POST", after=("hold",), json={}),
            ],
            concurrency={"limit": 1, "key": "{{ input.k }}", "on_full": "cancel_oldest"},
            deadline_s=10,
        ),
        "metered": _wf(
            [
                {
                    **_http(target, "metered", "call", "POST", keyed=True, json={}),
                    "limit": "partner",
                    "retry": {
                        "max_attempts": 4,
                        "initial_interval_s": 0.5,
                        "on_exhausted": "pause",
                    },
                },
                _http(target, "metered", "after", "GET", after=("call",), retries=3),
            ],
            limits={"partner": {**PARTNER, "circuit": CIRCUIT}},
        ),
        "throttled": _wf(
            [
                {
                    **_http(target, "throttled", "call", "GET"),
                    "limit": "quota",
                    # Its own retry waits what Retry-After asks, up to max_interval_s.
                    "retry": {"max_attempts": 4, "initial_interval_s": 0.2, "max_interval_s": 3},
                }
            ],
            limits={"quota": QUOTA},
        ),
        "approve": _wf(
            [
                _http(
                    target,
                    "approve",
                    "ask",
                    "POST",
                    retries=3,
                    keyed=True,
                    json={"url": "{{ waits.approval.url }}", "n": "{{ input.n }}"},
                ),
                {
                    "id": "approval",
                    "type": "wait",
                    "depends_on": ["ask"],
                    "timeout_s": WAIT_TIMEOUT_S,
                    "on_timeout": "continue",
                },
                _http(target, "approve", "done", "GET", after=("approval",), retries=3),
            ]
        ),
        "brief": _wf(
            [_http(target, "brief", "get", "GET", retries=3)], retention_days=RETENTION_DAYS
        ),
        "archived": _wf(
            [
                _http(target, "archived", "charge", "POST", json={"n": "{{ input.n }}"}),
                _http(target, "archived", "after", "GET", after=("charge",), retries=3),
            ],
            archive_days=1,
            # A search attribute (docs/contract.md#search-attributes): replays and
            # re-ingests must carry it too (promises.check_attributes).
            attributes={"order_id": "{{ input.order_id }}"},
        ),
    }
    found["mapped"] = _wf(
        [
            {
                "id": MAP_STEP,
                "type": "map",
                "items": "{{ input.lines }}",
                "max_parallel": MAP_PARALLEL,
                "on_item_failure": "collect",
                "steps": [
                    {
                        "id": MAP_POST,
                        "type": "http_request",
                        "request": {
                            "method": "POST",
                            # The step segment is the item's row id (lines[3].reserve),
                            # so the target's log pairs with its attempts like any step.
                            "url": f"{target.url}/t/mapped/{MAP_STEP}[{{{{ index }}}}]."
                            f"{MAP_POST}/{{{{ input.n }}}}/{{{{ execution.id }}}}",
                            "timeout_s": 2,
                            "json": {"sku": "{{ item.sku }}", "index": "{{ index }}"},
                        },
                    },
                    {
                        "id": "line",
                        "type": "transform",
                        "depends_on": [MAP_POST],
                        "output": {"sku": "{{ item.sku }}", "got": f"{{{{ {MAP_POST}.body.id }}}}"},
                    },
                ],
            },
            {
                "id": "total",
                "type": "transform",
                "depends_on": [MAP_STEP],
                "output": {"lines": f"{{{{ {MAP_STEP} }}}}"},
            },
        ]
    )
    # The child first: the parent's publish checks the workflows it calls for cycles.
    found[CHILD] = _wf(
        [
            _http(target, CHILD, CHILD_POST, "POST", json={"sku": "{{ input.sku }}"}),
            {
                "id": "shape",
                "type": "transform",
                "depends_on": [CHILD_POST],
                "output": {"sku": "{{ input.sku }}", "booking": f"{{{{ {CHILD_POST}.body.id }}}}"},
            },
        ]
    )
    found[PARENT] = _wf(
        [
            {"id": "prep", "type": "transform", "output": {"sku": "sku-{{ input.n }}"}},
            {
                "id": CALL,
                "type": "workflow",
                "workflow": CHILD,
                "depends_on": ["prep"],
                "input": {"n": "{{ input.n }}", "sku": "{{ prep.sku }}"},
            },
        ]
    )
    for key, (kind, options) in GROUPED.items():
        n = "0" if kind == "batch" else "{{ input.n }}"
        found[key] = {
            "trigger": {"webhook": {"auth": "none", kind: options}},
            "steps": [
                {
                    "id": "post",
                    "type": "http_request",
                    "request": {
                        "method": "POST",
                        "url": f"{target.url}/t/{key}/post/{n}/{{{{ execution.id }}}}",
                        "timeout_s": 2,
                        "json": {"input": "{{ input }}"},
                    },
                },
            ],
        }
    for key, overlap in OVERLAPS.items():
        found[key] = {
            "trigger": {
                "webhook": {"auth": "none"},
                "schedule": {"every_s": SCHEDULE_EVERY_S, "overlap": overlap, "input": {"n": 0}},
            },
            "steps": [
                _http(target, key, "tick", "GET", retries=3),
                {"id": "rest", "type": "delay", "duration_s": 2, "depends_on": ["tick"]},
                _http(target, key, "tock", "GET", after=("rest",), retries=3),
            ],
        }
    return {key: {"name": key, **definition} for key, definition in found.items()}


def source_definition() -> dict[str, Any]:
    """The source: GitHub-signed events; `push` starts orders, `issues` starts fanout."""

    def on(event: str) -> dict[str, Any]:
        return {"all": [{"path": "headers.x-github-event", "op": "eq", "value": event}]}

    return {
        "auth": "github",
        "subscriptions": [
            {"workflow": "orders", "filter": on("push")},
            {"workflow": "fanout", "filter": on("issues")},
        ],
    }


def ancestors(definition: dict[str, Any], step: str) -> set[str]:
    """The steps upstream of `step` (what a replay from it must not run again)."""
    parents = {s["id"]: s.get("depends_on", []) for s in definition["steps"]}
    found: set[str] = set()
    todo = list(parents.get(step, []))
    while todo:
        sid = todo.pop()
        if sid not in found:
            found.add(sid)
            todo.extend(parents.get(sid, []))
    return found


@dataclass
class Attempt:
    """One delivery attempt of a webhook: when it was sent and answered (wall clock)."""

    sent: float
    answered: float
    status: int | None
    execution_id: str | None
    replayed: bool


@dataclass
class SourceDelivery:
    event: str
    body: dict[str, Any]
    answers: list[tuple[int | None, list[str]]] = field(default_factory=list)


class Features:
    """Sends webhooks to the feature workflows and the source; resumes wait steps."""

    def __init__(
        self,
        client: RecordingClient,
        api_bases: list[str],
        rng: random.Random,
        target: Target,
        *,
        rate: float,
        map_items: int = 0,
    ) -> None:
        self.map_items = map_items
        self.client = client
        self.api_bases = api_bases
        self.rng = rng
        self.target = target
        self.rate = rate
        # key -> workflow, body and every attempt (the checker's "no 5xx for an accepted
        # event" reads the attempts' times against the executions' created_at).
        self.sent: dict[str, tuple[str, dict[str, Any], list[Attempt]]] = {}
        self.brief: list[tuple[int | None, str | None]] = []
        self.sources: dict[str, SourceDelivery] = {}
        self.refused_429 = 0
        self.resumes: dict[str, int] = {}
        self._resumed: set[str] = set()
        self._lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        with ThreadPoolExecutor(24, thread_name_prefix="soak-feature") as pool:
            n = 100_000
            while not stop.wait(self.rng.expovariate(self.rate)):
                n += 1
                self.send(pool, n)
                self.resume_waits(pool)

    def send(self, pool: ThreadPoolExecutor, n: int) -> None:
        rng = self.rng
        kind = rng.choices(
            [
                "lim_queue",
                "lim_drop",
                "lim_oldest",
                "metered",
                "approve",
                "brief",
                "archived",
                "src",
                "mapped",
                "debounced",
                "batched",
                PARENT,
            ],
            weights=[4, 2, 2, 6, 3, 1, 2, 2, 3, 3, 3, 3],
        )[0]
        if kind == "metered" and n % 3 == 0:
            kind = THROTTLED[0]
        soon = (datetime.now(UTC) + timedelta(seconds=rng.uniform(0.3, 4.0))).isoformat()
        if kind == "src":
            event = rng.choice(["push", "issues", "ping"])
            body = {"n": n, "notify": rng.random() < 0.5, "big": rng.random() < 0.5}
            delivery = str(uuid.UUID(int=rng.getrandbits(128)))
            self.sources[delivery] = SourceDelivery(event, body)
            pool.submit(self.deliver_source, delivery, rng.randrange(len(self.api_bases)))
            if rng.random() < 0.2:
                # A redelivery, sometimes under another (unsigned) event header: it must
                # answer the first routing (docs/reference/security.md).
                relabel = rng.choice([event, event, "push", "issues"])
                api = rng.randrange(len(self.api_bases))
                pool.submit(self.deliver_source, delivery, api, relabel)
            return
        if kind == "brief":
            pool.submit(self.deliver_brief, n, rng.randrange(len(self.api_bases)))
            return
        body: dict[str, Any] = {"n": n, "k": rng.choice("ab"), "until": soon}
        if kind == "archived":
            body["order_id"] = f"arch-{n}"  # its search attribute (no draw of the rng)
        if kind == "lim_oldest" and rng.random() < 0.3:
            # Past its deadline_s: the deadline stops it while it waits.
            body["until"] = (datetime.now(UTC) + timedelta(seconds=14)).isoformat()
        if kind in GROUPED:
            # A burst of 1-4 events (one key for debounce), 0-0.6 s apart: what gathers.
            k = rng.choice("abc")
            later = 0.0
            for j in range(rng.randint(1, 4)):
                later += rng.uniform(0.0, 0.6)
                key = f"soak-f{n}-{j}"
                with self._lock:
                    self.sent[key] = (kind, {"n": n * 10 + j, "k": k}, [])
                pool.submit(self.deliver, key, rng.randrange(len(self.api_bases)), later)
                if rng.random() < 0.1:
                    pool.submit(self.deliver, key, rng.randrange(len(self.api_bases)), later)
            return
        if kind == "mapped":
            count = rng.randint(*MAP_ITEMS)
            if self.map_items and rng.random() < BIG_MAP_SHARE:
                count = rng.randint(self.map_items // 2, self.map_items)
            body["lines"] = [{"sku": f"sku-{n}-{i}"} for i in range(count)]
        key = f"soak-f{n}"
        with self._lock:
            self.sent[key] = (kind, body, [])
        pool.submit(self.deliver, key, rng.randrange(len(self.api_bases)))
        if rng.random() < 0.1:
            pool.submit(self.deliver, key, rng.randrange(len(self.api_bases)))

    def burst(self) -> str:
        """pressure.BURST_SIZE webhooks to workflow `burst` at once (the nemesis's backlog
        operation), keyed and checked like every feature webhook."""
        with self._lock:
            first = 1_000_000 + 10_000 * sum(1 for k in self.sent if k.startswith("soak-b"))
        keys = []
        for i in range(BURST_SIZE):
            key = f"soak-b{first + i}"
            with self._lock:
                self.sent[key] = (BURST, {"n": first + i}, [])
            keys.append(key)
        started = time.monotonic()
        with ThreadPoolExecutor(8, thread_name_prefix="soak-burst") as pool:
            for i, key in enumerate(keys):
                pool.submit(self.deliver, key, i % len(self.api_bases))
        return f"{len(keys)} webhooks sent in {time.monotonic() - started:.1f}s"

    def deliver(self, key: str, api: int, after_s: float = 0.0) -> None:
        """POST with the Idempotency-Key until an answer that is not a 5xx (a 429 of
        max_queued is an answer: the event was refused, and is not sent again), with a
        real sender's patience (workload.patient)."""
        time.sleep(after_s)
        workflow, body, attempts = self.sent[key]
        url = f"{self.api_bases[api]}/hooks/{workflow}"

        def attempt() -> tuple[int | None, Any]:
            sent = time.time()
            r = self.client.request(
                "webhook", "POST", url, auth=False, json=body, headers={"Idempotency-Key": key}
            )
            status = r.status_code if r is not None else None
            eid = r.json().get("execution_id") if status == 202 and r is not None else None
            replayed = r is not None and r.headers.get("Idempotent-Replayed") == "true"
            with self._lock:
                attempts.append(Attempt(sent, time.time(), status, eid, replayed))
                if status == 429:
                    self.refused_429 += 1
            return status, r

        patient(key, attempt, lambda status: status is not None and status < 500)

    def deliver_brief(self, n: int, api: int) -> None:
        """One unkeyed webhook (retention may delete what it makes): sent once."""
        r = self.client.request(
            "webhook", "POST", f"{self.api_bases[api]}/hooks/brief", auth=False, json={"n": n}
        )
        status = r.status_code if r is not None else None
        eid = r.json().get("execution_id") if status == 202 and r is not None else None
        with self._lock:
            self.brief.append((status, eid))

    def deliver_source(self, delivery: str, api: int, event: str | None = None) -> None:
        source = self.sources[delivery]
        raw = json.dumps(source.body).encode()
        digest = hmac.new(SOURCE_SECRET.encode(), raw, hashlib.sha256).hexdigest()
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": event or source.event,
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": f"sha256={digest}",
        }
        url = f"{self.api_bases[api]}/hooks/{SOURCE}"

        def attempt() -> tuple[int | None, Any]:
            r = self.client.request("webhook", "POST", url, auth=False, data=raw, headers=headers)
            status = r.status_code if r is not None else None
            ids: list[str] = []
            if status == 202 and r is not None:
                payload = r.json()
                ids = [e["execution_id"] for e in payload.get("executions", [])]
            with self._lock:
                source.answers.append((status, ids))
            return status, r

        patient(delivery, attempt, lambda status: status is not None and status < 500)

    def resume_waits(self, pool: ThreadPoolExecutor) -> None:
        """For each new resume URL the target received (approve/ask), maybe resume it:
        on time, after the wait's timeout (410), twice with the same body (200) or with
        another (409); or leave it to time out or to the operator."""
        for req in list(self.target.received):
            if not req.path.startswith("/t/approve/ask/"):
                continue
            try:
                url = req.json()["url"]
            except (ValueError, KeyError, TypeError):
                continue
            if url in self._resumed:
                continue
            self._resumed.add(url)
            roll = self.rng.random()
            if roll < 0.35:
                continue  # times out, or the operator completes it
            later = self.rng.uniform(0.0, WAIT_TIMEOUT_S * 1.5)
            twice = self.rng.choice([None, "same", "other"])
            pool.submit(self.resume, url, later, twice)

    def resume(self, url: str, after_s: float, twice: str | None) -> None:
        time.sleep(after_s)
        path = "/hooks/resume/" + url.split("/hooks/resume/", 1)[1]
        base = self.api_bases[0]
        bodies = [{"approved": True}]
        if twice == "same":
            bodies.append({"approved": True})
        elif twice == "other":
            bodies.append({"approved": False})
        for body in bodies:
            r = self.client.request("resume", "POST", f"{base}{path}", auth=False, json=body)
            status = r.status_code if r is not None else None
            with self._lock:
                self.resumes[str(status)] = self.resumes.get(str(status), 0) + 1
