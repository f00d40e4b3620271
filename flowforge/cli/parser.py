"""The `flowforge` command tree, declared without loading any command: each command
names its handler as "module.function" (a module of flowforge/cli/), which main imports
only for the command that runs. `--help` and shell completion thus load argparse and the
domain's words, never the HTTP client, the database driver or the definitions parser."""

from __future__ import annotations

import argparse
from typing import Any

from flowforge.cli.arguments import (
    STATUSES,
    Parser,
    Version,
    common_options,
    execution_id,
    instant,
    json_value,
    limit,
    positive,
    step_id,
    step_row,
    target_version,
    version_or_latest,
    where,
    workflow_key,
)
from flowforge.domain.model import MAX_PAGE, RESOLUTIONS, GroupStatus, NotifyKind, NotifyShape
from flowforge.domain.operations import ACTIONS, Kind, Param
from flowforge.domain.roles import Role

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
    "apikey create": "flowforge --db apikey create --name oncall --role operator --workflow orders",
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
    "executions export": "flowforge executions export 01a233ee-a3de-71f1-8ccd-4191093a47ad "
    "--file case.json",
    "executions show": "flowforge executions show 01a233ee-a3de-71f1-8ccd-4191093a47ad",
    "workflow groups": "flowforge workflow groups sync --status open",
    "workflow pause": "flowforge workflow pause orders",
    "workflow reingest": "flowforge workflow reingest orders --from 2026-12-01T09:00:00Z "
    "--to 2026-12-01T10:00:00Z --dry-run",
    "workflow resume": "flowforge workflow resume orders --onto latest",
    "circuits": "flowforge circuits list",
    "circuits list": "flowforge circuits list --output json",
    "circuits close": "flowforge circuits close stripe --workflow billing",
    "events": "flowforge events list --name payment.settled --key o-1001",
    "events list": "flowforge events list --name payment.settled --key o-1001",
    "events send": "flowforge events send payment.settled o-1001 --payload '{\"amount\": 1999}' "
    "--id pay-7781",
    "notifications": "flowforge notifications list",
    "notifications list": "flowforge notifications list --output json",
    "notifications show": "flowforge notifications show oncall",
    "notifications create": "flowforge notifications create oncall https://hooks.example.com/ff "
    "--kind execution.failed --kind outcome.unknown",
    "notifications rotate": "flowforge notifications rotate oncall",
    "notifications enable": "flowforge notifications enable oncall",
    "notifications disable": "flowforge notifications disable oncall",
    "notifications delete": "flowforge notifications delete oncall",
    "failures": "flowforge failures groups --status open",
    "failures groups": "flowforge failures groups --workflow orders --status open",
    "failures show": "flowforge failures show 12",
    "failures resolve": "flowforge failures resolve 12",
    "failures ignore": "flowforge failures ignore 12",
    "failures reopen": "flowforge failures reopen 12",
    "failures replay": "flowforge failures replay 12 --onto latest --yes",
    "failures retry": "flowforge failures retry 12 --yes",
    "replay": "flowforge replay 01a233ee-a3de-71f1-8ccd-4191093a47ad --from-step notify "
    "--onto latest",
    "replay-bulk": "flowforge replay-bulk --workflow orders --of-version 3 --status failed "
    "--from-step notify --onto latest",
    "cancel-bulk": "flowforge cancel-bulk --workflow orders --status waiting --since 2h",
    "retry-bulk": "flowforge retry-bulk --workflow orders --status failed --since 1d --yes",
    "completion": 'eval "$(flowforge completion bash)"',
    "apply": "flowforge apply workflows/ --dry-run",
    "test": "flowforge test orders.json --fixture fixtures/orders.json --junit report.xml",
    "schedule": "flowforge schedule show sweep",
    "schedule show": "flowforge schedule show sweep",
    "schedule pause": "flowforge schedule pause sweep",
    "schedule resume": "flowforge schedule resume sweep",
    "schedule trigger": "flowforge schedule trigger sweep",
    "schedule backfill": "flowforge schedule backfill sweep --from 2026-11-24T00:00:00Z "
    "--to 2026-11-29T00:00:00Z --dry-run",
    **{action.command: action.example for action in ACTIONS},
}


def _example(path: str) -> str | None:
    """The epilog of a command's --help; a command without an example (a test fails for
    it, tests/unit/test_reference_docs.py) still works."""
    return f"example:\n  {EXAMPLES[path]}" if path in EXAMPLES else None


def dest(param: Param) -> str:
    """Where a declared action's param lands in the parsed arguments (`--output` is taken:
    it says how to print)."""
    return "step_output" if param.kind is Kind.OUTPUT else param.field


def _param(parser: argparse.ArgumentParser, param: Param) -> None:
    """A declared action's param (flowforge/domain/operations.py) as a positional argument."""
    if param.kind is Kind.OUTCOME:
        parser.add_argument(dest(param), choices=RESOLUTIONS, help=param.help)
    elif param.kind is Kind.OUTPUT:
        parser.add_argument(
            dest(param),
            nargs="?",
            type=json_value,
            metavar="OUTPUT",
            help=f"{param.help}, as JSON",
        )
    else:  # a step, or a map item's step: the API tells which it takes
        parser.add_argument(dest(param), type=step_row, help=param.help)


class _Tree:
    """Adds groups and commands to the tree, each with the common options, its help as
    its description and its example as the epilog."""

    def __init__(self, sub: Any, common: argparse.ArgumentParser) -> None:
        self.sub = sub
        self.common = common
        self.groups: dict[int, str] = {}  # a group's subparsers -> its name, for the examples

    def group(self, name: str, help_: str) -> Any:
        actions = self.sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=_example(name),
            parents=[self.common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ).add_subparsers(dest="action", required=True, metavar="ACTION")
        self.groups[id(actions)] = name
        return actions

    def command(self, parent: Any, name: str, handler: str, help_: str) -> argparse.ArgumentParser:
        path = f"{self.groups[id(parent)]} {name}" if id(parent) in self.groups else name
        parsed: argparse.ArgumentParser = parent.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=_example(path),
            parents=[self.common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parsed.set_defaults(handler=handler)
        return parsed


def _workflow_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", type=workflow_key, help="the workflow's key")


def _window(parser: argparse.ArgumentParser, since_help: str) -> None:
    """--since and --until: when the executions a command names were created."""
    parser.add_argument("--since", type=instant, metavar="WHEN", help=since_help)
    parser.add_argument(
        "--until", type=instant, metavar="WHEN", help="created before WHEN (as --since)"
    )


def _where(parser: argparse.ArgumentParser) -> None:
    """--where NAME=VALUE, repeatable: a search attribute (docs/contract.md#search-attributes)."""
    parser.add_argument(
        "--where",
        type=where,
        action="append",
        metavar="NAME=VALUE",
        help="only executions with this search attribute (repeat: all of them)",
    )


def _from_step(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from-step",
        required=True,
        type=step_id,
        help="run again from this step; its ancestors keep their outputs",
    )


def build_parser() -> argparse.ArgumentParser:
    """The command tree, one group of commands after another (their order is --help's)."""
    common = common_options()
    parser = Parser(
        prog="flowforge",
        description=DESCRIPTION,
        epilog=_example(""),
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=Version)
    tree = _Tree(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), common)
    _apikey_commands(tree)
    _workflow_commands(tree)
    _secret_commands(tree)
    _circuit_commands(tree)
    _execution_commands(tree)
    _bulk_commands(tree)
    _schedule_commands(tree)
    _notification_commands(tree)
    _failure_commands(tree)
    _event_commands(tree)
    _authoring_commands(tree)
    completion = tree.command(
        tree.sub, "completion", "completion.print_script", "print a shell completion script"
    )
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    completion.set_defaults(offline=True)
    return parser


def _failure_commands(tree: _Tree) -> None:
    """Failure groups (docs/contract.md#failure-groups)."""
    failures = tree.group("failures", "failure groups: failed and unknown executions alike")
    groups = tree.command(
        failures, "groups", "failures.list_groups", "failure groups, newest first"
    )
    groups.add_argument("--workflow", type=workflow_key, help="only this workflow's groups")
    groups.add_argument(
        "--status", choices=("open", "resolved", "ignored"), help="only groups in this status"
    )
    for verb, help_ in (
        ("show", "one group and its newest executions"),
        ("resolve", "resolve a group: its next failure reopens it and alerts once"),
        ("ignore", "ignore a group: it counts on, silently"),
        ("reopen", "open a group again (no alert)"),
        ("replay", "replay every failed execution of a group (needs --yes)"),
        ("retry", "retry every failed execution of a group in place (needs --yes)"),
    ):
        command = tree.command(failures, verb, f"failures.{verb}", help_)
        command.add_argument("group", type=int, help="the group's id (failures groups shows it)")
        if verb in ("replay", "retry"):
            command.add_argument("--yes", action="store_true", help="do it (else: say how many)")
        if verb == "replay":
            command.add_argument("--from-step", help="default: the group's step")
            command.add_argument(
                "--onto", type=target_version, default=None, help="a version number or latest"
            )


def _apikey_commands(tree: _Tree) -> None:
    apikey = tree.group("apikey", "manage API keys (on the box: --db)")
    create = tree.command(
        apikey, "create", "apikeys.create", "create a key (printed on the last line)"
    )
    create.add_argument("--name", required=True, help="who or what the key is for")
    create.add_argument(
        "--workflow",
        action="append",
        type=workflow_key,
        help="limit the key to this workflow (repeatable)",
    )
    create.add_argument(
        "--role",
        choices=[role.value for role in Role],
        help="viewer reads; operator also acts on executions; admin also publishes and "
        "manages secrets, sources, notification endpoints and limits (default: admin, "
        "or viewer with --read-only)",
    )
    create.add_argument("--read-only", action="store_true", help="the viewer role (GET only)")
    create.add_argument(
        "--secrets",
        action="store_true",
        help="may publish definitions that use {{ secrets.NAME }} (bound to their workflow; "
        "admin only)",
    )
    tree.command(apikey, "list", "apikeys.list_keys", "list keys")
    tree.command(apikey, "revoke", "apikeys.revoke", "revoke a key").add_argument(
        "id", type=positive, help="the key's ID, from apikey list"
    )


def _workflow_commands(tree: _Tree) -> None:
    workflow = tree.group("workflow", "publish and read workflows")
    publish = tree.command(workflow, "publish", "workflows.publish", "publish a definition file")
    publish.add_argument("file", help="the definition, a JSON file")
    publish.add_argument(
        "--key",
        help="the workflow to create or version (default: the file name, with a warning "
        "when that makes a new workflow)",
    )
    tree.command(workflow, "list", "workflows.list_workflows", "list workflows")
    show = tree.command(workflow, "show", "workflows.show", "show a workflow or one version")
    _workflow_key(show)
    show.add_argument("--version", type=positive, help="print this version's definition")
    diff = tree.command(
        workflow, "diff", "workflows.diff", "what changed between two versions (or files)"
    )
    _workflow_key(diff)
    diff.add_argument("old", help="a version number, or a definition file")
    diff.add_argument("new", help="a version number, or a definition file (not yet published)")
    gathered = tree.command(
        workflow, "groups", "workflows.groups", "debounce and batch groups, newest first"
    )
    _workflow_key(gathered)
    gathered.add_argument(
        "--status", choices=[s.value for s in GroupStatus], help="only groups in this state"
    )
    _workflow_key(
        tree.command(
            workflow, "pause", "workflows.pause", "webhooks queue; nothing starts until resumed"
        )
    )
    resuming = tree.command(
        workflow, "resume", "workflows.resume", "release paused and queued work in arrival order"
    )
    _workflow_key(resuming)
    resuming.add_argument(
        "--onto",
        type=version_or_latest,
        metavar="VERSION",
        help="first re-pin the executions that never started a step onto this version "
        "(a number, or latest): the ones that arrived while it was paused",
    )
    again = tree.command(
        workflow, "reingest", "workflows.reingest", "archived webhooks of a range as new executions"
    )
    _workflow_key(again)
    again.add_argument(
        "--from", dest="start", required=True, help="received at or after (RFC 3339)"
    )
    again.add_argument("--to", dest="end", required=True, help="received before (RFC 3339)")
    again.add_argument("--filter", help='a when-style condition, e.g. {"path": "input.kind", ...}')
    again.add_argument("--dry-run", action="store_true", help="count and sample, create nothing")


def _secret_commands(tree: _Tree) -> None:
    secret = tree.group("secret", "webhook signing secrets")
    _workflow_key(
        tree.command(secret, "create", "webhook_secrets.create", "create a signing secret")
    )
    _workflow_key(
        tree.command(secret, "list", "webhook_secrets.list_secrets", "list a workflow's secrets")
    )
    revoke = tree.command(secret, "revoke", "webhook_secrets.revoke", "revoke a signing secret")
    _workflow_key(revoke)
    revoke.add_argument("id", type=positive, help="the secret's ID, from secret list")


def _circuit_commands(tree: _Tree) -> None:
    circuits = tree.group("circuits", "circuit breakers and holds of outbound limits")
    tree.command(
        circuits, "list", "circuits.list_circuits", "open and half-open circuits, holds in force"
    )
    close = tree.command(circuits, "close", "circuits.close", "close a circuit and end its hold")
    close.add_argument(
        "key", help="the limit's key as circuits list shows it (host:NAME, shared:NAME or a name)"
    )
    close.add_argument("--workflow", type=workflow_key, help="the workflow whose own limit it is")


def _event_commands(tree: _Tree) -> None:
    """Events correlated by a business key (docs/contract.md#events)."""
    group = tree.group("events", "events that wait steps take by name and key")
    send = tree.command(group, "send", "events.send", "send an event to the waits for its key")
    send.add_argument("name", help="the event's name, such as payment.settled")
    send.add_argument("key", help="its business key, such as an order's id")
    send.add_argument("--payload", default="null", help="its JSON payload (default null)")
    send.add_argument("--id", help="its identity: the same id again is a redelivery")
    listing = tree.command(group, "list", "events.list_events", "the events kept, newest first")
    listing.add_argument("--name", help="only events of this name")
    listing.add_argument("--key", help="only events with this key")
    listing.add_argument("--limit", type=positive, default=100, help="at most this many")


def _notification_commands(tree: _Tree) -> None:
    """Endpoints told of failures, unknown outcomes and open circuits."""
    notify = tree.group(
        "notifications", "endpoints told of failures, unknown outcomes, open circuits, full queues"
    )
    tree.command(notify, "list", "notifications.list_endpoints", "every notification endpoint")
    for verb, handler, help_ in (
        ("show", "show", "one endpoint and its delivery history"),
        ("enable", "enable", "enable an endpoint again"),
        ("disable", "disable", "disable an endpoint; what waited for it is dropped"),
        ("delete", "delete", "remove an endpoint and its history"),
    ):
        tree.command(notify, verb, f"notifications.{handler}", help_).add_argument(
            "name", help="the endpoint's name"
        )
    rotate = tree.command(
        notify, "rotate", "notifications.rotate", "a new signing secret, or a Slack endpoint's URL"
    )
    rotate.add_argument("name", help="the endpoint's name")
    rotate.add_argument("--url", help="a Slack endpoint's new incoming-webhook URL")
    subscribe = tree.command(notify, "create", "notifications.create", "subscribe an endpoint")
    subscribe.add_argument("name", help="a name: lowercase letters, digits, - and _")
    subscribe.add_argument("url", help="where to POST each message")
    subscribe.add_argument(
        "--kind",
        action="append",
        required=True,
        choices=[kind.value for kind in NotifyKind],
        help="an event kind to be told of (repeat for more)",
    )
    subscribe.add_argument(
        "--shape",
        choices=[shape.value for shape in NotifyShape],
        default="standard",
        help="standard: Standard Webhooks-signed JSON; slack: an incoming webhook's text",
    )
    subscribe.add_argument("--workflow", type=workflow_key, help="only this workflow's events")


def _execution_commands(tree: _Tree) -> None:
    """Reading executions, the declared operator actions on one, and replaying one."""
    executions = tree.group("executions", "inspect executions")
    listing = tree.command(
        executions, "list", "executions.list_executions", "list executions, newest first"
    )
    listing.add_argument("--workflow", type=workflow_key, help="only this workflow's")
    listing.add_argument(
        "--status",
        choices=STATUSES,
        help="only in this status; needs_attention: every execution with an unknown step",
    )
    listing.add_argument("--limit", type=limit, default=20, help=f"1-{MAX_PAGE}")
    listing.add_argument("--cursor", help="next_cursor of the previous page")
    _where(listing)
    _window(
        listing,
        "created at or after WHEN: an ISO 8601 instant (UTC unless it says) or an age "
        "such as 30m, 6h, 2d",
    )
    detail = tree.command(executions, "show", "executions.show", "steps, attempts and who acted")
    detail.add_argument("id", type=execution_id, help="the execution's ID")
    exported = tree.command(
        executions, "export", "exporting.export", "an execution as a flowforge test fixture"
    )
    exported.add_argument("id", type=execution_id, help="the execution's ID")
    exported.add_argument("--file", help="write it here (default: print it)")

    for action in ACTIONS:
        acting = tree.command(tree.sub, action.command, "actions.act", action.help)
        acting.set_defaults(operation=action.name)
        acting.add_argument("id", type=execution_id, help="the execution's ID")
        for param in action.params:
            _param(acting, param)
    replaying = tree.command(
        tree.sub, "replay", "actions.replay", "replay an execution from a step onto a version"
    )
    replaying.add_argument("id", type=execution_id, help="the execution's ID")
    _from_step(replaying)
    replaying.add_argument(
        "--onto", type=target_version, default=None, help="a version number or latest (default)"
    )


def _bulk_commands(tree: _Tree) -> None:
    """The commands over every execution a filter names."""
    bulk = tree.command(
        tree.sub, "replay-bulk", "bulk.replay_bulk", "replay a workflow's executions by filter"
    )
    bulk.add_argument("--workflow", required=True, type=workflow_key)
    _from_step(bulk)
    bulk.add_argument("--onto", type=target_version, default=None, help="version or latest")
    bulk.add_argument("--of-version", type=positive, help="only executions of this version")
    bulk.add_argument("--status", choices=STATUSES)
    bulk.add_argument("--from", dest="start", help="created at or after (ISO-8601)")
    bulk.add_argument("--to", dest="end", help="created before (ISO-8601)")
    bulk.add_argument("--error", help="a step's error contains this text")
    _where(bulk)
    bulk.add_argument("--batch", type=limit, default=100, help=f"per call, 1-{MAX_PAGE}")
    bulk.add_argument("--yes", action="store_true", help="replay them (default: preview)")
    for name, handler, help_ in (
        ("cancel-bulk", "bulk.cancel_bulk", "cancel every unfinished execution a filter names"),
        ("retry-bulk", "bulk.retry_bulk", "retry every failed, cancelled or needs_attention one"),
    ):
        by_filter = tree.command(tree.sub, name, handler, help_)
        by_filter.add_argument("--workflow", type=workflow_key, help="only this workflow's")
        by_filter.add_argument(
            "--status",
            choices=STATUSES,
            help="only in this status (needs_attention: every execution with an unknown step)",
        )
        _window(by_filter, "created at or after WHEN (30m, 6h, 2d or an ISO 8601 instant)")
        _where(by_filter)
        by_filter.add_argument(
            "--yes",
            action="store_true",
            help="do it without asking (default: show the count and ask on a terminal; "
            "in a script, only show the count)",
        )


def _schedule_commands(tree: _Tree) -> None:
    schedule = tree.group("schedule", "a workflow's schedule: fire times, ledger, pause, backfill")
    _workflow_key(
        tree.command(schedule, "show", "schedules.show", "next fire times and the tick ledger")
    )
    for name, handler, help_ in (
        ("pause", "schedules.pause", "due ticks are ledgered paused, not fired"),
        ("resume", "schedules.resume", "ticks fire again from now on"),
        ("trigger", "schedules.trigger", "fire a tick now, under the overlap policy"),
    ):
        _workflow_key(tree.command(schedule, name, handler, help_))
    backfill = tree.command(schedule, "backfill", "schedules.backfill", "fire a past range's ticks")
    _workflow_key(backfill)
    backfill.add_argument("--from", dest="start", required=True, help="ISO-8601 instant")
    backfill.add_argument("--to", dest="end", required=True, help="ISO-8601 instant")
    backfill.add_argument("--dry-run", action="store_true", help="list; fire nothing")


def _authoring_commands(tree: _Tree) -> None:
    """Testing definitions offline and applying a folder of them."""
    applying = tree.command(
        tree.sub, "apply", "apply.apply_folder", "publish what changed in a folder of definitions"
    )
    applying.add_argument("folder", metavar="DIR", help="one workflow per *.json, keyed by name")
    applying.add_argument(
        "--dry-run", action="store_true", help="show the diff, publish nothing (exit 3: drift)"
    )

    testing = tree.command(
        tree.sub, "test", "testing.run_tests", "run definitions against fixtures, offline"
    )
    testing.add_argument("definitions", nargs="+", metavar="DEFINITION", help="a JSON file")
    testing.add_argument(
        "--fixture",
        action="append",
        help="a fixture file (repeatable; default: fixtures/NAME.json beside each definition)",
    )
    testing.add_argument(
        "--from",
        dest="fixture",
        action="append",
        metavar="FILE",
        help="an execution exported with `executions export`: replay it, say what differs",
    )
    testing.add_argument("--key", type=workflow_key, help="the workflow key (default: file name)")
    testing.add_argument("--junit", metavar="FILE", help="also write JUnit XML here")
    testing.set_defaults(offline=True)
