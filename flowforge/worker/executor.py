"""Running one wake-up: claim the step, do the work, checkpoint — with fencing.

Pure steps run inside the claiming transaction (no lease: the row lock is the lease).
An http_request is claimed in one committed transaction (new fencing token, open attempt
row) before the request leaves, sent with no transaction open, and checkpointed in a
second transaction that writes nothing unless the step still holds our token.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import psycopg_pool

from flowforge import faults, netguard
from flowforge.db import wrap_exceptions
from flowforge.engine import PURE_TYPES, Run
from flowforge.executions import load_run, save_run, unit_of_work
from flowforge.steps.http_request import Outcome, perform, render_request
from flowforge.templating import TemplateError
from flowforge.worker.broker import Wakeup

logger = logging.getLogger(__name__)


class Leases:
    """The fencing tokens this process holds, for the heartbeat to renew."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], int] = {}

    def hold(self, execution_id: str, step_id: str, token: int) -> None:
        with self._lock:
            self._held[(execution_id, step_id)] = token

    def release(self, execution_id: str, step_id: str) -> None:
        with self._lock:
            self._held.pop((execution_id, step_id), None)

    def snapshot(self) -> list[tuple[str, str, int]]:
        """The leases held right now."""
        with self._lock:
            return [(eid, sid, token) for (eid, sid), token in self._held.items()]


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
    ) -> None:
        self.pool = pool
        self.worker_id = worker_id
        self.lease_s = lease_s
        self.allow = allow
        self.secret_bindings = secret_bindings
        self.max_response_bytes = max_response_bytes
        self.leases = Leases()

    def handle(self, wakeup: Wakeup) -> None:
        """Process one wake-up; stale and duplicate ones change nothing."""
        eid, sid = wakeup.execution_id, wakeup.step_id
        log = {"execution_id": eid, "step": sid}
        with wrap_exceptions(), self.pool.connection() as conn, unit_of_work(conn):
            loaded = load_run(conn, eid)
            if loaded is None:
                logger.warning("wake-up for an unknown execution", extra=log)
                return
            run, _ = loaded
            state = run.steps.get(sid)
            if run.terminal or state is None or state.status != "ready":
                logger.debug("stale wake-up ignored", extra=log)
                return
            run.started()
            step = run.definition.step(sid)
            claimed = None
            if step.type in PURE_TYPES:
                run.advance()
            elif run.when_allows(sid):
                claimed = run.claim(sid, self.worker_id)
                self.leases.hold(eid, sid, claimed.fencing_token)
            save_run(conn, run, lease_s=self.lease_s)
        if claimed is not None:
            token = claimed.fencing_token
            faults.hit("after_claim_commit")
            try:
                outcome = self._attempt(run, sid)
                faults.hit("after_http_response")
                self._checkpoint(eid, sid, token, outcome)
            finally:
                self.leases.release(eid, sid)
        faults.hit("before_ack")

    def _attempt(self, run: Run, sid: str) -> Outcome:
        step = run.definition.step(sid)
        try:
            rendered = render_request(step, run.context(sid), self.secret_bindings)
        except TemplateError as exc:
            return Outcome("failed", error=f"request could not be rendered: {exc}")
        logger.info(
            "sending request",
            extra={"execution_id": run.execution_id, "step": sid, "method": rendered.method},
        )
        return perform(step, rendered, self.allow, self.max_response_bytes)

    def _checkpoint(self, eid: str, sid: str, token: int, outcome: Outcome) -> None:
        """Record the attempt; a worker that lost its lease writes nothing at all."""
        log = {"execution_id": eid, "step": sid, "fencing_token": token}
        with wrap_exceptions(), self.pool.connection() as conn, unit_of_work(conn):
            loaded = load_run(conn, eid)
            run = loaded[0] if loaded else None
            state = run.steps.get(sid) if run else None
            if (
                run is None
                or state is None
                or state.status != "running"
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
                return
            run.record_outcome(sid, token, outcome)
            save_run(conn, run, lease_s=self.lease_s)
        logger.info(
            "step attempt recorded",
            extra={**log, "outcome": outcome.kind, "http_status": outcome.http_status},
        )
