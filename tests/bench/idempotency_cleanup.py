"""How fast the reaper forgets expired idempotency keys, against intake's rate.

    .venv/bin/python -m tests.bench.idempotency_cleanup [--keys 1000000] [--intake 1000]

Creates a private, migrated database on the local PostgreSQL, fills it with `--keys`
expired keys shaped like intake's (a `webhook-id`, a SHA-256, an execution id), and
while a thread keeps inserting fresh keys at `--intake` per second, runs the reaper's
housekeeping passes back to back until the backlog is gone. Prints keys forgotten per
second; the database is dropped afterwards. A figure, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import threading
import time

import psycopg

from flowforge.store.db import create_pool
from flowforge.worker.housekeeping import Housekeeping
from tests.bench.infra import migrated_database

ADMIN_URL = "postgresql://root@127.0.0.1:5432/postgres"
EXPIRED = """
INSERT INTO idempotency_keys (workflow_id, key, body_sha256, execution_id, created_at)
SELECT 1, 'msg_' || md5(n::text), sha256(n::text::bytea), gen_random_uuid(),
       now() - interval '25 hours' - make_interval(secs => n %% 3600)
FROM generate_series(1, %(n)s) AS n
"""
FRESH = """
INSERT INTO idempotency_keys (workflow_id, key, body_sha256, execution_id)
SELECT 1, 'new_' || gen_random_uuid(), sha256(gen_random_uuid()::text::bytea),
       gen_random_uuid()
FROM generate_series(1, %(n)s)
"""


def main() -> None:
    """Measure and print; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--intake", type=int, default=1_000, help="fresh keys per second")
    args = parser.parse_args()
    with migrated_database(ADMIN_URL) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(EXPIRED, {"n": args.keys})
            conn.execute("VACUUM ANALYZE idempotency_keys")
        stop = threading.Event()

        def intake() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                while not stop.wait(0.1):
                    conn.execute(FRESH, {"n": args.intake // 10})

        feeder = threading.Thread(target=intake, daemon=True)
        pool = create_pool(url, max_size=2, name="bench-reaper")
        pool.open(wait=True)
        housekeeping = Housekeeping(pool, threading.Event())
        feeder.start()
        started = time.monotonic()
        forgotten, passes = 0, 0
        while forgotten < args.keys:  # passes back to back, as while a backlog lasts
            forgotten += housekeeping.forget_expired_keys()[0]
            passes += 1
        elapsed = time.monotonic() - started
        stop.set()
        feeder.join()
        pool.close()
        print(
            f"forgot {forgotten:,} expired idempotency keys in {elapsed:.1f} s over {passes} "
            f"housekeeping passes while intake added {args.intake:,}/s: {forgotten / elapsed:,.0f} "
            f"keys/s, {forgotten / elapsed / args.intake:.0f}x the intake rate"
        )


if __name__ == "__main__":
    main()
