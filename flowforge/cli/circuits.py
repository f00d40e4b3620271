"""`flowforge circuits`: the circuit breakers of outbound limits."""

from __future__ import annotations

import argparse

from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.cli.tables import table


def list_circuits(ops: Ops, args: argparse.Namespace) -> None:
    items = ops.circuits()
    columns = [
        ("WORKFLOW", "workflow"),
        ("KEY", "key"),
        ("STATE", "state"),
        ("FAILURES", "failures"),
        ("UNTIL", "until"),
        ("HELD UNTIL", "held_until"),
    ]
    emit(args, {"circuits": items}, lambda: table(items, columns))


def close(ops: Ops, args: argparse.Namespace) -> None:
    closed = ops.close_circuit(args.key, args.workflow)
    emit(args, closed, lambda: f"circuit {closed['key']!r} closed, hold ended")
