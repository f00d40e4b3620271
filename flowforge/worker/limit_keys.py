"""Which outbound limits a request goes through (docs/contract.md#outbound-limits): its
step's own limit, its name rendered when it is a template, and the operator's limit of
its URL's host, worked out on the claim before any key is locked."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from flowforge.domain import operator_limits
from flowforge.domain.definitions import LimitSpec
from flowforge.domain.engine import Run
from flowforge.domain.model import Outcome, OutcomeKind
from flowforge.domain.templating import TemplateError, render
from flowforge.steps.http_step import Rendered
from flowforge.store import outbound

# A rendered limit name is one of the workflow's own tenants: a text of this many
# characters at most, so that a sender cannot fill outbound_limits with megabyte keys.
MAX_RENDERED_LIMIT_CHARS = 200


def request_limits(
    run: Run,
    sid: str,
    prepared: Rendered | Outcome,
    host_limits: Mapping[str, LimitSpec],
    shared_limits: Mapping[str, operator_limits.SharedLimit],
) -> tuple[list[tuple[outbound.LimitKey, LimitSpec]], Rendered | Outcome]:
    """The outbound limits the request goes through (docs/contract.md#outbound-limits): the
    step's own, its name rendered when it is a template, and the operator's limit of its URL's
    host. A workflow's limits are its own (docs/reference/security.md, "Who owns a limit"):
    a rendered name is only ever a name among them. A name that cannot be rendered,
    or a shared limit the operator does not share with this workflow, fails the
    request, unsent."""
    if not isinstance(prepared, Rendered):
        return [], prepared
    found: list[tuple[outbound.LimitKey, LimitSpec]] = []
    name = run.definition.step(sid).limit
    if name is not None:
        spec = run.definition.limits[name]
        key: object = name
        if "{{" in name:
            try:
                key = render(name, run.context(sid))
            except TemplateError as exc:
                return [], Outcome(
                    OutcomeKind.FAILED, error=f"limit key could not be rendered: {exc}"
                )
            if key is None or key == "" or isinstance(key, dict | list):
                error = f"limit key {name!r} rendered to {key!r}, not a text or number"
                return [], Outcome(OutcomeKind.FAILED, error=error)
            if len(str(key)) > MAX_RENDERED_LIMIT_CHARS or "\x00" in str(key):
                error = (
                    f"limit key {name!r} rendered to a name over "
                    f"{MAX_RENDERED_LIMIT_CHARS} characters or with a NUL"
                )
                return [], Outcome(OutcomeKind.FAILED, error=error)
        if spec.shared is not None:
            shared = shared_limits.get(spec.shared)
            if shared is None or run.workflow not in shared.workflows:
                error = (
                    f"not sent: shared limit {spec.shared!r} is not shared with this "
                    "workflow (FLOWFORGE_SHARED_LIMITS)"
                )
                return [], Outcome(OutcomeKind.FAILED, error=error)
            found.append((outbound.LimitKey(outbound.SHARED, spec.shared), shared.spec))
        else:
            found.append((outbound.LimitKey(str(run.workflow_id), str(key)), spec))
    host = (urlsplit(prepared.url).hostname or "").lower().removesuffix(".")
    if host in host_limits:
        found.append((outbound.LimitKey(outbound.HOST, host), host_limits[host]))
    return found, prepared
