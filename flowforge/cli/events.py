"""`flowforge events`: events correlated by a business key (docs/contract.md#events)."""

from __future__ import annotations

import argparse
import json

from flowforge.cli.arguments import UsageError
from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.cli.tables import table


def send(ops: Ops, args: argparse.Namespace) -> None:
    try:
        payload = json.loads(args.payload)
    except ValueError:
        raise UsageError("--payload must be JSON, such as '{\"amount\": 1999}'") from None
    body = {"name": args.name, "key": args.key, "payload": payload}
    if args.id is not None:
        body["id"] = args.id
    sent = ops.send_event(body)
    again = " (a redelivery: nothing changed)" if sent["replayed"] else ""
    emit(args, sent, f"event {sent['id']} taken by {sent['delivered']} waiting step(s){again}")


def list_events(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.events(args.name, args.key, args.limit)
    columns = [
        ("RECEIVED", "received_at"),
        ("NAME", "name"),
        ("KEY", "key"),
        ("ID", "delivery_id"),
        ("TAKEN", "consumed_by"),
        ("EXPIRES", "expires_at"),
    ]
    emit(args, {"events": items}, lambda: table(items, columns))
