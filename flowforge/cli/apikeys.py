"""`flowforge apikey`: API keys exist only on the box (the API has no endpoint that
makes them)."""

from __future__ import annotations

import argparse

from flowforge.cli.ops import Ops, on_the_box
from flowforge.cli.output import emit
from flowforge.cli.tables import table


def create(ops: Ops, args: argparse.Namespace) -> None:
    created = on_the_box(ops, args).create_key(
        args.name, args.workflow or None, args.read_only, args.secrets, args.role
    )
    emit(
        args,
        created,
        f"created API key {created['id']} ({args.name}, {created['role']}); it is shown only "
        f"once:\n{created['key']}",
    )


def list_keys(ops: Ops, args: argparse.Namespace) -> None:
    keys = on_the_box(ops, args).keys()

    def text() -> str:
        rows = [
            {
                **row,
                "prefix": f"{row['prefix']}…",
                "state": "revoked" if row["revoked_at"] else "active",
                "role": row["role"] + ("+secrets" if row["publish_secrets"] else ""),
                "scope": ",".join(row["workflows"]) if row["workflows"] else "*",
                "last_used": row["last_used_at"] or "never",
            }
            for row in keys
        ]
        columns = [
            ("ID", "id"),
            ("PREFIX", "prefix"),
            ("STATE", "state"),
            ("ROLE", "role"),
            ("SCOPE", "scope"),
            ("LAST USED", "last_used"),
            ("NAME", "name"),
        ]
        return table(rows, columns)

    emit(args, {"items": keys}, text)


def revoke(ops: Ops, args: argparse.Namespace) -> None:
    on_the_box(ops, args).revoke_key(args.id)
    emit(args, {"id": args.id, "revoked": True}, f"revoked API key {args.id}")
