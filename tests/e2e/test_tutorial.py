"""docs/tutorial.md, pasted as written into one fresh shell on a fresh copy of the
checkout, works and prints what it says it prints.

What runs is the text of every ```sh block, in order, unchanged: the blocks honour the
environment (`${FLOWFORGE_DATABASE_URL:-...}`, `${PORT:-8000}`), so this test only
exports a private database, RabbitMQ prefix and ports — never the shared defaults. Each
`# -> ` line is what the command above it prints: `...` stands for anything on that line,
a run of spaces for any run of spaces, and the lines must appear in the output in the
order of the page.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import psycopg

from tests.support.checkout import fresh_copy
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
EXPECT = re.compile(r"^# -> (.*)$", re.MULTILINE)


def sh_blocks(text: str) -> list[str]:
    """The code of every ```sh block, in page order."""
    return re.findall(r"^```sh\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def expectation(line: str) -> re.Pattern[str]:
    """One `# -> ` line as a pattern: `...` is anything on the line, spaces are spaces."""
    parts = [r"\s+".join(re.escape(word) for word in chunk.split()) for chunk in line.split("...")]
    return re.compile(".*?".join(parts))


def unmatched(expected: list[str], output: str) -> list[str]:
    """The expected lines not found in `output` in order (each within one output line)."""
    missing, position = [], 0
    lines = output.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for text in expected:
        pattern = expectation(text)
        for number, line in enumerate(lines):
            if offsets[number + 1] <= position:
                continue
            start = max(0, position - offsets[number])
            if found := pattern.search(line, start):
                position = offsets[number] + found.end()
                break
        else:
            missing.append(text)
    return missing


def test_expectations_match_in_order_within_a_line() -> None:
    output = "execution 1  charge v1  needs_attention\n  charge  http  unknown   error: x\n"
    assert (
        unmatched(["execution ...  charge v1  needs_attention", "charge ... unknown"], output) == []
    )
    assert unmatched(["unknown", "execution"], output) == ["execution"]
    assert unmatched(["charge ... x error"], output) == ["charge ... x error"]


def test_the_tutorial_pasted_into_a_fresh_shell_prints_what_it_says(
    tmp_path: Path, new_database_url: str, amqp_url: str, amqp_prefix: str
) -> None:
    text = TUTORIAL.read_text(encoding="utf-8")
    script = "\n".join(sh_blocks(text))
    assert ":8000" not in script.replace("${PORT:-8000}", "")  # no port but the default's
    assert "whsec_..." not in script.split("#")[0]  # no placeholder where a value belongs
    clone = tmp_path / "flowforge"
    fresh_copy(clone)
    port, hang_port, chat_port = free_port(), free_port(), free_port()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "FLOWFORGE_DATABASE_URL": new_database_url,
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
        output, _ = shell.communicate(
            script.encode(), timeout=480
        )  # a loaded machine: pip, two servers, ~2 min of waits
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
    assert unmatched(EXPECT.findall(text), log) == [], log
    # Nothing the page does not announce: no tracebacks, no curl retry noise.
    assert "Traceback" not in log and "curl: (" not in log, log

    with psycopg.connect(new_database_url) as db:
        statuses = dict(
            db.execute(
                "SELECT e.idempotency_key, e.status FROM executions e"
                " JOIN workflows w ON w.id = e.workflow_id WHERE w.key = 'charge'"
            ).fetchall()
        )
        assert statuses.pop("order-1002") == "succeeded"  # resolved by the operator
        assert list(statuses.values()) == ["failed"]  # cancelled, retried, resolved, re-run
        (receipt,) = db.execute(
            "SELECT s.output FROM steps s JOIN executions e ON e.id = s.execution_id"
            " WHERE e.idempotency_key = 'order-1002' AND s.step_id = 'receipt'"
        ).fetchone()
        assert receipt == {"order": "A-1002", "payment_status": 201}
        # The Schedules section: one tick triggered by hand, the backfill only a dry run.
        sweep = db.execute(
            "SELECT e.trigger FROM executions e JOIN workflows w ON w.id = e.workflow_id"
            " WHERE w.key = 'sweep'"
        ).fetchall()
        assert sweep == [("schedule",)]
        # `orders` checks signatures: its one execution is the signed webhook (its
        # webhook-id is the idempotency key), not the unsigned or forged ones.
        signed = db.execute(
            "SELECT e.idempotency_key FROM executions e JOIN workflows w ON w.id = e.workflow_id"
            " WHERE w.key = 'orders'"
        ).fetchall()
        assert len(signed) == 1 and signed[0][0].startswith("msg_")
