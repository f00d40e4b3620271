"""A search attribute value PostgreSQL cannot store is refused up front, not by the
database (an error of psycopg's on the CLI's direct path)."""

from __future__ import annotations

import pytest

from flowforge.cli.arguments import where
from flowforge.domain.definitions import AttributeFilterInvalid, attribute_filter, attribute_value


@pytest.mark.parametrize("value", ["\ud800", "a\udcffb", "x\x00"])
def test_a_value_text_cannot_hold_is_no_attribute_and_no_filter(value: str) -> None:
    assert attribute_value(value) is None
    with pytest.raises(AttributeFilterInvalid):
        attribute_filter([("attr.order_id", "order_id", value)])


def test_the_cli_refuses_a_where_whose_value_cannot_be_stored() -> None:
    """argv decodes bytes that are not UTF-8 to lone surrogates (surrogateescape)."""
    with pytest.raises(Exception, match="without NUL"):
        where("order_id=\udcff")


def test_multibyte_values_count_characters_like_postgresql() -> None:
    assert attribute_value("é" * 200) == "é" * 200
    assert attribute_value("😀" * 200) == "😀" * 200
    assert attribute_value("😀" * 201) is None
