"""A map step's own fields (docs/contract.md#map): its items, how many run at once, what a
failed item does. The steps each item runs are checked like the workflow's own
(flowforge/domain/definitions/steps.py)."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions.bounds import (
    DEFAULT_MAP_PARALLEL,
    MAX_MAP_ITEMS,
    MAX_MAP_PARALLEL,
)
from flowforge.domain.definitions.checker import Checker, is_whole
from flowforge.domain.model import ItemFailure


class MapSection(Checker):
    """`items`, `max_parallel`, `on_item_failure`."""

    def map(
        self, raw: dict[str, Any], path: str, ancestors: frozenset[str]
    ) -> tuple[Any, int, ItemFailure]:
        """Check a map step (docs/contract.md#map): `items` an array or a template that renders one
        (at most MAX_MAP_ITEMS), max_parallel, on_item_failure."""
        if "items" not in raw:
            self.error(
                f"{path}.items",
                "items is required: an array, or a template such as "
                "{{ input.order.lines }} that renders one",
            )
        items = raw.get("items")
        if isinstance(items, list):
            if len(items) > MAX_MAP_ITEMS:
                self.error(
                    f"{path}.items",
                    f"{len(items)} items exceed the cap of {MAX_MAP_ITEMS} items per map",
                )
            else:
                self.templates(items, f"{path}.items", ancestors, secrets=False)
        elif isinstance(items, str):
            if "{{" not in items:
                self.error(f"{path}.items", "items must be an array or a template")
            else:
                self.templates(items, f"{path}.items", ancestors, secrets=False)
        elif "items" in raw:
            self.error(f"{path}.items", "items must be an array or a template")
        parallel: Any = raw.get("max_parallel", DEFAULT_MAP_PARALLEL)
        if not is_whole(parallel) or not 1 <= parallel <= MAX_MAP_PARALLEL:
            self.error(
                f"{path}.max_parallel",
                f"max_parallel must be an integer from 1 to {MAX_MAP_PARALLEL}",
            )
            parallel = DEFAULT_MAP_PARALLEL
        policy = self.choice(
            raw,
            "on_item_failure",
            ItemFailure.FAIL_FAST,
            path,
            'on_item_failure must be "fail_fast" or "collect"',
        )
        return items, parallel, policy
