"""bin/demo as a newcomer runs it: with its port taken by another server, and twice."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]


class Squatter(http.server.BaseHTTPRequestHandler):
    """Another program on the demo's port: answers /healthz, refuses everything else."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 401)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def busy_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Squatter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_demo_moves_off_a_busy_port_and_runs_again_without_new_keys_or_versions(
    busy_port: int,
    new_database_url: str,
    amqp_url: str,
    amqp_prefix: str,
    tmp_path: Path,
    env: dict[str, str],
) -> None:
    demo_env = {
        **{k: v for k, v in env.items() if not k.startswith("FLOWFORGE_")},
        "FLOWFORGE_DATABASE_URL": new_database_url,
        "FLOWFORGE_AMQP_URL": amqp_url,
        "FLOWFORGE_AMQP_PREFIX": amqp_prefix,
        "FLOWFORGE_DEMO_DIR": str(tmp_path / "demo"),
        "PORT": str(busy_port),
    }
    runs = [
        subprocess.run(
            [str(ROOT / "bin" / "demo")],
            env=demo_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"port {busy_port} is already in use by another program" in run.stdout
        assert "small_order" in run.stdout
        assert "skipped    because when shape.total lte 100 is false" in run.stdout
        last = run.stdout.strip().splitlines()[-1]
        assert last.startswith("Stopped the demo's API and worker") and "Next:" in last
    first, second = (run.stdout for run in runs)
    assert "created an API key" in first and "== publish docs/examples/order-sync.json" in first
    assert "reusing the demo's API key" in second
    assert "version 1 is already docs/examples/order-sync.json" in second
    with psycopg.connect(new_database_url) as db:
        assert db.execute("SELECT count(*) FROM api_keys").fetchone() == (1,)
        assert db.execute("SELECT count(*) FROM workflow_versions").fetchone() == (1,)
        statuses = db.execute("SELECT status FROM executions").fetchall()
        assert statuses == [("succeeded",), ("succeeded",)]
