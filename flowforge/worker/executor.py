"""Running one wake-up: claim the step, do the work, checkpoint — with fencing.

Pure steps run inside the claiming transaction (no lease: the row lock is the lease).
An http_request is claimed in one committed transaction (new fencing token, open attempt
row holding the rendered request, redacted) before the request leaves, sent with no
transaction open, and checkpointed in a second transaction that writes nothing unless the
step still holds our token. The lease is held (and renewed by the heartbeat) only from the
claim's commit until the checkpoint, and the request leaves only while the lease is known
to be ours (see `leases.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import psycopg
import psycopg_pool

from flowforge import faults, metrics, netguard, outbound, tracing, waits
from flowforge.db import wrap_exceptions
from flowforge.definitions import LimitSpec
from flowforge.engine import PURE_TYPES, Run, StepState
from flowforge.http_step import Rendered, perform, render_request
from flowforge.model import AttemptOutcome, EventKind, Outcome, StepStatus
from flowforge.runs import load_run, save_run, unit_of_work
from flowforge.templating import TemplateError, render
from flowforge.worker.broker import Wakeup
from flowforge.worker.leases import Lease, Leases

logger = logging.getLogger(__name__)

# A wake-up that failed and was dead-lettered counts against its step (while it is still
# the ready step it was): the reconciler waits twice as long per failure before it sends
# the next one (see reconciler.py). Any change of the step resets the count.
COUNT_FAILED_WAKEUP = """
UPDATE steps SET failed_wakeups = failed_wakeups + 1
WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s AND status = 'ready'
"""
# A request the fence kept home, whose attempt the reaper had already closed as
# `unknown` meanwhile: it provably never left, so the attempt is corrected to failed.
CORRECT_NEVER_SENT = """
UPDATE attempts SET outcome = %(failed)s, error = %(error)s
WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
  AND fencing_token = %(token)s AND outcome = %(unknown)s
RETURNING 1
"""
# How perform() words an outcome whose request provably never left (netguard.NotSent).
NOT_SENT_PREFIX = "not sent:"


class Executor:
    """Turns a wake-up into progress, safely under duplicates, crashes and lost leases."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        *,
        worker_id: str,
        lease_s: float,
        allow: netguard.Allowlist,
        secret_bindings: Mapping[str, frozenset[str]],
        max_response_bytes: int = 262_144,
        resume: waits.ResumeUrls | None = None,
        host_limits: Mapping[str, LimitSpec] | None = None,
        wake_in: Callable[[float], None] | None = None,
    ) -> None:
        self.pool = pool
        self.worker_id = worker_id
        self.lease_s = lease_s
        self.allow = allow
        self.secret_bindings = secret_bindings
        self.max_response_bytes = max_response_bytes
        self.resume = resume
        self.host_limits = host_limits or {}
        # Tells the timer scanner when a step that waits for a limit is due (its wake-up).
        self.wake_in = wake_in
        self.leases = Leases(lease_s)

    def handle(self, wakeup: Wakeup) -> None:
        """Process one wake-up; stale and duplicate ones change nothing."""
        eid, sid = wakeup.execution_id, wakeup.step_id
        with wrap_exceptions(), self.pool.connection() as conn:
            # No later than the transaction's now(), which sets the lease's expiry.
            began = time.monotonic()
            with unit_of_work(conn):
                run = _take_up(conn, wakeup)
                if run is None:
                    return
                step = run.definition.step(sid)
                claimed, wait = None, None
                limits: list[tuple[str, LimitSpec]] = []
                if step.type in PURE_TYPES:
                    run.advance()
                elif run.when_allows(sid):
                    # Rendered before the claim commits, so that its attempt row holds
                    # what is about to be sent, with no round trip of its own.
                    prepared = self._render(run, sid)
                    limits, prepared = self._limits(run, sid, prepared)
                    hold_s = self.lease_s + getattr(prepared, "timeout_s", 0.0)
                    wait = outbound.admit(conn, eid, sid, limits, hold_s) if limits else None
                    if wait is None:
                        sent = prepared.record() if isinstance(prepared, Rendered) else None
                        claimed = run.claim(sid, self.worker_id, self.lease_s, request=sent)
                    elif wait.new:
                        # Still `ready`: not an attempt, not a failure (SPEC §13).
                        detail = {"key": wait.key, "reason": wait.reason.value}
                        run.events.append(
                            (
                                sid,
                                EventKind.STEP_LIMITED,
                                {**detail, "until": wait.until.isoformat()},
                            )
                        )
                save_run(conn, run.take_changes())
                if claimed is not None:
                    faults.hit("before_claim_commit")
        if wait is not None and self.wake_in is not None:
            self.wake_in(wait.in_s)
        if claimed is not None:
            # The claim committed: only from here on does this worker hold the lease.
            token = claimed.fencing_token
            with self.leases.holding(eid, sid, token, confirmed_at=began) as lease:
                faults.hit("after_claim_commit")
                outcome = self._attempt(run, sid, lease, prepared)
                faults.hit("after_http_response")
                self._checkpoint(eid, sid, lease, outcome, limits)
        faults.hit("before_ack")

    def run_pure(self, conn: psycopg.Connection, wakeup: Wakeup) -> None:
        """Handle the wake-up of a pure step in the caller's open pipelined transaction
        (db.pipelined_transaction): its reads travel in one round trip, its writes with
        the caller's COMMIT.

        The relay calls this for a lone wake-up whose outbox row it deleted in that same
        transaction: the delete and the step's progress commit together or not at all, so
        a crash before the commit leaves the row for the next relay (SPEC §7), and no
        message, delivery or ack is needed. The step must be pure (the relay checks);
        an http_request needs its claim committed before the request leaves.
        """
        # The relay's claim skipped the WAL flush; load_run's lock turns it back on.
        run = _take_up(conn, wakeup)
        if run is None:
            return
        step = run.definition.step(wakeup.step_id)
        if step.type not in PURE_TYPES:
            raise ValueError(f"a {step.type} step cannot run inside the relay")
        run.advance()
        save_run(conn, run.take_changes())

    def wakeup_failed(self, wakeup: Wakeup) -> None:
        """Count a dead-lettered wake-up against its step, so the reconciler backs off."""
        with wrap_exceptions(), self.pool.connection() as conn:
            conn.execute(
                COUNT_FAILED_WAKEUP,
                {"execution_id": wakeup.execution_id, "step_id": wakeup.step_id},
            )

    def _render(self, run: Run, sid: str) -> Rendered | Outcome:
        """The request to send, or the failed outcome of a request that cannot be rendered;
        never raises, so the step is always checkpointed."""
        step = run.definition.step(sid)
        try:
            rounds = {wid: state.fencing_token for wid, state in run.steps.items()}
            rendered = render_request(
                step, run.context(sid), self.secret_bindings, self.resume, rounds
            )
        except TemplateError as exc:
            return Outcome("failed", error=f"request could not be rendered: {exc}")
        except Exception as exc:
            # Its message may quote a secret, and there is no redactor yet: the name only.
            name = type(exc).__name__
            log = {"execution_id": run.execution_id, "step": sid, "error": name}
            logger.error("internal error rendering the request", extra=log)
            return Outcome("failed", error=f"not sent: internal error: {name}")
        # budget_s: the attempt may take no longer than what is left of the step's budget.
        return dataclasses.replace(rendered, timeout_s=run.attempt_timeout(sid, rendered.timeout_s))

    def _limits(
        self, run: Run, sid: str, prepared: Rendered | Outcome
    ) -> tuple[list[tuple[str, LimitSpec]], Rendered | Outcome]:
        """The outbound limits the request goes through (SPEC §13): the step's own, its
        key rendered when it is a template, and the operator's limit of its URL's host.
        A key that cannot be rendered fails the request, unsent."""
        if not isinstance(prepared, Rendered):
            return [], prepared
        found: list[tuple[str, LimitSpec]] = []
        name = run.definition.step(sid).limit
        if name is not None:
            key: object = name
            if "{{" in name:
                try:
                    key = render(name, run.context(sid))
                except TemplateError as exc:
                    return [], Outcome("failed", error=f"limit key could not be rendered: {exc}")
                if key is None or key == "" or isinstance(key, dict | list):
                    error = f"limit key {name!r} rendered to {key!r}, not a text or number"
                    return [], Outcome("failed", error=error)
            found.append((str(key), run.definition.limits[name]))
        host = (urlsplit(prepared.url).hostname or "").lower().removesuffix(".")
        if host in self.host_limits:
            found.append((f"host:{host}", self.host_limits[host]))
        return found, prepared

    def _attempt(self, run: Run, sid: str, lease: Lease, prepared: Rendered | Outcome) -> Outcome:
        """Send the rendered request; never raises, so the step is always checkpointed."""
        if isinstance(prepared, Outcome):
            return prepared
        rendered = prepared
        step = run.definition.step(sid)
        log = {"execution_id": run.execution_id, "step": sid, "fencing_token": lease.token}
        passed_fence = False  # from then on the request may have left

        def fence() -> None:
            """Connected, nothing written yet: the last moment to keep the request home."""
            nonlocal passed_fence
            faults.hit("before_request_send")
            if not lease.still_ours():
                logger.warning(
                    "request not sent: this worker no longer knows its lease to be its own",
                    extra={
                        **log,
                        "lease_lost": lease.lost,
                        "since_confirmed_s": round(time.monotonic() - lease.confirmed_at, 3),
                    },
                )
                metrics.REQUEST_FENCED.inc()
                raise netguard.NotSent("lease not confirmed in time; request kept back")
            passed_fence = True

        logger.info("sending request", extra={**log, "method": rendered.method})
        span = tracing.attempt(run, sid, lease.token, rendered.method, self.worker_id)
        if (traceparent := span.traceparent()) is not None:
            # After the attempt row recorded the request: the header is the attempt's span,
            # not part of the step's definition (nor a secret to redact).
            rendered = dataclasses.replace(
                rendered, headers=_with_traceparent(rendered.headers, traceparent)
            )
        try:
            outcome = perform(
                step, rendered, self.allow, self.max_response_bytes, before_send=fence
            )
        except Exception as exc:
            # A bug must not leave the step running with nobody checkpointing it: that
            # dead-letters the wake-up, and the reaper would later call an unsafe request
            # that never left `unknown`. Only once past the fence may it have left.
            name = type(exc).__name__
            logger.error(
                "internal error during the request",
                extra={
                    **log,
                    "passed_fence": passed_fence,
                    "error": rendered.redact(_traceback(exc)),
                },
            )
            if not passed_fence:
                outcome = Outcome("failed", error=f"not sent: internal error: {name}")
            else:
                kind = "retry" if step.repeat_safe else "unknown"
                outcome = Outcome(kind, error=f"may have been sent: internal error: {name}")
        span.end(outcome)
        return outcome

    def _checkpoint(
        self,
        eid: str,
        sid: str,
        lease: Lease,
        outcome: Outcome,
        limits: list[tuple[str, LimitSpec]],
    ) -> None:
        """Record the attempt; a worker that lost its lease writes nothing at all. The
        request's limit slots end here; a 429/503 with Retry-After holds its keys."""
        token = lease.token
        log = {"execution_id": eid, "step": sid, "fencing_token": token}
        with wrap_exceptions(), self.pool.connection() as conn, unit_of_work(conn):
            run = load_run(conn, eid)
            faults.hit("inside_checkpoint")  # the execution row is locked here
            state = run.steps.get(sid) if run else None
            if (
                run is not None
                and state is not None
                and self._never_sent_but_unknown(conn, eid, sid, token, state, outcome)
            ):
                run.correct_never_sent(sid, outcome.error or NOT_SENT_PREFIX)
                if limits:  # nothing was sent: its limit slot ends now, not at its expiry
                    outbound.release(conn, eid, sid)
                save_run(conn, run.take_changes())
                logger.warning("request never sent: the reaper's unknown corrected", extra=log)
                return
            if (
                run is None
                or state is None
                or state.status != StepStatus.RUNNING
                or state.fencing_token != token
            ):
                logger.warning(
                    "lost ownership of the step: result discarded, nothing written",
                    extra={
                        **log,
                        "current_token": state.fencing_token if state else None,
                        "current_status": state.status if state else None,
                        "outcome": outcome.kind,
                    },
                )
                metrics.CHECKPOINT_FENCED.inc()
                return
            # A deadline that passed while the request was out: record it, start nothing.
            run.enforce_time_limits()
            run.record_outcome(sid, token, outcome)
            # Before the step row changes: a beat that then finds the step no longer
            # running must know it finished here rather than was taken over.
            lease.finished = True
            if limits:
                outbound.release(conn, eid, sid)
                self._hold(conn, run, sid, [key for key, _ in limits], outcome)
                circuits = [(key, spec.circuit) for key, spec in limits if spec.circuit]
                failed = outbound.failed_for_circuit(
                    outcome.http_status, outcome.kind, outcome.error
                )
                outbound.record_result(conn, circuits, failed)
            save_run(conn, run.take_changes())
        logger.info(
            "step attempt recorded",
            extra={**log, "outcome": outcome.kind, "http_status": outcome.http_status},
        )

    def _hold(
        self, conn: psycopg.Connection, run: Run, sid: str, keys: list[str], outcome: Outcome
    ) -> None:
        """A 429 or 503 with Retry-After holds each of the request's keys for everyone."""
        seconds = outcome.retry_after_s
        if outcome.http_status not in (429, 503) or not seconds:
            return
        reason = f"HTTP {outcome.http_status} with Retry-After {seconds:g} s"
        for key in keys:
            until = outbound.hold(conn, key, seconds, reason)
            detail = {"key": key, "until": until.isoformat(), "reason": reason}
            run.events.append((sid, EventKind.LIMIT_HELD, detail))

    @staticmethod
    def _never_sent_but_unknown(
        conn: psycopg.Connection,
        eid: str,
        sid: str,
        token: int,
        state: StepState,
        outcome: Outcome,
    ) -> bool:
        """Whether the reaper recorded `unknown` for this very attempt (same token, no
        operator decision since) although its request never left; corrects the attempt."""
        if not (outcome.error or "").startswith(NOT_SENT_PREFIX):
            return False
        if state.status != StepStatus.UNKNOWN or state.fencing_token != token:
            return False
        params = {
            "execution_id": eid,
            "step_id": sid,
            "token": token,
            "error": outcome.error,
            "failed": AttemptOutcome.FAILED,
            "unknown": AttemptOutcome.UNKNOWN,
        }
        return conn.execute(CORRECT_NEVER_SENT, params).fetchone() is not None


def _take_up(conn: psycopg.Connection, wakeup: Wakeup) -> Run | None:
    """Lock and load the wake-up's execution; None (after saving what time limits changed)
    when the wake-up is stale or a duplicate, else the run with its step started."""
    eid, sid = wakeup.execution_id, wakeup.step_id
    log = {"execution_id": eid, "step": sid}
    run = load_run(conn, eid)
    if run is None:
        logger.warning("wake-up for an unknown execution", extra=log)
        return None
    # Nothing new starts past a deadline or queue expiry, even in the moment before the
    # timer scanner applies it.
    run.enforce_time_limits()
    state = run.steps.get(sid)
    if run.terminal or state is None or state.status != StepStatus.READY:
        save_run(conn, run.take_changes())
        logger.debug("stale wake-up ignored", extra=log)
        return None
    if run.hold():
        # Paused (SPEC §14): the step stays ready; resume dispatches it again.
        save_run(conn, run.take_changes())
        logger.debug("wake-up of a paused execution set aside", extra=log)
        return None
    run.started()
    metrics.step_started(run, sid)
    return run


def _with_traceparent(headers: dict[str, str], traceparent: str) -> dict[str, str]:
    """The request's headers with the attempt's trace context in place of any the step's
    definition set (a template cannot know the attempt's span)."""
    kept = {k: v for k, v in headers.items() if k.lower() not in ("traceparent", "tracestate")}
    return {**kept, "traceparent": traceparent}


def _traceback(exc: BaseException) -> str:
    """The exception with its stack, for a log line that must still go through redaction."""
    return "".join(traceback.format_exception(exc))
