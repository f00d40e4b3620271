"""What the intake benches (tests/bench/debounce.py, tests/bench/routing.py) share: one
bin/api on a private, migrated database with no worker, and senders posting in a closed
loop. Figures, not tests: nothing here asserts."""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import requests

from flowforge.store import apikeys
from tests.bench.infra import migrated_database
from tests.support.processes import start_api

ADMIN_URL = "postgresql://root@127.0.0.1:5432/postgres"


@contextmanager
def api_alone() -> Iterator[tuple[requests.Session, str]]:
    """A session holding an API key, and the base URL of one bin/api (2 sync workers) on
    a private database, dropped afterwards. FLOWFORGE_WEBHOOK_RATE=0: the engine is
    measured, not the default limit."""
    with migrated_database(ADMIN_URL) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            key = apikeys.create(conn, "bench")[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")}
        env["FLOWFORGE_DATABASE_URL"] = url
        env["FLOWFORGE_WEBHOOK_RATE"] = "0"
        with tempfile.TemporaryDirectory() as tmp:
            proc, base = start_api(env, Path(tmp) / "api.log")
            try:
                session = requests.Session()
                session.headers["Authorization"] = f"Bearer {key}"
                yield session, base
            finally:
                proc.stop()


def closed_loop(
    seconds: float, senders: int, post: Callable[[requests.Session], requests.Response]
) -> tuple[float, int]:
    """Accepted (202) requests per second over `seconds`, `senders` threads each posting
    with `post` on a session of its own as fast as answers come; and how many were not."""
    stop = time.monotonic() + seconds
    accepted = [0] * senders
    refused = [0] * senders

    def send(index: int) -> None:
        session = requests.Session()
        while time.monotonic() < stop:
            if post(session).status_code == 202:
                accepted[index] += 1
            else:
                refused[index] += 1

    started = time.monotonic()
    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(accepted) / (time.monotonic() - started), sum(refused)


def closed_loop_arguments(description: str) -> argparse.ArgumentParser:
    """A closed-loop bench's command line: `--seconds` per phase, `--senders` threads."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=8)
    return parser
