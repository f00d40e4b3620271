"""The transform step (docs/contract.md#definition): its output rendered from the
template context, in the checkpoint that made it ready; one attempt, no retry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowforge.domain.kinds.base import StepKind
from flowforge.domain.model import AttemptOutcome, StepType
from flowforge.domain.model import StepStatus as S
from flowforge.domain.templating import TemplateError, render

if TYPE_CHECKING:
    from flowforge.domain.definitions import Step
    from flowforge.domain.engine import Run


class TransformKind(StepKind):
    type = StepType.TRANSFORM

    def start(self, run: Run, step: Step) -> None:
        """Render a transform's output: its one attempt succeeds or fails at once."""
        try:
            output = render(step.output, run.context(step.id))
        except TemplateError as exc:
            run.record_pure_attempt(step.id, AttemptOutcome.FAILED, str(exc))
            run.fail_step(step.id, str(exc))
            return
        run.record_pure_attempt(step.id, AttemptOutcome.SUCCEEDED)
        run.set_step(step.id, S.SUCCEEDED, output=output, started_at=run.now)


KIND = TransformKind()
