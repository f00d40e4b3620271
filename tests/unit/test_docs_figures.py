"""The figures the how-tos quote that the code decides (issue 42): connection budgets,
setting defaults, liveness timings. They drifted apart once (a worker's 15 connections in
the docs, 11 in the code); each is read from the page and compared with the code."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from flowforge.domain.model import WORKER_BEAT_S, WORKER_DEAD_AFTER_S
from flowforge.store import budget
from flowforge.store.config import Settings
from flowforge.worker.reaper import Reaper

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "howto"
SEVERAL = (HOWTO / "several-hosts.md").read_text()
SCALE = (HOWTO / "scale-out.md").read_text()
DEFAULTS = Settings()
# gunicorn sync workers on the 2-core hosts the pages assume: 2 x cores + 1.
API_WORKERS_2_CORES = 5
X = "\u00d7"  # the pages' multiplication sign


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text, re.DOTALL)
    assert found, f"the page no longer says {pattern!r}"
    return float(found.group(1))


def test_the_connection_budget_is_the_code_s() -> None:
    worker = budget.worker_budget(DEFAULTS).connections
    api = budget.api_budget(DEFAULTS, API_WORKERS_2_CORES).connections
    assert _number(r"\| bin/worker \|[^\n]*= (\d+)\) \|", SEVERAL) == worker
    assert _number(rf"defaults on 2 cores: 5 {X} 1 = (\d+)", SEVERAL) == api
    assert _number(r"LISTEN \(defaults: (\d+) \+ 1", SEVERAL) == DEFAULTS.worker_pool_size
    total = _number(rf"3 {X} {api} \+ 3 {X} {worker} = (\d+)", SEVERAL)
    assert total == 3 * api + 3 * worker


def test_the_setting_defaults_the_pages_quote_are_the_code_s() -> None:
    table = {
        "FLOWFORGE_DB_POOL_SIZE": DEFAULTS.db_pool_size,
        "FLOWFORGE_WORKER_CONCURRENCY": DEFAULTS.worker_concurrency,
        "FLOWFORGE_WORKER_POOL_SIZE": DEFAULTS.worker_pool_size,
    }
    for name, value in table.items():
        assert _number(rf"\| `{name}` \| `(\d+)` \|", SEVERAL) == value, name
    assert _number(r"`FLOWFORGE_DB_POOL_SIZE` \(default (\d+)\)", SCALE) == DEFAULTS.db_pool_size
    assert (
        _number(r"`FLOWFORGE_WORKER_POOL_SIZE` \(default (\d+)\)", SCALE)
        == DEFAULTS.worker_pool_size
    )
    assert (
        _number(r"`FLOWFORGE_WORKER_CONCURRENCY` \(default (\d+)\)", SCALE)
        == DEFAULTS.worker_concurrency
    )
    assert f"`{DEFAULTS.amqp_url}`" in SEVERAL


def test_the_takeover_bound_is_the_code_s() -> None:
    assert _number(r"renewed every (\d+) s", SEVERAL) == WORKER_BEAT_S
    assert _number(r"When a row is (\d+) s\s+old", SEVERAL) == WORKER_DEAD_AFTER_S
    assert _number(r"taken over at most (\d+) s", SEVERAL) == WORKER_DEAD_AFTER_S
    reaper = Reaper(
        None,  # type: ignore[arg-type]  # only its pass interval is read
        lease_s=DEFAULTS.lease_seconds,
        reconcile_s=DEFAULTS.reconcile_seconds,
        stop=threading.Event(),
    )
    assert _number(r"at least 0\.2 s: ([\d.]+) s with the defaults", SEVERAL) == reaper.interval
