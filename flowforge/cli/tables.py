"""How the `flowforge` CLI prints: JSON for scripts, aligned columns under a header for
people. Pure text, no I/O: the CLI writes what these return."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

# (header, key) of each column; a key names a field of the row.
Columns = Sequence[tuple[str, str]]
GAP = "  "


def to_json(value: Any) -> str:
    """Indented JSON; datetimes (from the database side) as ISO 8601 text."""
    return json.dumps(value, indent=2, default=_plain)


def cell(value: Any) -> str:
    """One value as table text: `-` for nothing, JSON for structures."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value, default=_plain)
    return " ".join(str(value).split())  # one line per row, whatever the value holds


def table(rows: Sequence[Mapping[str, Any]], columns: Columns) -> str:
    """A header and one line per row, each column as wide as its widest cell; the last
    column is not padded, so no line ends in spaces."""
    grid = [[header for header, _ in columns]]
    grid += [[cell(row.get(key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    return "\n".join(
        GAP.join(
            text if i == len(columns) - 1 else text.ljust(widths[i]) for i, text in enumerate(line)
        ).rstrip()
        for line in grid
    )


def _plain(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
