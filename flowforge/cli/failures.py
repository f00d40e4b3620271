"""`flowforge failures`: failure groups (docs/contract.md#failure-groups), read, resolved,
ignored, reopened, and replayed or retried whole, one batch after another."""

from __future__ import annotations

import argparse
from typing import Any

from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.cli.tables import table

COLUMNS = [
    ("ID", "id"),
    ("WORKFLOW", "workflow"),
    ("STEP", "step"),
    ("OUTCOME", "outcome"),
    ("CODE", "code"),
    ("KIND", "kind"),
    ("STATUS", "status"),
    ("COUNT", "count"),
    ("PENDING", "pending"),
    ("LAST SEEN", "last_seen"),
    ("MESSAGE", "message"),
]
EXECUTIONS = [("EXECUTION", "id"), ("STATUS", "status"), ("CREATED", "created_at")]
BATCH = 100


def list_groups(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.failure_groups(args.workflow, args.status)
    emit(args, {"groups": items}, lambda: table(items, COLUMNS))


def show(ops: Ops, args: argparse.Namespace) -> None:
    found = ops.failure_group(args.group)
    emit(
        args,
        found,
        lambda: table([found], COLUMNS) + "\n\n" + table(found.get("executions", []), EXECUTIONS),
    )


def _status(ops: Ops, args: argparse.Namespace, verb: str, said: str) -> None:
    emit(args, ops.failure_group_status(args.group, verb), f"failure group {args.group} {said}")


def resolve(ops: Ops, args: argparse.Namespace) -> None:
    _status(ops, args, "resolve", "resolved")


def ignore(ops: Ops, args: argparse.Namespace) -> None:
    _status(ops, args, "ignore", "ignored")


def reopen(ops: Ops, args: argparse.Namespace) -> None:
    _status(ops, args, "reopen", "reopened")


def _whole(ops: Ops, args: argparse.Namespace, verb: str, body: dict[str, Any]) -> None:
    """Every batch of the group, or (without --yes) how many it would take."""
    done_key = "replayed" if verb == "replay" else "retried"
    if not args.yes:
        pending = ops.failure_group(args.group)["pending"]
        emit(
            args,
            {"pending": pending},
            f"{pending} executions would be {done_key} (confirm with --yes)",
        )
        return
    after, done, refused = None, 0, []
    while True:
        batch = ops.failure_group_act(args.group, verb, {**body, "after": after, "limit": BATCH})
        done += len(batch[done_key])
        refused += batch["refused"]
        after = batch["next_after"]
        if after is None:
            break
    lines = [f"{done} executions {done_key}, {len(refused)} refused"]
    lines += [f"  {r['execution_id']}: {r['detail']}" for r in refused]
    emit(args, {done_key: done, "refused": refused}, "\n".join(lines))


def replay(ops: Ops, args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"version": "latest" if args.onto is None else args.onto}
    if args.from_step:
        body["from_step"] = args.from_step
    _whole(ops, args, "replay", body)


def retry(ops: Ops, args: argparse.Namespace) -> None:
    _whole(ops, args, "retry", {})
