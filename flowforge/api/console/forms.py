"""Reading the console's query strings and form fields into checked values; anything
malformed is a 400 page that says which field, never a 500."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import psycopg

from flowforge.domain.definitions import AttributeFilterInvalid, attribute_filter
from flowforge.domain.jsonvalues import loads_storable
from flowforge.domain.model import is_key
from flowforge.errors import Forbidden, InvalidBody, InvalidParameter
from flowforge.store import search
from flowforge.store.apikeys import ApiKey

# The filter fields, as the list's form names them; bulk pages carry the same ones.
FIELDS = ("id", "workflow", "status", "from", "to", "idempotency_key", "path", "value", "where")
PATH_SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_PATH_DEPTH = 8
MAX_TEXT = 512


@dataclass(frozen=True)
class Query:
    """The filter as typed (to refill the form and build links) and as a search.Filter."""

    raw: dict[str, str]
    filter: search.Filter

    def link(self, **extra: str) -> str:
        """The query string of this filter plus `extra`, for links and redirects."""
        return urlencode({**{k: v for k, v in self.raw.items() if v}, **extra})


def bad(field: str, message: str) -> InvalidParameter:
    """A 400 naming the field, rendered as the console's error page."""
    return InvalidParameter("Invalid filter", f"{field}: {message}")


def _instant(field: str, text: str) -> datetime:
    """A datetime-local value (or ISO 8601); without an offset it is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise bad(field, "not a date and time such as 2026-12-01T09:30") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _containment(path: str, value: str) -> Any:
    """`customer.id` and `42` → {"customer": {"id": 42}}: the value is JSON when it parses
    as JSON, else a string."""
    segments = path.split(".")
    if len(segments) > MAX_PATH_DEPTH or not all(PATH_SEGMENT.fullmatch(s) for s in segments):
        raise bad("path", f"dotted names of letters, digits, _ or -, at most {MAX_PATH_DEPTH}")
    try:
        document: Any = loads_storable(value)
    except ValueError:
        document = value
    if _has_empty_container(document):
        # jsonb_path_ops indexes leaf values only: `{}` or `[]` gives the GIN index
        # nothing to look up, and the query would read every execution.
        raise bad(
            "value",
            "an empty object or list ({} or []) matches too much to search for; give a "
            "value inside it (a number, a string, true/false/null)",
        )
    for segment in reversed(segments):
        document = {segment: document}
    return document


def _has_empty_container(value: Any) -> bool:
    """Whether a JSON value is, or holds at any depth, an empty object or list."""
    if isinstance(value, dict):
        return not value or any(_has_empty_container(v) for v in value.values())
    if isinstance(value, list):
        return not value or any(_has_empty_container(v) for v in value)
    return False


def parse_query(conn: psycopg.Connection, args: Mapping[str, str], key: ApiKey) -> Query:
    """The list filter from a query string, within what the key may read."""
    raw = {name: args.get(name, "").strip() for name in FIELDS}
    for name, text in raw.items():
        if len(text) > MAX_TEXT or "\x00" in text:
            raise bad(name, f"at most {MAX_TEXT} characters, no NUL")
    workflow = raw["workflow"]
    keys: list[str] | None
    if workflow:
        if not is_key(workflow):
            raise bad("workflow", "not a workflow key")
        if not key.allows(workflow, write=False):
            raise Forbidden("this API key may not read this workflow")
        keys = [workflow]
    else:
        keys = list(key.workflows) if key.workflows is not None else None
    ids: tuple[int, ...] | None = None
    if keys is not None:
        ids = tuple(search.workflow_ids(conn, keys).values()) or (-1,)  # -1: matches nothing
    status = raw["status"]
    if status and status not in search.STATUSES:
        raise bad("status", "one of " + ", ".join(search.STATUSES))
    prefix = search.id_prefix(raw["id"]) if raw["id"] else None
    if raw["id"] and prefix is None:
        raise bad("id", "an execution id or its first hex digits, such as 01a233ee")
    if raw["value"] and not raw["path"]:
        raise bad("path", "name the input path the value is compared with")
    flt = search.Filter(
        workflow_ids=ids,
        statuses=(status,) if status else None,
        created_from=_instant("from", raw["from"]) if raw["from"] else None,
        created_to=_instant("to", raw["to"]) if raw["to"] else None,
        idempotency_key=raw["idempotency_key"] or None,
        input_match=_containment(raw["path"], raw["value"]) if raw["path"] else None,
        id_prefix=prefix,
        attributes=_where(raw["where"]) if raw["where"] else (),
    )
    return Query(raw, flt)


def _where(text: str) -> tuple[tuple[str, str], ...]:
    """The search box's `name=value` (docs/contract.md#search-attributes): one attribute."""
    name, equals, value = text.partition("=")
    if not equals:
        raise bad("where", "name=value, such as order_id=4711")
    try:
        return attribute_filter([("where", name.strip(), value.strip())])
    except AttributeFilterInvalid as exc:
        raise bad("where", (exc.errors or [{}])[0].get("message", "")) from None


def json_field(form: Mapping[str, str], name: str) -> Any:
    """A JSON form field (an output); empty is null."""
    text = form.get(name, "").strip()
    if not text:
        return None
    try:
        return loads_storable(text)
    except ValueError:
        raise InvalidBody("Invalid output", f"{name} must be JSON (or left empty)") from None
