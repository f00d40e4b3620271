"""A map of pure items against as many separate executions, and the page of a big map.

    .venv/bin/python -m tests.bench.fanout [--items 1000] [--page-items 10000]

Starts bin/api and bin/worker in a private database and RabbitMQ vhost (tests/bench
session). First `--items` executions of a chain of two transforms, each started by its
own webhook, timed from the first webhook to the last success (PostgreSQL's clock);
then one execution whose map runs the same two transforms for `--items` items, timed
the same way; prints both rates and their ratio (asked: ≥ 0.8). Then a map of
`--page-items` pure items, its execution page read `--reads` times each way — the API's
GET /api/v1/executions/{id} and the console's /ui/executions/{id} (signed in) — median
and max in ms (asked: < 200 ms). Each figure is printed with `met` or `NOT met`.
Figures, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from tests.bench.infra import ADMIN_DATABASE, BenchError
from tests.bench.session import Session
from tests.support.definitions import unsigned

CHAIN = [
    {"id": "shape", "type": "transform", "output": {"n": "{{ input.n }}"}},
    {"id": "done", "type": "transform", "depends_on": ["shape"], "output": "{{ shape }}"},
]
ITEM = [
    {"id": "shape", "type": "transform", "output": {"n": "{{ item }}"}},
    {"id": "done", "type": "transform", "depends_on": ["shape"], "output": "{{ shape }}"},
]
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
# The figures this bench asks for (a map as fast as separate executions, its page quick).
RATIO_ASKED = 0.8
PAGE_MS_ASKED = 200.0
SPAN = """
SELECT count(*), extract(epoch FROM max(e.finished_at) - min(e.created_at))
FROM executions e JOIN workflows w ON w.id = e.workflow_id
WHERE w.key = %s AND e.status = 'succeeded'
"""


def _workflow(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return unsigned(steps, "fan-out bench")


def _mapped(items: int) -> dict[str, Any]:
    return _workflow(
        [
            {
                "id": "each",
                "type": "map",
                "items": "{{ input.items }}",
                "max_parallel": 20,
                "steps": ITEM,
            }
        ]
    )


def _until_done(session: Session, key: str, count: int, timeout_s: float = 600) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        done, span = session.conn.execute(SPAN, (key,)).fetchone()
        if done >= count:
            return float(span)
        if time.monotonic() > deadline:
            raise BenchError(f"timed out: {done} of {count} {key} executions done")
        time.sleep(0.2)


def _hook(session: Session, key: str, body: Any) -> str:
    r = requests.post(
        session.hook_url(key),
        json=body,
        headers={"Idempotency-Key": f"f-{uuid.uuid4().hex}"},
        timeout=60,
    )
    if r.status_code != 202:
        raise BenchError(f"webhook answered {r.status_code}: {r.text[:300]}")
    return str(r.json()["execution_id"])


def _timed(http: requests.Session, url: str, reads: int) -> list[float]:
    """Milliseconds of `reads` GETs of `url`, each answered 200."""
    timings = []
    for _ in range(reads):
        started = time.perf_counter()
        r = http.get(url, timeout=60)
        timings.append((time.perf_counter() - started) * 1000)
        if r.status_code != 200:
            raise BenchError(f"{url} answered {r.status_code}")
    return timings


def _console(session: Session) -> requests.Session:
    """A console session signed in with the bench's API key."""
    http = requests.Session()
    page = http.get(f"{session.api_url}/ui/signin", timeout=30)
    found = CSRF.search(page.text)
    if found is None:
        raise BenchError("the console's sign-in page has no CSRF token")
    r = http.post(
        f"{session.api_url}/ui/signin",
        data={"csrf": found.group(1), "api_key": session.api_key},
        allow_redirects=False,
        timeout=30,
    )
    if r.status_code != 303:
        raise BenchError(f"console sign-in answered {r.status_code}")
    return http


def measure(session: Session, items: int, page_items: int, reads: int = 20) -> dict[str, float]:
    """The figures of the module docstring; needs bin/api and bin/worker running."""
    session.publish("chains", _workflow(CHAIN))
    session.publish("mapped", _mapped(items))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: _hook(session, "chains", {"n": n}), range(items)))
    chains_s = _until_done(session, "chains", items)
    _hook(session, "mapped", {"items": list(range(items))})
    map_s = _until_done(session, "mapped", 1)
    big = _hook(session, "mapped", {"items": list(range(page_items))})
    _until_done(session, "mapped", 2)
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {session.api_key}"
    api = _timed(http, f"{session.api_url}/api/v1/executions/{big}", reads)
    console = _timed(_console(session), f"{session.api_url}/ui/executions/{big}", reads)
    return {
        "chains_per_s": items / chains_s,
        "map_items_per_s": items / map_s,
        "ratio": (items / map_s) / (items / chains_s),
        "page_p50_ms": statistics.median(api),
        "page_max_ms": max(api),
        "console_p50_ms": statistics.median(console),
        "console_max_ms": max(console),
    }


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    """Measure and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--page-items", type=int, default=10_000)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    with Session(ADMIN_DATABASE, 2, 8, keep_logs=False, profile_dir=None) as s:
        s.start_api()
        s.start_worker()
        f = measure(s, args.items, args.page_items, args.reads)
    print(
        f"{args.items} chains of two transforms: {f['chains_per_s']:.0f} executions/s; "
        f"a map of {args.items} such items: {f['map_items_per_s']:.0f} items/s "
        f"(ratio {f['ratio']:.2f}, asked >= {RATIO_ASKED}: {_met(f['ratio'] >= RATIO_ASKED)})"
    )
    for name, key in (("API", "page"), ("console", "console")):
        p50 = f[f"{key}_p50_ms"]
        print(
            f"execution page of a {args.page_items}-item map, {name}, {args.reads} reads: "
            f"median {p50:.1f} ms, max {f[f'{key}_max_ms']:.1f} ms "
            f"(asked < {PAGE_MS_ASKED:.0f} ms: {_met(p50 < PAGE_MS_ASKED)})"
        )


if __name__ == "__main__":
    main()
