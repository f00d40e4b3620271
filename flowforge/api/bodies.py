"""Reading request bodies: content type, size, encoding and JSON, each with its own 4xx."""

from __future__ import annotations

from typing import Any

from flask import current_app, request

from flowforge.domain.jsonvalues import loads_storable
from flowforge.errors import (
    InvalidBody,
    InvalidParameter,
    PayloadTooLarge,
    UnsupportedMediaType,
)


def read_body() -> bytes:
    """The raw JSON bytes, as signatures and idempotency hash them: never re-serialised."""
    if request.headers.get("Content-Encoding", "identity").lower() != "identity":
        raise UnsupportedMediaType("compressed bodies are not accepted; send identity-encoded JSON")
    mimetype = request.mimetype or ""
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise UnsupportedMediaType("send the body as application/json")
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    too_large = PayloadTooLarge(f"the body is larger than the {limit}-byte limit")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    raw = request.get_data(cache=True)
    # A chunked body (no Content-Length) is cut at the limit without a word by werkzeug's
    # LimitedStream; one byte past it on the server's stream tells "exactly" from "more".
    chunked = request.content_length is None
    if chunked and len(raw) >= limit and request.environ["wsgi.input"].read(1):
        raise too_large
    return raw


def parse_json(raw: bytes, *, whole_numbers_as_int: bool = False) -> Any:
    """Parse a body; a 400 that never echoes what was sent."""
    try:
        # UTF-8 only (RFC 8259 §8.1): the raw text is what jsonb stores for webhooks.
        # NotStorable (valid JSON that jsonb cannot hold, or nesting beyond MAX_DEPTH) is a
        # ClientError: a 400 by itself.
        text = raw.decode("utf-8")
        return loads_storable(text, whole_numbers_as_int=whole_numbers_as_int)
    except (ValueError, UnicodeDecodeError) as exc:
        # Never echo the body: it may carry private data.
        position = getattr(exc, "pos", None)
        where = f" at byte {position}" if position is not None else ""
        raise InvalidParameter("Malformed JSON", f"the body is not valid JSON{where}") from None


def json_body() -> Any:
    """The parsed JSON body of a management request. Its numbers are parameters, so a
    whole number written 761228.0 is the integer /openapi.json types (a webhook's body,
    kept as it was sent, goes through parse_json alone)."""
    return parse_json(read_body(), whole_numbers_as_int=True)


# A user-supplied signing secret (a workflow's or a source's): its length, in characters.
MIN_SECRET, MAX_SECRET = 16, 1024


def supplied_secret() -> str | None:
    """The `value` of a user-supplied secret, or None when the request has no body."""
    if not request.content_length and not request.get_data(cache=True):
        return None
    document = json_body()
    if not isinstance(document, dict) or set(document) != {"value"}:
        raise InvalidBody("Invalid secret", 'send {"value": "<the provider\'s secret>"}')
    value = document["value"]
    if not isinstance(value, str) or not MIN_SECRET <= len(value) <= MAX_SECRET:
        raise InvalidBody(
            "Invalid secret",
            f"value must be a string of {MIN_SECRET}-{MAX_SECRET} characters",
            errors=[{"path": "$.value", "message": "a string of 16-1024 characters"}],
        )
    if not value.isprintable():
        raise InvalidBody("Invalid secret", "value must be printable characters")
    return value
