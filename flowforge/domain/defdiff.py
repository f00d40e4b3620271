"""What changed between two versions of a definition, structurally and in the author's
order: `trigger` where the author put it, a step matched by its `id` wherever it moved,
one line per changed value with its JSON path.

Bounded, because a definition can be a megabyte chosen by anyone allowed to publish: the
walk visits each node of both documents once (dict and id lookups, no line matching, which
is what made a text diff of two adversarial ~94 KB versions take seconds), stops after
MAX_CHANGES changes, and each value is shown cut to MAX_VALUE characters.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_CHANGES = 200
MAX_VALUE = 160
# Deeper than this a subtree is compared whole (definitions are validated far shallower).
MAX_DEPTH = 64


@dataclass
class Diff:
    """The changes, each `(sign, path, text)`: `+` added, `-` removed, `~` changed."""

    changes: list[tuple[str, str, str]] = field(default_factory=list)
    truncated: bool = False

    def lines(self, old_name: str, new_name: str) -> list[str]:
        """As text, one change a line, under a `--- old` / `+++ new` header."""
        if not self.changes:
            return []
        body = [f"{sign} {path}: {text}" for sign, path, text in self.changes]
        if self.truncated:
            body.append(f"@ … more changes not shown (the first {MAX_CHANGES} are)")
        return [f"--- {old_name}", f"+++ {new_name}", *body]


class _Full(Exception):
    """MAX_CHANGES reached: the walk stops."""


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def _merged(old: list[Any], new: list[Any]) -> list[Any]:
    """The new order, with what only the old one has put back after its old predecessor
    (in one pass over each: no list searching, however many were removed)."""
    present = set(new)
    start = object()
    removed_after: dict[Any, list[Any]] = {}
    anchor: Any = start
    for item in old:
        if item in present:
            anchor = item
        else:
            removed_after.setdefault(anchor, []).append(item)
    order = list(removed_after.get(start, []))
    for item in new:
        order.append(item)
        order.extend(removed_after.get(item, []))
    return order


def _ids(items: list[Any]) -> list[str] | None:
    """The `id` of each item when every item is an object with a distinct string id."""
    ids = [x.get("id") if isinstance(x, dict) else None for x in items]
    if all(isinstance(i, str) for i in ids) and len(set(ids)) == len(ids):
        return ids  # type: ignore[return-value]
    return None


def diff(old: Any, new: Any) -> Diff:
    """The changes from `old` to `new`, in the author's (new version's) order."""
    found = Diff()

    def add(sign: str, path: str, text: str) -> None:
        if len(found.changes) >= MAX_CHANGES:
            found.truncated = True
            raise _Full
        found.changes.append((sign, path, text))

    def walk(a: Any, b: Any, path: str, depth: int) -> None:
        if depth > MAX_DEPTH or type(a) is not type(b) or not isinstance(a, dict | list):
            if a != b:
                add("~", path, f"{_show(a)} → {_show(b)}")
            return
        if isinstance(a, dict):
            members(a, b, _merged(list(a), list(b)), lambda key: f"{path}.{key}", depth)
            return
        old_ids, new_ids = _ids(a), _ids(b)
        if old_ids is not None and new_ids is not None:
            old_set, new_set = set(old_ids), set(new_ids)
            if [i for i in new_ids if i in old_set] != [i for i in old_ids if i in new_set]:
                add("~", f"{path} order", f"{', '.join(old_ids)} → {', '.join(new_ids)}")
            by_old, by_new = dict(zip(old_ids, a, strict=True)), dict(zip(new_ids, b, strict=True))
            members(by_old, by_new, _merged(old_ids, new_ids), lambda i: f"{path}[id={i}]", depth)
            return
        indices = range(max(len(a), len(b)))
        members(dict(enumerate(a)), dict(enumerate(b)), indices, lambda i: f"{path}[{i}]", depth)

    def members(
        a: dict[Any, Any],
        b: dict[Any, Any],
        names: Iterable[Any],
        where: Callable[[Any], str],
        depth: int,
    ) -> None:
        """An object's keys, a list's steps by id or its items by index: each one only
        the old side has is removed, only the new side added, on both compared within."""
        for name in names:
            here = where(name)
            if name not in b:
                add("-", here, _show(a[name]))
            elif name not in a:
                add("+", here, _show(b[name]))
            else:
                walk(a[name], b[name], here, depth + 1)

    with contextlib.suppress(_Full):  # the answer is full: what was found is the diff
        walk(old, new, "$", 0)
    return found
