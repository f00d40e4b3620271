"""What a newcomer meets first: refusals that say what is missing, warnings where a
command does something useless, and command line tools that find their virtualenv and
name the variable to set when the database is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.problems import assert_problem
from tests.support.processes import TEST_ENCRYPTION_KEY, Process, wait_for

ROOT = Path(__file__).resolve().parents[2]
FLOWFORGE = ROOT / ".venv" / "bin" / "flowforge"
SIGNED = {"name": "signed", "steps": [{"id": "a", "type": "transform", "output": 1}]}
UNSIGNED = {**SIGNED, "trigger": {"webhook": {"auth": "none"}}}
# An interpreter without FlowForge's dependencies, as a fresh shell's `python3` is.
SYSTEM_PYTHON = "/usr/bin/python3"


def publish(client: Any, key: str, api_key: str, definition: dict[str, Any]) -> None:
    r = client.post(
        f"/api/v1/workflows/{key}/versions",
        json=definition,
        headers={"Authorization": f"Bearer {api_key}"},
    )
    assert r.status_code == 201, r.get_data(as_text=True)


def bare_env(**extra: str) -> dict[str, str]:
    """A fresh shell's environment: no venv on PATH, no FLOWFORGE_* settings."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), **extra}


def test_a_signed_workflow_without_a_secret_says_it_has_none(app_client: Any, api_key: str) -> None:
    publish(app_client, "orders", api_key, SIGNED)
    headers = {"Content-Type": "application/json"}
    unsigned = assert_problem(app_client.post("/hooks/orders", data=b"{}", headers=headers), 401)
    assert "no active signing secret" in unsigned["detail"]
    assert "webhook-id" in unsigned["detail"]  # and what is wrong with the request itself
    signed_by_nobody = {
        **headers,
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(time.time())),
        "webhook-signature": "v1,AAAA",
    }
    r = app_client.post("/hooks/orders", data=b"{}", headers=signed_by_nobody)
    assert "no active signing secret" in assert_problem(r, 401)["detail"]


def test_a_secret_for_an_unsigned_workflow_comes_with_a_warning(
    app_client: Any, api_key: str, database_url: str
) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    publish(app_client, "loose", api_key, UNSIGNED)
    publish(app_client, "strict", api_key, SIGNED)
    loose = app_client.post("/api/v1/workflows/loose/webhook-secrets", headers=auth)
    assert loose.status_code == 201
    assert "auth" in loose.get_json()["warning"] and "none" in loose.get_json()["warning"]
    strict = app_client.post("/api/v1/workflows/strict/webhook-secrets", headers=auth)
    assert strict.status_code == 201 and "warning" not in strict.get_json()

    env = bare_env(
        FLOWFORGE_DATABASE_URL=database_url, FLOWFORGE_ENCRYPTION_KEY=TEST_ENCRYPTION_KEY
    )
    cli = subprocess.run(
        [str(FLOWFORGE), "secret", "create", "loose"], env=env, capture_output=True, text=True
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines()[-1].startswith("whsec_")  # the last line stays the secret
    assert "warning" in cli.stderr and "unsigned" in cli.stderr
    quiet = subprocess.run(
        [str(FLOWFORGE), "secret", "create", "strict"], env=env, capture_output=True, text=True
    )
    assert quiet.returncode == 0 and quiet.stderr == ""


@pytest.mark.parametrize(
    "command",
    [[SYSTEM_PYTHON, str(ROOT / "bin" / "migrate")], [str(FLOWFORGE), "workflow", "list"]],
    ids=["bin/migrate", "flowforge"],
)
def test_a_missing_database_names_the_variable_to_set(
    command: list[str], new_database_url: str
) -> None:
    result = subprocess.run(
        command,
        env=bare_env(FLOWFORGE_DATABASE_URL=new_database_url),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "does not exist" in result.stderr
    assert f"FLOWFORGE_DATABASE_URL is {new_database_url}" in result.stderr
    assert "Traceback" not in result.stderr


def test_bin_migrate_from_a_fresh_shell_finds_the_venv_and_can_create_the_database(
    new_database_url: str,
) -> None:
    """Run by the system python3, without the venv activated, as README's walkthrough does."""

    def migrate_create() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SYSTEM_PYTHON, str(ROOT / "bin" / "migrate"), "--create"],
            env=bare_env(FLOWFORGE_DATABASE_URL=new_database_url),
            capture_output=True,
            text=True,
        )

    result = migrate_create()
    assert result.returncode == 0, result.stderr
    assert "created database" in result.stdout
    again = migrate_create()
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "migrate: applied 0 migration(s)"


@pytest.mark.parametrize("script", ["api", "worker", "migrate", "demo", "test"])
def test_every_bin_command_answers_help(script: str) -> None:
    result = subprocess.run(
        [str(ROOT / "bin" / script), "--help"],
        env=bare_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: bin/{script}")


def test_bin_test_help_is_its_own_not_pytests() -> None:
    """`bin/test --help` says what the README says about it, and runs nothing."""
    said = subprocess.run(
        [str(ROOT / "bin" / "test"), "--help"],
        env=bare_env(),
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    for named in ("--fast", "FLOWFORGE_TEST_DATABASE_URL", "FLOWFORGE_TEST_AMQP_URL", "CI=true"):
        assert named in said, named
    assert "pytest --help" in said and "positional arguments" not in said


def test_a_venv_without_the_dependencies_is_reported_with_what_to_run(tmp_path: Path) -> None:
    """A checkout whose .venv is missing: the message is the command to create it."""
    checkout = tmp_path / "checkout"
    (checkout / "bin").mkdir(parents=True)
    (checkout / "flowforge").mkdir()
    for name in ("__init__.py", "launcher.py"):
        (checkout / "flowforge" / name).write_bytes((ROOT / "flowforge" / name).read_bytes())
    (checkout / "bin" / "worker").write_bytes((ROOT / "bin" / "worker").read_bytes())
    result = subprocess.run(
        [SYSTEM_PYTHON, str(checkout / "bin" / "worker")],
        env=bare_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert f"cd {checkout} && python3 -m venv .venv && .venv/bin/pip install -e ." in result.stderr


def test_a_worker_started_against_a_missing_database_names_the_variable(
    new_database_url: str, tmp_path: Path, amqp_url: str, amqp_prefix: str
) -> None:
    """It keeps running and retrying (an outage must not kill it), and says what to set."""
    log = tmp_path / "worker.log"
    worker = Process(
        [SYSTEM_PYTHON, str(ROOT / "bin" / "worker")],
        bare_env(
            FLOWFORGE_DATABASE_URL=new_database_url,
            FLOWFORGE_AMQP_URL=amqp_url,
            FLOWFORGE_AMQP_PREFIX=amqp_prefix,
        ),
        log,
    )
    try:
        wait_for(
            lambda: f"FLOWFORGE_DATABASE_URL is {new_database_url}" in worker.log(),
            timeout=20,
            message="the worker's hint",
        )
        assert worker.popen.poll() is None
        hint = next(json.loads(line) for line in worker.log().splitlines() if "hint" in line)
        assert hint["level"] == "warning" and "does not exist" in hint["error"]
    finally:
        worker.stop()
