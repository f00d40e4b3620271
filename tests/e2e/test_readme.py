"""README.md's walkthrough, pasted in order into one fresh shell on a fresh copy of the
checkout, works: what runs is the text of the ```sh blocks, as a newcomer pastes them.

The blocks honour the environment (`${FLOWFORGE_DATABASE_URL:-...}`, `${PORT:-8000}`), so
this test only exports a private database, RabbitMQ prefix and ports — never the shared
defaults. Two substitutions are made, both in the Security section's signing recipe,
which is written for a reader rather than for pasting: its `SECRET=whsec_...` placeholder
line is dropped (the walkthrough has just set `$SECRET` for real) and its hard-coded
`http://127.0.0.1:8000` becomes `$API`.

Every ```sh block must be either run here or listed in NOT_RUN with the reason, so a new
block cannot slip past unchecked.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
# Headings (## or ###) whose sh blocks are pasted, in README order.
RUN = (
    "Running it yourself",
    "curl",
    "The operator CLI",
    "Schedules",
    "Waiting for the outside world",
    "Signed webhooks",
)
NOT_RUN = {
    "The two commands": "bin/demo is tests/e2e/test_demo.py; bin/test is this suite",
    "Performance": "bin/bench takes minutes and starts its own servers",
    "Deploying": "needs Docker or root with systemd; tests/integration/test_deploy_files.py",
}
PLACEHOLDER_SECRET = re.compile(r"^SECRET=whsec_\.\.\..*$", re.MULTILINE)


def sh_blocks(text: str) -> list[tuple[str, str, str]]:
    """(## heading, ### heading, code) of every ```sh block."""
    blocks, h2, h3 = [], "", ""
    for match in re.finditer(
        r"^(##+) ([^\n]+)$|^```sh\n(.*?)^```$", text, re.MULTILINE | re.DOTALL
    ):
        if match.group(1):
            if len(match.group(1)) == 2:
                h2, h3 = match.group(2).strip(), ""
            else:
                h3 = match.group(2).strip()
        else:
            blocks.append((h2, h3, match.group(3)))
    return blocks


def walkthrough(text: str) -> str:
    """The blocks to paste, in order, with the recipe's two substitutions."""
    pasted = []
    for h2, h3, code in sh_blocks(text):
        if h3 in RUN or (not h3 and h2 in RUN):
            if h3 == "Signed webhooks":
                code = PLACEHOLDER_SECRET.sub("", code).replace("http://127.0.0.1:8000", "$API")
            pasted.append(code)
        elif h2 not in NOT_RUN:
            raise AssertionError(f"README sh block under {h2!r}/{h3!r} is neither run nor excused")
    # README's closing advice, in prose: stop what the walkthrough started.
    return "\n".join([*pasted, "kill $(jobs -p)", "wait"])


def fresh_copy(destination: Path) -> None:
    """What a clone holds: tracked and new files, nothing ignored (no .venv, no logs)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = destination / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode)


@pytest.fixture
def private_database(pg_admin_url: str) -> Iterator[str]:
    """A database name nobody uses, created by the walkthrough itself, dropped after."""
    name = f"ff_readme_{uuid.uuid4().hex[:10]}"
    yield psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_readme_walkthrough_works_pasted_into_a_fresh_shell(
    tmp_path: Path, private_database: str, amqp_url: str, amqp_prefix: str
) -> None:
    script = walkthrough((ROOT / "README.md").read_text(encoding="utf-8"))
    assert ":8000" not in script and "/flowforge " not in script  # the shared defaults
    assert "steps/charge/resolve" in script and "secret create orders" in script
    assert "kill $(jobs -p)" in (ROOT / "README.md").read_text(encoding="utf-8")
    clone = tmp_path / "flowforge"
    fresh_copy(clone)
    port, hang_port, chat_port = free_port(), free_port(), free_port()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "FLOWFORGE_DATABASE_URL": private_database,
        "FLOWFORGE_AMQP_URL": amqp_url,
        "FLOWFORGE_AMQP_PREFIX": amqp_prefix,
        "PORT": str(port),
        "HANG_PORT": str(hang_port),
        "CHAT_PORT": str(chat_port),
    }
    shell = subprocess.Popen(
        ["bash", "-e"],  # -e: a failing command fails the test; otherwise a plain shell
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=clone,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = shell.communicate(script.encode(), timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)  # anything the last block did not stop
    log = output.decode(errors="replace")
    logs = [
        p.read_text(errors="replace")
        for p in (clone / "api.log", clone / "worker.log")
        if p.exists()
    ]
    assert shell.returncode == 0, "\n".join([log, *(x for x in logs if x)])

    assert "small_order" in log and "because when shape.total lte 100 is false" in log
    assert "this workflow has no active signing secret" in log
    assert "already resumed with a different body" in log and "the wait is over" in log
    assert "idempotent-replayed: true" in log.lower()
    assert "no matching signature" in log
    # The operator CLI went through the API: the history names the key, not cli@host.
    assert re.search(r"step\.resolved +charge +api key 1 \(me\)", log), log
    assert "was already failed" in log
    assert "is not an execution id (a UUID)" in log and "exit 2" in log
    assert '"would fire"' in log and '"paused":true' in log.replace(" ", "")
    with psycopg.connect(private_database) as db:
        statuses = dict(
            db.execute(
                "SELECT e.idempotency_key, e.status FROM executions e"
                " JOIN workflows w ON w.id = e.workflow_id"
                " WHERE w.key NOT IN ('orders', 'approval', 'sweep')"
            ).fetchall()
        )
        assert statuses.pop("order-1001") == "succeeded"
        assert statuses.pop("order-1002") == "succeeded"  # resolved by the operator
        assert list(statuses.values()) == ["failed"]  # the cancelled, retried, failed one
        # The Schedules section: one tick triggered by hand, the backfill only a dry run.
        sweep = db.execute(
            "SELECT e.trigger FROM executions e JOIN workflows w ON w.id = e.workflow_id"
            " WHERE w.key = 'sweep'"
        ).fetchall()
        assert sweep == [("schedule",)]
        (receipt,) = db.execute(
            "SELECT s.output FROM steps s JOIN executions e ON e.id = s.execution_id"
            " WHERE e.idempotency_key = 'order-1002' AND s.step_id = 'receipt'"
        ).fetchone()
        assert receipt == {"order": "A-1002", "payment_status": 201}
        # The approval example: one resumed by its URL, one failed by the operator.
        approvals = db.execute(
            "SELECT e.status, s.output FROM executions e JOIN workflows w ON w.id = e.workflow_id"
            " JOIN steps s ON s.execution_id = e.id AND s.step_id = 'decision'"
            " WHERE w.key = 'approval' ORDER BY e.id"
        ).fetchall()
        assert approvals == [
            ("succeeded", {"order": "A-2001", "approved": True}),
            ("failed", None),
        ]
        # `orders` checks signatures: its one execution is the Security recipe's signed
        # webhook (its webhook-id is the idempotency key), not the unsigned or forged ones.
        signed = db.execute(
            "SELECT e.idempotency_key FROM executions e JOIN workflows w ON w.id = e.workflow_id"
            " WHERE w.key = 'orders'"
        ).fetchall()
        assert len(signed) == 1 and signed[0][0].startswith("msg_")
