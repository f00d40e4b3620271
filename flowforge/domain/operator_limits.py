"""The operator's outbound limits (docs/contract.md#outbound-limits): FLOWFORGE_OUTBOUND_LIMITS
per host and FLOWFORGE_SHARED_LIMITS shared by named workflows, parsed into the LimitSpec a
definition's own limit is, and held to the same bounds. Settings read them; store/outbound.py
counts against them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from flowforge.domain.definitions import (
    SHARED_LIMIT_NAME,
    DefinitionInvalid,
    LimitSpec,
    parse_operator_limit,
)
from flowforge.errors import ConfigError


@dataclass(frozen=True)
class SharedLimit:
    """A limit the operator shares (FLOWFORGE_SHARED_LIMITS) and the workflows that may
    opt into it with {"shared": NAME}; its bounds are the operator's alone."""

    spec: LimitSpec
    workflows: frozenset[str]


def _operator_limits(name: str, text: str) -> dict[str, dict[str, Any]]:
    """An operator's JSON object of named limits, each an object."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{name} must be a JSON object of limits: {exc}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError(f'{name} must be a JSON object such as {{"NAME": {{...}}}}')
    return raw


def _operator_spec(name: str, where: str, raw: dict[str, Any]) -> LimitSpec:
    """One operator's limit, held to the bounds of a definition's limit."""
    try:
        return parse_operator_limit(raw, where)
    except DefinitionInvalid as exc:
        problems = "; ".join(f"{e['path']}: {e['message']}" for e in exc.errors)
        raise ConfigError(f"{name}: {problems}") from None


def parse_host_limits(text: str) -> dict[str, LimitSpec]:
    """FLOWFORGE_OUTBOUND_LIMITS: an operator's limits per host, as JSON such as
    {"api.stripe.com": {"rate_per_s": 25, "burst": 50, "concurrency": 10}}; every request
    to that host (as its URL names it) counts against key host:api.stripe.com."""
    name = "FLOWFORGE_OUTBOUND_LIMITS"
    return {
        host.lower().removesuffix("."): _operator_spec(name, host, spec)
        for host, spec in _operator_limits(name, text).items()
    }


def parse_shared_limits(text: str) -> dict[str, SharedLimit]:
    """FLOWFORGE_SHARED_LIMITS: limits the operator shares between named workflows, as
    JSON such as {"stripe-account": {"rate_per_s": 25, "workflows": ["billing", "refunds"]}}.
    A workflow opts in with a limit {"shared": "stripe-account"}; one not named here is
    refused at run time (docs/reference/definition.md, "limits")."""
    name = "FLOWFORGE_SHARED_LIMITS"
    found = {}
    for shared, raw in _operator_limits(name, text).items():
        workflows = raw.get("workflows")
        if not SHARED_LIMIT_NAME.fullmatch(shared):
            raise ConfigError(f"{name}: {shared!r} is not a limit name (letters, digits, ._-)")
        if not isinstance(workflows, list) or not all(isinstance(w, str) for w in workflows):
            raise ConfigError(f"{name}: {shared!r} needs workflows, a list of workflow names")
        spec = {k: v for k, v in raw.items() if k != "workflows"}
        found[shared] = SharedLimit(_operator_spec(name, shared, spec), frozenset(workflows))
    return found
