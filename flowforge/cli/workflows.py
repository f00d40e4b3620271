"""`flowforge workflow`: publish, read, compare, pause, resume and re-ingest workflows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from flowforge.cli.arguments import UsageError
from flowforge.cli.ops import Ops
from flowforge.cli.output import emit, warn
from flowforge.cli.tables import cell, table, to_json
from flowforge.domain.model import WORKFLOW_KEY


def publish(ops: Ops, args: argparse.Namespace) -> None:
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
        warn(
            f"created a new workflow {key!r}, named after the file; to publish a version "
            "of an existing workflow, name it with --key KEY"
        )
    if warning := published.get("warning"):
        warn(warning)
    if version == 1:
        said = f"created workflow {key}: version 1"
    else:
        said = f"published version {version} of workflow {key}"
    emit(args, published, said)


def list_workflows(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.workflows()
    columns = [
        ("WORKFLOW", "workflow"),
        ("VERSION", "latest_version"),
        ("AUTH", "webhook_auth"),
        ("NAME", "name"),
    ]
    emit(args, {"items": items}, lambda: table(items, columns))


def show(ops: Ops, args: argparse.Namespace) -> None:
    if args.version:
        shown = ops.version(args.key, args.version)
        emit(args, shown, lambda: to_json(shown))
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

    emit(args, workflow, text)


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


def diff(ops: Ops, args: argparse.Namespace) -> None:
    from flowforge.domain import defdiff

    found = defdiff.diff(_definition(ops, args.key, args.old), _definition(ops, args.key, args.new))
    said = found.lines(args.old, args.new)
    emit(
        args,
        {"changes": [list(c) for c in found.changes], "truncated": found.truncated},
        "\n".join(said) if said else "no difference",
    )


def groups(ops: Ops, args: argparse.Namespace) -> None:
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
    emit(args, shown, lambda: table(shown["items"], columns))


def pause(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.pause_workflow(args.key)
    emit(args, done, f"workflow {args.key} is paused ({done['held']} executions held)")


def resume(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.resume_workflow(args.key, args.onto)
    said = ""
    if args.onto is not None:
        said = f"{done['repinned']} never-started executions re-pinned onto version {done['onto']}"
        if done["kept"]:
            said += f" ({done['kept']} kept their version: their concurrency key would change)"
        said += "; "
    emit(
        args,
        done,
        f"{said}workflow {args.key} is running again ({done['resumed']} executions resumed, "
        f"{done['started']} started from the queue)",
    )


def reingest(ops: Ops, args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"from": args.start, "to": args.end, "dry_run": args.dry_run}
    if args.filter is not None:
        try:
            body["filter"] = json.loads(args.filter)
        except ValueError as exc:
            raise UsageError(f"--filter is not JSON: {exc}") from None
    if args.dry_run:
        shown = ops.reingest(args.key, body)
        more = " (more after this page)" if shown["next"] is not None else ""
        emit(args, shown, f"{shown['matched']} archived webhooks would be re-ingested{more}")
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
    emit(args, result, "\n".join(lines))
