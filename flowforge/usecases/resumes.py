"""A resume of a wait step (POST /hooks/resume/<token>): one unit of work, like a webhook.

The resume row, the step's success, whatever becomes ready after it and the outbox rows
of its wake-ups commit in one transaction, under the execution row lock that every
writer takes first — so twenty racing resumes of one step are served one after the
other: the first wins (202), the same body again is a replay (200), another body is a
conflict (409). The API never talks to RabbitMQ; the relay publishes after the commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from flowforge.domain.definitions import require_values
from flowforge.domain.model import StepStatus, StepType
from flowforge.errors import ClientError, Conflict, NotFound
from flowforge.store import waits
from flowforge.store.runs import load_run, save_run, unit_of_work
from flowforge.trust import resume_tokens, sealing

logger = logging.getLogger(__name__)


class Gone(ClientError):
    """The wait is over: its step timed out, was cancelled or completed otherwise, or its
    execution finished; a resume can no longer change it."""

    status = 410
    title = "Gone"


@dataclass(frozen=True)
class Resumed:
    """The answer to a resume: which step, and whether this body had been taken already."""

    execution_id: str
    step_id: str
    replayed: bool
    kept: bool  # arrived before the step was ready: recorded, applied when it starts


def resume(
    conn: psycopg.Connection,
    resume_key: bytes,
    token: str,
    raw: bytes,
    body: object,
    *,
    check_signature: Callable[[list[str]], None],
    encryption_key: bytes | None,
) -> Resumed:
    """Apply (or keep for later) a resume of the wait step its token names.

    `check_signature(secrets)` raises signatures.SignatureInvalid unless the request is
    signed by one of the workflow's active secrets; it is called only for wait steps with
    "auth": "signature"."""
    named = resume_tokens.verify(resume_key, token)
    if named is None:
        raise NotFound("no such resume URL")
    execution_id, step_id, round_ = named
    log = {"execution_id": execution_id, "step": step_id}
    sha = resume_tokens.body_sha256(raw)
    with unit_of_work(conn):
        run = load_run(conn, execution_id)
        if run is None:
            # A genuine token whose execution was deleted by retention.
            raise Gone("this wait's execution no longer exists")
        state = run.steps.get(step_id)
        if state is None or run.definition.step(step_id).type != StepType.WAIT:
            raise Gone("this execution's version has no such wait step")
        if round_ != state.fencing_token:
            # A URL of an earlier round of a retried wait: that wait is over.
            raise Gone(f"step {step_id!r} was retried: this resume URL is from an earlier wait")
        if run.definition.step(step_id).resume_auth == "signature":
            rows = conn.execute(waits.SIGNING_SECRETS, {"execution_id": execution_id}).fetchall()
            check_signature(
                [sealing.unseal(encryption_key, sealed, wf, sid) for sid, wf, sealed in rows]
            )
        form = run.definition.step(step_id).form
        if form is not None:
            # docs/contract.md#approvals: a machine's resume of an approval is held to its
            # form as a person's submission is; refused whole, before anything is written.
            require_values(form, body, "$")
        existing = conn.execute(
            waits.FIND_RESUME, {"execution_id": execution_id, "step_id": step_id}
        ).fetchone()
        if existing is not None:
            existing_sha, applied = bytes(existing[0]), existing[1]
            if not applied and not run.wait_not_started(step_id):
                raise Gone(f"step {step_id!r} is {state.status}: the wait ended without it")
            if existing_sha != sha:
                raise Conflict("this wait was already resumed with a different body")
            return Resumed(execution_id, step_id, replayed=True, kept=not applied)
        params = {
            "execution_id": execution_id,
            "step_id": step_id,
            "body_sha256": sha,
            "body": raw.decode(),
        }
        if run.wait_open(step_id):
            conn.execute(waits.INSERT_RESUME, {**params, "applied": True})
            run.resume(step_id, body)
            save_run(conn, run.take_changes())
            logger.info("wait resumed", extra=log)
            return Resumed(execution_id, step_id, replayed=False, kept=False)
        if run.wait_not_started(step_id):
            conn.execute(waits.INSERT_RESUME, {**params, "applied": False})
            logger.info("resume kept until the wait begins", extra=log)
            return Resumed(execution_id, step_id, replayed=False, kept=True)
        if (
            not run.terminal
            and state.status in {StepStatus.WAITING, StepStatus.READY}
            and state.wake_at is not None
            and state.wake_at <= run.now
        ):
            # Its timeout is due and the timer scanner has not got to it: apply it here, so
            # the history says why this resume was refused.
            run.time_out(step_id)
            save_run(conn, run.take_changes())
    raise Gone(f"step {step_id!r} is {run.steps[step_id].status}: the wait is over")
