"""`flowforge test`'s driver: one execution run by the production engine with no database,
broker or network (docs/reference/testing.md).

It is the worker's loop with the I/O taken out, and nothing else: the same `Run`
(flowforge/domain/engine.py) is built as the intake builds a new execution (roots ready),
each ready step is taken up as the executor takes up a wake-up (`started`, `advance` for
a pure step; `when_allows`, `render_request`, `claim`, `classify`, `record_outcome` for
an http_request), and a due `waiting` step is made ready as the timer scanner makes it.
Only the clock is fake: it jumps to the next due step, so delays, waits and retries take
no time. The answers come from a fixture (flowforge/steps/fixtures.py) and go through the
worker's own classification and redaction (http_step.classify), so a fixture's 503, lost
answer or echoed secret ends as it would in production.

This is the one place that talks to `Run` for the offline run, through the calls the
executor makes (flowforge/worker/executor.py): keep them in step with it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from flowforge.domain.definitions import Definition
from flowforge.domain.engine import PURE_TYPES, Run, StepState
from flowforge.domain.model import ExecutionStatus, Outcome, OutcomeKind, StepStatus, StepType
from flowforge.domain.templating import TemplateError
from flowforge.steps import netguard
from flowforge.steps.fixtures import Case
from flowforge.steps.http_step import Rendered, classify, render_request
from flowforge.trust import resume_tokens

WORKER = "flowforge-test"
# The worker's default cap on a response body (flowforge/worker/executor.py).
MAX_RESPONSE_BYTES = 262_144
# Where {{ waits.STEP.url }} points offline, and the key it is signed with: a test run's
# resume URLs are well-formed but lead nowhere.
OFFLINE_RESUME = resume_tokens.ResumeUrls("http://flowforge.test", b"flowforge-test-resume-key")
# A run that takes more units of work than this is stuck in a loop the fixture made (a
# target answering 503 forever to a step with a huge retry budget): stopped, said.
MAX_UNITS = 10_000


@dataclass
class Sent:
    """One request as it left (the attempt's record: Rendered.record, redacted)."""

    step: str
    attempt: int
    method: str
    url: str
    headers: dict[str, str]
    body: str | None
    json: Any = None

    def as_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        if self.json is None:
            del found["json"]
        return found


@dataclass
class Result:
    """What an offline run ended with."""

    status: str
    steps: dict[str, dict[str, Any]]
    requests: list[Sent]
    problems: list[str] = field(default_factory=list)  # the fixture could not answer
    elapsed_s: float = 0.0  # of the fake clock

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "steps": self.steps,
            "requests": [sent.as_dict() for sent in self.requests],
        }


def new_run(definition: Definition, case: Case, workflow: str, version: int) -> Run:
    """A new execution as the intake writes it (flowforge/store/creation.py): `queued`, its
    roots `ready`, the other steps `pending`."""
    roots = set(definition.roots())
    return Run(
        execution_id=case.execution_id,
        workflow=workflow,
        version=version,
        status=ExecutionStatus.QUEUED,
        input=case.input,
        definition=definition,
        steps={
            s.id: StepState(s.id, s.type, StepStatus.READY if s.id in roots else StepStatus.PENDING)
            for s in definition.steps
        },
        now=datetime.fromisoformat(case.now),
    )


class OfflineRun:
    """One fixture case through the engine; `run()` returns what it ended with."""

    def __init__(
        self,
        definition: Definition,
        case: Case,
        *,
        workflow: str,
        version: int = 1,
        resume: resume_tokens.ResumeUrls | None = None,
    ) -> None:
        if resume is None and case.public_url is not None:
            resume = resume_tokens.ResumeUrls(case.public_url, OFFLINE_RESUME.key)
        self.case, self.resume = case, resume or OFFLINE_RESUME
        self.run = new_run(definition, case, workflow, version)
        self.started_at = self.run.now
        self.sent: list[Sent] = []
        self.problems: list[str] = []
        self.env = {f"FLOWFORGE_SECRET_{k.upper()}": v for k, v in case.secrets.items()}
        # Every secret the fixture gives is bound to the workflow under test.
        self.bindings = {k.upper(): frozenset({workflow}) for k in case.secrets}
        self.resumes = dict(case.resumes)

    def run_to_end(self) -> Result:
        run = self.run
        for _ in range(MAX_UNITS):
            run.take_changes()
            if run.terminal:
                break
            ready = [sid for sid, s in run.steps.items() if s.status == StepStatus.READY]
            if ready:
                self._wakeup(ready[0])
            elif not self._resume_or_wake():
                break  # nothing runs and nothing is due: unknown, or waits for an operator
        else:
            self.problems.append(f"stopped after {MAX_UNITS} units of work")
        return Result(
            status=str(run.status),
            steps={sid: _step(state) for sid, state in run.steps.items()},
            requests=self.sent,
            problems=self.problems,
            elapsed_s=(run.now - self.started_at).total_seconds(),
        )

    def _wakeup(self, sid: str) -> None:
        """What the executor does with a wake-up of a ready step (executor._take_up, _take)."""
        run = self.run
        run.enforce_time_limits()
        run.started()
        step = run.definition.step(sid)
        if step.type in PURE_TYPES:
            run.advance()
            if step.type == StepType.WORKFLOW and run.changes.child_starts:
                self.problems.append(f"{sid}: workflow steps cannot run offline")
                run.fail_step(sid, "flowforge test: child workflows cannot run offline")
            return
        if not run.when_allows(sid):
            return
        prepared = self._render(sid)
        sent = prepared.record() if isinstance(prepared, Rendered) else None
        claimed = run.claim(sid, WORKER, request=sent)
        outcome = prepared if isinstance(prepared, Outcome) else self._send(sid, prepared)
        if outcome.retry_at is not None:
            seconds = (outcome.retry_at - run.now).total_seconds()
            outcome = dataclasses.replace(outcome, retry_after_s=seconds, retry_at=None)
        run.enforce_time_limits()
        run.record_outcome(sid, claimed.fencing_token, outcome)

    def _render(self, sid: str) -> Rendered | Outcome:
        """executor._render, with the fixture's secrets and the offline resume URLs."""
        run = self.run
        step = run.definition.step(sid)
        try:
            rounds = {wid: state.fencing_token for wid, state in run.steps.items()}
            rendered = render_request(
                step, run.context(sid), self.bindings, self.resume, rounds, self.env
            )
        except TemplateError as exc:
            return Outcome(OutcomeKind.FAILED, error=f"request could not be rendered: {exc}")
        return dataclasses.replace(rendered, timeout_s=run.attempt_timeout(sid, rendered.timeout_s))

    def _send(self, sid: str, rendered: Rendered) -> Outcome:
        """The fixture's answer, classified as the worker classifies a real one."""
        record = rendered.record()
        body = record["body"]
        parsed = None
        if body is not None and "json" in _content_type(record["headers"]):
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        attempt = self.run.steps[sid].attempts
        self.sent.append(
            Sent(sid, attempt, record["method"], record["url"], record["headers"], body, parsed)
        )
        answer = self.case.answer(rendered.method, rendered.url)

        def send() -> netguard.HttpResult:
            if answer is None:
                self.problems.append(f"{sid}: no target answers {rendered.method} {rendered.url}")
                raise netguard.RequestRefused(f"flowforge test: no target answers {rendered.url}")
            if answer.lost or answer.delay_s >= rendered.timeout_s:
                self.run.now += timedelta(seconds=min(answer.delay_s, rendered.timeout_s))
                raise netguard.SentNoResponse("the fixture's answer was lost")
            self.run.now += timedelta(seconds=answer.delay_s)
            wait = netguard.retry_after(
                answer.headers.get("retry-after"), answer.headers.get("date")
            )
            return netguard.HttpResult(
                status=answer.status,
                # Framed by its length, as a server answering HTTP/1.1 with a body frames it.
                headers={"content-length": str(len(answer.body)), **answer.headers},
                body=answer.body[: MAX_RESPONSE_BYTES + rendered.redactor_reach],
                truncated=len(answer.body) > MAX_RESPONSE_BYTES + rendered.redactor_reach,
                duration_ms=round(answer.delay_s * 1000),
                retry_after_s=wait if not isinstance(wait, datetime) else None,
                retry_at=wait if isinstance(wait, datetime) else None,
            )

        return classify(self.run.definition.step(sid), rendered, MAX_RESPONSE_BYTES, send)

    def _resume_or_wake(self) -> bool:
        """A fixture's resume for an open wait, else the timer scanner's next due step
        with the clock moved to it; False when nothing is waiting on time."""
        run = self.run
        for sid in [s for s in self.resumes if s in run.steps]:
            if run.wait_open(sid):
                run.resume(sid, self.resumes.pop(sid))
                return True
        due = [
            (s.wake_at, sid)
            for sid, s in run.steps.items()
            if s.status == StepStatus.WAITING and s.wake_at is not None
        ]
        if not due:
            return False
        wake_at, sid = min(due)
        run.now = max(run.now, wake_at)
        # flowforge/worker/timers.py WAKE_DUE: `waiting -> ready`, the execution running.
        run.set_step(sid, StepStatus.READY)
        run.derive_status()
        return True


def _content_type(headers: dict[str, str]) -> str:
    return next((v for k, v in headers.items() if k.lower() == "content-type"), "")


def _step(state: StepState) -> dict[str, Any]:
    return {
        "status": str(state.status),
        "output": state.output,
        "error": state.error,
        "attempts": state.attempts,
    }


def run_case(definition: Definition, case: Case, *, workflow: str, version: int = 1) -> Result:
    """Run one fixture case offline to its end (or to where it waits for an operator)."""
    return OfflineRun(definition, case, workflow=workflow, version=version).run_to_end()
