"""`flowforge schedule`: a workflow's schedule, its tick ledger, pause and backfill."""

from __future__ import annotations

import argparse
from typing import Any

from flowforge.cli.executions import actor_text
from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.cli.tables import table


def _schedule_text(shown: dict[str, Any]) -> str:
    """The schedule as an operator reads it: what and when, the next ticks, the ledger."""
    spec = shown["schedule"]
    when = f"cron {spec['cron']!r}" if "cron" in spec else f"every {spec['every_s']} s"
    state = "paused" if shown["paused"] else "active"
    lines = [
        f"{shown['workflow']} v{shown['version']}: {when} in {shown['timezone']}, "
        f"overlap {spec.get('overlap', 'skip')}, {state}",
        "",
        table(
            shown["next"], [("NEXT (UTC)", "tick_at"), ("LOCAL", "local"), ("FIRES", "fires_at")]
        ),
        "",
    ]
    rows = [{**r, "by": actor_text(r["actor"]) if r["actor"] else ""} for r in shown["ledger"]]
    columns = [
        ("TICK", "tick_at"),
        ("OUTCOME", "outcome"),
        ("EXECUTION", "execution_id"),
        ("REASON", "reason"),
        ("BY", "by"),
    ]
    return "\n".join([*lines, table(rows, columns)])


def show(ops: Ops, args: argparse.Namespace) -> None:
    shown = ops.schedule(args.key)
    emit(args, shown, lambda: _schedule_text(shown))


def pause(ops: Ops, args: argparse.Namespace) -> None:
    shown = ops.pause_schedule(args.key)
    emit(args, shown, f"schedule of {args.key} is paused")


def resume(ops: Ops, args: argparse.Namespace) -> None:
    shown = ops.resume_schedule(args.key)
    emit(args, shown, f"schedule of {args.key} is active")


def trigger(ops: Ops, args: argparse.Namespace) -> None:
    tick = ops.trigger_schedule(args.key)
    detail = " ".join(str(tick[k]) for k in ("execution_id", "reason") if tick.get(k))
    emit(args, tick, f"tick {tick['tick_at']} {tick['outcome']} {detail}".rstrip())


def backfill(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.backfill_schedule(args.key, args.start, args.end, args.dry_run)
    columns = [("TICK", "tick_at"), ("OUTCOME", "outcome"), ("EXECUTION", "execution_id")]
    suffix = " (dry run: nothing fired)" if args.dry_run else ""
    emit(
        args,
        done,
        lambda: f"{table(done['items'], columns)}\n{len(done['items'])} tick(s){suffix}",
    )
