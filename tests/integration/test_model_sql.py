"""The model and the schema speak the same words: each status set in flowforge/model.py is
exactly what the SQL CHECK constraints of the migrated database allow."""

from __future__ import annotations

import re
from enum import StrEnum

import psycopg
import pytest

from flowforge.model import (
    AttemptOutcome,
    CircuitState,
    ExecutionStatus,
    KeyOrigin,
    LimitReason,
    PauseReason,
    StepStatus,
    WebhookAuth,
)

CHECK_OF_COLUMN = """
SELECT pg_get_constraintdef(c.oid)
FROM pg_constraint c
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
WHERE c.contype = 'c' AND c.conrelid = %(table)s::regclass AND a.attname = %(column)s
"""


def allowed_values(db: psycopg.Connection, table: str, column: str) -> set[str]:
    """The literals of the one CHECK constraint on a column: `status IN ('a', 'b')`."""
    rows = db.execute(CHECK_OF_COLUMN, {"table": table, "column": column}).fetchall()
    assert len(rows) == 1, rows
    return set(re.findall(r"'([^']*)'::text", rows[0][0]))


@pytest.mark.parametrize(
    ("table", "column", "enum"),
    [
        ("executions", "status", ExecutionStatus),
        ("steps", "status", StepStatus),
        ("attempts", "outcome", AttemptOutcome),
        ("idempotency_keys", "origin", KeyOrigin),
        ("workflow_versions", "webhook_auth", WebhookAuth),
        ("executions", "pause_reason", PauseReason),
        ("limit_waits", "reason", LimitReason),
        ("outbound_limits", "circuit", CircuitState),
    ],
)
def test_check_constraint_lists_exactly_the_enum(
    db: psycopg.Connection, table: str, column: str, enum: type[StrEnum]
) -> None:
    assert allowed_values(db, table, column) == {member.value for member in enum}
