"""Migration 0036 gives every outbound limit row, slot and wait its owner
(docs/reference/security.md, "Who owns a limit"): an operator's "host:NAME" becomes
('host', NAME); a definition's limit row, once shared by every workflow that rendered the
same name, is copied to each workflow with a step waiting for it or in flight through it,
its hold carried on."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable

import psycopg

from flowforge.store.migrate import discover
from tests.integration.test_migrate import empty_db  # noqa: F401  (fixture)

BEFORE = """
INSERT INTO workflows (id, key) VALUES (1, 'billing'), (2, 'refunds');
INSERT INTO workflow_versions (id, workflow_id, version, name, definition, webhook_auth)
VALUES (1, 1, 1, 'b', '{}', 'none'), (2, 2, 1, 'r', '{}', 'none');
INSERT INTO executions (id, workflow_id, version_id, status, input)
VALUES (%(b)s, 1, 1, 'running', '{}'), (%(r)s, 2, 2, 'running', '{}');
INSERT INTO outbound_limits (key, held_until, held_reason)
VALUES ('pay', now() + interval '1 hour', 'HTTP 429'), ('host:api.example.com', NULL, NULL),
       ('forgotten', NULL, NULL);
INSERT INTO limit_waits (execution_id, step_id, key, reason, wake_at)
VALUES (%(b)s, 'call', 'pay', 'held', now() + interval '1 hour'),
       (%(r)s, 'call', 'host:api.example.com', 'rate', now());
INSERT INTO outbound_slots (execution_id, step_id, key, until)
VALUES (%(r)s, 'call', 'pay', now() + interval '1 minute'),
       (%(r)s, 'other', 'host:api.example.com', now() + interval '1 minute');
"""


def test_0036_gives_every_limit_its_owner(empty_db: Callable[[], str]) -> None:  # noqa: F811
    url = empty_db()
    migrations = discover()
    at = next(i for i, m in enumerate(migrations) if m.version == "0036_limit_owners")

    def apply(upto: slice) -> None:
        for migration in migrations[upto]:
            command = ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(migration.path)]
            subprocess.run(command, check=True, capture_output=True)

    apply(slice(0, at))
    b, r = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in filter(str.strip, BEFORE.split(";\n")):
            conn.execute(statement, {"b": b, "r": r} if "%(" in statement else None)
    apply(slice(at, at + 1))
    with psycopg.connect(url, autocommit=True) as conn:
        limits = conn.execute(
            "SELECT owner, key, held_until IS NOT NULL FROM outbound_limits ORDER BY owner, key"
        ).fetchall()
        # Both workflows used "pay" (one waiting, one in flight): each gets its own copy.
        assert limits == [
            ("1", "pay", True),
            ("2", "pay", True),
            ("host", "api.example.com", False),
        ]
        waits = conn.execute("SELECT owner, key FROM limit_waits ORDER BY owner").fetchall()
        assert waits == [("1", "pay"), ("host", "api.example.com")]
        slots = conn.execute("SELECT owner, key FROM outbound_slots ORDER BY owner").fetchall()
        assert slots == [("2", "pay"), ("host", "api.example.com")]
