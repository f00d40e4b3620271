"""The `flowforge` operator command. It talks to PostgreSQL directly (like bin/migrate),
so an operator on the box can act even when the API is down."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from flowforge import (
    actions,
    apikeys,
    catalog,
    flowcontrol,
    schedules,
    secret_bindings,
    signatures,
    timeline,
)
from flowforge.config import Settings
from flowforge.db import conninfo
from flowforge.definitions import DefinitionInvalid, parse_definition, parse_until
from flowforge.errors import FlowForgeError
from flowforge.hints import database_hint
from flowforge.model import RESOLUTIONS, StepStatus


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _apikey_create(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    scope = args.workflow or None
    key_id, key = apikeys.create(conn, args.name, scope, args.read_only, args.secrets)
    print(f"created API key {key_id} ({args.name}); it is shown only once:")
    print(key)


def _apikey_list(conn: psycopg.Connection, _args: argparse.Namespace) -> None:
    for row in apikeys.list_keys(conn):
        state = "revoked" if row["revoked_at"] else "active"
        scope = ",".join(row["workflows"]) if row["workflows"] else "*"
        mode = "read-only" if row["read_only"] else "read-write"
        mode += "+secrets" if row["publish_secrets"] else ""
        used = row["last_used_at"].isoformat() if row["last_used_at"] else "never"
        print(
            f"{row['id']:>4}  {row['prefix']}…  {state:<8} {mode:<18} {scope:<20} "
            f"last used {used}  {row['name']}"
        )


def _apikey_revoke(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    apikeys.revoke(conn, args.id)
    print(f"revoked API key {args.id}")


def _workflow_publish(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    document = json.loads(Path(args.file).read_text(encoding="utf-8"))
    key = args.key or Path(args.file).stem.replace(".", "-").lower()
    if not catalog.is_key(key):
        raise FlowForgeError(f"invalid workflow key {key!r}: use --key")
    definition = parse_definition(document)
    bindings = Settings.from_env().secret_bindings
    secret_bindings.check(secret_bindings.references(document), key, bindings)
    published = catalog.publish(conn, key, document, definition, None)
    print(f"published {published['workflow']} version {published['version']}")


def _workflow_list(conn: psycopg.Connection, _args: argparse.Namespace) -> None:
    for w in catalog.list_workflows(conn, None):
        print(f"{w['workflow']:<24} v{w['latest_version']:<4} {w['webhook_auth']:<9} {w['name']}")


def _workflow_show(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    if args.version:
        _print_json(catalog.get_version(conn, args.key, args.version))
    else:
        _print_json(catalog.get_workflow(conn, args.key))


def _secret_create(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    encryption_key = Settings.from_env().encryption_key
    created = catalog.create_secret(conn, args.key, signatures.new_secret(), encryption_key)
    if warning := catalog.unsigned_warning(conn, args.key):
        print(f"flowforge: warning: {warning}", file=sys.stderr)
    print(f"created webhook secret {created['id']} for {args.key}; it is shown only once:")
    print(created["secret"])


def _secret_revoke(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    catalog.revoke_secret(conn, args.key, args.id)
    print(f"revoked webhook secret {args.id} of {args.key}")


def _executions_list(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    page = timeline.list_executions(
        conn,
        workflow=args.workflow,
        workflows=None,
        status=args.status,
        limit=args.limit,
        cursor=args.cursor,
    )
    for item in page["items"]:
        print(
            f"{item['id']}  {item['workflow']} v{item['version']:<3} {item['status']:<16}"
            f"{item['created_at']}"
        )
    if page["next_cursor"]:
        print(f"next page: --cursor {page['next_cursor']}")


def _executions_show(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    detail = timeline.execution_detail(conn, args.id)
    detail["flow_control"] = flowcontrol.flow_state(conn, args.id)
    if args.json:
        _print_json(detail)
        return
    print(
        f"execution {detail['id']}  {detail['workflow']} v{detail['version']}  {detail['status']}"
    )
    print(f"  created {detail['created_at']}  finished {detail['finished_at'] or '-'}")
    flow = detail["flow_control"]
    if flow.get("stop_reason"):
        print(f"  stopped: {flow['stop_reason']}")
    if waiting := flow.get("waiting_for_slot"):
        print(
            f"  waits for a slot of key {waiting['key']!r} (limit {waiting['limit']}): "
            f"{waiting['ahead']} ahead, held by {', '.join(waiting['held_by']) or '-'}"
        )
    for s in detail["steps"]:
        line = f"  {s['id']:<20} {s['type']:<13} {s['status']:<10}"
        if s["wake_at"] and s["status"] == StepStatus.WAITING:
            line += f" wakes {s['wake_at']}"
        if s["error"]:
            line += f" error: {s['error']}"
        if s["skipped_because"]:
            line += f" because {s['skipped_because']}"
        print(line)
        for a in s["attempts"]:
            extra = f" HTTP {a['http_status']}" if a["http_status"] else ""
            extra += f" {a['duration_ms']} ms" if a["duration_ms"] is not None else ""
            extra += f" ({a['error']})" if a["error"] else ""
            print(
                f"      attempt {a['attempt']}: {a['outcome'] or 'in flight'}{extra}"
                f"  {a['started_at']}"
            )
        if s["output"] is not None:
            print(f"      output: {json.dumps(s['output'])[:200]}")


def _cancel(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    status, was_terminal = actions.cancel(conn, args.id, actor=_cli_actor())
    print(f"execution {args.id} {'was already' if was_terminal else 'is now'} {status}")


def _retry(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    print(f"execution {args.id} is now {actions.retry(conn, args.id, actor=_cli_actor())}")


def _resolve(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    output = json.loads(args.output) if args.output is not None else None
    status = actions.resolve(conn, args.id, args.step, args.outcome, output, actor=_cli_actor())
    print(f"step {args.step} resolved as {args.outcome}; execution is now {status}")


def _cli_actor() -> dict[str, str]:
    """Who acts, for the history, when an operator uses the CLI on the box."""
    return {"kind": "cli", "name": f"cli@{socket.gethostname()}"}


def _complete(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    output = json.loads(args.output) if args.output is not None else None
    status = actions.complete_wait(conn, args.id, args.step, output, actor=_cli_actor())
    print(f"step {args.step} completed; execution is now {status}")


def _fail(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    status = actions.fail_wait(conn, args.id, args.step, actor=_cli_actor())
    print(f"step {args.step} failed; execution is now {status}")


def _schedule_print(shown: dict[str, Any]) -> None:
    state = "paused" if shown["paused"] else "active"
    spec = shown["schedule"]
    when = f"cron {spec['cron']!r}" if "cron" in spec else f"every {spec['every_s']} s"
    print(
        f"{shown['workflow']} v{shown['version']}: {when} in {shown['timezone']}, "
        f"overlap {spec.get('overlap', 'skip')}, {state}"
    )
    print("next:")
    for tick in shown["next"]:
        print(f"  {tick['tick_at']}  {tick['local']}")
    print("ledger (newest first):")
    for row in shown["ledger"]:
        who = f"  by {row['actor']['name']}" if row["actor"] else ""
        print(
            f"  {row['tick_at']}  {row['outcome']:<9} {row['execution_id'] or '-':<36}"
            f"  {row['reason'] or ''}{who}"
        )


def _schedule_show(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    shown = schedules.show(conn, args.key)
    if args.json:
        _print_json(shown)
    else:
        _schedule_print(shown)


def _schedule_pause(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    schedules.set_paused(conn, args.key, True, _cli_actor())
    print(f"schedule of {args.key} is paused")


def _schedule_resume(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    schedules.set_paused(conn, args.key, False, _cli_actor())
    print(f"schedule of {args.key} is active")


def _schedule_trigger(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    outcome = schedules.Ticker().trigger(conn, args.key, _cli_actor())
    print(
        f"tick {schedules.iso(outcome.tick_at)} {outcome.outcome}"
        f" {outcome.execution_id or ''} {outcome.reason or ''}".rstrip()
    )


def _schedule_backfill(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    start, end = parse_until(args.start), parse_until(args.end)
    if end < start:
        raise FlowForgeError("--to must not be before --from")
    items = schedules.Ticker().backfill(
        conn, args.key, start, end, dry_run=args.dry_run, actor=_cli_actor()
    )
    for item in items:
        print(f"{item['tick_at']}  {item['outcome']:<13} {item['execution_id'] or ''}".rstrip())
    print(f"{len(items)} tick(s){' (dry run: nothing fired)' if args.dry_run else ''}")


def build_parser() -> argparse.ArgumentParser:
    """The command tree."""
    parser = argparse.ArgumentParser(prog="flowforge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(parent: Any, name: str, handler: Callable[..., None], help_: str) -> Any:
        command = parent.add_parser(name, help=help_)
        command.set_defaults(handler=handler)
        return command

    apikey = sub.add_parser("apikey", help="manage API keys").add_subparsers(required=True)
    create = add(apikey, "create", _apikey_create, "create a key (printed on the last line)")
    create.add_argument("--name", required=True)
    create.add_argument(
        "--workflow", action="append", help="limit the key to this workflow (repeatable)"
    )
    create.add_argument("--read-only", action="store_true")
    create.add_argument(
        "--secrets",
        action="store_true",
        help="may publish definitions that use {{ secrets.NAME }} (bound to their workflow)",
    )
    add(apikey, "list", _apikey_list, "list keys")
    add(apikey, "revoke", _apikey_revoke, "revoke a key").add_argument("id", type=int)

    workflow = sub.add_parser("workflow", help="publish and read workflows")
    wsub = workflow.add_subparsers(required=True)
    publish = add(wsub, "publish", _workflow_publish, "publish a definition file")
    publish.add_argument("file")
    publish.add_argument("--key", help="workflow key (default: the file name)")
    add(wsub, "list", _workflow_list, "list workflows")
    show = add(wsub, "show", _workflow_show, "show a workflow or one version")
    show.add_argument("key")
    show.add_argument("--version", type=int)

    secret = sub.add_parser("secret", help="webhook signing secrets").add_subparsers(required=True)
    add(secret, "create", _secret_create, "create a signing secret").add_argument("key")
    revoke = add(secret, "revoke", _secret_revoke, "revoke a signing secret")
    revoke.add_argument("key")
    revoke.add_argument("id", type=int)

    executions = sub.add_parser("executions", help="inspect executions").add_subparsers(
        required=True
    )
    listing = add(executions, "list", _executions_list, "list executions, newest first")
    listing.add_argument("--workflow")
    listing.add_argument("--status")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--cursor")
    detail = add(executions, "show", _executions_show, "steps, attempts and outputs")
    detail.add_argument("id")
    detail.add_argument("--json", action="store_true")

    add(sub, "cancel", _cancel, "cancel an execution").add_argument("id")
    add(sub, "retry", _retry, "re-run failed and cancelled steps").add_argument("id")
    resolve = add(sub, "resolve", _resolve, "settle a step whose outcome is unknown")
    resolve.add_argument("id")
    resolve.add_argument("step")
    resolve.add_argument("outcome", choices=RESOLUTIONS)
    resolve.add_argument("--output", help="the step's output as JSON (with succeeded)")
    complete = add(sub, "complete", _complete, "end a waiting wait step as a resume would")
    complete.add_argument("id")
    complete.add_argument("step")
    complete.add_argument("--output", help="the step's output as JSON (default null)")
    fail = add(sub, "fail", _fail, "fail a waiting wait step (the execution fails)")
    fail.add_argument("id")
    fail.add_argument("step")

    schedule = sub.add_parser("schedule", help="a workflow's schedule").add_subparsers(
        required=True
    )
    shown = add(schedule, "show", _schedule_show, "next fire times and the tick ledger")
    shown.add_argument("key")
    shown.add_argument("--json", action="store_true")
    add(schedule, "pause", _schedule_pause, "due ticks are ledgered paused").add_argument("key")
    add(schedule, "resume", _schedule_resume, "ticks fire again").add_argument("key")
    add(schedule, "trigger", _schedule_trigger, "fire a tick now").add_argument("key")
    backfill = add(schedule, "backfill", _schedule_backfill, "fire the past ticks of a range")
    backfill.add_argument("key")
    backfill.add_argument("--from", dest="start", required=True, help="ISO-8601 instant")
    backfill.add_argument("--to", dest="end", required=True, help="ISO-8601 instant")
    backfill.add_argument("--dry-run", action="store_true", help="list, fire nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `flowforge` console script."""
    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    try:
        with psycopg.connect(conninfo(settings.database_url), autocommit=True) as conn:
            args.handler(conn, args)
    except DefinitionInvalid as exc:
        print("flowforge: invalid definition:", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error['path']}: {error['message']}", file=sys.stderr)
        return 2
    except psycopg.OperationalError as exc:
        print(f"flowforge: {str(exc).strip()}", file=sys.stderr)
        print(f"flowforge: {database_hint(settings.database_url)}", file=sys.stderr)
        return 1
    except psycopg.errors.UndefinedTable as exc:
        print(f"flowforge: {str(exc).splitlines()[0]}", file=sys.stderr)
        print(
            "flowforge: this database has no FlowForge schema yet: run bin/migrate", file=sys.stderr
        )
        print(f"flowforge: {database_hint(settings.database_url)}", file=sys.stderr)
        return 1
    except (FlowForgeError, psycopg.Error, OSError, ValueError) as exc:
        print(f"flowforge: {exc}", file=sys.stderr)
        return 1
    return 0
