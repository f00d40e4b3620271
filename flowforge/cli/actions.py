"""The operator actions on one execution: each declared action (flowforge/domain/operations.py)
through one handler, and replay."""

from __future__ import annotations

import argparse

from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.cli.parser import dest
from flowforge.domain.model import ExecutionStatus
from flowforge.domain.operations import BY_NAME, Answer


def act(ops: Ops, args: argparse.Namespace) -> None:
    """Any declared action: its params' values from the command line, in their order."""
    action = BY_NAME[args.operation]
    values = [getattr(args, dest(param)) for param in action.params]
    done = ops.act(action, args.id, values)
    if action.answer is Answer.CANCEL:
        said = _cancelled(args.id, done)
    else:
        said = action.said.format_map({**vars(args), "status": done["status"]})
    emit(args, done, said)


def _cancelled(execution_id: str, done: dict[str, object]) -> str:
    if done["already_finished"]:
        return f"execution {execution_id} was already {done['status']}"
    if done["status"] == ExecutionStatus.CANCELLED:
        return f"execution {execution_id} is now cancelled"
    # A request in flight is never taken back: the execution stops once it is recorded.
    return (
        f"execution {execution_id} cancel requested: a request in flight finishes and is "
        "recorded, nothing after it starts"
    )


def replay(ops: Ops, args: argparse.Namespace) -> None:
    made = ops.replay(args.id, args.from_step, args.onto)
    emit(
        args,
        made,
        f"execution {made['execution_id']} replays {args.id} from {args.from_step} on "
        f"version {made['version']}; it is {made['status']}",
    )
