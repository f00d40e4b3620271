"""The long-poll slots of one bin/api (docs/contract.md#live-progress): made by its master,
at most workers - 1, each held by one poll at a time, across processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flowforge.api import API_DB_TIMEOUT_S, serve
from flowforge.api.console import live
from flowforge.store import db

# Another process (a sibling worker) holding the first slot, as Slots.taken does.
HOLD_FIRST = """
import fcntl, sys
with open(sys.argv[1] + "/slot-0", "ab") as slot:
    fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_the_master_leaves_one_worker_free_of_long_polls(tmp_path: Path) -> None:
    assert live.server_slots(str(tmp_path / "a"), 2, 5) == 2
    assert live.server_slots(str(tmp_path / "b"), 2, 2) == 1
    assert live.server_slots(str(tmp_path / "c"), 3, 1) == 0
    assert live.Slots(tmp_path / "b" / live.SLOTS_DIR).size == 1


def test_a_slot_is_held_by_one_poll_of_any_process_and_freed_when_it_ends(
    tmp_path: Path,
) -> None:
    slots = live.Slots.prepare(tmp_path / "slots", 1)
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD_FIRST, str(slots.directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdin is not None
        assert other.stdout.readline().strip() == "held"
        with slots.taken() as got:
            assert got is False
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.wait(10) == 0
    finally:
        other.kill()
    with slots.taken() as got:
        assert got is True
        with slots.taken() as second:
            assert second is False
    with live.Slots.prepare(tmp_path / "none", 0).taken() as got:
        assert got is False


def test_a_poll_ends_in_time_for_its_slowest_read_before_gunicorn_kills_the_worker() -> None:
    """A read begun at a wait's very end may take the API's database bound plus the reply
    margin; the wait, counted from the request's start, leaves room for it."""
    assert live.SLOWEST_READ_S == API_DB_TIMEOUT_S + db.REPLY_MARGIN_S
    timeout = serve.DEFAULTS[serve.DEFAULTS.index("--timeout") + 1]
    assert float(timeout) == live.WORKER_TIMEOUT_S
    assert 0 < live.LONGEST_WAIT_S <= live.WORKER_TIMEOUT_S - live.SLOWEST_READ_S
