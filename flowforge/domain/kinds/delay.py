"""The delay step (docs/contract.md#definition): `waiting` until its `wake_at`, a duration
from its start or a rendered `until`; the timer scanner (worker/timers.py) makes it
`ready` again when that time comes, and it then succeeds. A cancel stops it at once,
like any waiting step."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from flowforge.domain.kinds.base import StepKind
from flowforge.domain.model import StepStatus as S
from flowforge.domain.model import StepType
from flowforge.domain.templating import TemplateError, render

if TYPE_CHECKING:
    from flowforge.domain.definitions import Step
    from flowforge.domain.engine import Run


class DelayKind(StepKind):
    type = StepType.DELAY

    def start(self, run: Run, step: Step) -> None:
        """Start a delay (done at once if its time has come), or end it: its time came."""
        state = run.steps[step.id]
        if state.wake_at is not None:
            # The timer scanner made it ready: the wait is over.
            run.set_step(step.id, S.SUCCEEDED, output={"waited_until": state.wake_at.isoformat()})
            return
        try:
            wake_at = _delay_until(run, step)
        except (TemplateError, ValueError) as exc:
            run.fail_step(step.id, f"delay: {exc}")
            return
        if wake_at <= run.now:
            run.set_step(
                step.id,
                S.SUCCEEDED,
                wake_at=wake_at,
                started_at=run.now,
                output={"waited_until": wake_at.isoformat()},
            )
        else:
            run.set_step(step.id, S.WAITING, wake_at=wake_at, started_at=run.now)


def _delay_until(run: Run, step: Step) -> datetime:
    if step.duration_s is not None:
        return run.now + timedelta(seconds=step.duration_s)
    assert step.until is not None
    rendered = render(step.until, run.context(step.id))
    if not isinstance(rendered, str):
        raise ValueError("until must render to an ISO-8601 timestamp string")
    return run.parse_until(rendered)


KIND = DelayKind()
