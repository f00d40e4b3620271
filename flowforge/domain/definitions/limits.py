"""Outbound limits (docs/contract.md#outbound-limits): a definition's named `limits`, each a rate,
a concurrency, a circuit (docs/contract.md#circuits) or an operator's shared limit; the
operator's host and shared limits are checked by the same rules."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions.bounds import (
    MAX_CIRCUIT_FAILURES,
    MAX_CIRCUIT_S,
    MAX_HOLD_S,
    MAX_LIMIT_RATE,
    MAX_LIMITS,
    MIN_LIMIT_RATE,
)
from flowforge.domain.definitions.checker import Checker, is_whole
from flowforge.domain.definitions.shapes import SHARED_LIMIT_NAME, Circuit, LimitSpec
from flowforge.domain.jsonvalues import is_number

_LIMIT_KEYS = frozenset({"rate_per_s", "burst", "concurrency", "circuit", "max_hold_s"})
_CIRCUIT_KEYS = frozenset({"failures", "window_s", "cool_down_s"})


class LimitsSection(Checker):
    """`limits` and one limit's bounds."""

    def limits(self, doc: dict[str, Any]) -> dict[str, LimitSpec]:
        """Check `limits`: named outbound limits, each a rate (with a burst), a concurrency
        or both. A name with placeholders keys the limit per value; like a concurrency key
        it may read input only."""
        raw = doc.get("limits", {})
        path = "$.limits"
        if not isinstance(raw, dict):
            self.error(path, "limits must be an object of named limits")
            return {}
        if len(raw) > MAX_LIMITS:
            self.error(path, f"{len(raw)} limits exceed the limit of {MAX_LIMITS}")
            return {}
        found: dict[str, LimitSpec] = {}
        for name, spec in raw.items():
            where = f"{path}.{name}"
            if not name or name.startswith("host:"):
                self.error(where, "a limit's name is non-empty and does not start with 'host:'")
                continue
            if "{{" in name:
                self.concurrency_key(name, where)
            if isinstance(spec, dict) and "shared" in spec:
                shared = spec["shared"]
                if set(spec) != {"shared"} or "{{" in name:
                    self.error(where, 'a shared limit is {"shared": NAME} alone, not templated')
                elif not isinstance(shared, str) or not SHARED_LIMIT_NAME.fullmatch(shared):
                    self.error(f"{where}.shared", "shared names an operator's shared limit")
                else:
                    found[name] = LimitSpec(shared=shared)
                continue
            checked = self.limit_spec(spec, where)
            if checked is not None:
                found[name] = checked
        return found

    def limit_spec(self, spec: Any, where: str) -> LimitSpec | None:
        """Check one limit's bounds: a rate (with a burst), a concurrency, a circuit, the
        longest hold. The operator's host and shared limits are checked the same way."""
        if not isinstance(spec, dict):
            self.error(where, "a limit is an object with rate_per_s, burst, concurrency")
            return None
        self.unknown_keys(spec, _LIMIT_KEYS, where)
        for name in sorted(_LIMIT_KEYS & {k for k, v in spec.items() if v is None}):
            self.error(f"{where}.{name}", f"{name} is left out, never null")
        rate: Any = spec.get("rate_per_s")
        burst: Any = spec.get("burst")
        concurrency: Any = spec.get("concurrency")
        max_hold: Any = spec.get("max_hold_s", MAX_HOLD_S)
        if rate is not None and self.stored and is_number(rate) and 0 < rate < MIN_LIMIT_RATE:
            rate = MIN_LIMIT_RATE  # published before the bound: it applies at run time
        if rate is not None and (
            not is_number(rate) or not MIN_LIMIT_RATE <= rate <= MAX_LIMIT_RATE
        ):
            self.error(
                f"{where}.rate_per_s",
                f"rate_per_s must be a number from {MIN_LIMIT_RATE:.6f} (one an hour) "
                f"to {MAX_LIMIT_RATE}",
            )
        if burst is not None and (
            rate is None or not is_whole(burst) or not 1 <= burst <= MAX_LIMIT_RATE
        ):
            self.error(
                f"{where}.burst",
                f"burst needs rate_per_s and is an integer from 1 to {MAX_LIMIT_RATE}",
            )
        if concurrency is not None and (
            not is_whole(concurrency) or not 1 <= concurrency <= MAX_LIMIT_RATE
        ):
            self.error(
                f"{where}.concurrency",
                f"concurrency must be an integer from 1 to {MAX_LIMIT_RATE}",
            )
        if not is_number(max_hold) or not 0 <= max_hold <= MAX_HOLD_S:
            self.error(
                f"{where}.max_hold_s", f"max_hold_s must be seconds from 0 to {MAX_HOLD_S:g}"
            )
        circuit = self.circuit(spec.get("circuit"), f"{where}.circuit")
        if rate is None and concurrency is None and circuit is None:
            self.error(where, "a limit needs rate_per_s, concurrency or circuit")
            return None
        return LimitSpec(
            rate_per_s=float(rate) if is_number(rate) else None,
            burst=burst if is_whole(burst) else 1,
            concurrency=concurrency if is_whole(concurrency) else None,
            circuit=circuit,
            max_hold_s=float(max_hold) if is_number(max_hold) else MAX_HOLD_S,
        )

    def circuit(self, raw: Any, path: str) -> Circuit | None:
        """Check a limit's `circuit`: failures, window_s and cool_down_s, all required."""
        if raw is None:
            return None
        if not isinstance(raw, dict):
            self.error(path, "circuit must be an object with failures, window_s, cool_down_s")
            return None
        self.unknown_keys(raw, _CIRCUIT_KEYS, path)
        failures: Any = raw.get("failures")
        window: Any = raw.get("window_s")
        cool_down: Any = raw.get("cool_down_s")
        good = True
        if not is_whole(failures) or not 1 <= failures <= MAX_CIRCUIT_FAILURES:
            self.error(
                f"{path}.failures",
                f"failures is required: an integer from 1 to {MAX_CIRCUIT_FAILURES}",
            )
            good = False
        for name, value in (("window_s", window), ("cool_down_s", cool_down)):
            if not is_number(value) or not 0 < value <= MAX_CIRCUIT_S:
                self.error(f"{path}.{name}", f"{name} is required: seconds in (0, {MAX_CIRCUIT_S}]")
                good = False
        return Circuit(failures, float(window), float(cool_down)) if good else None
