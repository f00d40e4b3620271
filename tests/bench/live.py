"""What open live console pages cost bin/api (docs/contract.md#live-progress): `bin/bench
--phase live [--pages 500] [--seconds 60]`.

Starts bin/api (its default workers, so FLOWFORGE_LIVE_WAITS' default bound) and bin/worker
in a private database and vhost, publishes a workflow whose first step waits and a chain of
three transforms, starts `--watched` waiting executions and signs in to the console. Then
two windows of `--seconds` each, both with the same steady load (webhooks of the chain at
`--rate` per second, which the worker runs): the first without pages, the second with
`--pages` threads that each behave as one open execution page's script: long poll
GET /ui/executions/{id}/changes?since=, honour Retry-After, fetch the fragment when it
changed. Four times in the window one watched execution's wait is completed through the
API, so some pages see a change (and stop: their execution is over). The figure is
bin/api's CPU (master and workers, from /proc/PID/stat) in the second window minus the
first, as a share of one CPU. A figure, not a test: nothing is asserted.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import requests

from tests.bench.infra import BenchError, CpuWindow
from tests.bench.session import CHAIN3, Session
from tests.support.definitions import transform, wait, workflow

WATCHED = workflow(
    wait("approval", 3600),
    transform("ship", {"ok": "{{ approval.ok }}"}, after=("approval",)),
    name="Watched",
)
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
VERSION = re.compile(r'data-version="([0-9.-]+)"')
# The share of one CPU 500 open pages may cost bin/api (issue #46).
TARGET_PCT = 10.0


def _sign_in(base: str, key: str) -> str:
    """A console session's cookie header value."""
    http_session = requests.Session()
    page = http_session.get(f"{base}/ui/signin", timeout=30)
    token = CSRF.search(page.text)
    if token is None:
        raise BenchError("the sign-in page has no CSRF token")
    r = http_session.post(
        f"{base}/ui/signin",
        data={"csrf": token.group(1), "api_key": key},
        allow_redirects=False,
        timeout=30,
    )
    if r.status_code != 303:
        raise BenchError(f"signing in answered {r.status_code}")
    return "; ".join(f"{c.name}={c.value}" for c in http_session.cookies)


class Page(threading.Thread):
    """One open execution page: what console.js does, over plain HTTP/1.1."""

    def __init__(self, base: str, cookie: str, eid: str, version: str, tally: Counter) -> None:
        super().__init__(daemon=True)
        self.host, self.port = urllib.parse.urlsplit(base).netloc.split(":")
        self.headers = {"Cookie": cookie, "X-Requested-With": "fetch"}
        self.eid = eid
        self.version = version
        self.tally = tally
        self.stop = threading.Event()

    def _get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, int(self.port), timeout=30)
        try:
            conn.request("GET", path, headers=self.headers)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._once()
            except OSError:
                self.tally["error"] += 1
                self.stop.wait(5)

    def _once(self) -> None:
        since = urllib.parse.quote(self.version)
        status, headers, body = self._get(f"/ui/executions/{self.eid}/changes?since={since}")
        if status != 200:
            self.tally[f"status {status}"] += 1
            self.stop.wait(5)
            return
        answer = json.loads(body)
        retry = int(headers.get("Retry-After", "0"))
        if answer["changed"]:
            self.tally["changed"] += 1
            _, fragment_headers, _ = self._get(f"/ui/executions/{self.eid}/live")
            self.version = fragment_headers.get("X-Version", answer["version"])
        elif retry:
            self.tally["retry-after"] += 1
            self.stop.wait(retry)
        else:
            self.tally["waited"] += 1
        if not answer["live"]:
            self.tally["over"] += 1
            self.stop.wait(3600)


def _steady(session: Session, rate: float, stop: threading.Event) -> Callable[[], int]:
    """Webhooks of the chain at `rate` per second until `stop`; returns a counter."""
    sent = [0]

    def send() -> None:
        http_session = requests.Session()
        started = time.monotonic()
        while not stop.is_set():
            http_session.post(session.hook_url("chain3"), json={"order_id": 1, "total": 2})
            sent[0] += 1
            stop.wait(max(0.0, started + sent[0] / rate - time.monotonic()))

    threading.Thread(target=send, daemon=True).start()
    return lambda: sent[0]


def _complete_now_and_then(
    session: Session, ids: list[str], every_s: float, stop: threading.Event
) -> None:
    def complete() -> None:
        auth = {"Authorization": f"Bearer {session.api_key}"}
        for eid in ids:
            if stop.wait(every_s):
                return
            requests.post(
                f"{session.api_url}/api/v1/executions/{eid}/steps/approval/complete",
                json={"output": {"ok": True}},
                headers=auth,
                timeout=30,
            )

    threading.Thread(target=complete, daemon=True).start()


def _window(session: Session, seconds: float) -> float:
    """bin/api's CPU over `seconds`, in ms."""
    assert session.api is not None and session.worker is not None
    with CpuWindow({"api": session.api.pid, "worker": session.worker.pid}) as cpu:
        time.sleep(seconds)
    return cpu.groups["api"]


def run(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Both windows; the figures."""
    threading.stack_size(256 * 1024)
    with Session.from_args(args) as session:
        session.start_api()
        session.start_worker()
        session.publish("chain3", CHAIN3)
        session.publish("watched", WATCHED)
        ids = [
            requests.post(
                session.hook_url("watched"),
                json={"n": n},
                headers={"Idempotency-Key": f"w-{uuid.uuid4().hex}"},
                timeout=30,
            ).json()["execution_id"]
            for n in range(args.watched)
        ]
        deadline = time.monotonic() + 120
        waiting = "SELECT count(*) FROM steps WHERE step_id = 'approval' AND status = 'waiting'"
        while int(session.scalar(waiting)) < len(ids):
            if time.monotonic() > deadline:
                raise BenchError("the watched executions never all waited")
            time.sleep(0.2)
        cookie = _sign_in(session.api_url, session.api_key)
        versions = {}
        for eid in ids:
            page = requests.get(
                f"{session.api_url}/ui/executions/{eid}", headers={"Cookie": cookie}, timeout=30
            )
            versions[eid] = VERSION.findall(page.text)[0]
        stop = threading.Event()
        sent = _steady(session, args.rate, stop)
        log(f"live: baseline window, {args.seconds:g} s of steady load alone")
        time.sleep(5)  # the load settles
        baseline_ms = _window(session, args.seconds)
        tally: Counter = Counter()
        pages = [
            Page(session.api_url, cookie, ids[n % len(ids)], versions[ids[n % len(ids)]], tally)
            for n in range(args.pages)
        ]
        for page in pages:
            page.start()
        # A few watched executions finish in the window: their pages refresh, then stop.
        _complete_now_and_then(session, ids, args.seconds / 4, stop)
        log(f"live: {args.pages} pages open, {args.seconds:g} s window")
        time.sleep(5)  # every page has asked once
        before = dict(tally)
        live_ms = _window(session, args.seconds)
        polls = {k: v - before.get(k, 0) for k, v in tally.items()}
        stop.set()
        for page in pages:
            page.stop.set()
        sent_total = sent()
    extra_pct = max(0.0, live_ms - baseline_ms) / (args.seconds * 10.0)
    return {
        "pages": args.pages,
        "watched": args.watched,
        "seconds": args.seconds,
        "api_workers": args.api_workers,
        "load_webhooks": sent_total,
        "api_cpu_baseline_pct": baseline_ms / (args.seconds * 10.0),
        "api_cpu_with_pages_pct": live_ms / (args.seconds * 10.0),
        "api_cpu_for_pages_pct": extra_pct,
        "answers": polls,
        "target_pct": TARGET_PCT,
    }


def table(report: dict[str, Any]) -> str:
    """The figures as bin/bench prints them."""
    answers = ", ".join(f"{k} {v}" for k, v in sorted(report["answers"].items()))
    verdict = "ok" if report["api_cpu_for_pages_pct"] <= TARGET_PCT else "OVER"
    return "\n".join(
        [
            f"live pages ({report['pages']} open on {report['watched']} executions, "
            f"{report['seconds']:g} s windows, bin/api with {report['api_workers']} workers):",
            f"  bin/api CPU, steady load alone  {report['api_cpu_baseline_pct']:6.1f} % of a CPU",
            f"  bin/api CPU, load + pages       {report['api_cpu_with_pages_pct']:6.1f} % of a CPU",
            f"  of which the pages              {report['api_cpu_for_pages_pct']:6.1f} %"
            f"  (target <= {TARGET_PCT:g} %: {verdict})",
            f"  answers in the window: {answers}",
        ]
    )
