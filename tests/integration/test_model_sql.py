"""The model and the schema speak the same words: every CHECK constraint of the migrated
database is held to the code. A closed set (`status IN ('a', 'b')`) is exactly one of the
enums or named sets of flowforge/domain/model.py; a pattern is the one the code matches with; any
other CHECK is listed here by name. A new CHECK fails until it is placed."""

from __future__ import annotations

import re
from collections.abc import Iterable

import psycopg
import pytest

from flowforge.domain.definitions.bounds import ATTRIBUTE_NAME
from flowforge.domain.model import (
    PAUSABLE,
    WORKFLOW_KEY,
    AttemptOutcome,
    CircuitState,
    DeliveryStatus,
    ExecutionStatus,
    FailureGroupStatus,
    FailureOutcome,
    GroupKind,
    GroupStatus,
    KeyOrigin,
    LedgerOutcome,
    LimitReason,
    NotifyShape,
    PauseReason,
    StepStatus,
    WebhookAuth,
)
from flowforge.domain.roles import Role
from flowforge.observe.tracing import format_traceparent

CHECKS = """
SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
FROM pg_constraint c
WHERE c.contype = 'c' AND c.connamespace = current_schema()::regnamespace
ORDER BY 1, 2
"""
# (table, column) of each closed-set CHECK: the values the code writes there.
CLOSED_SETS: dict[tuple[str, str], Iterable[str]] = {
    ("executions", "status"): ExecutionStatus,
    ("executions", "paused_from"): PAUSABLE,
    ("executions", "pause_reason"): PauseReason,
    ("steps", "status"): StepStatus,
    ("attempts", "outcome"): AttemptOutcome,
    ("idempotency_keys", "origin"): KeyOrigin,
    ("workflow_versions", "webhook_auth"): WebhookAuth,
    ("sources", "auth"): WebhookAuth,
    ("limit_waits", "reason"): LimitReason,
    ("outbound_limits", "circuit"): CircuitState,
    ("schedule_ticks", "outcome"): LedgerOutcome,
    ("intake_groups", "kind"): GroupKind,
    ("intake_groups", "status"): GroupStatus,
    ("notify_endpoints", "shape"): NotifyShape,
    ("notify_deliveries", "status"): DeliveryStatus,
    ("failure_groups", "status"): FailureGroupStatus,
    ("failure_groups", "outcome"): FailureOutcome,
    ("api_keys", "role"): Role,
}
# (table, column) of each pattern CHECK: the regular expression the code matches with.
PATTERNS: dict[tuple[str, str], str] = {
    ("workflows", "key"): WORKFLOW_KEY.pattern,
    ("sources", "name"): WORKFLOW_KEY.pattern,
    ("execution_attributes", "name"): ATTRIBUTE_NAME,
    # What tracing.format_traceparent writes (test_traceparents_fit_the_check).
    ("executions", "traceparent"): "00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}",
}
# Every other CHECK, by constraint name: shapes and bounds, not words of the domain.
STRUCTURAL = {
    "executions_priority_range",
    "sources_subscriptions_check",
    "webhook_secrets_one_form",
    "workflows_max_concurrency_check",
    "executions_parent_check",
    "outbound_limits_owner",
    "execution_attributes_value_check",
    "api_keys_secrets_need_admin",
}
_CLOSED = re.compile(r"CHECK \(\((\w+) = ANY \(ARRAY\[(.*)\]\)\)\)")
_PATTERN = re.compile(r"CHECK \(\((\w+) ~ '\^(.*)\$'::text\)\)")


@pytest.fixture
def checks(db: psycopg.Connection) -> list[tuple[str, str, str]]:
    return db.execute(CHECKS).fetchall()


def test_every_closed_set_check_lists_exactly_its_enum(
    checks: list[tuple[str, str, str]],
) -> None:
    found = {}
    for table, _, definition in checks:
        if match := _CLOSED.fullmatch(definition):
            column, values = match.groups()
            found[(table, column)] = set(re.findall(r"'([^']*)'::text", values))
    assert set(found) == set(CLOSED_SETS), "place each closed-set CHECK in CLOSED_SETS"
    for place, values in CLOSED_SETS.items():
        assert found[place] == {str(value) for value in values}, place


def test_every_pattern_check_is_the_codes_pattern(checks: list[tuple[str, str, str]]) -> None:
    found = {}
    for table, _, definition in checks:
        if match := _PATTERN.fullmatch(definition):
            column, pattern = match.groups()
            found[(table, column)] = pattern
    assert found == PATTERNS


def test_every_other_check_is_listed(checks: list[tuple[str, str, str]]) -> None:
    other = {
        name
        for _, name, definition in checks
        if not _CLOSED.fullmatch(definition) and not _PATTERN.fullmatch(definition)
    }
    assert other == STRUCTURAL


def test_traceparents_fit_the_check() -> None:
    pattern = re.compile(PATTERNS[("executions", "traceparent")])
    for ids in ((1, 1, 1), (2**128 - 1, 2**64 - 1, 0)):
        assert pattern.fullmatch(format_traceparent(*ids))
