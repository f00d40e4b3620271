"""The operator actions on one execution: cancel, retry, resolve, complete, fail, pause,
resume, fail-paused and replay."""

from __future__ import annotations

import argparse

from flowforge.cli.ops import Ops
from flowforge.cli.output import emit
from flowforge.domain.model import ExecutionStatus


def cancel(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.cancel(args.id)
    if done["already_finished"]:
        said = f"execution {args.id} was already {done['status']}"
    elif done["status"] == ExecutionStatus.CANCELLED:
        said = f"execution {args.id} is now cancelled"
    else:
        # A request in flight is never taken back: the execution stops once it is recorded.
        said = (
            f"execution {args.id} cancel requested: a request in flight finishes and is "
            "recorded, nothing after it starts"
        )
    emit(args, done, said)


def retry(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.retry(args.id)
    emit(args, done, f"execution {args.id} is now {done['status']}")


def resolve(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.resolve(args.id, args.step, args.outcome, args.step_output)
    emit(
        args,
        done,
        f"step {args.step} resolved as {args.outcome}; execution is now {done['status']}",
    )


def complete(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.complete(args.id, args.step, args.step_output)
    emit(args, done, f"step {args.step} completed; execution is now {done['status']}")


def fail(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.fail(args.id, args.step)
    emit(args, done, f"step {args.step} failed; execution is now {done['status']}")


def pause(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.pause(args.id)
    emit(args, done, f"execution {args.id} is now {done['status']}")


def resume(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.resume(args.id)
    emit(args, done, f"execution {args.id} is now {done['status']}")


def fail_paused(ops: Ops, args: argparse.Namespace) -> None:
    done = ops.fail_paused(args.id)
    emit(args, done, f"execution {args.id} is now {done['status']}")


def replay(ops: Ops, args: argparse.Namespace) -> None:
    made = ops.replay(args.id, args.from_step, args.onto)
    emit(
        args,
        made,
        f"execution {made['execution_id']} replays {args.id} from {args.from_step} on "
        f"version {made['version']}; it is {made['status']}",
    )
