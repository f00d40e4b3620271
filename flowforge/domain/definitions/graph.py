"""The graph a definition's steps form: closures, the topological order, the cycles that
prevent one. Pure functions over `{step id: parent ids}`, tolerant of invalid input because
the parser orders steps before it knows they are valid."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any


def closure(parents: Mapping[str, Iterable[str]], start: Iterable[str]) -> frozenset[str]:
    """Collect every step reachable through depends_on; tolerates cycles in invalid input."""
    seen: set[str] = set()
    stack = list(start)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(parents.get(node, ()))
    return frozenset(seen)


def topological(parents: dict[str, list[str]]) -> list[str]:
    """Order parents before children, keeping definition order among steps that are ready."""
    ids = list(parents)
    position = {step_id: index for index, step_id in enumerate(ids)}
    waiting = {step_id: len(deps) for step_id, deps in parents.items()}
    children: dict[str, list[str]] = {step_id: [] for step_id in ids}
    for step_id, deps in parents.items():
        for parent in deps:
            children[parent].append(step_id)
    ready = [position[step_id] for step_id in ids if waiting[step_id] == 0]
    order: list[str] = []
    while ready:
        step_id = ids[heapq.heappop(ready)]
        order.append(step_id)
        for child in children[step_id]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, position[child])
    return order


def cycles(parents: dict[str, list[str]], ordered: set[str]) -> list[list[str]]:
    """Name each cycle once, so the author sees the loop and not just that one exists."""
    position = {step_id: index for index, step_id in enumerate(parents)}
    walked: set[str] = set()
    cycles: list[list[str]] = []
    for start in parents:
        trail: list[str] = []
        node = start
        # Every step left out of the order has a parent also left out: walking up must loop.
        while node not in ordered and node not in walked and node not in trail:
            trail.append(node)
            node = next(parent for parent in parents[node] if parent not in ordered)
        if node in trail:
            loop = trail[trail.index(node) :]
            first = loop.index(min(loop, key=position.__getitem__))
            cycles.append(loop[first:] + loop[:first])
        walked.update(trail)
    return cycles


def count_steps(steps: list[Any]) -> int:
    """Steps of the workflow and of its maps' items: both bound the work of each check."""
    inner = sum(
        len(raw["steps"])
        for raw in steps
        if isinstance(raw, dict) and raw.get("type") == "map" and isinstance(raw.get("steps"), list)
    )
    return len(steps) + inner
