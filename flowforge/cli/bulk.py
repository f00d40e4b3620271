"""Actions on every execution a filter names: replay-bulk, cancel-bulk, retry-bulk."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flowforge.cli.apiclient import ApiError
from flowforge.cli.arguments import UsageError
from flowforge.cli.executions import query
from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.domain.model import MAX_PAGE
from flowforge.domain.operations import BY_NAME
from flowforge.errors import ClientError


def replay_bulk(ops: Ops, args: argparse.Namespace) -> None:
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
    if args.where:
        flt["attributes"] = dict(args.where)
    body: dict[str, Any] = {
        "filter": flt,
        "from_step": args.from_step,
        "version": "latest" if args.onto is None else args.onto,
    }
    preview = ops.replay_bulk({**body, "dry_run": True})
    if not args.yes or not preview["count"]:
        emit(
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
    emit(args, result, "\n".join(lines))


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
        page = ops.list_executions(query(args, limit=MAX_PAGE, cursor=cursor))
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
    if not (args.workflow or args.status or args.since or args.until or args.where):
        raise UsageError(
            f"name what to {action}: --workflow, --status, --since, --until or --where "
            "(a bulk action over every execution is not a default)"
        )
    ids, capped = _selection(ops, args, action)
    eligible = ", ".join(sorted(BULK_ELIGIBLE[action]))
    said = f"{len(ids)}{'+' if capped else ''} executions would be {BULK_DONE[action]}"
    if capped:
        raise UsageError(f"{said}: more than {BULK_MAX}; narrow the filter")
    if not ids or not _confirmed(args, f"{said} (only {eligible} ones). Go on?"):
        hint = "" if not ids else " (confirm with --yes)"
        emit(args, {"dry_run": True, "count": len(ids), "ids": ids}, f"{said}{hint}")
        return
    declared = BY_NAME[action]
    done, skipped = 0, []
    for execution_id in ids:
        try:
            ops.act(declared, execution_id, ())
            done += 1
        except ApiError as exc:
            if exc.status >= 500:
                raise
            skipped.append({"execution_id": execution_id, "detail": exc.detail})
        except ClientError as exc:
            skipped.append({"execution_id": execution_id, "detail": exc.detail})
    lines = [f"{done} executions {BULK_DONE[action]}, {len(skipped)} skipped"]
    lines += [f"  {s['execution_id']}: {s['detail']}" for s in skipped]
    emit(args, {"dry_run": False, "done": done, "skipped": skipped}, "\n".join(lines))


def cancel_bulk(ops: Ops, args: argparse.Namespace) -> None:
    _bulk(ops, args, "cancel")


def retry_bulk(ops: Ops, args: argparse.Namespace) -> None:
    _bulk(ops, args, "retry")
