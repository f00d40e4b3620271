"""`flowforge secret`: a workflow's webhook signing secrets."""

from __future__ import annotations

import argparse

from flowforge.cli.ops import Ops
from flowforge.cli.output import emit, warn
from flowforge.cli.tables import table


def create(ops: Ops, args: argparse.Namespace) -> None:
    created = ops.create_secret(args.key)
    if warning := created.get("warning"):
        warn(warning)
    emit(
        args,
        created,
        f"created webhook secret {created['id']} for {args.key}; it is shown only once:\n"
        f"{created['secret']}",
    )


def list_secrets(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.secrets(args.key)
    columns = [("ID", "id"), ("CREATED", "created_at"), ("REVOKED", "revoked_at")]
    emit(args, {"items": items}, lambda: table(items, columns))


def revoke(ops: Ops, args: argparse.Namespace) -> None:
    ops.revoke_secret(args.key, args.id)
    emit(
        args,
        {"workflow": args.key, "id": args.id, "revoked": True},
        f"revoked webhook secret {args.id} of {args.key}",
    )
