"""The definition's own fields besides its steps and triggers: time limits
(docs/contract.md#deadline), retention (docs/contract.md#retention), the archive kept for
re-ingest, and the `input_schema` its webhooks' bodies must match
(flowforge/domain/inputschema.py)."""

from __future__ import annotations

from typing import Any

from flowforge.domain import inputschema
from flowforge.domain.definitions.bounds import (
    DEFAULT_RETENTION_DAYS,
    MAX_RETENTION_DAYS,
    MAX_TIME_LIMIT_S,
)
from flowforge.domain.definitions.checker import Checker
from flowforge.domain.jsonvalues import is_number


class DocumentSection(Checker):
    """`deadline_s`, `start_within_s`, `retention_days`, `archive_days`, `input_schema`."""

    def time_limit(self, doc: dict[str, Any], name: str) -> float | None:
        """Check a whole-execution time limit in seconds."""
        if name not in doc:
            return None
        value = doc[name]
        if not is_number(value) or not 0 < value <= MAX_TIME_LIMIT_S:
            self.error(f"$.{name}", f"{name} must be seconds in (0, {MAX_TIME_LIMIT_S}]")
            return None
        return float(value)

    def retention_days(self, doc: dict[str, Any]) -> float:
        """Check `retention_days`: how long finished executions are kept, in days."""
        if "retention_days" not in doc:
            return DEFAULT_RETENTION_DAYS
        value = doc["retention_days"]
        if not is_number(value) or not 0 < value <= MAX_RETENTION_DAYS:
            self.error(
                "$.retention_days",
                f"retention_days must be days in (0, {MAX_RETENTION_DAYS:.0f}], fractions allowed",
            )
            return DEFAULT_RETENTION_DAYS
        return float(value)

    def archive_days(self, doc: dict[str, Any]) -> float:
        """Check `archive_days`: how long accepted webhooks' raw requests are kept for
        re-ingest, in days; 0 (the default) archives nothing, so no body is stored that
        nobody asked to keep."""
        value = doc.get("archive_days", 0)
        if not is_number(value) or not 0 <= value <= MAX_RETENTION_DAYS:
            self.error(
                "$.archive_days",
                f"archive_days must be days in [0, {MAX_RETENTION_DAYS:.0f}] (0: no archive), "
                "fractions allowed",
            )
            return 0.0
        return float(value)

    def input_schema(self, doc: dict[str, Any]) -> Any:
        """Check `input_schema` (a JSON Schema 2020-12 the webhook bodies must match)."""
        if "input_schema" in doc:
            for problem in inputschema.problems(doc["input_schema"], "$.input_schema"):
                self.error(problem["path"], problem["message"])
        return doc.get("input_schema")
