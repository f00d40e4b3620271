"""The `flowforge` operator command.

Remote, the way operators use it: `--api URL` (or FLOWFORGE_API_URL) with the key in
FLOWFORGE_API_KEY runs every read and operator command as one call to the HTTP API, with
the key's scope and read-only rules, and the key named in the history. No database
access is needed.

On the box: `--db`, or no API URL at all, talks to PostgreSQL directly (like bin/migrate),
so an operator can act while the API is down; the history names `cli@<host>`. `apikey`
exists only there: the API has no endpoint that makes keys.

`--output json|table` on every command. Exit codes: 0 done; 1 refused or failed (403,
404, 409, a server or connection failure); 2 a usage error (bad arguments, or the API
said 400/422).
"""

# Adding a command: a `_name(ops, args)` handler that calls one method, present with the
# same name and answer on `ApiClient` (flowforge/cli/apiclient.py) and on `Database`
# (flowforge/cli/direct.py), and prints with `_emit`; then one `command(...)` line in
# build_parser, and its example in EXAMPLES. A command with no API endpoint takes
# `_database(ops, args)` instead.

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

from flowforge.cli.apiclient import ApiClient, ApiError, ApiUnreachable
from flowforge.cli.tables import cell, table, to_json
from flowforge.domain.definitions import is_step_id, is_step_row
from flowforge.domain.model import (
    MAX_PAGE,
    RESOLUTIONS,
    WORKFLOW_KEY,
    ExecutionQuery,
    ExecutionStatus,
    GroupStatus,
    StepStatus,
)
from flowforge.errors import ClientError, DatabaseUnavailable, FlowForgeError, SchemaMissing

if TYPE_CHECKING:
    from flowforge.cli.direct import Database

USAGE = 2
REFUSED = 1
# API answers that mean the command was wrong as typed, not refused.
USAGE_STATUSES = frozenset({400, 413, 415, 422})
STATUSES = tuple(status.value for status in ExecutionStatus)


class UsageError(FlowForgeError):
    """The command cannot run as typed."""


# Remote mode never loads the database side (psycopg and the persistence modules): that
# halves the start-up of every remote command.
Ops: TypeAlias = "ApiClient | Database"


# Statuses in colour, only for a person at a terminal: never into a pipe or a file, and
# never when NO_COLOR is set (https://no-color.org).
COLOURS = {
    "succeeded": "32",
    "failed": "31",
    "needs_attention": "33",
    "unknown": "33",
    "cancelled": "2",
}


def _colour() -> bool:
    return not os.environ.get("NO_COLOR") and sys.stdout.isatty()


def _paint(text: str, status: str) -> str:
    code = COLOURS.get(status)
    if code is None or not _colour():
        return text
    return f"\033[{code}m{text}\033[0m"


# C0 and C1 controls but line feed and tab, and DEL: a value an attacker wrote (a URL
# template filled from a webhook, a workflow name) must not drive the terminal (OSC 52
# clipboard writes, erased lines, a fake status) in human-readable output
# (docs/contract.md#control-characters). On a terminal with colour on, the few colour sequences
# _paint writes pass (they can only colour text); every other control is shown escaped.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_OWN_COLOURS = re.compile(
    "(\x1b\\[(?:0|"
    + "|".join(sorted(set(COLOURS.values())))
    + ")m)|([\x00-\x08\x0b-\x1f\x7f-\x9f])"
)


def printable(text: str) -> str:
    """The text with every terminal control shown as its escape (`\\x1b`), not obeyed."""
    if not _colour():
        return _CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
    return _OWN_COLOURS.sub(lambda match: match.group(1) or f"\\x{ord(match.group(2)):02x}", text)


def _emit(args: argparse.Namespace, value: Any, text: str | Callable[[], str]) -> None:
    """Print `value` as JSON with --output json (already escaped), else the human text
    with its control characters escaped, through a pager when it is longer than the
    terminal (as git and gh do)."""
    if args.format == "json":
        print(to_json(value))
        return
    shown = printable(text if isinstance(text, str) else text())
    if not _paged(args, shown):
        print(shown)


# `less` as git runs it: quit if one screen is enough (F), keep colours (R), leave the
# text on the screen (X). $LESS, when set, wins.
PAGER_LESS = "FRX"


def _pager(args: argparse.Namespace) -> str | None:
    """The pager command for a person at a terminal: $FLOWFORGE_PAGER, else $PAGER,
    else less; none with --no-pager, into a pipe or a file, or when it is empty or cat."""
    if getattr(args, "no_pager", False) or not (sys.stdout.isatty() and sys.stdin.isatty()):
        return None
    chosen = os.environ.get("FLOWFORGE_PAGER", os.environ.get("PAGER", "less")).strip()
    return None if chosen in ("", "cat") else chosen


def _paged(args: argparse.Namespace, text: str) -> bool:
    """Show `text` through the pager if it needs more lines than the terminal has;
    whether it did."""
    command = _pager(args)
    if command is None or text.count("\n") + 1 < shutil.get_terminal_size().lines:
        return False
    env = {**os.environ, "LESS": os.environ.get("LESS", PAGER_LESS)}
    try:
        # A shell, as git runs it: $PAGER is a command line by convention ("less -S").
        pager = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env)
    except OSError:
        return False  # no such pager: print as if there were none
    assert pager.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # the reader quit before the end
        pager.stdin.write(f"{text}\n".encode())
        pager.stdin.close()
    pager.wait()
    return True


def _warn(text: str) -> None:
    """A warning on stderr, so that stdout stays the answer."""
    print(f"flowforge: warning: {text}", file=sys.stderr)


def _database(ops: Ops, args: argparse.Namespace) -> Database:
    """The database side, for a command that has no API endpoint; a usage error remotely."""
    if isinstance(ops, ApiClient):
        raise UsageError(
            f"`flowforge {args.command}` has no API endpoint: it works on the database only; "
            "run it on the box with --db (and FLOWFORGE_DATABASE_URL)"
        )
    return ops


# ---- API keys (database only) -----------------------------------------------------------


def _apikey_create(ops: Ops, args: argparse.Namespace) -> None:
    created = _database(ops, args).create_key(
        args.name, args.workflow or None, args.read_only, args.secrets
    )
    _emit(
        args,
        created,
        f"created API key {created['id']} ({args.name}); it is shown only once:\n{created['key']}",
    )


def _apikey_list(ops: Ops, args: argparse.Namespace) -> None:
    keys = _database(ops, args).keys()

    def text() -> str:
        rows = [
            {
                **row,
                "prefix": f"{row['prefix']}…",
                "state": "revoked" if row["revoked_at"] else "active",
                "mode": ("read-only" if row["read_only"] else "read-write")
                + ("+secrets" if row["publish_secrets"] else ""),
                "scope": ",".join(row["workflows"]) if row["workflows"] else "*",
                "last_used": row["last_used_at"] or "never",
            }
            for row in keys
        ]
        columns = [
            ("ID", "id"),
            ("PREFIX", "prefix"),
            ("STATE", "state"),
            ("MODE", "mode"),
            ("SCOPE", "scope"),
            ("LAST USED", "last_used"),
            ("NAME", "name"),
        ]
        return table(rows, columns)

    _emit(args, {"items": keys}, text)


def _apikey_revoke(ops: Ops, args: argparse.Namespace) -> None:
    _database(ops, args).revoke_key(args.id)
    _emit(args, {"id": args.id, "revoked": True}, f"revoked API key {args.id}")


# ---- workflows and signing secrets -------------------------------------------------------


def _workflow_publish(ops: Ops, args: argparse.Namespace) -> None:
    path = Path(args.file)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read a definition from {path}: {exc}") from None
    key = args.key or path.stem.replace(".", "-").lower()
    if not WORKFLOW_KEY.fullmatch(key):
        raise UsageError(f"invalid workflow key {key!r}: use --key")
    published = ops.publish(key, document)
    version = published["version"]
    if version == 1 and not args.key:
        # `publish charge-v2.json` meant as a version of `charge` would otherwise
        # silently start a second workflow.
        _warn(
            f"created a new workflow {key!r}, named after the file; to publish a version "
            "of an existing workflow, name it with --key KEY"
        )
    if warning := published.get("warning"):
        _warn(warning)
    if version == 1:
        said = f"created workflow {key}: version 1"
    else:
        said = f"published version {version} of workflow {key}"
    _emit(args, published, said)


def _workflow_list(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.workflows()
    columns = [
        ("WORKFLOW", "workflow"),
        ("VERSION", "latest_version"),
        ("AUTH", "webhook_auth"),
        ("NAME", "name"),
    ]
    _emit(args, {"items": items}, lambda: table(items, columns))


def _circuits_list(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.circuits()
    columns = [("KEY", "key"), ("STATE", "state"), ("FAILURES", "failures"), ("UNTIL", "until")]
    _emit(args, {"circuits": items}, lambda: table(items, columns))


def _circuits_close(ops: Ops, args: argparse.Namespace) -> None:
    closed = ops.close_circuit(args.key)
    _emit(args, closed, lambda: f"circuit {closed['key']!r} closed")


def _workflow_show(ops: Ops, args: argparse.Namespace) -> None:
    if args.version:
        shown = ops.version(args.key, args.version)
        _emit(args, shown, lambda: to_json(shown))
        return
    workflow = ops.workflow(args.key)

    def text() -> str:
        versions = workflow.get("versions", [])
        head = {k: v for k, v in workflow.items() if k != "versions"}
        lines = [f"{k}: {cell(v)}" for k, v in head.items()]
        columns = [
            (name.upper().replace("_", " "), name) for name in (versions[0] if versions else {})
        ]
        return "\n".join([*lines, "", table(versions, columns)] if columns else lines)

    _emit(args, workflow, text)


def _definition(ops: Ops, key: str, which: str) -> Any:
    """Version `which` of workflow `key` (a number), or the definition in file `which`."""
    if which.isdigit():
        return ops.version(key, int(which))["definition"]
    try:
        return json.loads(Path(which).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{which!r} is neither a version number nor a definition file: {exc}"
        ) from None


def _workflow_diff(ops: Ops, args: argparse.Namespace) -> None:
    from flowforge.domain import defdiff

    found = defdiff.diff(_definition(ops, args.key, args.old), _definition(ops, args.key, args.new))
    said = found.lines(args.old, args.new)
    _emit(
        args,
        {"changes": [list(c) for c in found.changes], "truncated": found.truncated},
        "\n".join(said) if said else "no difference",
    )


def _secret_create(ops: Ops, args: argparse.Namespace) -> None:
    created = ops.create_secret(args.key)
    if warning := created.get("warning"):
        _warn(warning)
    _emit(
        args,
        created,
        f"created webhook secret {created['id']} for {args.key}; it is shown only once:\n"
        f"{created['secret']}",
    )


def _secret_list(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.secrets(args.key)
    columns = [("ID", "id"), ("CREATED", "created_at"), ("REVOKED", "revoked_at")]
    _emit(args, {"items": items}, lambda: table(items, columns))


def _secret_revoke(ops: Ops, args: argparse.Namespace) -> None:
    ops.revoke_secret(args.key, args.id)
    _emit(
        args,
        {"workflow": args.key, "id": args.id, "revoked": True},
        f"revoked webhook secret {args.id} of {args.key}",
    )


# ---- executions ----------------------------------------------------------------------


def _query(args: argparse.Namespace, *, limit: int, cursor: str | None) -> ExecutionQuery:
    """The executions the command's filter names (--workflow, --status, --since, --until)."""
    return ExecutionQuery(
        workflow=args.workflow,
        status=args.status,
        limit=limit,
        cursor=cursor,
        since=args.since,
        until=args.until,
    )


def _executions_list(ops: Ops, args: argparse.Namespace) -> None:
    page = ops.list_executions(_query(args, limit=args.limit, cursor=args.cursor))
    columns = [
        ("ID", "id"),
        ("WORKFLOW", "workflow"),
        ("VERSION", "version"),
        ("STATUS", "status"),
        ("CREATED", "created_at"),
        ("FINISHED", "finished_at"),
    ]
    _emit(args, page, lambda: table(page["items"], columns))
    if page["next_cursor"] and args.format != "json":
        # On stderr: stdout stays the table, for pipes.
        print(f"next page: --cursor {page['next_cursor']}", file=sys.stderr)


def _execution_text(detail: dict[str, Any]) -> str:
    """The execution as an operator reads it: status, steps and attempts, then who did what."""
    lines = [
        f"execution {detail['id']}  {detail['workflow']} v{detail['version']}  "
        + _paint(detail["status"], detail["status"]),
        f"  created {detail['created_at']}  finished {detail['finished_at'] or '-'}",
    ]
    flow = detail.get("flow_control") or {}
    if flow.get("stop_reason"):
        lines.append(f"  stopped: {flow['stop_reason']}")
    if waiting := flow.get("waiting_for_slot"):
        lines.append(
            f"  waits for a slot of key {waiting['key']!r} (limit {waiting['limit']}): "
            f"{waiting['ahead']} ahead, held by {', '.join(waiting['held_by']) or '-'}"
        )
    if parent := detail.get("parent"):
        gone = " (parent deleted by retention)" if detail.get("parent_deleted") else ""
        lines.append(
            f"  child of {parent['execution_id']}{gone} (step {parent['step_id']}),"
            f" depth {detail.get('depth', 1)}"
        )
    for child in detail.get("children") or []:
        lines.append(
            f"  step {child['step_id']} started {child['workflow']} execution "
            f"{child['execution_id']}: " + _paint(child["status"], child["status"])
        )
    for child in detail.get("waiting_on_children") or []:
        if child["needs_attention"]:
            lines.append(
                f"  waits on child {child['execution_id']}, which needs attention: "
                "resolve it there and this execution goes on"
            )
    for limited in detail.get("waiting_on_limits") or []:
        lines.append(
            f"  step {limited['step']} waits for limit {limited['key']!r} "
            f"({limited['reason']}) until {limited['until']}, since {limited['since']}"
            + (f"; held: {limited['held_reason']}" if limited["reason"] == "held" else "")
        )
    for s in detail["steps"]:
        line = f"  {s['id']:<20} {s['type']:<13} " + _paint(f"{s['status']:<10}", s["status"])
        if s["wake_at"] and s["status"] == StepStatus.WAITING:
            line += f" wakes {s['wake_at']}"
        if s["error"] and s["status"] != StepStatus.SUCCEEDED:
            # A step that succeeded on a later try keeps the error of the one before:
            # its attempt lines say it; on the step's line it would read as a failure.
            line += f" error: {s['error']}"
        if s["skipped_because"]:
            line += f" because {s['skipped_because']}"
        lines.append(line)
        for a in s["attempts"]:
            extra = f" HTTP {a['http_status']}" if a["http_status"] else ""
            extra += f" {a['duration_ms']} ms" if a["duration_ms"] is not None else ""
            extra += f" ({a['error']})" if a["error"] else ""
            lines.append(
                f"      attempt {a['attempt']}: {a['outcome'] or 'in flight'}{extra}"
                f"  {a['started_at']}"
            )
            if sent := a.get("request"):
                verb = "not sent" if (a["error"] or "").startswith("not sent") else "sent"
                lines.append(f"        {verb} {sent['method']} {sent['url']}")
            if a["outcome"] in ("unknown", "lost_lease") and not a.get("response"):
                lines.append(f"        no answer (by {a['worker'] or '?'})")
        if s["output"] is not None:
            output = json.dumps(s["output"])
            lines.append(f"      output: {output[:200]}{'…' if len(output) > 200 else ''}")
    acted = [e for e in detail.get("events", []) if "actor" in (e.get("detail") or {})]
    if acted:
        lines.append("  operator actions:")
        rows = [
            {
                "at": e["at"],
                "event": e["kind"],
                "step": e["step"],
                "by": _actor_text(e["detail"]["actor"]),
            }
            for e in acted
        ]
        history = table(rows, [("AT", "at"), ("EVENT", "event"), ("STEP", "step"), ("BY", "by")])
        lines += [f"    {line}" for line in history.splitlines()]
    return "\n".join(lines)


def _actor_text(actor: dict[str, Any]) -> str:
    """`api key 3 (ops)`, `cli@box`, `flow control`."""
    if actor.get("kind") == "api_key":
        return f"api key {actor.get('id')} ({actor.get('name')})"
    return str(actor.get("name", actor.get("kind", "?")))


def _executions_show(ops: Ops, args: argparse.Namespace) -> None:
    detail = ops.execution(args.id)
    _emit(args, detail, lambda: _execution_text(detail))


def _cancel(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.cancel(args.id)
    if done["already_finished"]:
        said = f"execution {args.id} was already {done['status']}"
    elif done["status"] == ExecutionStatus.CANCELLED:
        said = f"execution {args.id} is now cancelled"
    else:
        # A request in flight is never taken back: the execution stops once it is recorded.
        said = (
            f"execution {args.id} cancel requested: a request in flight finishes and is "
            "recorded, nothing after it starts"
        )
    _emit(args, done, said)


def _retry(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.retry(args.id)
    _emit(args, done, f"execution {args.id} is now {done['status']}")


def _resolve(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.resolve(args.id, args.step, args.outcome, args.step_output)
    _emit(
        args,
        done,
        f"step {args.step} resolved as {args.outcome}; execution is now {done['status']}",
    )


def _complete(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.complete(args.id, args.step, args.step_output)
    _emit(args, done, f"step {args.step} completed; execution is now {done['status']}")


def _fail(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.fail(args.id, args.step)
    _emit(args, done, f"step {args.step} failed; execution is now {done['status']}")


def _pause(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.pause(args.id)
    _emit(args, done, f"execution {args.id} is now {done['status']}")


def _resume(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.resume(args.id)
    _emit(args, done, f"execution {args.id} is now {done['status']}")


def _fail_paused(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.fail_paused(args.id)
    _emit(args, done, f"execution {args.id} is now {done['status']}")


def _workflow_groups(ops: Ops, args: argparse.Namespace) -> None:
    shown = ops.groups(args.key, args.status)
    columns = [
        ("GROUP", "id"),
        ("KIND", "kind"),
        ("KEY", "key"),
        ("STATUS", "status"),
        ("EVENTS", "events"),
        ("DUE", "due_at"),
        ("EXECUTION", "execution_id"),
    ]
    _emit(args, shown, lambda: table(shown["items"], columns))


def _workflow_pause(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.pause_workflow(args.key)
    _emit(args, done, f"workflow {args.key} is paused ({done['held']} executions held)")


def _workflow_resume(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.resume_workflow(args.key)
    _emit(
        args,
        done,
        f"workflow {args.key} is running again ({done['resumed']} executions resumed, "
        f"{done['started']} started from the queue)",
    )


def _workflow_reingest(ops: Ops, args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"from": args.start, "to": args.end, "dry_run": args.dry_run}
    if args.filter is not None:
        try:
            body["filter"] = json.loads(args.filter)
        except ValueError as exc:
            raise UsageError(f"--filter is not JSON: {exc}") from None
    if args.dry_run:
        shown = ops.reingest(args.key, body)
        more = " (more after this page)" if shown["next"] is not None else ""
        _emit(args, shown, f"{shown['matched']} archived webhooks would be re-ingested{more}")
        return
    # One capped page per call, following `next` until the range is done.
    created, existing, refused, after = 0, 0, [], 0
    while True:
        done = ops.reingest(args.key, {**body, "after": after})
        created += len(done["created"])
        existing += len(done["existing"])
        refused += done["refused"]
        if done["next"] is None:
            break
        after = done["next"]
    result = {"created": created, "existing": existing, "refused": refused}
    lines = [
        f"{created} executions created, {existing} already re-ingested, {len(refused)} refused"
    ]
    lines += [f"  delivery {r['delivery_id']}: {r['detail']}" for r in refused]
    _emit(args, result, "\n".join(lines))


def _target_version(text: str) -> int | None:
    """--onto: a version number, or `latest` (None)."""
    if text == "latest":
        return None
    return _positive(text)


def _replay(ops: Ops, args: argparse.Namespace) -> None:
    made = ops.replay(args.id, args.from_step, args.onto)
    _emit(
        args,
        made,
        f"execution {made['execution_id']} replays {args.id} from {args.from_step} on "
        f"version {made['version']}; it is {made['status']}",
    )


def _replay_bulk(ops: Ops, args: argparse.Namespace) -> None:
    flt: dict[str, Any] = {"workflow": args.workflow}
    for name, value in (
        ("version", args.of_version),
        ("status", args.status),
        ("from", args.start),
        ("to", args.end),
        ("error", args.error),
    ):
        if value is not None:
            flt[name] = value
    body: dict[str, Any] = {
        "filter": flt,
        "from_step": args.from_step,
        "version": "latest" if args.onto is None else args.onto,
    }
    preview = ops.replay_bulk({**body, "dry_run": True})
    if not args.yes or not preview["count"]:
        _emit(
            args,
            preview,
            f"{preview['count']} executions would be replayed (confirm with --yes)",
        )
        return
    after, replayed, refused = None, 0, []
    while True:
        done = ops.replay_bulk(
            {**body, "upto": preview["upto"], "after": after, "limit": args.batch}
        )
        replayed += len(done["replayed"])
        refused += done["refused"]
        after = done["next_after"]
        if after is None:
            break
    result = {"replayed": replayed, "refused": refused}
    lines = [f"{replayed} executions replayed, {len(refused)} refused"]
    lines += [f"  {r['execution_id']}: {r['detail']}" for r in refused]
    _emit(args, result, "\n".join(lines))


# Which executions a bulk action touches, as the console's bulk page and the single
# commands decide: cancel stops what has not finished; retry re-runs what ended badly.
BULK_ELIGIBLE = {
    "cancel": frozenset({"queued", "running", "waiting", "paused", "needs_attention"}),
    "retry": frozenset({"failed", "cancelled", "needs_attention"}),
}
BULK_DONE = {"cancel": "cancelled", "retry": "retried"}
# A bulk action by filter walks at most this many executions: beyond, narrow the filter.
BULK_MAX = 10_000


def _selection(ops: Ops, args: argparse.Namespace, action: str) -> tuple[list[str], bool]:
    """The ids of the executions the filter names that the action applies to, newest
    first, fixed before anything is done (later arrivals stay out); and whether the
    walk stopped at BULK_MAX."""
    eligible, chosen, cursor = BULK_ELIGIBLE[action], [], None
    while True:
        page = ops.list_executions(_query(args, limit=MAX_PAGE, cursor=cursor))
        chosen += [row["id"] for row in page["items"] if row["status"] in eligible]
        cursor = page["next_cursor"]
        if cursor is None or len(chosen) >= BULK_MAX:
            return chosen[:BULK_MAX], cursor is not None


def _confirmed(args: argparse.Namespace, question: str) -> bool:
    """--yes, or a person at the terminal who answers y; never a pipe's silence."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        return False
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _bulk(ops: Ops, args: argparse.Namespace, action: str) -> None:
    """Cancel or retry every execution a filter names: a preview count first, then one
    call per execution, each recorded in its history with the key (or cli@host) as the
    actor; one that moved on since the preview is counted as skipped."""
    if not (args.workflow or args.status or args.since or args.until):
        raise UsageError(
            f"name what to {action}: --workflow, --status, --since or --until "
            "(a bulk action over every execution is not a default)"
        )
    ids, capped = _selection(ops, args, action)
    eligible = ", ".join(sorted(BULK_ELIGIBLE[action]))
    said = f"{len(ids)}{'+' if capped else ''} executions would be {BULK_DONE[action]}"
    if capped:
        raise UsageError(f"{said}: more than {BULK_MAX}; narrow the filter")
    if not ids or not _confirmed(args, f"{said} (only {eligible} ones). Go on?"):
        hint = "" if not ids else " (confirm with --yes)"
        _emit(args, {"dry_run": True, "count": len(ids), "ids": ids}, f"{said}{hint}")
        return
    act = ops.cancel if action == "cancel" else ops.retry
    done, skipped = 0, []
    for execution_id in ids:
        try:
            act(execution_id)
            done += 1
        except ApiError as exc:
            if exc.status >= 500:
                raise
            skipped.append({"execution_id": execution_id, "detail": exc.detail})
        except ClientError as exc:
            skipped.append({"execution_id": execution_id, "detail": exc.detail})
    lines = [f"{done} executions {BULK_DONE[action]}, {len(skipped)} skipped"]
    lines += [f"  {s['execution_id']}: {s['detail']}" for s in skipped]
    _emit(args, {"dry_run": False, "done": done, "skipped": skipped}, "\n".join(lines))


def _cancel_bulk(ops: Ops, args: argparse.Namespace) -> None:
    _bulk(ops, args, "cancel")


def _retry_bulk(ops: Ops, args: argparse.Namespace) -> None:
    _bulk(ops, args, "retry")


# ---- shell completion ---------------------------------------------------------------

COMPLETION_BASH = """\
# flowforge completion for bash (generated from its argument parser).
# Load it: eval "$(flowforge completion bash)", or save it in
# ~/.local/share/bash-completion/completions/flowforge
_flowforge() {{
    # zsh (through bashcompinit): arrays counted from 0, as in bash, for this function.
    [[ -n "${{ZSH_VERSION-}}" ]] && setopt localoptions ksharrays
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local path="" next i
    for ((i = 1; i < COMP_CWORD; i++)); do
        next="${{path:+$path }}${{COMP_WORDS[i]}}"
        case "$next" in
{paths}
        esac
    done
    local words="" opts=""
    case "$path|$prev" in
{values}
    *)
        case "$path" in
{words}
        esac
        [[ "$cur" == -* ]] && words="$opts"
        ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _flowforge flowforge
"""
COMPLETION_ZSH = """\
# flowforge completion for zsh: the bash completion through bashcompinit.
# Load it: eval "$(flowforge completion zsh)" in ~/.zshrc (after compinit).
autoload -U +X bashcompinit && bashcompinit
"""


def _tree(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command path of the parser (`""`, `workflow`, `workflow publish`, ...)."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its actions here, documented or not
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _tree(child, f"{path} {name}".strip())


def completion_script(shell: str) -> str:
    """The completion script for `shell`, generated from build_parser(), so it completes
    exactly the commands, options and choices the parser has."""
    paths, values, words = [], [], []
    for path, parser in _tree(build_parser()):
        if path:
            paths.append(f"        {shlex.quote(path)}) path={shlex.quote(path)} ;;")
        offered, options = [], []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                offered += list(action.choices)
            options += [o for o in action.option_strings if o.startswith("--")]
            if (
                action.choices
                and action.option_strings
                and not isinstance(action, argparse._SubParsersAction)
            ):
                for option in action.option_strings:
                    values.append(
                        f"    {shlex.quote(f'{path}|{option}')}) "
                        f"words={shlex.quote(' '.join(map(str, action.choices)))} ;;"
                    )
            elif (
                action.choices
                and not action.option_strings
                and not isinstance(action, argparse._SubParsersAction)
            ):
                offered += [str(c) for c in action.choices]
        words.append(
            f"        {shlex.quote(path)}) words={shlex.quote(' '.join(offered))} "
            f"opts={shlex.quote(' '.join(options))} ;;"
        )
    script = COMPLETION_BASH.format(
        paths="\n".join(paths), values="\n".join(values), words="\n".join(words)
    )
    return script if shell == "bash" else COMPLETION_ZSH + script


def _completion(_ops: Ops | None, args: argparse.Namespace) -> None:
    print(completion_script(args.shell), end="")


# ---- schedules -----------------------------------------------------------------------


def _schedule_text(shown: dict[str, Any]) -> str:
    """The schedule as an operator reads it: what and when, the next ticks, the ledger."""
    spec = shown["schedule"]
    when = f"cron {spec['cron']!r}" if "cron" in spec else f"every {spec['every_s']} s"
    state = "paused" if shown["paused"] else "active"
    lines = [
        f"{shown['workflow']} v{shown['version']}: {when} in {shown['timezone']}, "
        f"overlap {spec.get('overlap', 'skip')}, {state}",
        "",
        table(
            shown["next"], [("NEXT (UTC)", "tick_at"), ("LOCAL", "local"), ("FIRES", "fires_at")]
        ),
        "",
    ]
    rows = [{**r, "by": _actor_text(r["actor"]) if r["actor"] else ""} for r in shown["ledger"]]
    columns = [
        ("TICK", "tick_at"),
        ("OUTCOME", "outcome"),
        ("EXECUTION", "execution_id"),
        ("REASON", "reason"),
        ("BY", "by"),
    ]
    return "\n".join([*lines, table(rows, columns)])


def _schedule_show(ops: Ops, args: argparse.Namespace) -> None:
    shown = ops.schedule(args.key)
    _emit(args, shown, lambda: _schedule_text(shown))


def _schedule_pause(ops: Ops, args: argparse.Namespace) -> None:
    shown = ops.pause_schedule(args.key)
    _emit(args, shown, f"schedule of {args.key} is paused")


def _schedule_resume(ops: Ops, args: argparse.Namespace) -> None:
    shown = ops.resume_schedule(args.key)
    _emit(args, shown, f"schedule of {args.key} is active")


def _schedule_trigger(ops: Ops, args: argparse.Namespace) -> None:
    tick = ops.trigger_schedule(args.key)
    detail = " ".join(str(tick[k]) for k in ("execution_id", "reason") if tick.get(k))
    _emit(args, tick, f"tick {tick['tick_at']} {tick['outcome']} {detail}".rstrip())


def _schedule_backfill(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.backfill_schedule(args.key, args.start, args.end, args.dry_run)
    columns = [("TICK", "tick_at"), ("OUTCOME", "outcome"), ("EXECUTION", "execution_id")]
    suffix = " (dry run: nothing fired)" if args.dry_run else ""
    _emit(
        args,
        done,
        lambda: f"{table(done['items'], columns)}\n{len(done['items'])} tick(s){suffix}",
    )


# ---- arguments -----------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """One line on stderr (argparse prints the whole usage block)."""
        self.exit(USAGE, f"error: {message} (see: {self.prog} --help)\n")


def _execution_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an execution id (a UUID)") from None


def _step_id(text: str) -> str:
    if not is_step_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a step id")
    return text


def _step_row(text: str) -> str:
    """A step, or one of a map's items' steps (`lines[3].reserve`), which resolve settles."""
    if not is_step_row(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a step id")
    return text


def _workflow_key(text: str) -> str:
    if not WORKFLOW_KEY.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a workflow key (1-64 of a-z, 0-9, '-' and '_')"
        )
    return text


def _positive(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} must be 1 or more")
    return number


def _limit(text: str) -> int:
    number = _positive(text)
    if number > MAX_PAGE:
        raise argparse.ArgumentTypeError(f"{number} is more than {MAX_PAGE}")
    return number


AGE = re.compile(r"(\d+)([smhd])")
AGE_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _instant(text: str) -> datetime:
    """`2026-12-01T09:00:00Z`, `2026-12-01` (UTC unless an offset is given), or an age
    back from now: `30m`, `6h`, `2d`."""
    if found := AGE.fullmatch(text.strip()):
        return datetime.now(UTC) - timedelta(
            seconds=int(found.group(1)) * AGE_SECONDS[found.group(2)]
        )
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an instant (2026-12-01T09:00:00Z) or an age (30m, 6h, 2d)"
        ) from None
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None


def _api_url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text) < len("http://x"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def _common() -> Parser:
    """Options every command takes, before or after its name. SUPPRESS as the default lets
    a value given at either place survive the other parser."""
    common = Parser(add_help=False)
    common.add_argument(
        "--api",
        type=_api_url,
        metavar="URL",
        default=argparse.SUPPRESS,
        help="run through the HTTP API at URL (default: $FLOWFORGE_API_URL), "
        "with the key in $FLOWFORGE_API_KEY",
    )
    common.add_argument(
        "--db",
        action="store_true",
        default=argparse.SUPPRESS,
        help="talk to PostgreSQL directly ($FLOWFORGE_DATABASE_URL), on the box",
    )
    common.add_argument(
        "--output",
        dest="format",
        choices=("table", "json"),
        default=argparse.SUPPRESS,
        help="table (default) or json",
    )
    common.add_argument(
        "--no-pager",
        action="store_true",
        default=argparse.SUPPRESS,
        help="never page long output (default: $FLOWFORGE_PAGER or $PAGER, else less, "
        "on a terminal only)",
    )
    return common


class _Version(argparse.Action):
    """`--version`, looked up only when asked: importlib.metadata is slow to load."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("flowforge")
        except PackageNotFoundError:  # run from a checkout without an install
            found = "unknown"
        print(f"flowforge {found}")
        parser.exit(0)


DESCRIPTION = """\
Operate FlowForge: publish workflows, inspect executions, cancel, retry and resolve them.

Through the HTTP API with --api URL (or FLOWFORGE_API_URL) and the key in
FLOWFORGE_API_KEY: the key's scope and read-only rules apply, and the history names it.
On the box with --db (or no API URL): straight on PostgreSQL (FLOWFORGE_DATABASE_URL),
also while the API is down; API keys are managed only there.

Exit codes: 0 done, 1 refused or failed, 2 wrong as typed."""

# Each command's example, shown at the end of its --help (and in docs/reference/cli.md).
EXAMPLES = {
    "": "flowforge executions list --status needs_attention",
    "apikey": "flowforge --db apikey create --name ops --workflow orders",
    "apikey create": "flowforge --db apikey create --name deploy --workflow orders --secrets",
    "apikey list": "flowforge --db apikey list",
    "apikey revoke": "flowforge --db apikey revoke 3",
    "workflow": "flowforge workflow publish orders.json",
    "workflow publish": "flowforge workflow publish charge-v2.json --key charge",
    "workflow list": "flowforge workflow list",
    "workflow show": "flowforge workflow show orders --version 2",
    "workflow diff": "flowforge workflow diff orders 2 orders.json",
    "secret": "flowforge secret create orders",
    "secret create": "SECRET=$(flowforge secret create orders | tail -n1)",
    "secret list": "flowforge secret list orders",
    "secret revoke": "flowforge secret revoke orders 1",
    "executions": "flowforge executions show 01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "executions list": "flowforge executions list --workflow orders --status failed --since 6h",
    "executions show": "flowforge executions show 01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "cancel": "flowforge cancel 01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "retry": "flowforge retry 01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "resolve": "flowforge resolve 01a233ee-a3de-71f1-8ccd-4191093a47ad charge succeeded "
    "'{\"status\": 201}'",
    "complete": "flowforge complete 01a233ee-a3de-71f1-8ccd-4191093a47ad approval "
    "'{\"approved\": true}'",
    "fail": "flowforge fail 01a233ee-a3de-71f1-8ccd-4191093a47ad approval",
    "workflow groups": "flowforge workflow groups sync --status open",
    "workflow pause": "flowforge workflow pause orders",
    "workflow reingest": "flowforge workflow reingest orders --from 2026-12-01T09:00:00Z "
    "--to 2026-12-01T10:00:00Z --dry-run",
    "workflow resume": "flowforge workflow resume orders",
    "circuits": "flowforge circuits list",
    "circuits list": "flowforge circuits list --output json",
    "circuits close": "flowforge circuits close stripe",
    "pause": "flowforge pause 01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "resume": "flowforge resume 01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "fail-paused": "flowforge fail-paused 01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "replay": "flowforge replay 01a233ee-a3de-71f1-8ccd-4191093a47ad --from-step notify "
    "--onto latest",
    "replay-bulk": "flowforge replay-bulk --workflow orders --of-version 3 --status failed "
    "--from-step notify --onto latest",
    "cancel-bulk": "flowforge cancel-bulk --workflow orders --status waiting --since 2h",
    "retry-bulk": "flowforge retry-bulk --workflow orders --status failed --since 1d --yes",
    "completion": 'eval "$(flowforge completion bash)"',
    "schedule": "flowforge schedule show sweep",
    "schedule show": "flowforge schedule show sweep",
    "schedule pause": "flowforge schedule pause sweep",
    "schedule resume": "flowforge schedule resume sweep",
    "schedule trigger": "flowforge schedule trigger sweep",
    "schedule backfill": "flowforge schedule backfill sweep --from 2026-11-24T00:00:00Z "
    "--to 2026-11-29T00:00:00Z --dry-run",
}


def _example(path: str) -> str | None:
    """The epilog of a command's --help; a command without an example (a test fails for
    it, tests/unit/test_reference_docs.py) still works."""
    return f"example:\n  {EXAMPLES[path]}" if path in EXAMPLES else None


def build_parser() -> argparse.ArgumentParser:
    """The command tree."""
    common = _common()
    parser = Parser(
        prog="flowforge",
        description=DESCRIPTION,
        epilog=_example(""),
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    groups: dict[int, str] = {}  # a group's subparsers -> its name, for the examples

    def group(name: str, help_: str) -> Any:
        actions = sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=_example(name),
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ).add_subparsers(dest="action", required=True, metavar="ACTION")
        groups[id(actions)] = name
        return actions

    def command(
        parent: Any, name: str, handler: Callable[[Ops, argparse.Namespace], None], help_: str
    ) -> argparse.ArgumentParser:
        path = f"{groups[id(parent)]} {name}" if id(parent) in groups else name
        parsed: argparse.ArgumentParser = parent.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=_example(path),
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parsed.set_defaults(handler=handler)
        return parsed

    apikey = group("apikey", "manage API keys (on the box: --db)")
    create = command(apikey, "create", _apikey_create, "create a key (printed on the last line)")
    create.add_argument("--name", required=True, help="who or what the key is for")
    create.add_argument(
        "--workflow",
        action="append",
        type=_workflow_key,
        help="limit the key to this workflow (repeatable)",
    )
    create.add_argument("--read-only", action="store_true", help="GET only")
    create.add_argument(
        "--secrets",
        action="store_true",
        help="may publish definitions that use {{ secrets.NAME }} (bound to their workflow)",
    )
    command(apikey, "list", _apikey_list, "list keys")
    command(apikey, "revoke", _apikey_revoke, "revoke a key").add_argument(
        "id", type=_positive, help="the key's ID, from apikey list"
    )

    workflow = group("workflow", "publish and read workflows")
    publish = command(workflow, "publish", _workflow_publish, "publish a definition file")
    publish.add_argument("file", help="the definition, a JSON file")
    publish.add_argument(
        "--key",
        help="the workflow to create or version (default: the file name, with a warning "
        "when that makes a new workflow)",
    )
    command(workflow, "list", _workflow_list, "list workflows")
    show = command(workflow, "show", _workflow_show, "show a workflow or one version")
    show.add_argument("key", type=_workflow_key, help="the workflow's key")
    show.add_argument("--version", type=_positive, help="print this version's definition")
    diff = command(workflow, "diff", _workflow_diff, "what changed between two versions (or files)")
    diff.add_argument("key", type=_workflow_key, help="the workflow's key")
    diff.add_argument("old", help="a version number, or a definition file")
    diff.add_argument("new", help="a version number, or a definition file (not yet published)")
    gathered = command(
        workflow, "groups", _workflow_groups, "debounce and batch groups, newest first"
    )
    gathered.add_argument("key", type=_workflow_key, help="the workflow's key")
    gathered.add_argument(
        "--status", choices=[s.value for s in GroupStatus], help="only groups in this state"
    )
    command(
        workflow, "pause", _workflow_pause, "webhooks queue; nothing starts until resumed"
    ).add_argument("key", type=_workflow_key, help="the workflow's key")
    command(
        workflow, "resume", _workflow_resume, "release paused and queued work in arrival order"
    ).add_argument("key", type=_workflow_key, help="the workflow's key")
    again = command(
        workflow, "reingest", _workflow_reingest, "archived webhooks of a range as new executions"
    )
    again.add_argument("key", type=_workflow_key, help="the workflow's key")
    again.add_argument(
        "--from", dest="start", required=True, help="received at or after (RFC 3339)"
    )
    again.add_argument("--to", dest="end", required=True, help="received before (RFC 3339)")
    again.add_argument("--filter", help='a when-style condition, e.g. {"path": "input.kind", ...}')
    again.add_argument("--dry-run", action="store_true", help="count and sample, create nothing")

    secret = group("secret", "webhook signing secrets")
    command(secret, "create", _secret_create, "create a signing secret").add_argument(
        "key", type=_workflow_key, help="the workflow's key"
    )
    command(secret, "list", _secret_list, "list a workflow's secrets").add_argument(
        "key", type=_workflow_key, help="the workflow's key"
    )
    revoke = command(secret, "revoke", _secret_revoke, "revoke a signing secret")
    revoke.add_argument("key", type=_workflow_key, help="the workflow's key")
    revoke.add_argument("id", type=_positive, help="the secret's ID, from secret list")

    circuits = group("circuits", "circuit breakers of outbound limits")
    command(circuits, "list", _circuits_list, "open and half-open circuits")
    command(circuits, "close", _circuits_close, "close a circuit by hand").add_argument(
        "key", help="the limit's key in the definition's limits, as circuits list shows it"
    )

    executions = group("executions", "inspect executions")
    listing = command(executions, "list", _executions_list, "list executions, newest first")
    listing.add_argument("--workflow", type=_workflow_key, help="only this workflow's")
    listing.add_argument(
        "--status",
        choices=STATUSES,
        help="only in this status; needs_attention: every execution with an unknown step",
    )
    listing.add_argument("--limit", type=_limit, default=20, help=f"1-{MAX_PAGE}")
    listing.add_argument("--cursor", help="next_cursor of the previous page")
    listing.add_argument(
        "--since",
        type=_instant,
        metavar="WHEN",
        help="created at or after WHEN: an ISO 8601 instant (UTC unless it says) or an age "
        "such as 30m, 6h, 2d",
    )
    listing.add_argument(
        "--until", type=_instant, metavar="WHEN", help="created before WHEN (as --since)"
    )
    detail = command(executions, "show", _executions_show, "steps, attempts and who acted")
    detail.add_argument("id", type=_execution_id, help="the execution's ID")

    def on_step(
        name: str, handler: Callable[[Ops, argparse.Namespace], None], help_: str
    ) -> argparse.ArgumentParser:
        parsed = command(sub, name, handler, help_)
        parsed.add_argument("id", type=_execution_id, help="the execution's ID")
        parsed.add_argument("step", type=_step_row, help="the step's id in the definition")
        return parsed

    command(
        sub,
        "cancel",
        _cancel,
        "cancel an execution: queued and waiting work stops at once, a request in flight "
        "finishes and is recorded",
    ).add_argument("id", type=_execution_id, help="the execution's ID")
    command(sub, "retry", _retry, "re-run failed and cancelled steps").add_argument(
        "id", type=_execution_id, help="the execution's ID"
    )
    for name, handler, help_ in (
        ("pause", _pause, "pause an execution: nothing of it starts until resumed"),
        ("resume", _resume, "resume a paused execution (an exhausted step runs again)"),
        ("fail-paused", _fail_paused, "fail an execution paused at an exhausted step"),
    ):
        command(sub, name, handler, help_).add_argument(
            "id", type=_execution_id, help="the execution's ID"
        )
    replaying = command(sub, "replay", _replay, "replay an execution from a step onto a version")
    replaying.add_argument("id", type=_execution_id, help="the execution's ID")
    replaying.add_argument(
        "--from-step",
        required=True,
        type=_step_id,
        help="run again from this step; its ancestors keep their outputs",
    )
    replaying.add_argument(
        "--onto", type=_target_version, default=None, help="a version number or latest (default)"
    )
    bulk = command(sub, "replay-bulk", _replay_bulk, "replay a workflow's executions by filter")
    bulk.add_argument("--workflow", required=True, type=_workflow_key)
    bulk.add_argument(
        "--from-step",
        required=True,
        type=_step_id,
        help="run again from this step; its ancestors keep their outputs",
    )
    bulk.add_argument("--onto", type=_target_version, default=None, help="version or latest")
    bulk.add_argument("--of-version", type=_positive, help="only executions of this version")
    bulk.add_argument("--status", choices=STATUSES)
    bulk.add_argument("--from", dest="start", help="created at or after (ISO-8601)")
    bulk.add_argument("--to", dest="end", help="created before (ISO-8601)")
    bulk.add_argument("--error", help="a step's error contains this text")
    bulk.add_argument("--batch", type=_limit, default=100, help=f"per call, 1-{MAX_PAGE}")
    bulk.add_argument("--yes", action="store_true", help="replay them (default: preview)")
    for name, handler, help_ in (
        ("cancel-bulk", _cancel_bulk, "cancel every unfinished execution a filter names"),
        ("retry-bulk", _retry_bulk, "retry every failed, cancelled or needs_attention one"),
    ):
        by_filter = command(sub, name, handler, help_)
        by_filter.add_argument("--workflow", type=_workflow_key, help="only this workflow's")
        by_filter.add_argument(
            "--status",
            choices=STATUSES,
            help="only in this status (needs_attention: every execution with an unknown step)",
        )
        by_filter.add_argument(
            "--since",
            type=_instant,
            metavar="WHEN",
            help="created at or after WHEN (30m, 6h, 2d or an ISO 8601 instant)",
        )
        by_filter.add_argument(
            "--until", type=_instant, metavar="WHEN", help="created before WHEN (as --since)"
        )
        by_filter.add_argument(
            "--yes",
            action="store_true",
            help="do it without asking (default: show the count and ask on a terminal; "
            "in a script, only show the count)",
        )
    resolve = on_step("resolve", _resolve, "settle a step whose outcome is unknown")
    resolve.add_argument("outcome", choices=RESOLUTIONS, help="what the request did")
    resolve.add_argument(
        "step_output",
        nargs="?",
        type=_json_value,
        metavar="OUTPUT",
        help="the step's output as JSON (with succeeded)",
    )
    complete = on_step("complete", _complete, "end a waiting wait step as a resume would")
    complete.add_argument(
        "step_output",
        nargs="?",
        type=_json_value,
        metavar="OUTPUT",
        help="the step's output as JSON (default null)",
    )
    on_step("fail", _fail, "fail a waiting wait step (the execution fails)")

    schedule = group("schedule", "a workflow's schedule: fire times, ledger, pause, backfill")
    shown = command(schedule, "show", _schedule_show, "next fire times and the tick ledger")
    shown.add_argument("key", type=_workflow_key, help="the workflow's key")
    for name, handler, help_ in (
        ("pause", _schedule_pause, "due ticks are ledgered paused, not fired"),
        ("resume", _schedule_resume, "ticks fire again from now on"),
        ("trigger", _schedule_trigger, "fire a tick now, under the overlap policy"),
    ):
        command(schedule, name, handler, help_).add_argument(
            "key", type=_workflow_key, help="the workflow's key"
        )
    backfill = command(schedule, "backfill", _schedule_backfill, "fire a past range's ticks")
    backfill.add_argument("key", type=_workflow_key, help="the workflow's key")
    backfill.add_argument("--from", dest="start", required=True, help="ISO-8601 instant")
    backfill.add_argument("--to", dest="end", required=True, help="ISO-8601 instant")
    backfill.add_argument("--dry-run", action="store_true", help="list; fire nothing")

    completion = command(sub, "completion", _completion, "print a shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    completion.set_defaults(offline=True)
    return parser


def _remote(args: argparse.Namespace) -> str | None:
    """The API URL to use, or None for the database."""
    explicit = getattr(args, "api", None)
    if getattr(args, "db", False):
        if explicit:
            raise UsageError("--api and --db exclude each other")
        return None
    if explicit:
        return str(explicit)
    from_env = os.environ.get("FLOWFORGE_API_URL", "").strip()
    if from_env:
        try:
            return _api_url(from_env)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"FLOWFORGE_API_URL: {exc}") from None
    return None


def _error(title: str, detail: str) -> None:
    message = f"error: {title}: {detail}" if detail else f"error: {title}"
    print(printable(message), file=sys.stderr)


def console() -> int:
    """The `flowforge` console script: `main` in a process of its own."""
    # Like every Unix tool: `flowforge ... | head -n1` ends quietly when head has read
    # enough, instead of a BrokenPipeError traceback. Only here, never in main(): a
    # process that calls main() in-process (the tests) must not die of a closed pipe.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `flowforge` command; its exit status."""
    args = build_parser().parse_args(argv)
    args.format = getattr(args, "format", "table")
    if getattr(args, "offline", False):
        # Needs neither the API nor the database (shell completion).
        args.handler(None, args)
        return 0
    try:
        url = _remote(args)
        if url is not None:
            return _run_remote(url, args)
    except UsageError as exc:
        _error("usage", str(exc))
        return USAGE
    return _run_local(args)


def _run_remote(url: str, args: argparse.Namespace) -> int:
    key = os.environ.get("FLOWFORGE_API_KEY", "").strip()
    if not key:
        raise UsageError(
            f"FLOWFORGE_API_KEY is not set: --api {url} needs an API key "
            "(`flowforge apikey create` on the box makes one)"
        )
    try:
        args.handler(ApiClient(url, key), args)
    except ApiError as exc:
        _error(exc.title, exc.detail)
        for error in exc.errors:
            print(printable(f"  {error.get('path')}: {error.get('message')}"), file=sys.stderr)
        return USAGE if exc.status in USAGE_STATUSES else REFUSED
    except ApiUnreachable as exc:
        _error("unreachable", str(exc))
        return REFUSED
    except (KeyError, TypeError, AttributeError) as exc:
        # A 2xx JSON object without what a FlowForge API answers: not our API (a stub, a
        # portal, another version behind the URL), said in one line, not a traceback.
        _error("unexpected answer", f"{url} answered without {exc}: is this a FlowForge API?")
        return REFUSED
    return 0


def _run_local(args: argparse.Namespace) -> int:
    # Only here: remote commands never load the database driver (see Ops).
    import psycopg

    from flowforge.cli.direct import Database
    from flowforge.domain.definitions import DefinitionInvalid
    from flowforge.store.config import Settings
    from flowforge.store.db import conninfo, wrap_exceptions
    from flowforge.store.hints import database_hint

    try:
        settings = Settings.from_env()
    except FlowForgeError as exc:
        _error("configuration", str(exc))
        return USAGE
    try:
        # A session of its own (prepared statements, transactions): never through a pooler.
        # psycopg's errors leave as FlowForge's (the one translation, store/db.py).
        with (
            wrap_exceptions(every_error=True),
            psycopg.connect(conninfo(settings.direct_url), autocommit=True) as conn,
        ):
            args.handler(Database(conn), args)
    except UsageError as exc:
        _error("usage", str(exc))
        return USAGE
    except DefinitionInvalid as exc:
        _error(exc.title, f"{len(exc.errors)} problem(s):")
        for error in exc.errors:
            print(f"  {error['path']}: {error['message']}", file=sys.stderr)
        return USAGE
    except ClientError as exc:
        _error(exc.title, exc.detail)
        return USAGE if exc.status in USAGE_STATUSES else REFUSED
    except DatabaseUnavailable as exc:
        print(f"flowforge: {str(exc).strip()}", file=sys.stderr)
        print(f"flowforge: {database_hint(settings.direct_url)}", file=sys.stderr)
        return REFUSED
    except SchemaMissing as exc:
        print(f"flowforge: {str(exc).splitlines()[0]}", file=sys.stderr)
        print(
            "flowforge: this database has no FlowForge schema yet: run bin/migrate", file=sys.stderr
        )
        print(f"flowforge: {database_hint(settings.direct_url)}", file=sys.stderr)
        return REFUSED
    except (FlowForgeError, OSError, ValueError) as exc:
        _error("failed", str(exc))
        return REFUSED
    return 0
