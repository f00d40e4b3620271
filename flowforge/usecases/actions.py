"""Operator actions on an execution: cancel, retry, resolve, complete or fail a wait,
pause, resume or fail a paused one —
each one unit of work, recorded in the history with its actor (docs/contract.md#actors).

Each is declared once in flowforge/domain/operations.py, and the API, the console and the
CLI on the box run it through `perform`. Every public function takes `actor` (required,
keyword): the API passes the key that authenticated the request (`{"kind": "api_key",
"id": ..., "name": ...}`), the CLI on the box `{"kind": "cli", "name": "cli@<host>"}`, flow
control `model.FLOW_CONTROL_ACTOR`."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from flowforge.domain.definitions import may_decide, require_values
from flowforge.domain.engine import Run
from flowforge.domain.model import ExecutionStatus, PauseReason, StepStatus, StepType, StopReason
from flowforge.domain.operations import (
    Action,
    Answer,
    Done,
    fail_paused_refusal,
    pause_refusal,
    retry_refusal,
)
from flowforge.errors import Conflict, Forbidden, NotFound
from flowforge.store import flowcontrol, waits
from flowforge.store.runs import load_run, save_run, unit_of_work


def _locked(conn: psycopg.Connection, execution_id: str) -> Run:
    run = load_run(conn, execution_id)
    if run is None:
        raise NotFound(f"execution {execution_id} does not exist")
    return run


logger = logging.getLogger(__name__)

# How long a cancel tries to lock an execution another session holds (a unit of work
# takes milliseconds) before it records the cancel for the reaper to apply.
CANCEL_LOCK_TRIES = 5
CANCEL_LOCK_PAUSE_S = 0.2
EXECUTION_STATUS = "SELECT status FROM executions WHERE id = %(id)s"
RECORD_CANCEL = """
INSERT INTO pending_cancels (execution_id, actor) VALUES (%(id)s, %(actor)s)
ON CONFLICT (execution_id) DO NOTHING
"""
PENDING_CANCELS = "SELECT execution_id, actor FROM pending_cancels ORDER BY requested_at LIMIT 100"
DELETE_PENDING_CANCEL = "DELETE FROM pending_cancels WHERE execution_id = %(id)s"
# Cancels of executions deleted meanwhile (retention): the table has no foreign key.
DELETE_ORPHAN_CANCELS = """
DELETE FROM pending_cancels p
WHERE NOT EXISTS (SELECT FROM executions e WHERE e.id = p.execution_id)
"""


def cancel(
    conn: psycopg.Connection, execution_id: str, *, actor: dict[str, Any]
) -> tuple[str, bool]:
    """Cancel an execution; returns its status and whether it had already finished.

    An execution another session keeps locked (a worker frozen inside a unit of work)
    is not waited for — that ended in a 503 after the statement timeout: the cancel is
    recorded in pending_cancels and applied by the reaper once the lock is free."""
    status = ""
    for _ in range(CANCEL_LOCK_TRIES):
        with unit_of_work(conn):
            run = load_run(conn, execution_id, skip_locked=True)
            if run is not None:
                if run.terminal:
                    return run.status, True
                run.cancel(actor=actor)
                save_run(conn, run.take_changes())
                return run.status, False
        row = conn.execute(EXECUTION_STATUS, {"id": execution_id}).fetchone()
        if row is None:
            raise NotFound(f"execution {execution_id} does not exist")
        status = row[0]
        time.sleep(CANCEL_LOCK_PAUSE_S)
    conn.execute(RECORD_CANCEL, {"id": execution_id, "actor": Jsonb(actor)})
    return status, False


def apply_pending_cancels(conn: psycopg.Connection) -> int:
    """Apply the cancels recorded while their execution was locked; one still locked
    stays for the next pass. Returns how many were applied."""
    applied = 0
    pending = conn.execute(PENDING_CANCELS).fetchall()
    if pending:
        conn.execute(DELETE_ORPHAN_CANCELS)
    for execution_id, actor in pending:
        with unit_of_work(conn):
            run = load_run(conn, str(execution_id), skip_locked=True)
            if run is None:
                continue
            if not run.terminal and not run.cancel_requested:
                run.cancel(actor=actor)
                save_run(conn, run.take_changes())
            conn.execute(DELETE_PENDING_CANCEL, {"id": execution_id})
            applied += 1
    return applied


def stop(
    conn: psycopg.Connection,
    execution_id: str,
    reason: str,
    *,
    actor: dict[str, Any],
    skip_locked: bool = False,
) -> str | None:
    """Stop an execution for flow control, by the cancel rules, recording `reason`:
    `concurrency` (replaced by on_full cancel_oldest), `deadline` or `expired`. Returns the
    status, or None when it had already ended or been stopped (nothing is changed then) or,
    with `skip_locked`, when another session holds it locked (the caller retries later)."""
    with unit_of_work(conn):
        run = load_run(conn, execution_id, skip_locked=skip_locked)
        if run is None:
            return None
        if run.terminal or run.cancel_requested:
            return None
        if reason == "deadline":
            run.pass_deadline(actor=actor)
        elif reason == "expired":
            run.expire(actor=actor)
        else:
            run.stop(
                StopReason(reason),
                "execution cancelled: a newer one took its slot (cancel_oldest)",
                actor=actor,
            )
        save_run(conn, run.take_changes())
    return run.status


def stop_replaced(
    conn: psycopg.Connection, holders: tuple[str, ...], *, actor: dict[str, Any]
) -> None:
    """Stop the holders a cancel_oldest intake (or a cancel_other tick) replaced, after its
    commit. The new execution is accepted already: a holder that is locked (a worker frozen
    inside a unit of work) or a stop that fails (the database went away) never turns that
    into an error; the reconciler stops surplus holders (reconciler.SURPLUS_HOLDERS)."""
    for holder in holders:
        try:
            stop(conn, holder, "concurrency", actor=actor, skip_locked=True)
        except Exception:
            logger.warning(
                "replaced execution not stopped yet; the reconciler will",
                extra={"execution_id": holder},
                exc_info=True,
            )


def retry(conn: psycopg.Connection, execution_id: str, *, actor: dict[str, Any]) -> str:
    """Re-run the failed and cancelled steps of a finished execution.

    Steps whose outcome is unknown are not re-sent: the operator resolves them first.
    """
    with unit_of_work(conn):
        run = _locked(conn, execution_id)
        refusal = retry_refusal(run.status, ((sid, s.status) for sid, s in run.steps.items()))
        if refusal is not None:
            raise Conflict(refusal)
        if run.concurrency_key is not None and not run.held_slot:
            flowcontrol.take_slot_for_retry(
                conn, run.workflow_id, run.concurrency_key, run.execution_id
            )
        rerun = run.retry(actor=actor)
        conn.execute(waits.DROP_KEPT_RESUMES, {"execution_id": run.execution_id, "step_ids": rerun})
        save_run(conn, run.take_changes())
    return run.status


def resolve(
    conn: psycopg.Connection,
    execution_id: str,
    step_id: str,
    outcome: str,
    output: Any,
    *,
    actor: dict[str, Any],
) -> str:
    """Settle a step whose remote effect was unknown, as succeeded or failed."""
    with unit_of_work(conn):
        run = _locked(conn, execution_id)
        state = run.steps.get(step_id)
        if state is None:
            raise NotFound(f"execution {execution_id} has no step {step_id!r}")
        if state.status != StepStatus.UNKNOWN:
            raise Conflict(f"step {step_id!r} is {state.status}; only unknown steps are resolved")
        run.resolve(step_id, outcome, output, actor=actor)
        save_run(conn, run.take_changes())
    return run.status


def _open_wait(run: Run, execution_id: str, step_id: str) -> None:
    """Refuse anything but a wait step that is waiting and not yet timed out."""
    state = run.steps.get(step_id)
    if state is None:
        raise NotFound(f"execution {execution_id} has no step {step_id!r}")
    if run.definition.step(step_id).type != StepType.WAIT:
        raise Conflict(f"step {step_id!r} is not a wait step")
    if not run.wait_open(step_id):
        raise Conflict(
            f"step {step_id!r} is {state.status}; only a waiting wait step (before its "
            "timeout) can be completed or failed"
        )


def _assigned(run: Run, step_id: str, actor: dict[str, Any]) -> None:
    """Refuse a key that is not among an approval's assignees (docs/contract.md#approvals):
    complete and fail decide it as the approvals' own route does. The CLI on the box, which
    holds the database and makes the keys, is not a key and is not held to them."""
    form = run.definition.step(step_id).form
    if form is None or actor.get("kind") != "api_key":
        return
    if not may_decide(form, str(actor.get("name"))):
        raise Forbidden(f"this approval is assigned to {', '.join(form.assignees)}")


def complete_wait(
    conn: psycopg.Connection,
    execution_id: str,
    step_id: str,
    output: Any,
    *,
    actor: dict[str, Any],
) -> str:
    """An operator ends a wait as a resume would, with `output`; recorded with the actor."""
    with unit_of_work(conn):
        run = _locked(conn, execution_id)
        _open_wait(run, execution_id, step_id)
        _assigned(run, step_id, actor)
        form = run.definition.step(step_id).form
        if form is not None:
            # docs/contract.md#approvals: an operator's output is held to the form too.
            require_values(form, output, "$.output")
        run.resume(step_id, output, actor=actor)
        save_run(conn, run.take_changes())
    return run.status


def fail_wait(
    conn: psycopg.Connection, execution_id: str, step_id: str, *, actor: dict[str, Any]
) -> str:
    """An operator fails a waiting step (the answer is no); recorded with the actor."""
    with unit_of_work(conn):
        run = _locked(conn, execution_id)
        _open_wait(run, execution_id, step_id)
        _assigned(run, step_id, actor)
        run.fail_wait(step_id, actor)
        save_run(conn, run.take_changes())
    return run.status


def pause(conn: psycopg.Connection, execution_id: str, *, actor: dict[str, Any]) -> str:
    """Pause an execution (docs/contract.md#pause): nothing of it starts or continues until it is
    resumed; a request in flight finishes and is recorded. Pausing a paused one is a no-op."""
    with unit_of_work(conn):
        run = _locked(conn, execution_id)
        refusal = pause_refusal(run.status, cancel_requested=run.cancel_requested)
        if refusal is not None:
            raise Conflict(refusal)
        run.pause(PauseReason.OPERATOR, actor=actor)
        save_run(conn, run.take_changes())
    return run.status


def resume(conn: psycopg.Connection, execution_id: str, *, actor: dict[str, Any]) -> str:
    """Resume a paused execution: it goes on as it was (a step whose tries ran out runs
    again); one that was queued for a concurrency slot takes its place in the queue."""
    with unit_of_work(conn):
        run = _locked(conn, execution_id)
        if not run.paused:
            raise Conflict(f"execution is {run.status}; only a paused execution can be resumed")
        if run.workflow_paused_by is not None:
            raise Conflict(
                f"workflow {run.workflow!r} is paused; resume the workflow to resume its executions"
            )
        run.unpause(actor=actor)
        save_run(conn, run.take_changes())
        if run.status == ExecutionStatus.QUEUED and run.concurrency_key is not None:
            flowcontrol.fill_slots(conn, run.workflow_id, run.concurrency_key)
    return run.status


def fail_paused(conn: psycopg.Connection, execution_id: str, *, actor: dict[str, Any]) -> str:
    """An operator fails an execution paused at a step whose tries ran out
    (docs/contract.md#on-exhausted)."""
    with unit_of_work(conn):
        run = _locked(conn, execution_id)
        refusal = fail_paused_refusal(
            run.status, (s.status for s in run.steps.values()), paused=run.paused
        )
        if refusal is not None:
            raise Conflict(refusal)
        run.fail_paused(actor=actor)
        save_run(conn, run.take_changes())
    return run.status


def perform(
    conn: psycopg.Connection,
    action: Action,
    execution_id: str,
    values: Sequence[Any],
    *,
    actor: dict[str, Any],
) -> Done:
    """Run a declared action's unit of work (its `does`, a function of this module) with
    the values of its params in their declared order."""
    result = globals()[action.does](conn, execution_id, *values, actor=actor)
    if action.answer is Answer.CANCEL:
        status, already_finished = result
        return Done(execution_id, status, already_finished)
    return Done(execution_id, result)
