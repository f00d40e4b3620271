"""`retention_days` (docs/contract.md#retention) is validated at its JSON path like every other
option."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.definitions import DEFAULT_RETENTION_DAYS, DefinitionInvalid, parse_definition

STEPS = [{"id": "shape", "type": "transform", "output": {}}]


def test_retention_defaults_to_thirty_days_and_takes_fractions() -> None:
    assert DEFAULT_RETENTION_DAYS == 30
    assert parse_definition({"name": "t", "steps": STEPS}).retention_days == 30
    for days in (0.002, 1, 7.5, 3650):
        parsed = parse_definition({"name": "t", "steps": STEPS, "retention_days": days})
        assert parsed.retention_days == days


@pytest.mark.parametrize("days", [0, -1, 3650.5, "30", True, None, [30], {"days": 30}])
def test_a_bad_retention_is_refused_at_its_path(days: Any) -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition({"name": "t", "steps": STEPS, "retention_days": days})
    assert [e["path"] for e in caught.value.errors] == ["$.retention_days"]
    assert "retention_days must be days in (0, 3650]" in caught.value.errors[0]["message"]
