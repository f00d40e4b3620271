"""An http_request step's own fields: its request (the only place secrets and resume URLs
may appear, docs/contract.md#secret-destinations) and its budget."""

from __future__ import annotations

import re
from typing import Any

from flowforge.domain import templating
from flowforge.domain.definitions.bounds import (
    DEFAULT_REQUEST_TIMEOUT_S,
    MAX_REQUEST_TIMEOUT_S,
    MAX_TIME_LIMIT_S,
)
from flowforge.domain.definitions.checker import Checker
from flowforge.domain.definitions.shapes import METHODS
from flowforge.domain.jsonvalues import is_number

_REQUEST_KEYS = frozenset(
    {
        "method",
        "url",
        "headers",
        "json",
        "body",
        "timeout_s",
        "idempotency_key",
        "allow_templated_destination",
    }
)
# A URL template's origin: up to the first '/', '?' or '#' after its '://' (the whole
# template when it has none, `{{ input.callback_url }}`).
_ORIGIN_END = re.compile(r"://[^/?#]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class RequestSection(Checker):
    """`request` and `budget_s`."""

    def request(self, request: Any, path: str, ancestors: frozenset[str]) -> dict[str, Any] | None:
        """Check and normalise an HTTP request; the only place secrets may appear."""
        if not isinstance(request, dict):
            self.error(path, "request is required: an object with method and url")
            return None
        self.unknown_keys(request, _REQUEST_KEYS, path)
        method = request.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in METHODS:
            self.error(f"{path}.method", f"method must be one of {', '.join(METHODS)}")
        if not isinstance(request.get("url"), str):
            self.error(f"{path}.url", "url is required: a string")
        headers = request.get("headers", {})
        if not isinstance(headers, dict):
            self.error(f"{path}.headers", "headers must be an object of strings")
        else:
            for name, value in headers.items():
                self.header(name, value, f"{path}.headers.{name}")
        if "json" in request and "body" in request:
            self.error(path, "give at most one of json and body")
        if "body" in request and not isinstance(request["body"], str):
            self.error(f"{path}.body", "body must be a string (use json for JSON payloads)")
        timeout_s = request.get("timeout_s", DEFAULT_REQUEST_TIMEOUT_S)
        if not is_number(timeout_s) or not 0 < timeout_s <= MAX_REQUEST_TIMEOUT_S:
            self.error(
                f"{path}.timeout_s",
                f"timeout_s must be a number with 0 < timeout_s <= {MAX_REQUEST_TIMEOUT_S}",
            )
        key = request.get("idempotency_key")
        if "idempotency_key" in request and (not isinstance(key, str) or not key):
            self.error(f"{path}.idempotency_key", "idempotency_key must be a non-empty string")
        self.templates(request, path, ancestors, secrets=True)
        self.destination(request, path)
        normalised = {
            "method": str(method).upper(),
            "url": request.get("url"),
            "headers": headers,
            "timeout_s": timeout_s,
            "idempotency_key": key,
        }
        if request.get("allow_templated_destination") is True:
            normalised["allow_templated_destination"] = True
        normalised.update({k: request[k] for k in ("json", "body") if k in request})
        return normalised

    def destination(self, request: dict[str, Any], path: str) -> None:
        """docs/contract.md#secret-destinations: a request that carries a secret or a resume URL
        goes where the publisher said. Its scheme, host and port may come from a secret (the
        operator's) but not from the execution's data — the input, a step's output — which whoever
        sends the webhook controls, unless `allow_templated_destination` says so."""
        url, opt_in = request.get("url"), request.get("allow_templated_destination", False)
        if not isinstance(opt_in, bool):
            self.error(f"{path}.allow_templated_destination", "must be true or false")
            return
        if not isinstance(url, str) or opt_in:
            return
        end = _ORIGIN_END.search(url)
        origin = url[: end.end()] if end else url
        try:
            carried = {
                placeholder
                for _, text in templating.iter_template_strings(request)
                for placeholder in templating.find_placeholders(text)
                if placeholder.startswith(("secrets.", "waits."))
            }
            chosen = [
                placeholder
                for placeholder in templating.find_placeholders(origin)
                if not placeholder.startswith("secrets.")
            ]
        except templating.TemplateSyntaxError:
            return  # self.templates has said what is wrong with it
        if not carried:
            return
        if chosen:
            self.error(
                f"{path}.url",
                f"this request carries {', '.join(sorted(carried))}, so its scheme, host "
                f"and port must not come from {{{{ {chosen[0]} }}}}: whoever sends the data "
                "would choose where the secret goes. Fix the destination in the definition, "
                "or set allow_templated_destination: true to accept that",
            )

    def header(self, name: str, value: Any, path: str) -> None:
        """Keep header names to RFC 7230 tokens and values free of line breaks."""
        if not _HEADER_NAME.fullmatch(name):
            self.error(path, f"header name {name!r} is not an RFC 7230 token")
        if not isinstance(value, str):
            self.error(path, "header value must be a string")
        elif "\r" in value or "\n" in value:
            self.error(path, "header value must not contain CR or LF")

    def budget(
        self, raw: dict[str, Any], path: str, request: dict[str, Any] | None
    ) -> float | None:
        """Check `budget_s`: room for at least one whole attempt."""
        if "budget_s" not in raw:
            return None
        budget = raw["budget_s"]
        if not is_number(budget) or not 0 < budget <= MAX_TIME_LIMIT_S:
            self.error(f"{path}.budget_s", f"budget_s must be a number in (0, {MAX_TIME_LIMIT_S}]")
            return None
        timeout = request["timeout_s"] if request is not None else None
        if is_number(timeout) and budget < timeout:
            self.error(
                f"{path}.budget_s",
                f"budget_s {budget} is shorter than one attempt's timeout_s {timeout}",
            )
        return float(budget)
