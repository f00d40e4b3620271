"""Geometry of the execution page, computed here so templates only place shapes: the DAG
in columns by depth, and each step's attempts on one time axis."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 150, 44, 50, 16, 8
AXIS_W, ROW_H = 760, 26


@dataclass(frozen=True)
class Box:
    """One step of the DAG: where it sits and what state it is in."""

    id: str
    type: str
    status: str
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    """depends_on, drawn from the right side of one box to the left side of another."""

    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class Dag:
    """The laid-out DAG and the size of its drawing."""

    boxes: list[Box]
    edges: list[Edge]
    width: int
    height: int


def layout(steps: list[dict[str, Any]], statuses: dict[str, str]) -> Dag:
    """Columns by longest path from a root (steps come in the definition's order, which
    lists every step after the ones it depends on); rows in definition order."""
    depth: dict[str, int] = {}
    for step in steps:
        parents = [p for p in step.get("depends_on", []) if p in depth]
        depth[step["id"]] = 1 + max((depth[p] for p in parents), default=-1)
    rows: dict[int, int] = {}
    place: dict[str, tuple[int, int]] = {}
    boxes = []
    for step in steps:
        column = depth[step["id"]]
        row = rows.get(column, 0)
        rows[column] = row + 1
        x, y = MARGIN + column * (BOX_W + GAP_X), MARGIN + row * (BOX_H + GAP_Y)
        place[step["id"]] = (x, y)
        boxes.append(
            Box(step["id"], step.get("type", "?"), statuses.get(step["id"], "pending"), x, y)
        )
    edges = [
        Edge(
            place[parent][0] + BOX_W,
            place[parent][1] + BOX_H // 2,
            place[step["id"]][0],
            place[step["id"]][1] + BOX_H // 2,
        )
        for step in steps
        for parent in step.get("depends_on", [])
        if parent in place
    ]
    columns = 1 + max(depth.values(), default=0)
    tallest = max(rows.values(), default=1)
    return Dag(
        boxes,
        edges,
        2 * MARGIN + columns * BOX_W + (columns - 1) * GAP_X,
        2 * MARGIN + tallest * BOX_H + (tallest - 1) * GAP_Y,
    )


@dataclass(frozen=True)
class Bar:
    """One attempt on the time axis."""

    step: str
    attempt: int
    outcome: str
    x: float
    width: float
    y: int
    label: str


@dataclass(frozen=True)
class Timeline:
    """Every attempt of the execution against one axis from its creation to now (or its
    end)."""

    bars: list[Bar]
    rows: list[str]
    span_s: float
    height: int


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def timeline(
    created_at: datetime,
    ended_at: datetime,
    attempts: list[dict[str, Any]],
    step_order: list[str],
) -> Timeline:
    """Place each attempt (started_at, finished_at or still running at `ended_at`)."""
    span = max(_seconds(created_at, ended_at), 0.001)
    rows = [s for s in step_order if any(a["step_id"] == s for a in attempts)]
    bars = []
    for a in attempts:
        start = _seconds(created_at, a["started_at"])
        end = _seconds(created_at, a["finished_at"] or ended_at)
        took = a["duration_ms"] if a["duration_ms"] is not None else round((end - start) * 1000)
        outcome = a["outcome"] or "running"
        bars.append(
            Bar(
                a["step_id"],
                a["attempt"],
                outcome,
                x=AXIS_W * start / span,
                width=max(2.0, AXIS_W * (end - start) / span),
                y=rows.index(a["step_id"]) * ROW_H,
                label=f"{a['step_id']} #{a['attempt']}: {outcome}, {took} ms",
            )
        )
    return Timeline(bars, rows, span, max(1, len(rows)) * ROW_H)
