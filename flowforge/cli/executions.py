"""`flowforge executions`: list executions and show one as an operator reads it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flowforge.cli.ops import Ops
from flowforge.cli.output import emit, paint
from flowforge.cli.tables import table
from flowforge.domain.model import ExecutionQuery, StepStatus


def query(args: argparse.Namespace, *, limit: int, cursor: str | None) -> ExecutionQuery:
    """The executions the command's filter names (--workflow, --status, --since, --until,
    --where)."""
    return ExecutionQuery(
        workflow=args.workflow,
        status=args.status,
        limit=limit,
        cursor=cursor,
        since=args.since,
        until=args.until,
        attributes=tuple(args.where or ()),
    )


def list_executions(ops: Ops, args: argparse.Namespace) -> None:
    page = ops.list_executions(query(args, limit=args.limit, cursor=args.cursor))
    columns = [
        ("ID", "id"),
        ("WORKFLOW", "workflow"),
        ("VERSION", "version"),
        ("STATUS", "status"),
        ("CREATED", "created_at"),
        ("FINISHED", "finished_at"),
    ]
    emit(args, page, lambda: table(page["items"], columns))
    if page["next_cursor"] and args.format != "json":
        # On stderr: stdout stays the table, for pipes.
        print(f"next page: --cursor {page['next_cursor']}", file=sys.stderr)


def _head(detail: dict[str, Any]) -> list[str]:
    """What the execution is, where it stands and what it waits for, before its steps."""
    lines = [
        f"execution {detail['id']}  {detail['workflow']} v{detail['version']}  "
        + paint(detail["status"], detail["status"]),
        f"  created {detail['created_at']}  finished {detail['finished_at'] or '-'}",
    ]
    if attributes := detail.get("attributes"):
        # docs/contract.md#search-attributes: what `executions list --where` finds it by.
        lines.append("  attributes " + "  ".join(f"{k}={v}" for k, v in attributes.items()))
    flow = detail.get("flow_control") or {}
    if flow.get("stop_reason"):
        lines.append(f"  stopped: {flow['stop_reason']}")
    if waiting := flow.get("waiting_for_slot"):
        lines.append(
            f"  waits for a slot of key {waiting['key']!r} (limit {waiting['limit']}): "
            f"{waiting['ahead']} ahead, held by {', '.join(waiting['held_by']) or '-'}"
        )
    if parent := detail.get("parent"):
        gone = " (parent deleted by retention)" if detail.get("parent_deleted") else ""
        lines.append(
            f"  child of {parent['execution_id']}{gone} (step {parent['step_id']}),"
            f" depth {detail.get('depth', 1)}"
        )
    for child in detail.get("children") or []:
        lines.append(
            f"  step {child['step_id']} started {child['workflow']} execution "
            f"{child['execution_id']}: " + paint(child["status"], child["status"])
        )
    for child in detail.get("waiting_on_children") or []:
        if child["needs_attention"]:
            lines.append(
                f"  waits on child {child['execution_id']}, which needs attention: "
                "resolve it there and this execution goes on"
            )
    for limited in detail.get("waiting_on_limits") or []:
        lines.append(
            f"  step {limited['step']} waits for limit {limited['key']!r} "
            f"({limited['reason']}) until {limited['until']}, since {limited['since']}"
            + (f"; held: {limited['held_reason']}" if limited["reason"] == "held" else "")
        )
    return lines


def execution_text(detail: dict[str, Any]) -> str:
    """The execution as an operator reads it: status, steps and attempts, then who did what."""
    lines = _head(detail)
    for s in detail["steps"]:
        line = f"  {s['id']:<20} {s['type']:<13} " + paint(f"{s['status']:<10}", s["status"])
        if s["wake_at"] and s["status"] == StepStatus.WAITING:
            line += f" wakes {s['wake_at']}"
        if s["error"] and s["status"] != StepStatus.SUCCEEDED:
            # A step that succeeded on a later try keeps the error of the one before:
            # its attempt lines say it; on the step's line it would read as a failure.
            line += f" error: {s['error']}"
        if s["skipped_because"]:
            line += f" because {s['skipped_because']}"
        lines.append(line)
        for a in s["attempts"]:
            extra = f" HTTP {a['http_status']}" if a["http_status"] else ""
            extra += f" {a['duration_ms']} ms" if a["duration_ms"] is not None else ""
            extra += f" ({a['error']})" if a["error"] else ""
            lines.append(
                f"      attempt {a['attempt']}: {a['outcome'] or 'in flight'}{extra}"
                f"  {a['started_at']}"
            )
            if sent := a.get("request"):
                verb = "not sent" if (a["error"] or "").startswith("not sent") else "sent"
                lines.append(f"        {verb} {sent['method']} {sent['url']}")
            if a["outcome"] in ("unknown", "lost_lease") and not a.get("response"):
                lines.append(f"        no answer (by {a['worker'] or '?'})")
        if s["output"] is not None:
            output = json.dumps(s["output"])
            lines.append(f"      output: {output[:200]}{'…' if len(output) > 200 else ''}")
    acted = [e for e in detail.get("events", []) if "actor" in (e.get("detail") or {})]
    if acted:
        lines.append("  operator actions:")
        rows = [
            {
                "at": e["at"],
                "event": e["kind"],
                "step": e["step"],
                "by": actor_text(e["detail"]["actor"]),
            }
            for e in acted
        ]
        history = table(rows, [("AT", "at"), ("EVENT", "event"), ("STEP", "step"), ("BY", "by")])
        lines += [f"    {line}" for line in history.splitlines()]
    return "\n".join(lines)


def actor_text(actor: dict[str, Any]) -> str:
    """`api key 3 (ops)`, `cli@box`, `flow control`."""
    if actor.get("kind") == "api_key":
        return f"api key {actor.get('id')} ({actor.get('name')})"
    return str(actor.get("name", actor.get("kind", "?")))


def show(ops: Ops, args: argparse.Namespace) -> None:
    detail = ops.execution(args.id)
    emit(args, detail, lambda: execution_text(detail))
