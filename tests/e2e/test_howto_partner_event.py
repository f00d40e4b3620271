"""docs/howto/wait-for-a-partner-event.md, pasted as written into one fresh shell, works
and prints what it says it prints (issue 44): an order workflow charges (a stand-in
payment API the page starts), waits for Stripe's payment_intent.succeeded for its own
order, sent signed with Stripe's own library, and is found afterwards with
`--where order_id=…`.

The page starts where the tutorial's shell stands after its block 3, so this test gives
the shell exactly that: a real bin/api and bin/worker on a private database, the venv on
PATH, FLOWFORGE_API_URL and FLOWFORGE_API_KEY exported. Nothing else: no FLOWFORGE_
setting of this machine, no stripe secret, a free port for the stand-in. The `# -> `
lines are matched as in tests/e2e/test_tutorial.py, whose helpers these are.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg

from tests.e2e.test_tutorial import EXPECT, ROOT, expectation, sh_blocks, unmatched
from tests.support.processes import Process, free_port

HOWTO = ROOT / "docs" / "howto" / "wait-for-a-partner-event.md"
# A row of `executions list`: an execution id, then its workflow, version and status.
LISTED = re.compile(r"^[0-9a-f]{8}-[0-9a-f-]{27}\s")
FOUND_ROW = expectation("orders ... succeeded")


def test_the_partner_event_howto_pasted_into_a_fresh_shell_prints_what_it_says(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    db: psycopg.Connection,
    tmp_path: Path,
) -> None:
    text = HOWTO.read_text(encoding="utf-8")
    script = "\n".join(sh_blocks(text))
    # No placeholder where a value belongs: every URL and secret is one the page sets.
    assert "<your host>" not in script and "payments.internal" not in script
    assert "whsec_..." not in script and "whsec_…" not in script
    workers()
    env = {
        # The venv's bin first, as after the tutorial's `. .venv/bin/activate`.
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "FLOWFORGE_API_URL": api,
        "FLOWFORGE_API_KEY": api_key,
        "PAYMENTS_PORT": str(free_port()),
    }
    workdir = tmp_path / "shell"
    workdir.mkdir()
    shell = subprocess.Popen(
        ["bash", "-e"],  # -e: a failing command fails the test; otherwise a plain shell
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = shell.communicate(script.encode(), timeout=120)  # ~6 s unloaded
    except subprocess.TimeoutExpired:  # a loop that never ends: fail with what it printed
        os.killpg(shell.pid, signal.SIGKILL)
        output, _ = shell.communicate()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)  # the stand-in, if the last block did not run
    log = output.decode(errors="replace")
    assert shell.returncode == 0, log
    assert unmatched(EXPECT.findall(text), log) == [], log
    assert "Traceback" not in log and "curl: (" not in log, log
    # `--where order_id=o-1001` listed one execution: the order's, succeeded.
    rows = [line for line in log.splitlines() if LISTED.match(line)]
    assert len(rows) == 1 and FOUND_ROW.search(rows[0]), log

    # The charge reached the stand-in payment API, once.
    assert (workdir / "payments.log").read_text().count('"POST /charge HTTP/1.1" 201') == 1
    # The order's wait ended with the event's payload: the body the page sent as Stripe.
    sent = json.loads(re.search(r"^BODY='(.*)'$", script, re.MULTILINE)[1])
    waits = db.execute(
        "SELECT e.status, s.output FROM executions e JOIN workflows w ON w.id = e.workflow_id"
        " JOIN steps s ON s.execution_id = e.id AND s.step_id = 'paid' WHERE w.key = 'orders'"
    ).fetchall()
    assert waits == [("succeeded", sent)]
    # The intake took the delivery as Stripe's: keyed by the event's id, signed.
    (intake,) = db.execute(
        "SELECT e.idempotency_key FROM executions e JOIN workflows w ON w.id = e.workflow_id"
        " WHERE w.key = 'stripe-intake'"
    ).fetchall()
    assert intake == ("evt_1001",)
