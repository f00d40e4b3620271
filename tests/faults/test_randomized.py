"""The randomized fault run, short form: one fixed seed, about a minute and a half on a
loaded 2-core machine (see tests/soak/soak.py for what it does, the long form and how to
replay a seed).

Promise: under SIGKILL, SIGSTOP (also of a worker frozen inside a unit of work), reset,
blackholed, stranded and lock-partitioned database and broker links, stops and kills of
the run's own PostgreSQL and RabbitMQ servers, and operator cancel / retry / resolve /
complete / pause / resume / replay / re-ingest at random moments, no invariant breaks
(tests/soak/checker.py lists them) — for every feature: concurrency limits, schedules,
wait steps, retention, outbound limits and circuits, a signed source, map steps, debounce
and batch, child workflows, events correlated by key (early, late, redelivered, for
nobody), search attributes and failure groups. A failure prints
every violation and the command that replays its seed. Deselect locally with
`-m "not randomized"`.

Seed 11 runs on the run's own servers and is known (by its draws) to stop or kill one of
them; every run also has a worker with a skewed clock, a full disk and a connection storm
(tests/soak/pressure.py) once, and only the long form a backlog past the reconcile
interval. The long form (docs/explanation/failures.md) covers the shared services and the
replicated servers (failover, node loss) too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.soak.soak import Options, run_one

# Its occasional big map has 20-40 items: the long form's hundreds drain at about one
# item a second on a loaded machine, past the quiet wait's cap of a short run.
SHORT = Options(duration=35.0, interval=(0.3, 1.2), settle_cap=240.0, map_items=40)
SEEDS = {11: replace(SHORT, servers="own")}


@pytest.mark.randomized
@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_no_invariant_breaks_under_random_faults(
    seed: int, pg_admin_url: str, amqp_url: str, tmp_path: Path
) -> None:
    options = SEEDS[seed]
    outcome = run_one(seed, replace(options, logs=tmp_path), pg_admin_url, amqp_url)
    assert not outcome.violations, (
        f"{outcome.summary()}\nreplay (best effort): .venv/bin/python -m tests.soak.soak "
        f"--seed {seed} {options.replay_flags()}"
    )
    # The run touched what it is for (figures, not timings).
    by_workflow = outcome.figures["executions_by_workflow"]
    ran = (
        "lim_queue",
        "metered",
        "approve",
        "sched_skip",
        "orders",
        "mapped",
        "childed",
        "awaited",
        "archived",
    )
    for workflow in ran:
        assert by_workflow.get(workflow), f"no {workflow} execution: {by_workflow}"
    # This round's promises were exercised: waits took events, attributes and failure
    # groups were written (tests/soak/promises.py).
    figures = outcome.figures
    assert figures["event_consumptions"] and figures["events_sent"]["redeliveries"], figures
    assert figures["attribute_rows"] and figures["failed_grouped"], figures
    groups = outcome.figures["groups"]
    assert groups.get("debounce events") and groups.get("batch events"), groups
    if options.servers == "own":
        assert outcome.figures["server_outages"], "no server fault: choose another seed"
        # The pressure faults every run has (tests/soak/nemesis.py PRESSURE_AT_S).
        faults, outages = outcome.figures["faults"], outcome.figures["server_outages"]
        assert faults.get("skew") and outages.get("pg_disk") and outages.get("pg_storm"), faults
