"""Shared fixtures: a private database per test (copied from a migrated template), a
private RabbitMQ name prefix per test, real bin/api and bin/worker processes, and a
recording HTTP target on 127.0.0.1."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import psycopg
import pytest

from flowforge.store import apikeys
from flowforge.store.migrate import migrate
from flowforge.trust.sealing import parse_key
from tests.support import inprocess
from tests.support.api import Api
from tests.support.inprocess import InProcess, Runner
from tests.support.own_servers import own_postgres, own_rabbitmq  # noqa: F401 - fixtures
from tests.support.processes import (
    TEST_ENCRYPTION_KEY,
    TEST_NOTIFY_KEY,
    TEST_RESUME_KEY,
    Process,
    process_env,
    start_api,
    start_worker,
)
from tests.support.services import find_postgres, find_rabbitmq
from tests.support.target import Target


def _with_database(url: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=name)


def _drop(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


UNIT = Path(__file__).parent / "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/unit is in the fast lane (`bin/test --fast`); other modules
    join it with `pytestmark = pytest.mark.fast` (docs/howto/develop.md)."""
    for item in items:
        if UNIT in item.path.parents:
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def _cleanups() -> Iterator[list[Callable[[], None]]]:
    cleanups: list[Callable[[], None]] = []
    yield cleanups
    for cleanup in reversed(cleanups):
        cleanup()


@pytest.fixture(scope="session")
def pg_admin_url(_cleanups: list[Callable[[], None]]) -> str:
    return find_postgres(_cleanups)


@pytest.fixture(scope="session")
def amqp_url(_cleanups: list[Callable[[], None]]) -> str:
    return find_rabbitmq(_cleanups)


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    """A database migrated once per session; each test gets a copy of it."""
    name = f"ff_tmpl_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    migrate(_with_database(pg_admin_url, name))
    yield name
    _drop(pg_admin_url, name)


@pytest.fixture
def database_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """A private, migrated database for this test, dropped afterwards."""
    name = f"ff_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield _with_database(pg_admin_url, name)
    _drop(pg_admin_url, name)


@pytest.fixture
def new_database_url(pg_admin_url: str) -> Iterator[str]:
    """The URL of a database nobody has created: the code under test creates it (bin/demo,
    the tutorial, a failover report's new primary); dropped afterwards."""
    name = f"ff_new_{uuid.uuid4().hex[:10]}"
    yield _with_database(pg_admin_url, name)
    _drop(pg_admin_url, name)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def amqp_prefix(amqp_url: str) -> Iterator[str]:
    """Private exchange and queue names on the shared broker, deleted afterwards."""
    prefix = f"ff_t_{uuid.uuid4().hex[:12]}"
    yield prefix
    try:
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    except Exception:
        return
    channel = conn.channel()
    for queue in (f"{prefix}.steps", f"{prefix}.dead"):
        channel.queue_delete(queue)
    for exchange in (prefix, f"{prefix}.dlx"):
        channel.exchange_delete(exchange)
    conn.close()


@pytest.fixture
def env(database_url: str, amqp_url: str, amqp_prefix: str) -> dict[str, str]:
    """Environment of the processes under test: short leases, loopback allowed."""
    return process_env(
        database_url,
        amqp_url,
        amqp_prefix,
        LEASE_SECONDS="2",
        WORKER_CONCURRENCY="4",
        LOG_LEVEL="INFO",
        # Lets tests arm FLOWFORGE_FAULTS, which production configuration refuses.
        TEST_MODE="1",
    )


@pytest.fixture
def api_key(db: psycopg.Connection) -> str:
    """A key with every permission, publishing definitions that use secrets included."""
    return apikeys.create(db, "tests", publish_secrets=True)[1]


@pytest.fixture
def target() -> Iterator[Target]:
    server = Target()
    yield server
    server.close()


@pytest.fixture
def workers(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """Start real bin/worker processes: workers(**extra_env)."""
    started: list[Process] = []

    def start(**extra: str) -> Process:
        proc = start_worker({**env, **extra}, tmp_path / f"worker-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def api(env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A real bin/api (gunicorn) process; yields its base URL."""
    proc, base = start_api(env, tmp_path / "api.log")
    yield base
    proc.stop()


@pytest.fixture
def client(api: str, api_key: str) -> Api:
    """The real bin/api, driven over HTTP with an API key."""
    return Api(api, api_key)


@pytest.fixture
def app_client(database_url: str) -> Iterator[Any]:
    """The Flask app in-process against the private database, for fast API tests."""
    from flowforge.api import create_app
    from flowforge.store.config import Settings

    app = create_app(
        Settings(
            database_url=database_url,
            max_body_bytes=65_536,
            encryption_key=parse_key(TEST_ENCRYPTION_KEY),
            resume_key=parse_key(TEST_RESUME_KEY),
            notify_key=parse_key(TEST_NOTIFY_KEY),
        )
    )
    app.extensions["flowforge.pool"].wait(timeout=10)
    yield app.test_client()
    app.extensions["flowforge.pool"].close()


@pytest.fixture
def in_process(app_client: Any, api_key: str, database_url: str) -> Iterator[InProcess]:
    """FlowForge without processes: the API app and the worker's executor, driven in the
    test's process (tests/support/inprocess.py); `Api`'s publish, start, execution, wait."""
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    with inprocess.executor(database_url, "test-in-process", "worker-in-process") as executor:
        yield InProcess(app_client, executor)


@pytest.fixture
def worker_in_process(database_url: str) -> Iterator[Runner]:
    """The worker's executor and timer scan in the test's process, run by hand
    (`until(condition)`), for tests that drive the API their own way (the console's)."""
    with inprocess.executor(database_url, "test-in-process", "worker-in-process") as executor:
        yield Runner(executor)


@pytest.fixture
def open_client(app_client: Any, api_key: str) -> Any:
    """The in-process app, authenticated with `api_key`, with workflow `open` (OPEN)
    published."""
    from tests.support.definitions import OPEN

    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {api_key}"
    assert app_client.post("/api/v1/workflows/open/versions", json=OPEN).status_code == 201
    return app_client


@pytest.fixture
def published(open_client: Any) -> Any:
    """The in-process app with workflow `open` and three executions of it, signed out (the
    console's tests sign in as they need)."""
    for x in ("a", "b", "c"):
        r = open_client.post("/hooks/open", json={"x": x, "customer": {"id": 7 if x == "a" else 8}})
        assert r.status_code == 202, r.get_data(as_text=True)
    open_client.environ_base.pop("HTTP_AUTHORIZATION")
    return open_client
