"""`flowforge notifications`: endpoints told of failures (docs/contract.md#notifications)."""

from __future__ import annotations

import argparse

from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.cli.tables import table

COLUMNS = [
    ("NAME", "name"),
    ("SHAPE", "shape"),
    ("KINDS", "kinds"),
    ("WORKFLOW", "workflow"),
    ("ENABLED", "enabled"),
    ("REASON", "disabled_reason"),
    ("URL", "url"),
]
HISTORY = [
    ("MESSAGE", "id"),
    ("TYPE", "type"),
    ("EVENTS", "events"),
    ("STATUS", "status"),
    ("ATTEMPTS", "attempts"),
    ("LAST", "last_status"),
    ("CREATED", "created_at"),
]


def list_endpoints(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.notifications()
    emit(args, {"endpoints": items}, lambda: table(items, COLUMNS))


def show(ops: Ops, args: argparse.Namespace) -> None:
    found = ops.notification(args.name)
    emit(
        args, found, lambda: table([found], COLUMNS) + "\n\n" + table(found["deliveries"], HISTORY)
    )


def create(ops: Ops, args: argparse.Namespace) -> None:
    body = {"name": args.name, "url": args.url, "shape": args.shape, "kinds": args.kind}
    if args.workflow:
        body["workflow"] = args.workflow
    made = ops.subscribe(body)
    secret = made.get("secret")
    signed = f"; signing secret (shown once): {secret}" if secret else ""
    emit(args, made, f"endpoint {made['name']!r} subscribed{signed}")


def rotate(ops: Ops, args: argparse.Namespace) -> None:
    made = ops.rotate_notification(args.name, args.url)
    secret = made.get("secret")
    said = f"; new signing secret (shown once): {secret}" if secret else "; new URL saved"
    emit(args, made, f"endpoint {args.name!r} rotated{said}")


def enable(ops: Ops, args: argparse.Namespace) -> None:
    emit(args, ops.switch_notification(args.name, "enable"), f"endpoint {args.name!r} enabled")


def disable(ops: Ops, args: argparse.Namespace) -> None:
    emit(args, ops.switch_notification(args.name, "disable"), f"endpoint {args.name!r} disabled")


def delete(ops: Ops, args: argparse.Namespace) -> None:
    ops.unsubscribe(args.name)
    emit(args, {"name": args.name, "deleted": True}, f"endpoint {args.name!r} deleted")
