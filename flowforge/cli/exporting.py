"""`flowforge executions export ID`: an execution as a `flowforge test` fixture
(flowforge/steps/recording.py), to replay offline with `flowforge test --from FILE`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flowforge.cli.ops import Ops
from flowforge.steps import recording
from flowforge.trust import secret_bindings


def export(ops: Ops, args: argparse.Namespace) -> None:
    """Write the fixture to --file, or print it. Every secret value this process holds
    (FLOWFORGE_SECRET_<NAME>, as a worker on the box does) is cut out as well, in every spelling."""
    execution = ops.execution(args.id)
    definition = ops.version(execution["workflow"], execution["version"])["definition"]
    known = [
        value
        for name, value in os.environ.items()
        if name.startswith("FLOWFORGE_SECRET_") and not name.endswith(secret_bindings.SUFFIX)
    ]
    text = recording.scrubbed(recording.as_fixture(execution, definition), known)
    if args.file:
        Path(args.file).write_text(text, encoding="utf-8")
        print(f"wrote {args.file}: flowforge test DEFINITION --from {args.file}", file=sys.stderr)
    else:
        sys.stdout.write(text)
