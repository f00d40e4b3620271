"""The console's operator actions: the one place it calls flowforge.actions, each call
recorded in the execution's history with the signed-in key as its actor."""

from __future__ import annotations

from typing import Any

import psycopg

from flowforge import actions
from flowforge.apikeys import ApiKey


def cancel(conn: psycopg.Connection, key: ApiKey, execution_id: str) -> str:
    """Cancel an execution (a finished one is left as it is)."""
    status, _was_terminal = actions.cancel(conn, execution_id, actor=key.actor())
    return status


def retry(conn: psycopg.Connection, key: ApiKey, execution_id: str) -> str:
    """Re-run the failed and cancelled steps of a finished execution."""
    return actions.retry(conn, execution_id, actor=key.actor())


def resolve(
    conn: psycopg.Connection,
    key: ApiKey,
    execution_id: str,
    step_id: str,
    outcome: str,
    output: Any,
) -> str:
    """Settle a step whose outcome is unknown as succeeded (with output) or failed."""
    return actions.resolve(conn, execution_id, step_id, outcome, output, actor=key.actor())


def complete_wait(
    conn: psycopg.Connection, key: ApiKey, execution_id: str, step_id: str, output: Any
) -> str:
    """End a waiting wait step with `output`, as a resume would."""
    return actions.complete_wait(conn, execution_id, step_id, output, actor=key.actor())


def fail_wait(conn: psycopg.Connection, key: ApiKey, execution_id: str, step_id: str) -> str:
    """Fail a waiting wait step: the answer is no."""
    return actions.fail_wait(conn, execution_id, step_id, actor=key.actor())
