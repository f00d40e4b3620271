"""Faults of pressure for the randomized run (issue 39): a worker whose clock is an hour
off, a connection storm and a full disk on the run's own PostgreSQL, and a backlog
longer than the reconcile interval.

- skew: a worker is killed and its successor runs under libfaketime (Debian's
  `faketime`; .ci/run installs it) an hour ahead or behind: its `time.time()` and
  `datetime.now()` are wrong, its monotonic clock is not. Delays, leases, ticks and holds
  follow the database clock (docs/contract.md#holds), so every promise of the checker
  must hold with it. Without libfaketime the operation does nothing but say so.
- storm: connections to the run's own PostgreSQL until it refuses more (max_connections),
  held 1-5 s: the processes' new connections are refused; the API answers 503, never
  500, and nothing accepted is lost.
- disk: the executions table lives on a tmpfs tablespace of its own (SmallDisk), which
  is filled up for 1-6 s: intake answers 503 saying the disk is full, and a worker's
  writes to executions fail and are retried.
- backlog: a burst of webhooks whose steps the target answers slowly, sized so that the
  queue takes longer than the reconcile interval to drain (workflow BURST): a wake-up
  still queued is not lost, and the reconciler must not publish it again.

Storm and disk act on the run's own servers only (`--servers own`): the shared ones
serve other tests.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SKEW = "1h"
# Connections the storm opens at most (the run's own PostgreSQL allows 200).
STORM_MAX = 400
# The tmpfs under the executions table: room for a run's rows, filled by the fault.
DISK_SIZE = "64m"
# Workflow `burst`: one GET the target answers after BURST_DELAY_S. BURST_SIZE of them
# keep every worker slot (3 workers x 4) busy for BURST_SIZE * BURST_DELAY_S / 12 s,
# beyond the default reconcile interval (30 s).
BURST = "burst"
BURST_SIZE = 480
BURST_DELAY_S = 1.0


def skewed_env(ahead: bool) -> dict[str, str] | None:
    """The environment that runs a process an hour ahead (or behind); None without
    libfaketime."""
    if not FAKETIME.exists():
        return None
    return {
        "LD_PRELOAD": str(FAKETIME),
        "FAKETIME": f"{'+' if ahead else '-'}{SKEW}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def storm(admin_url: str, hold_s: float) -> str:
    """Open connections until the server refuses one (or STORM_MAX), hold them, close."""
    held: list[psycopg.Connection[Any]] = []
    refused = ""
    try:
        while len(held) < STORM_MAX:
            try:
                held.append(psycopg.connect(admin_url, autocommit=True, connect_timeout=3))
            except psycopg.OperationalError as exc:
                refused = str(exc).strip().splitlines()[-1][:80]
                break
        time.sleep(hold_s)
    finally:
        for conn in held:
            with contextlib.suppress(psycopg.Error):
                conn.close()
    return f"{len(held)} connections held {hold_s:.1f}s; then refused: {refused or 'none'}"


class SmallDisk:
    """The run database's executions table on a tmpfs of DISK_SIZE (mounting needs
    root: without it, `ready` is False and the disk operation does nothing)."""

    def __init__(self) -> None:
        self.mount = Path(tempfile.mkdtemp(prefix="flowforge-soak-disk-"))
        self.mount.chmod(0o755)
        self.name = f"ff_soak_disk_{uuid.uuid4().hex[:8]}"
        self.ready = False
        self._mounted = False
        self._filler = self.mount / "filler"
        self._lock = threading.Lock()

    def attach(self, admin_url: str, database_url: str) -> None:
        """Mount the tmpfs and move the executions table onto it."""
        options = f"size={DISK_SIZE},mode=0755"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(self.mount)],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            print(f"small disk not mounted, no pg_disk fault: {done.stderr!r}", flush=True)
            return
        self._mounted = True
        location = self.mount / "pg"
        location.mkdir()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            owner = Path(conn.execute("SHOW data_directory").fetchone()[0]).stat()  # type: ignore[index]
            os.chown(location, owner.st_uid, owner.st_gid)
            conn.execute(f"CREATE TABLESPACE {self.name} LOCATION '{location}'")
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE executions SET TABLESPACE {self.name}")
        self.ready = True

    def fill(self, hold_s: float) -> str:
        """Fill the tmpfs, hold it full, free it."""
        with self._lock:
            written = 0
            try:
                with open(self._filler, "wb") as out, contextlib.suppress(OSError):
                    while True:
                        out.write(b"\0" * 65536)
                        out.flush()
                        written += 65536
                time.sleep(hold_s)
            finally:
                self._filler.unlink(missing_ok=True)
        return f"{written // 2**20} MiB written, full {hold_s:.1f}s"

    def close(self) -> None:
        """Unmount (the run's own server, and its database, are gone by then)."""
        if self._mounted:
            subprocess.run(["umount", "-l", str(self.mount)], check=False)
        with contextlib.suppress(OSError):
            self.mount.rmdir()


def burst_definition(target_url: str) -> dict[str, Any]:
    """Workflow BURST: one GET at /t/burst/get/<n>/<execution>, answered slowly."""
    return {
        "name": BURST,
        "trigger": {"webhook": {"auth": "none"}},
        "steps": [
            {
                "id": "get",
                "type": "http_request",
                "request": {
                    "method": "GET",
                    "url": f"{target_url}/t/{BURST}/get/{{{{ input.n }}}}/{{{{ execution.id }}}}",
                    "timeout_s": 5,
                },
                "retry": {"max_attempts": 3, "initial_interval_s": 0.2},
            }
        ],
    }
