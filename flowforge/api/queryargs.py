"""Query-string arguments that several list routes take alike: a page's `limit`, a
`status` and a `workflow` filter, refused (400, 403) the same way wherever they are given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flowforge.domain.model import MAX_PAGE, is_key
from flowforge.errors import Forbidden, InvalidParameter
from flowforge.store.apikeys import ApiKey


def page_limit(args: Mapping[str, str], default: int) -> int:
    """The `limit` argument, from 1 to MAX_PAGE (`default` when absent)."""
    try:
        limit = int(args.get("limit", default))
    except ValueError:
        raise InvalidParameter("Invalid limit", "limit must be an integer") from None
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidParameter("Invalid limit", f"limit must be between 1 and {MAX_PAGE}")
    return limit


def readable_workflow(args: Mapping[str, str], key: ApiKey) -> str | None:
    """The `workflow` filter (None: every workflow), once it is a workflow key the API key
    may read: a list never shows another scope's executions by being asked for them."""
    workflow = args.get("workflow")
    if workflow is not None and not is_key(workflow):
        # Also keeps NUL bytes, which PostgreSQL text cannot hold, away from the query.
        raise InvalidParameter("Invalid workflow", "workflow must be a workflow key")
    if workflow is not None and not key.allows(workflow, write=False):
        raise Forbidden("this API key may not read this workflow")
    return workflow


def status_filter(args: Mapping[str, str], statuses: Sequence[str]) -> str | None:
    """The `status` filter (None: any status), once it is one of `statuses`."""
    status = args.get("status")
    if status is not None and status not in statuses:
        raise InvalidParameter("Invalid status", f"status must be one of {', '.join(statuses)}")
    return status
