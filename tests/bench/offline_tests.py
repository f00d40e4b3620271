"""How long `flowforge test` takes on the four examples in docs/examples/ (issue 45's target:
under 2 s in total), as a CI job runs it: the installed `flowforge` script as a new process,
every example and its fixtures in one command.

    .venv/bin/python -m tests.bench.offline_tests [--runs 5]

Printed: the wall time of the whole command (p50 and max of `--runs`, after one untimed
warm-up run that fills the page cache), the CPU time it used, and the cases it ran with
the time the runs themselves took. A figure, not a test: nothing
is asserted.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOWFORGE = str(Path(sys.executable).parent / "flowforge")
TARGET_S = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    examples = sorted(str(p) for p in (ROOT / "docs" / "examples").glob("*.json"))
    times, cpu, summary = [], [], ""
    for n in range(args.runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run([FLOWFORGE, "test", *examples], capture_output=True, timeout=60)
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(
                f"flowforge test failed:\n{done.stdout.decode()}{done.stderr.decode()}"
            )
        summary = done.stdout.decode().strip().splitlines()[-1]
        if n:
            times.append(elapsed)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print(f"flowforge test on {len(examples)} examples ({summary})")
    print(
        f"  wall p50 {statistics.median(times):.3f} s, max {max(times):.3f} s "
        f"(target < {TARGET_S:g} s in total)"
    )
    # CPU time is what other work on a shared machine inflates least.
    print(f"  cpu p50 {statistics.median(cpu):.3f} s (imports included; the runs themselves above)")


if __name__ == "__main__":
    main()
