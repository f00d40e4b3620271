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
import functools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping

import psycopg
import psycopg_pool

from flowforge import faults
from flowforge.domain import operator_limits
from flowforge.domain.definitions import LimitSpec
from flowforge.domain.engine import PURE_TYPES, Run, StepState, since_resume
from flowforge.domain.model import (
    AttemptOutcome,
    EventKind,
    Outcome,
    OutcomeKind,
    StepStatus,
    StepType,
)
from flowforge.domain.templating import TemplateError
from flowforge.errors import DatabaseError, DatabaseUnavailable
from flowforge.observe import metrics, tracing
from flowforge.steps import netguard
from flowforge.steps.http_step import Rendered, perform, render_request
from flowforge.store import outbound
from flowforge.store.db import COMMIT_WITHOUT_FLUSH, FLUSH_BARRIER, wrap_exceptions
from flowforge.store.priorities import (
    BETTER_READY,
    BETTER_TRIES,
    DEFAULT_AGEING_S,
    READY_PRIORITY_SPREAD,
    REDISPATCH,
    SPREAD_EVERY_S,
)
from flowforge.store.runs import load_run, on_commit, save_run, unit_of_work
from flowforge.trust import resume_tokens
from flowforge.worker.broker import Wakeup
from flowforge.worker.leases import Lease, Leases
from flowforge.worker.limit_keys import request_limits

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
# This worker's own attempt only: a claim whose commit was lost (a failover to a standby
# that lacked it) hands its token out again, to another worker.
CORRECT_NEVER_SENT = """
UPDATE attempts SET outcome = %(failed)s, error = %(error)s
WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
  AND fencing_token = %(token)s AND worker = %(worker)s AND outcome = %(unknown)s
RETURNING 1
"""
# The reaper's `unknown` on this worker's attempt, taken back by the worker that holds
# the attempt's answer (Run.reopen_unknown): the attempt is open again for the checkpoint
# to close with that answer. Only the attempt the reaper closed as unknown, and only while
# its step is still unknown with the same token (checked under the execution's lock).
REOPEN_UNKNOWN = """
UPDATE attempts SET outcome = NULL, error = NULL, finished_at = NULL
WHERE execution_id = %(execution_id)s AND step_id = %(step_id)s
  AND fencing_token = %(token)s AND worker = %(worker)s AND outcome = %(unknown)s
RETURNING 1
"""
# How perform() words an outcome whose request provably never left (netguard.NotSent).
NOT_SENT_PREFIX = "not sent:"
# A checkpoint that fails for want of the database is tried again: the outcome is known
# only in this thread, and handing the delivery back loses it — a request that provably
# never left, or one whose answer came back, is then the reaper's `unknown`. Tried until
# it is saved or fenced, for at most CHECKPOINT_PATIENCE_S, and not once the worker stops
# taking work (its drain must end: the step is then the reaper's, as after a crash).
CHECKPOINT_PATIENCE_S = 120.0
CHECKPOINT_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
# The claim transaction of a step with outbound limits locks each key's row (outbound.py),
# and a row lock lasts until COMMIT returns: with the commit's wait for the disk included,
# one key admitted one request per WAL flush (23/s on a busy disk for a limit of 50/s).
# So that transaction commits without waiting for the disk, releasing its locks at once,
# and FLUSH_BARRIER follows it on the same connection before the request leaves or the
# wake-up is acked: a transaction with a WAL record of its own, committed with the
# configured synchronous_commit, which PostgreSQL makes durable (and, with a synchronous
# standby, replicated) only together with all WAL written before it — the claim included.
# Nothing depends on the claim before it is as durable as the server is configured to
# make it; only the key's lock no longer waits for that.
# FLOWFORGE_SYNC_UNSAFE_CLAIMS (docs/howto/several-hosts.md): the claim of a step unsafe to
# repeat commits with this synchronous_commit level, for that transaction only, so that no
# unsafe request leaves on a claim a synchronous standby lacks (after a failover the new
# primary would send it again). Every other commit keeps the server's setting. The COMMIT
# runs without a statement timeout: a timeout cancels the wait for the standby, and a
# cancelled wait leaves the transaction committed locally with no more than a warning —
# the request would leave. The client's reply deadline ends the wait instead, and a claim
# whose commit was not confirmed sends nothing.
SYNC_UNSAFE_CLAIM = """
SELECT set_config('synchronous_commit', %(level)s, true),
       set_config('statement_timeout', '0', true)
"""
# The outcome of a claimed request whose claim could not be confirmed durable.
NOT_FLUSHED = "not sent: lease not confirmed: the claim was not confirmed durable"
# The outcome of a claimed request whose claim's COMMIT got no answer (_ClaimUnconfirmed).
NOT_CONFIRMED = "not sent: lease not confirmed: the claim's commit got no answer"


@dataclasses.dataclass(frozen=True)
class _Taken:
    """What the unit of work that took a step up leaves for the rest of the wake-up: the
    run, the claimed step (an http_request about to be sent), the outbound wait it got
    instead, the limits it goes through and the request (or the outcome of one that
    could not be rendered)."""

    run: Run
    claimed: StepState | None
    wait: outbound.Wait | None
    limits: list[tuple[outbound.LimitKey, LimitSpec]]
    prepared: Rendered | Outcome


class _ClaimUnconfirmed(Exception):
    """The claim's COMMIT was sent and its answer lost (a PostgreSQL stop, a cut link): the
    claim may have landed, and its request has not left."""

    def __init__(self, taken: _Taken) -> None:
        super().__init__("the claim's commit was not confirmed")
        self.taken = taken


class _NotTaken(Exception):
    """A better step could not be taken up (a bug of its own, before anything committed):
    the wake-up goes on with the step it names, so one bad step never stops the others."""


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
        resume: resume_tokens.ResumeUrls | None = None,
        host_limits: Mapping[str, LimitSpec] | None = None,
        shared_limits: Mapping[str, operator_limits.SharedLimit] | None = None,
        wake_in: Callable[[float], None] | None = None,
        ageing_s: float = DEFAULT_AGEING_S,
        wake_at_place: Callable[[Wakeup, float], None] | None = None,
        stopping: threading.Event | None = None,
        sync_unsafe_claims: str = "",
    ) -> None:
        self.pool = pool
        self.sync_unsafe_claims = sync_unsafe_claims
        # Set when the worker stops taking work: a checkpoint is no longer tried again.
        self.stopping = stopping or threading.Event()
        self.worker_id = worker_id
        self.lease_s = lease_s
        # Seconds of waiting worth one priority point; 0: priorities off
        # (docs/contract.md#priority).
        self.ageing_s = ageing_s
        self._spread_lock = threading.Lock()
        self._spread_at = -SPREAD_EVERY_S
        self._spread = True
        self.allow = allow
        self.secret_bindings = secret_bindings
        self.max_response_bytes = max_response_bytes
        self.resume = resume
        self.host_limits = host_limits or {}
        self.shared_limits = shared_limits or {}
        # Tells the timer scanner when a step that waits for a limit is due (its wake-up).
        self.wake_in = wake_in
        # Wakes a step with a reserved place of a rate limit at that place, in-process
        # (places.py): the scanner is only its fallback.
        self.wake_at_place = wake_at_place
        self.leases = Leases(lease_s)

    def handle(self, wakeup: Wakeup) -> None:
        """Process one wake-up; stale and duplicate ones change nothing.

        With priorities on, the wake-up first goes to a better ready step when there is
        one (BETTER_READY), and the step it names is dispatched again in that claim's
        transaction; otherwise, or when none of them can be taken now, to its own step."""
        if self.ageing_s > 0 and self._priorities_differ():
            for better in self._better(wakeup):
                try:
                    if self._handle(better, displaced=wakeup):
                        return
                except _NotTaken as exc:
                    log = {"execution_id": better.execution_id, "step": better.step_id}
                    logger.error("better step not taken", extra=log, exc_info=exc.__cause__)
                    self.wakeup_failed(better)
        self._handle(wakeup)

    def _priorities_differ(self) -> bool:
        """Whether ready steps of more than one priority exist, as last seen by a unit
        of work (_ask_spread)."""
        return self._spread

    def _ask_spread(self, conn: psycopg.Connection) -> psycopg.Cursor | None:
        """READY_PRIORITY_SPREAD queued in the unit of work's first round trip, when the
        last look is SPREAD_EVERY_S old (one thread asks; the others use what it saw);
        _saw_spread reads its answer."""
        if self.ageing_s <= 0:
            return None
        now = time.monotonic()
        with self._spread_lock:
            if now - self._spread_at < SPREAD_EVERY_S:
                return None
            self._spread_at = now
        return conn.cursor().execute(READY_PRIORITY_SPREAD)

    def _saw_spread(self, asked: psycopg.Cursor | None) -> None:
        if asked is not None:
            row = asked.fetchone()
            self._spread = bool(row and row[0])

    def _better(self, wakeup: Wakeup) -> list[Wakeup]:
        """Ready steps that rank before the one the wake-up names, best first (none when
        that step is not ready: a stale wake-up stays a no-op)."""
        params = {
            "execution_id": wakeup.execution_id,
            "step_id": wakeup.step_id,
            "ageing_s": self.ageing_s,
            "tries": BETTER_TRIES,
        }
        with wrap_exceptions(), self.pool.connection() as conn:
            rows = conn.execute(BETTER_READY, params).fetchall()
        return [Wakeup(str(eid), sid) for eid, sid in rows]

    def _handle(self, wakeup: Wakeup, displaced: Wakeup | None = None) -> bool:
        """Take up one step and run it; whether it was taken up (False: stale, or, for a
        better step taken instead of `displaced`, locked by another session)."""
        eid, sid = wakeup.execution_id, wakeup.step_id
        with wrap_exceptions(), self.pool.connection() as conn:
            # No later than the transaction's now(), which sets the lease's expiry.
            began = time.monotonic()
            try:
                with wrap_exceptions():
                    taken = self._take(conn, wakeup, displaced)
            except _ClaimUnconfirmed as lost:
                # If the claim landed, the reaper would find its lease run out and record
                # "may have been sent": the checkpoint below says "not sent" instead, once
                # the database answers again (docs/contract.md#frozen-processes, no false unknown);
                # if it did not land, the checkpoint finds the step moved on and writes nothing.
                taken, unconfirmed = lost.taken, True
            except DatabaseUnavailable:
                raise  # an outage (or a cancelled statement): the wake-up is tried again
            except Exception as exc:
                if displaced is None:
                    raise
                raise _NotTaken(str(exc)) from exc
            else:
                unconfirmed = False
            if taken is None:
                return False
            run, claimed, wait = taken.run, taken.claimed, taken.wait
            limits, prepared = taken.limits, taken.prepared
            durable = not unconfirmed and (not limits or _flushed(conn))
        if wait is not None:
            if wait.reserved and self.wake_at_place is not None:
                self.wake_at_place(wakeup, wait.in_s)
            elif self.wake_in is not None:
                self.wake_in(wait.in_s)
        if claimed is not None:
            # The claim committed: only from here on does this worker hold the lease.
            token = claimed.fencing_token
            with self.leases.holding(eid, sid, token, confirmed_at=began) as lease:
                faults.hit("after_claim_commit")
                if durable:
                    outcome = self._attempt(run, sid, lease, prepared)
                else:
                    error = NOT_CONFIRMED if unconfirmed else NOT_FLUSHED
                    outcome = Outcome(OutcomeKind.RETRY, error=error)
                faults.hit("after_http_response")
                self._checkpoint_patiently(eid, sid, lease, outcome, limits, again=unconfirmed)
        faults.hit("before_ack")
        return True

    def _take(
        self, conn: psycopg.Connection, wakeup: Wakeup, displaced: Wakeup | None
    ) -> _Taken | None:
        """The unit of work that takes a step up: a pure step runs in it; an
        http_request is claimed (or set to wait for its outbound limits). None when the
        step was not taken up. A better step taken instead of `displaced` is taken only
        if its execution is not locked, and `displaced` is dispatched again in the same
        transaction."""
        eid, sid = wakeup.execution_id, wakeup.step_id
        prepared: Rendered | Outcome = Outcome(OutcomeKind.FAILED, error="not prepared")
        claimed: StepState | None = None
        # Whether the relays must hear of this commit: unknown (yes) but for a pure step
        # whose save wrote no wake-up, with no displaced step dispatched again.
        woke = [True]
        try:
            with wrap_exceptions(), unit_of_work(conn, woke=lambda: woke[0]):
                spread = self._ask_spread(conn)
                run = _take_up(conn, wakeup, skip_locked=displaced is not None)
                self._saw_spread(spread)
                if run is None:
                    return None
                step = run.definition.step(sid)
                wait = None
                limits: list[tuple[outbound.LimitKey, LimitSpec]] = []
                pure = step.type in PURE_TYPES
                if pure:
                    run.advance()
                elif run.when_allows(sid):
                    # Rendered before the claim commits, so that its attempt row holds
                    # what is about to be sent, with no round trip of its own.
                    prepared = self._render(run, sid)
                    limits, prepared = request_limits(
                        run, sid, prepared, self.host_limits, self.shared_limits
                    )
                    hold_s = self.lease_s + getattr(prepared, "timeout_s", 0.0)
                    wait = None
                    if limits:
                        conn.execute(COMMIT_WITHOUT_FLUSH)
                        wait = outbound.admit(conn, eid, sid, limits, hold_s)
                    if wait is None:
                        sent = prepared.record() if isinstance(prepared, Rendered) else None
                        claimed = run.claim(sid, self.worker_id, self.lease_s, request=sent)
                    elif wait.new:
                        # Still `ready`: not an attempt, not a failure
                        # (docs/contract.md#outbound-limits).
                        detail = {"key": wait.key.label, "reason": wait.reason.value}
                        run.events.append(
                            (
                                sid,
                                EventKind.STEP_LIMITED,
                                {**detail, "until": wait.until.isoformat()},
                            )
                        )
                woke[0] = save_run(conn, run.take_changes()) or not pure
                if displaced is not None:
                    woke[0] = True
                    conn.execute(
                        REDISPATCH,
                        {"execution_id": displaced.execution_id, "step_id": displaced.step_id},
                    )
                    on_commit(metrics.TAKEN_FIRST.inc)
                    logger.debug(
                        "a better ready step taken first",
                        extra={"execution_id": eid, "step": sid, "instead_of": displaced.step_id},
                    )
                if claimed is not None:
                    if self.sync_unsafe_claims and not step.repeat_safe:
                        # Last in the transaction, so nothing sets it back before COMMIT.
                        conn.execute(SYNC_UNSAFE_CLAIM, {"level": self.sync_unsafe_claims})
                    faults.hit("before_claim_commit")
        except DatabaseUnavailable as exc:
            if claimed is None or run is None or not conn.closed:
                raise  # no claim, or the server answered (a timeout, a rollback)
            # The connection was lost with the claim's COMMIT sent, or about to be (it
            # travels with the writes, db.SyncedPipeline): the claim may have landed.
            raise _ClaimUnconfirmed(_Taken(run, claimed, None, limits, prepared)) from exc
        return _Taken(run, claimed, wait, limits, prepared)

    def run_pure(self, conn: psycopg.Connection, wakeup: Wakeup) -> bool:
        """Handle the wake-up of a pure step in the caller's open pipelined transaction
        (db.pipelined_transaction): its reads travel in one round trip, its writes with
        the caller's COMMIT.

        The relay calls this for a lone wake-up whose outbox row it deleted in that same
        transaction: the delete and the step's progress commit together or not at all, so
        a crash before the commit leaves the row for the next relay
        (docs/contract.md#lost-messages), and no message, delivery or ack is needed. The step must
        be pure (the relay checks); an http_request needs its claim committed before the request
        leaves. Returns whether it may have written a wake-up (runs.save_run), which the
        relays then hear of after the commit.
        """
        # The relay's claim skipped the WAL flush; load_run's lock turns it back on.
        run = _take_up(conn, wakeup)
        if run is None:
            return True  # what _take_up saved (a time limit, a hold) may have woken others
        step = run.definition.step(wakeup.step_id)
        if step.type not in PURE_TYPES:
            raise ValueError(f"a {step.type} step cannot run inside the relay")
        run.advance()
        return save_run(conn, run.take_changes())

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
            return Outcome(OutcomeKind.FAILED, error=f"request could not be rendered: {exc}")
        except Exception as exc:
            # Its message may quote a secret, and there is no redactor yet: the name only.
            name = type(exc).__name__
            log = {"execution_id": run.execution_id, "step": sid, "error": name}
            logger.error("internal error rendering the request", extra=log)
            return Outcome(OutcomeKind.FAILED, error=f"not sent: internal error: {name}")
        # budget_s: the attempt may take no longer than what is left of the step's budget.
        return dataclasses.replace(rendered, timeout_s=run.attempt_timeout(sid, rendered.timeout_s))

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
                outcome = Outcome(OutcomeKind.FAILED, error=f"not sent: internal error: {name}")
            else:
                kind = OutcomeKind.RETRY if step.repeat_safe else OutcomeKind.UNKNOWN
                outcome = Outcome(kind, error=f"may have been sent: internal error: {name}")
        span.end(outcome)
        return outcome

    def _checkpoint_patiently(
        self,
        eid: str,
        sid: str,
        lease: Lease,
        outcome: Outcome,
        limits: list[tuple[outbound.LimitKey, LimitSpec]],
        again: bool = False,
    ) -> None:
        """_checkpoint, tried again while the database is unavailable (see
        CHECKPOINT_PATIENCE_S); the lease is still beaten meanwhile, so a link back within
        the lease saves the outcome as if nothing happened. `again`: the claim itself may
        not have committed (_checkpoint's `again`)."""
        deadline = time.monotonic() + CHECKPOINT_PATIENCE_S
        failures = 0
        while True:
            try:
                self._checkpoint(eid, sid, lease, outcome, limits, again=again or failures > 0)
                return
            except DatabaseUnavailable as exc:
                lease.finished = False  # not saved: the heartbeat must keep the lease
                pause = CHECKPOINT_BACKOFF_S[min(failures, len(CHECKPOINT_BACKOFF_S) - 1)]
                failures += 1
                if self.stopping.is_set() or time.monotonic() + pause > deadline:
                    raise
                logger.warning(
                    "checkpoint not saved: database unavailable; trying again",
                    extra={
                        "execution_id": eid,
                        "step": sid,
                        "fencing_token": lease.token,
                        "failures": failures,
                        "error": str(exc),
                    },
                )
                if self.stopping.wait(pause):
                    raise

    def _checkpoint(
        self,
        eid: str,
        sid: str,
        lease: Lease,
        outcome: Outcome,
        limits: list[tuple[outbound.LimitKey, LimitSpec]],
        again: bool = False,
    ) -> None:
        """Record the attempt; a worker that lost its lease writes nothing at all. The
        request's limit slots end here; a 429/503 with Retry-After holds its keys.
        `again`: an earlier try failed, and may have committed before its reply was lost."""
        token = lease.token
        log = {"execution_id": eid, "step": sid, "fencing_token": token}
        with wrap_exceptions(), self.pool.connection() as conn, unit_of_work(conn):
            run = load_run(conn, eid, open_items=True, also=[sid])
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
                run is not None
                and state is not None
                and self._answer_settles_unknown(conn, eid, sid, token, state, outcome)
            ):
                run.reopen_unknown(sid, token, self.worker_id, outcome.attempt_outcome)
                logger.warning("the reaper's unknown settled by the request's answer", extra=log)
            if (
                run is None
                or state is None
                or state.status != StepStatus.RUNNING
                or state.fencing_token != token
                or state.lease_owner != self.worker_id
            ):
                self._moved_on(conn, eid, sid, token, state, outcome, again=again)
                return
            if outcome.retry_at is not None:
                # A dated Retry-After with no usable Date: the database's clock reads it
                # (docs/contract.md, "Outbound limits"), never this worker's.
                seconds = outbound.seconds_until(conn, outcome.retry_at)
                outcome = dataclasses.replace(outcome, retry_after_s=seconds, retry_at=None)
            # A deadline that passed while the request was out: record it, start nothing.
            run.enforce_time_limits()
            run.record_outcome(sid, token, outcome)
            # Before the step row changes: a beat that then finds the step no longer
            # running must know it finished here rather than was taken over.
            lease.finished = True
            if limits:
                outbound.release(conn, eid, sid)
                self._hold(conn, run, sid, limits, outcome)
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

    def _moved_on(
        self,
        conn: psycopg.Connection,
        eid: str,
        sid: str,
        token: int,
        state: StepState | None,
        outcome: Outcome,
        *,
        again: bool,
    ) -> None:
        """The checkpoint of a step no longer ours (fenced): nothing of the outcome is
        written, but a request that provably never left corrects its attempt's history."""
        found = {
            "execution_id": eid,
            "step": sid,
            "fencing_token": token,
            "current_token": state.fencing_token if state else None,
            "current_status": state.status if state else None,
            "outcome": outcome.kind,
        }
        # An operator acted on the reaper's unknown first (a retry, a cancel, a
        # resolve): theirs stands, but the attempt's history is made true.
        if self._correct_never_sent(conn, eid, sid, token, outcome):
            logger.warning(
                "request never sent: its attempt corrected, the step had moved on",
                extra=found,
            )
        elif again:
            logger.warning(
                "checkpoint tried again found the step moved on: saved by the "
                "earlier try, or taken over meanwhile",
                extra=found,
            )
        else:
            logger.warning(
                "lost ownership of the step: result discarded, nothing written",
                extra=found,
            )
            metrics.CHECKPOINT_FENCED.inc()

    def _hold(
        self,
        conn: psycopg.Connection,
        run: Run,
        sid: str,
        limits: list[tuple[outbound.LimitKey, LimitSpec]],
        outcome: Outcome,
    ) -> None:
        """A 429 or 503 with Retry-After holds each of the request's keys for everyone
        through them, each for at most its limit's max_hold_s."""
        seconds = outcome.retry_after_s
        if outcome.http_status not in (429, 503) or not seconds:
            return
        reason = f"HTTP {outcome.http_status} with Retry-After {seconds:g} s"
        for key, spec in limits:
            until = outbound.hold(conn, key, seconds, reason, spec.max_hold_s)
            if until is not None:
                detail = {"key": key.label, "until": until.isoformat(), "reason": reason}
                run.events.append((sid, EventKind.LIMIT_HELD, detail))

    def _never_sent_but_unknown(
        self,
        conn: psycopg.Connection,
        eid: str,
        sid: str,
        token: int,
        state: StepState,
        outcome: Outcome,
    ) -> bool:
        """Whether the reaper recorded `unknown` for this very attempt (same token, no
        operator decision since) although its request never left; corrects the attempt."""
        if state.status != StepStatus.UNKNOWN or state.fencing_token != token:
            return False
        return self._correct_never_sent(conn, eid, sid, token, outcome)

    def _answer_settles_unknown(
        self,
        conn: psycopg.Connection,
        eid: str,
        sid: str,
        token: int,
        state: StepState,
        outcome: Outcome,
    ) -> bool:
        """Whether this worker holds the answer to an attempt the reaper recorded
        `unknown` (same token: no operator has retried or resolved it since); reopens the
        attempt. An outcome that is itself unknown (no answer came) settles nothing."""
        if (
            state.status != StepStatus.UNKNOWN
            or state.fencing_token != token
            or outcome.kind == OutcomeKind.UNKNOWN
        ):
            return False
        params = {
            "execution_id": eid,
            "step_id": sid,
            "token": token,
            "worker": self.worker_id,
            "unknown": AttemptOutcome.UNKNOWN,
        }
        return conn.execute(REOPEN_UNKNOWN, params).fetchone() is not None

    def _correct_never_sent(
        self, conn: psycopg.Connection, eid: str, sid: str, token: int, outcome: Outcome
    ) -> bool:
        """Correct this worker's attempt holding `token` from `unknown` to failed when its
        request provably never left; whether it was corrected."""
        if not (outcome.error or "").startswith(NOT_SENT_PREFIX):
            return False
        params = {
            "execution_id": eid,
            "step_id": sid,
            "token": token,
            "worker": self.worker_id,
            "error": outcome.error,
            "failed": AttemptOutcome.FAILED,
            "unknown": AttemptOutcome.UNKNOWN,
        }
        return conn.execute(CORRECT_NEVER_SENT, params).fetchone() is not None


def _flushed(conn: psycopg.Connection) -> bool:
    """Wait until what this connection committed without a flush is durable (see
    FLUSH_BARRIER); False when that cannot be confirmed. Then the request stays home and
    its checkpoint says so, instead of leaving a claim nobody works on to be reaped
    as an outcome that may have left."""
    try:
        with wrap_exceptions(every_error=True):
            conn.execute(FLUSH_BARRIER)
    except (DatabaseUnavailable, DatabaseError) as exc:
        logger.warning("claim not confirmed durable; the request stays home: %s", exc)
        return False
    return True


def _take_up(conn: psycopg.Connection, wakeup: Wakeup, *, skip_locked: bool = False) -> Run | None:
    """Lock and load the wake-up's execution; None (after saving what time limits changed)
    when the wake-up is stale or a duplicate, else the run with its step started. With
    `skip_locked`, None too when another session holds the execution locked."""
    eid, sid = wakeup.execution_id, wakeup.step_id
    log = {"execution_id": eid, "step": sid}
    # A map's settled items are not loaded (docs/contract.md#map): a unit of work costs what the
    # items in flight cost, not what the map has done so far.
    run = load_run(conn, eid, skip_locked=skip_locked, open_items=True, also=[sid])
    if run is None:
        if not skip_locked:
            logger.warning("wake-up for an unknown execution", extra=log)
        return None
    # Nothing new starts past a deadline or queue expiry, even in the moment before the
    # timer scanner applies it.
    run.enforce_time_limits()
    state = run.steps.get(sid)
    if (
        state is not None
        and state.type == StepType.WORKFLOW
        and state.status == StepStatus.WAITING
        and not run.terminal
    ):
        # docs/contract.md#child-workflows: its child ended (or needs, or no longer needs, an
        # operator); advance() takes that up, and a duplicate changes nothing.
        return run
    if run.terminal or state is None or state.status != StepStatus.READY:
        save_run(conn, run.take_changes())
        logger.debug("stale wake-up ignored", extra=log)
        return None
    if run.hold():
        # Paused (docs/contract.md#pause): the step stays ready; resume dispatches it again.
        save_run(conn, run.take_changes())
        logger.debug("wake-up of a paused execution set aside", extra=log)
        return None
    run.started()
    waited = since_resume(run, sid)
    if waited is not None:
        on_commit(functools.partial(metrics.resumed_step_started, waited))
    return run


def _with_traceparent(headers: dict[str, str], traceparent: str) -> dict[str, str]:
    """The request's headers with the attempt's trace context in place of any the step's
    definition set (a template cannot know the attempt's span)."""
    kept = {k: v for k, v in headers.items() if k.lower() not in ("traceparent", "tracestate")}
    return {**kept, "traceparent": traceparent}


def _traceback(exc: BaseException) -> str:
    """The exception with its stack, for a log line that must still go through redaction."""
    return "".join(traceback.format_exception(exc))
