"""The two halves `bin/test` runs at once for the whole suite.

Most of the suite's time is spent waiting on real processes (a worker's lease running out,
a proxy's outage, a browser's page load), so two pytest runs side by side take little more
than the longer of them. The halves are split by folder, with a few integration modules
moved to the first half so both take about as long; every test module is in exactly one
half (tests/unit/test_shards.py).

`python -m tests.shards N` prints the modules of half N (0 or 1), one per line.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).parent

# The first half: whole folders.
FIRST_FOLDERS = ("e2e", "faults", "unit")
# Integration modules that join the first half so that both halves take about as long
# (figures in docs/howto/develop.md).
FIRST_INTEGRATION: tuple[str, ...] = ("test_child_workflow.py", "test_openapi_contract.py")


def modules() -> list[Path]:
    """Every test module of the suite, in the order pytest would collect them."""
    return sorted(TESTS.glob("*/test_*.py"))


def half(index: int) -> list[Path]:
    """The modules of half `index`: 0 is the first half, 1 the second."""
    first = [
        path
        for path in modules()
        if path.parent.name in FIRST_FOLDERS
        or (path.parent.name == "integration" and path.name in FIRST_INTEGRATION)
    ]
    if index == 0:
        return first
    return [path for path in modules() if path not in first]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("0", "1"):
        print("usage: python -m tests.shards 0|1", file=sys.stderr)
        return 2
    for path in half(int(argv[0])):
        print(path.relative_to(TESTS.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
