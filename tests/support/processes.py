"""Starting the real bin/api and bin/worker (and the servers tests run beside them) as
child processes, waiting on them, and killing them: the one place tests do that."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
# The key that seals webhook signing secrets in every test process (32 bytes, base64url).
# Tests that need no key say so with FLOWFORGE_ENCRYPTION_KEY="".
TEST_ENCRYPTION_KEY = "dGVzdC1vbmx5LWVuY3J5cHRpb24ta2V5LTMyYnl0ZXM"
# The key that signs resume URLs of wait steps in every test process (32 bytes).
TEST_RESUME_KEY = "cmVzdW1lLWtleS1mb3ItdGVzdHMtb25seS0zMmJ5dGU"
# The key that seals notification endpoints' secrets (API, worker, migrate; 32 bytes).
TEST_NOTIFY_KEY = "bm90aWZ5LWtleS1mb3ItdGVzdHMtb25seS0zMmJ5dGU"


def process_env(
    database_url: str, amqp_url: str, amqp_prefix: str, **settings: str
) -> dict[str, str]:
    """The environment of a bin/api or bin/worker under test: this machine's, without its
    FLOWFORGE_ settings, plus these URLs, the tests' keys, what every test wants (a
    reconciler every 2 s, the loopback allowed, no webhook rate limit) and `settings`
    (LEASE_SECONDS="2" is FLOWFORGE_LEASE_SECONDS=2), which win."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_")},
        "FLOWFORGE_DATABASE_URL": database_url,
        "FLOWFORGE_AMQP_URL": amqp_url,
        "FLOWFORGE_AMQP_PREFIX": amqp_prefix,
        "FLOWFORGE_ENCRYPTION_KEY": TEST_ENCRYPTION_KEY,
        "FLOWFORGE_RESUME_KEY": TEST_RESUME_KEY,
        "FLOWFORGE_NOTIFY_KEY": TEST_NOTIFY_KEY,
        "FLOWFORGE_RECONCILE_SECONDS": "2",
        "FLOWFORGE_HTTP_ALLOW": "127.0.0.1",
        # Load tests send far more than the default 100 webhooks/s per workflow; the
        # limit's own tests (test_intake_floods.py) take this out.
        "FLOWFORGE_WEBHOOK_RATE": "0",
        **{f"FLOWFORGE_{name}": value for name, value in settings.items()},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ports a server that is stopped and started again keeps: below the kernel's ephemeral
# range (net.ipv4.ip_local_port_range, 32768-60999 by default), which free_port() draws
# from and every outgoing connection takes its local port from. A port in that range is
# free only while its server listens: seed 2334 stopped its own RabbitMQ's app, an
# outgoing connection on the machine was given the port meanwhile, and start_app failed
# with eaddrinuse, leaving the run without a broker for good.
SERVER_PORTS = (20_000, 32_000)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


def server_port() -> int:
    """A free loopback port outside the ephemeral range, for a server the test stops and
    starts again on the same port (tests/support/own_servers.py)."""
    low, high = _ephemeral_range()
    candidates = [p for p in range(*SERVER_PORTS) if not low <= p <= high]
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free server port below the ephemeral range")


def kill_session(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGKILL a child's whole session (a server and its helpers): the loss of the host."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll until predicate() is truthy; return its value or fail with `message`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class Process:
    """A child process with its output captured to a file for assertions on logs."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = dict(env)
        if env.get("FLOWFORGE_FAULTS"):
            # Fault points arm only in test mode (production refuses FLOWFORGE_FAULTS).
            env.setdefault("FLOWFORGE_TEST_MODE", "1")
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.kill(self.popen.pid, signum)

    def kill(self) -> None:
        """SIGKILL, the crash every recovery path is built for."""
        kill_session(self.popen, 10)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGCONT)
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.kill()
        self._log.close()
        return self.popen.returncode


# The worker's command line; tests that expect it to refuse to start run it bare.
WORKER = [sys.executable, str(ROOT / "bin" / "worker")]


def run_migrate(
    env: Mapping[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """bin/migrate ARGS with this environment, run to its end, its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bin" / "migrate"), *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def api_argv(port: int, workers: int) -> list[str]:
    """bin/api's command line on a loopback port."""
    return [
        sys.executable,
        str(ROOT / "bin" / "api"),
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
    ]


def wait_answering(proc: Process, url: str, what: str, timeout: float = 30) -> None:
    """Poll `url` until it answers 200; fail at once with the log if `proc` exits."""

    def answering() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{what} exited early:\n{proc.log()}")
        try:
            return requests.get(url, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    wait_for(answering, timeout=timeout, message=f"{what} to answer {url}")


def start_api(env: Mapping[str, str], log_path: Path, workers: int = 2) -> tuple[Process, str]:
    """bin/api on a free loopback port; returns the process and its base URL."""
    port = free_port()
    env = {
        "FLOWFORGE_ENCRYPTION_KEY": TEST_ENCRYPTION_KEY,
        "FLOWFORGE_RESUME_KEY": TEST_RESUME_KEY,
        "FLOWFORGE_NOTIFY_KEY": TEST_NOTIFY_KEY,
        **env,
    }
    proc = Process(api_argv(port, workers), env, log_path)
    base = f"http://127.0.0.1:{port}"
    wait_answering(proc, f"{base}/healthz", "bin/api")
    return proc, base


def start_worker(env: Mapping[str, str], log_path: Path) -> Process:
    """bin/worker; ready once it logs that its consumer is consuming."""
    proc = Process(WORKER, env, log_path)

    def consuming() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"bin/worker exited early:\n{proc.log()}")
        return '"consuming"' in proc.log()

    wait_for(consuming, timeout=30, message="bin/worker to start consuming")
    return proc
