"""The `flowforge` CLI in remote mode (docs/contract.md#remote-cli): a real bin/api, the CLI as a
subprocess with an API URL and key and a database URL that leads nowhere — an operator needs no
database access. Reads, every operator action, scoped and read-only keys, the errors."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
import requests

from flowforge.store import apikeys
from flowforge.store.runs import load_run, save_run, unit_of_work
from tests.faults.helpers import FLOWFORGE
from tests.integration.test_audit import CHARGE, lose_the_lease
from tests.support.api import Api
from tests.support.definitions import unsigned
from tests.support.processes import free_port

WAITER = unsigned([{"id": "approval", "type": "wait", "timeout_s": 3600}])


def remote(api: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`flowforge ARGS` from an operator's laptop: the API's URL and a key, no database."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "FLOWFORGE_API_URL": api,
        "FLOWFORGE_API_KEY": key,
        "FLOWFORGE_DATABASE_URL": f"postgresql://127.0.0.1:{free_port()}/nowhere",
    }
    return subprocess.run([FLOWFORGE, *args], env=env, capture_output=True, text=True, timeout=60)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result
    assert result.stderr == "", result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], code: int, start: str) -> str:
    """A refusal is one line on stderr, with its exit code, and never a traceback."""
    assert result.returncode == code, result
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(start), result.stderr
    return result.stderr


def start(api: str, workflow: str) -> str:
    r = requests.post(f"{api}/hooks/{workflow}", json={}, timeout=10)
    assert r.status_code == 202, r.text
    return str(r.json()["execution_id"])


def start_the_wait(db: psycopg.Connection, execution_id: str) -> None:
    """What a worker does first with a root wait step: it begins to wait."""
    with unit_of_work(db):
        run = load_run(db, execution_id)
        assert run is not None
        run.advance()
        save_run(db, run.take_changes())


def assert_aligned(text: str) -> list[dict[str, str]]:
    """Every column starts where its header starts; returns the rows by header."""
    header, *lines = text.splitlines()
    names = header.split()
    starts = [header.index(name) for name in names]
    rows = []
    for line in lines:
        for at in starts[1:]:
            assert line[at - 2 : at] == "  " and line[at] != " ", (header, line)
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def test_operators_read_and_act_through_the_api_with_their_keys_rules(
    api: str, api_key: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    _, read_only = apikeys.create(db, "auditor", read_only=True)
    scoped_id, scoped = apikeys.create(db, "charge-ops", ["charge"])
    (tmp_path / "charge.json").write_text(json.dumps(CHARGE))
    published = ok(
        remote(
            api, api_key, "workflow", "publish", str(tmp_path / "charge.json"), "--key", "charge"
        )
    )
    assert published == "created workflow charge: version 1\n"
    Api(api, api_key).publish("waiter", WAITER)
    charge, waiter, other = start(api, "charge"), start(api, "waiter"), start(api, "waiter")

    # Reads: an aligned table under its header, JSON that parses, with a read-only key.
    rows = assert_aligned(ok(remote(api, read_only, "executions", "list")))
    assert [(r["ID"], r["WORKFLOW"], r["STATUS"]) for r in rows] == [
        (other, "waiter", "queued"),
        (waiter, "waiter", "queued"),
        (charge, "charge", "queued"),
    ]
    listed = remote(api, read_only, "--output", "json", "executions", "list", "--limit", "2")
    page = json.loads(ok(listed))
    assert [item["id"] for item in page["items"]] == [other, waiter] and page["next_cursor"]

    # Writes: a read-only key is refused, a scoped key acts only on its workflow.
    refused(remote(api, read_only, "cancel", charge), 1, "error: Forbidden: ")
    refused(remote(api, scoped, "cancel", waiter), 1, "error: Forbidden: ")
    assert ok(remote(api, scoped, "cancel", charge)) == f"execution {charge} is now cancelled\n"
    again = json.loads(ok(remote(api, scoped, "cancel", charge, "--output", "json")))
    assert again == {"execution_id": charge, "status": "cancelled", "already_finished": True}
    assert ok(remote(api, scoped, "retry", charge)) == f"execution {charge} is now running\n"
    refused(remote(api, scoped, "retry", charge), 1, "error: Conflict: execution is running")
    lose_the_lease(db, charge)
    settled = ok(remote(api, scoped, "resolve", charge, "charge", "succeeded", '{"id": 7}'))
    assert settled == "step charge resolved as succeeded; execution is now succeeded\n"
    start_the_wait(db, waiter)
    start_the_wait(db, other)
    completed = ok(remote(api, api_key, "complete", waiter, "approval", '{"ok": true}'))
    assert completed == "step approval completed; execution is now succeeded\n"
    assert "execution is now failed" in ok(remote(api, api_key, "fail", other, "approval"))

    # The history names the key that acted, and `show` prints who did what.
    shown = remote(api, read_only, "executions", "show", charge, "--output", "json")
    detail = json.loads(ok(shown))
    by_scoped = {"kind": "api_key", "id": scoped_id, "name": "charge-ops"}
    acted = [
        (e["kind"], e["detail"]["actor"])
        for e in detail["events"]
        if "actor" in (e["detail"] or {})
    ]
    assert acted == [  # the second cancel changed nothing, so it is not in the history
        ("execution.cancel_requested", by_scoped),
        ("execution.retried", by_scoped),
        ("step.resolved", by_scoped),
    ]
    assert [s["output"] for s in detail["steps"]] == [{"id": 7}]
    text = ok(remote(api, read_only, "executions", "show", charge)).splitlines()
    assert text[0].startswith(f"execution {charge}  charge v1  succeeded")
    assert text[text.index("  operator actions:") + 1].split() == ["AT", "EVENT", "STEP", "BY"]
    assert text[-1].split()[1:] == [
        "step.resolved",
        "charge",
        "api",
        "key",
        str(scoped_id),
        "(charge-ops)",
    ]

    # The API's refusals: one line each; 1 when refused, 2 when the request was bad.
    missing = remote(api, read_only, "executions", "show", str(uuid.uuid4()))
    refused(missing, 1, "error: Not found: ")
    cursor = remote(api, read_only, "executions", "list", "--cursor", "bogus")
    refused(cursor, 2, "error: Invalid cursor: ")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(unsigned([{"id": "x", "type": "nope"}])))
    invalid = remote(api, api_key, "workflow", "publish", str(broken))
    assert invalid.returncode == 2, invalid
    first, *paths = invalid.stderr.splitlines()
    assert first.startswith("error: Invalid definition: ")
    assert paths and all(line.startswith("  $.") for line in paths), invalid.stderr


def test_publish_says_which_workflow_it_created_or_versioned_and_warns(
    api: str, api_key: str, tmp_path: Path
) -> None:
    (tmp_path / "charge-v2.json").write_text(json.dumps(CHARGE))
    # A new key from the file name: created, and a warning that --key names an existing one.
    made = remote(api, api_key, "workflow", "publish", str(tmp_path / "charge-v2.json"))
    assert made.returncode == 0 and made.stdout == "created workflow charge-v2: version 1\n"
    assert "created a new workflow 'charge-v2', named after the file" in made.stderr
    assert "--key" in made.stderr
    again = remote(api, api_key, "workflow", "publish", str(tmp_path / "charge-v2.json"))
    assert ok(again) == "published version 2 of workflow charge-v2\n"
    # No trigger: a signed webhook nobody can call yet, said in the API's answer and by the CLI.
    bare = {key: value for key, value in CHARGE.items() if key != "trigger"}
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    warned = remote(
        api,
        api_key,
        "--output",
        "json",
        "workflow",
        "publish",
        str(tmp_path / "bare.json"),
        "--key",
        "bare",
    )
    assert warned.returncode == 0, warned
    assert "has no trigger" in json.loads(warned.stdout)["warning"]
    assert "flowforge: warning: this definition has no trigger" in warned.stderr


def test_a_closed_pipe_ends_the_cli_quietly(api: str, api_key: str) -> None:
    """`flowforge ... | head -n1` ends like any Unix tool: no BrokenPipeError traceback,
    however much was left to write when head stopped reading."""
    pad = {f"pad{n}": "x" * 60_000 for n in range(6)}  # far more than a pipe holds
    big = unsigned([{"id": "pad", "type": "transform", "output": pad}])
    Api(api, api_key).publish("big", big)
    env = {**os.environ, "FLOWFORGE_API_URL": api, "FLOWFORGE_API_KEY": api_key}
    done = subprocess.run(
        f"{FLOWFORGE} workflow show big --version 1 | head -n1",
        shell=True,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "{\n" and done.stderr == "", done.stderr


def _publish_waiter(api: str, api_key: str) -> None:
    """Publish WAITER (again: a version the same as the newest is no error)."""
    requests.post(
        f"{api}/api/v1/workflows/waiter/versions",
        json=WAITER,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    ).raise_for_status()


def test_executions_list_by_creation_time(api: str, api_key: str, db: psycopg.Connection) -> None:
    _publish_waiter(api, api_key)
    started = [start(api, "waiter") for _ in range(2)]
    recent = ok(remote(api, api_key, "--output", "json", "executions", "list", "--since", "1h"))
    assert [item["id"] for item in json.loads(recent)["items"]] == started[::-1]
    old = ok(remote(api, api_key, "--output", "json", "executions", "list", "--until", "1h"))
    assert json.loads(old)["items"] == []
    between = remote(
        api,
        api_key,
        "--output",
        "json",
        "executions",
        "list",
        "--since",
        "2000-01-01",
        "--until",
        "2100-01-01T00:00:00+00:00",
    )
    assert len(json.loads(ok(between))["items"]) == 2
    refused(
        remote(api, api_key, "executions", "list", "--since", "yesterday"),
        2,
        "error: argument --since",
    )
    r = requests.get(
        f"{api}/api/v1/executions?since=soon",
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    )
    assert r.status_code == 400 and r.headers["Content-Type"] == "application/problem+json"


def test_workflow_diff_between_versions_and_a_file(api: str, api_key: str, tmp_path: Path) -> None:
    first = unsigned([{"id": "a", "type": "transform", "output": {"n": 1}}])
    (tmp_path / "v1.json").write_text(json.dumps(first))
    ok(remote(api, api_key, "workflow", "publish", str(tmp_path / "v1.json"), "--key", "d"))
    second = unsigned([{"id": "a", "type": "transform", "output": {"n": 2}}])
    (tmp_path / "v2.json").write_text(json.dumps(second))
    ok(remote(api, api_key, "workflow", "publish", str(tmp_path / "v2.json"), "--key", "d"))
    assert ok(remote(api, api_key, "workflow", "diff", "d", "1", "2")).splitlines() == [
        "--- 1",
        "+++ 2",
        "~ $.steps[id=a].output.n: 1 → 2",
    ]
    assert ok(remote(api, api_key, "workflow", "diff", "d", "2", str(tmp_path / "v2.json"))) == (
        "no difference\n"
    )
    refused(remote(api, api_key, "workflow", "diff", "d", "1", "nope.json"), 2, "error: usage")


def test_colour_only_on_a_terminal_and_never_with_no_color(
    api: str, api_key: str, db: psycopg.Connection
) -> None:
    _publish_waiter(api, api_key)
    eid = start(api, "waiter")
    db.execute("UPDATE executions SET status = 'failed' WHERE id = %s", (eid,))
    env = {**os.environ, "FLOWFORGE_API_URL": api, "FLOWFORGE_API_KEY": api_key}
    env.pop("NO_COLOR", None)

    def on_a_terminal(**extra: str) -> str:
        """The command under a pseudo-terminal (util-linux script), as a person runs it."""
        done = subprocess.run(
            ["script", "-qec", f"{FLOWFORGE} executions show {eid}", "/dev/null"],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done
        return done.stdout

    assert "\x1b[31mfailed\x1b[0m" in on_a_terminal()
    assert "\x1b[" not in on_a_terminal(NO_COLOR="1")
    piped = subprocess.run(
        [FLOWFORGE, "executions", "show", eid], env=env, capture_output=True, text=True, timeout=60
    )
    assert "failed" in piped.stdout and "\x1b[" not in piped.stdout


class _Odd(http.server.BaseHTTPRequestHandler):
    """Whatever the test asks for: a login redirect of a proxy, an HTML page, stray JSON."""

    answer: tuple[int, str, bytes] = (302, "text/html", b"<html>moved</html>")

    def _reply(self) -> None:
        status, content_type, body = self.answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if 300 <= status < 400:
            self.send_header("Location", "https://sso.example/login")
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _reply

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    "answer",
    [
        (302, "text/html", b"<html>moved</html>"),
        (301, "application/json", b'{"moved": true}'),
        (200, "text/html", b"<html>a portal</html>"),
        (202, "application/json", b"[1, 2]"),
        (200, "application/json", b'"text"'),
        (200, "application/json", b'{"unexpected": 1}'),
        (204, "application/json", b""),
        (502, "text/html", b"<html>bad gateway</html>"),
    ],
)
def test_an_unexpected_answer_is_one_line_and_exit_1(answer: tuple[int, str, bytes]) -> None:
    handler = type("Odd", (_Odd,), {"answer": answer})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        eid = str(uuid.uuid4())
        for command in (["cancel", eid], ["retry", eid], ["executions", "show", eid]):
            refused(remote(url, "ffk_whatever", *command), 1, "error: ")
    finally:
        server.shutdown()
        server.server_close()
