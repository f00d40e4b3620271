"""The http_request step, the one kind that leaves the process (docs/contract.md#delivery).

It is not pure: made ready, it is dispatched (a wake-up through the outbox), a worker
claims it (Run.claim: a lease and a fencing token), steps/http_step.py sends it, and its
outcome comes back through Run.record_outcome, which the core owns with retries, budget_s
and lease recovery (the rules of docs/contract.md#outcomes-stick). It needs no hook.
"""

from __future__ import annotations

from flowforge.domain.kinds.base import StepKind
from flowforge.domain.model import StepType


class HttpRequestKind(StepKind):
    type = StepType.HTTP_REQUEST
    pure = False


KIND = HttpRequestKind()
