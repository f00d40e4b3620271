"""The randomized fault run, short form: a few fixed seeds, about a minute each (see
tests/soak/soak.py for what it does, the long form and how to replay a seed).

Promise: under SIGKILL, SIGSTOP, reset, blackholed and stranded database and broker links,
and operator cancel / retry / resolve at random moments, no invariant of SPEC §7 breaks
(tests/soak/checker.py lists them). A failure prints every violation and the command
that replays its seed. Deselect locally with `-m "not randomized"`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.soak.soak import Options, run_one

SEEDS = (1, 2, 3)
SHORT = Options(duration=30.0, interval=(0.3, 1.2))


@pytest.mark.randomized
@pytest.mark.parametrize("seed", SEEDS)
def test_no_invariant_breaks_under_random_faults(
    seed: int, pg_admin_url: str, amqp_url: str, tmp_path: Path
) -> None:
    outcome = run_one(seed, replace(SHORT, logs=tmp_path), pg_admin_url, amqp_url)
    assert not outcome.violations, (
        f"{outcome.summary()}\nreplay (best effort): .venv/bin/python -m tests.soak.soak "
        f"--seed {seed} {SHORT.replay_flags()}"
    )
