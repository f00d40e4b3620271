"""Geometry of the execution page, computed here so templates only place shapes: the DAG
in columns by depth, and each step's attempts on one time axis."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime
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
    """One attempt on the time axis, or the time a step spent not running: a delay, a
    wait for its resume, or the back-off before its next attempt (kind)."""

    step: str
    attempt: int
    outcome: str
    x: float
    width: float
    y: int
    label: str
    kind: str = "attempt"


@dataclass(frozen=True)
class Timeline:
    """Every attempt of the execution against one axis from its creation to now (or its
    end)."""

    bars: list[Bar]
    rows: list[str]
    span_s: float
    height: int


def stamp(value: str | datetime) -> str:
    """The console's one timestamp format, on every page: UTC to the millisecond."""
    instant = datetime.fromisoformat(value) if isinstance(value, str) else value
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def attempt_took(a: dict[str, Any], end: datetime) -> str:
    """An attempt's duration; one with no answer (unknown, lost lease) has no recorded
    duration, so it is the time from sending to when it was given up on (or to now)."""
    if a["duration_ms"] is not None:
        return f"{a['duration_ms']} ms"
    finished = a["finished_at"] or end
    took = round(_seconds(a["started_at"], finished) * 1000)
    return f"{took} ms" if a["finished_at"] else f"{took} ms so far"


# Time a step spends not running, drawn so that no stretch of the axis is unexplained.
PAUSES = {"delay": "delay", "wait": "waiting for its resume"}


def timeline(
    created_at: datetime,
    ended_at: datetime,
    attempts: list[dict[str, Any]],
    step_order: list[str],
    steps: list[dict[str, Any]] | None = None,
) -> Timeline:
    """Place each attempt (started_at, finished_at or still running at `ended_at`), and
    what lies between: a delay or wait step's time (started_at to finished_at, or on),
    and the back-off between one attempt of a step and its next (or its wake-up)."""
    span = max(_seconds(created_at, ended_at), 0.001)
    spans = _pauses(steps or [], ended_at) + _backoffs(attempts, steps or [], ended_at)
    shown = {a["step_id"] for a in attempts} | {name for name, *_ in spans}
    rows = [s for s in step_order if s in shown]
    bars = []
    for step_id, kind, start_at, end_at, label in spans:
        start, end = _seconds(created_at, start_at), _seconds(created_at, end_at)
        bars.append(
            Bar(
                step_id,
                0,
                kind,
                x=AXIS_W * start / span,
                width=max(2.0, AXIS_W * (end - start) / span),
                y=rows.index(step_id) * ROW_H,
                label=label,
                kind=kind,
            )
        )
    for a in attempts:
        start = _seconds(created_at, a["started_at"])
        end = _seconds(created_at, a["finished_at"] or ended_at)
        outcome = a["outcome"] or "running"
        bars.append(
            Bar(
                a["step_id"],
                a["attempt"],
                outcome,
                x=AXIS_W * start / span,
                width=max(2.0, AXIS_W * (end - start) / span),
                y=rows.index(a["step_id"]) * ROW_H,
                label=f"{a['step_id']} #{a['attempt']}: {outcome}, {attempt_took(a, ended_at)}",
            )
        )
    return Timeline(bars, rows, span, max(1, len(rows)) * ROW_H)


# A span between attempts or of a pause: step, kind, from, to, label.
_Span = tuple[str, str, datetime, datetime, str]


def _pauses(steps: list[dict[str, Any]], ended_at: datetime) -> list[_Span]:
    """A delay or wait step's time: started_at to finished_at, or on."""
    spans: list[_Span] = []
    for s in steps:
        if s["type"] in PAUSES and s["started_at"] is not None:
            began = datetime.fromisoformat(s["started_at"])
            stopped = datetime.fromisoformat(s["finished_at"]) if s["finished_at"] else ended_at
            what = PAUSES[s["type"]]
            until = (
                f", wakes {stamp(s['wake_at'])}" if s["wake_at"] and not s["finished_at"] else ""
            )
            spans.append(
                (
                    s["id"],
                    s["type"],
                    began,
                    stopped,
                    f"{s['id']}: {what}, {_seconds(began, stopped):.3f} s{until}",
                )
            )
    return spans


def _backoffs(
    attempts: list[dict[str, Any]], steps: list[dict[str, Any]], ended_at: datetime
) -> list[_Span]:
    """The back-off between one attempt of a step and its next (or its wake-up)."""
    spans: list[_Span] = []
    by_step: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        by_step.setdefault(a["step_id"], []).append(a)
    waking = {s["id"]: s for s in steps if s["status"] == "waiting" and s["wake_at"]}
    for step_id, tries in by_step.items():
        for before, after in itertools.pairwise(tries):
            if before["finished_at"] and after["started_at"] > before["finished_at"]:
                took = _seconds(before["finished_at"], after["started_at"])
                spans.append(
                    (
                        step_id,
                        "backoff",
                        before["finished_at"],
                        after["started_at"],
                        f"{step_id}: back-off before attempt {after['attempt']}, {took:.3f} s",
                    )
                )
        last = tries[-1]
        if step_id in waking and last["finished_at"]:
            spans.append(
                (
                    step_id,
                    "backoff",
                    last["finished_at"],
                    ended_at,
                    f"{step_id}: back-off, next attempt at {stamp(waking[step_id]['wake_at'])}",
                )
            )
    return spans
