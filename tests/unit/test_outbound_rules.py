"""Outbound limits in a definition and in configuration (docs/contract.md#outbound-limits): what is
accepted and what is refused, saying where."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.definitions import Circuit, DefinitionInvalid, LimitSpec, parse_definition
from flowforge.store.config import ConfigError, Settings


def definition(limits: Any, limit: Any = "partner") -> dict[str, Any]:
    return {
        "name": "t",
        "limits": limits,
        "steps": [
            {
                "id": "call",
                "type": "http_request",
                "limit": limit,
                "request": {"url": "https://api.example.com/x"},
            }
        ],
    }


def test_a_step_goes_through_a_named_limit() -> None:
    parsed = parse_definition(
        definition({"partner": {"rate_per_s": 25, "burst": 50, "concurrency": 10}})
    )
    assert parsed.limits == {"partner": LimitSpec(rate_per_s=25.0, burst=50, concurrency=10)}
    assert parsed.step("call").limit == "partner"


def test_a_limit_may_be_a_circuit_breaker_alone() -> None:
    circuit = {"failures": 5, "window_s": 60, "cool_down_s": 30}
    parsed = parse_definition(definition({"partner": {"circuit": circuit}}))
    assert parsed.limits["partner"] == LimitSpec(circuit=Circuit(5, 60.0, 30.0))


def test_a_limit_per_tenant_is_named_by_its_template() -> None:
    name = "{{ input.tenant }}"
    parsed = parse_definition(definition({name: {"concurrency": 2}}, limit=name))
    assert parsed.limits[name] == LimitSpec(concurrency=2)


@pytest.mark.parametrize(
    ("limits", "limit", "path"),
    [
        ({"partner": {"rate_per_s": 5}}, "other", "$.steps[0].limit"),
        ({"partner": {"rate_per_s": 0}}, "partner", "$.limits.partner.rate_per_s"),
        ({"partner": {"burst": 5, "concurrency": 1}}, "partner", "$.limits.partner.burst"),
        ({"partner": {}}, "partner", "$.limits.partner"),
        ({"partner": {"concurrency": 1.5}}, "partner", "$.limits.partner.concurrency"),
        ({"partner": {"rate": 5}}, "partner", "$.limits.partner.rate"),
        ({"host:x": {"rate_per_s": 5}}, "host:x", "$.limits.host:x"),
        ({"{{ secrets.k }}": {"rate_per_s": 5}}, "{{ secrets.k }}", "$.limits.{{ secrets.k }}"),
        ([], "partner", "$.limits"),
        (
            {"partner": {"circuit": {"failures": 0, "window_s": 1, "cool_down_s": 1}}},
            "partner",
            "$.limits.partner.circuit.failures",
        ),
        (
            {"partner": {"circuit": {"failures": 2, "window_s": 1}}},
            "partner",
            "$.limits.partner.circuit.cool_down_s",
        ),
    ],
)
def test_a_bad_limit_is_refused_saying_where(limits: Any, limit: Any, path: str) -> None:
    with pytest.raises(DefinitionInvalid) as refused:
        parse_definition(definition(limits, limit))
    assert path in [error["path"] for error in refused.value.errors], refused.value.errors


def test_operators_set_limits_per_host() -> None:
    settings = Settings.from_env(
        {"FLOWFORGE_OUTBOUND_LIMITS": '{"API.Stripe.com.": {"rate_per_s": 25, "burst": 5}}'}
    )
    assert settings.host_limits == {"api.stripe.com": LimitSpec(rate_per_s=25.0, burst=5)}


@pytest.mark.parametrize(
    "raw", ["[", "[]", '{"h": {}}', '{"h": {"rate_per_s": -1}}', '{"h": {"concurrency": true}}']
)
def test_a_bad_host_limit_stops_start_up(raw: str) -> None:
    with pytest.raises(ConfigError, match="FLOWFORGE_OUTBOUND_LIMITS"):
        Settings.from_env({"FLOWFORGE_OUTBOUND_LIMITS": raw})
