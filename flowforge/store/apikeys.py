"""Operator API keys: random, prefixed so they are greppable, stored only as SHA-256, each
with a role (flowforge/domain/roles.py) and optionally limited to some workflows."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg

from flowforge.domain.roles import Access, Role, from_legacy
from flowforge.errors import InvalidParameter, NotFound
from flowforge.store.db import one

PREFIX = "ff_"

INSERT_KEY = """
INSERT INTO api_keys (name, key_hash, key_prefix, workflows, role, publish_secrets)
VALUES (%(name)s, %(key_hash)s, %(key_prefix)s, %(workflows)s, %(role)s, %(publish_secrets)s)
RETURNING id
"""
LIST_KEYS = """
SELECT id, name, key_prefix, workflows, role, publish_secrets, created_at, last_used_at,
       revoked_at
FROM api_keys ORDER BY id
"""
REVOKE_KEY = "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = %(id)s"
# Looks a presented key up by its hash; touches last_used_at at most once a minute so
# reads do not turn into a write per request.
AUTHENTICATE = """
WITH found AS (
    SELECT id, name, workflows, role, publish_secrets, last_used_at FROM api_keys
    WHERE key_hash = %(key_hash)s AND revoked_at IS NULL
), touched AS (
    UPDATE api_keys SET last_used_at = now()
    WHERE id = (SELECT id FROM found)
      AND (last_used_at IS NULL OR last_used_at < now() - interval '60 seconds')
)
SELECT id, name, workflows, role, publish_secrets FROM found
"""


@dataclass(frozen=True)
class ApiKey:
    """A presented, valid key and what it may do."""

    id: int
    name: str
    workflows: tuple[str, ...] | None
    role: Role
    publish_secrets: bool = False  # may publish definitions that use {{ secrets.NAME }}

    @property
    def read_only(self) -> bool:
        """A viewer: reads only (what `read_only` meant before roles)."""
        return self.role is Role.VIEWER

    def may(self, access: Access) -> bool:
        """Whether this key's role has this access (docs/contract.md#roles)."""
        return access.allows(self.role)

    def allows(self, workflow: str | None, *, write: bool) -> bool:
        """Whether this key may read (or write) the given workflow: its scope, and a
        viewer never writes (the route's declared access checked the rest of the role)."""
        if write and self.read_only:
            return False
        return self.workflows is None or workflow is None or workflow in self.workflows

    def actor(self) -> dict[str, Any]:
        """Who acts, for an execution's history or a schedule's ledger (docs/contract.md#actors):
        this key, whether it came with an API request, a remote CLI call or a console session."""
        return {"kind": "api_key", "id": self.id, "name": self.name}


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def create(
    conn: psycopg.Connection,
    name: str,
    workflows: list[str] | None = None,
    read_only: bool = False,
    publish_secrets: bool = False,
    role: Role | str | None = None,
) -> tuple[int, str]:
    """Make a new key; the plain key exists only in the return value. Without a role, the
    old flags decide it (read_only: viewer, else admin), so older callers keep working."""
    chosen = role_of(role, read_only, publish_secrets)
    key = PREFIX + secrets.token_hex(32)
    (key_id,) = one(
        conn.execute(
            INSERT_KEY,
            {
                "name": name,
                "key_hash": _hash(key),
                "key_prefix": key[:10],
                "workflows": workflows,
                "role": chosen.value,
                "publish_secrets": publish_secrets,
            },
        )
    )
    return key_id, key


def list_keys(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every key, revoked ones included, never with its secret part."""
    columns = [
        "id",
        "name",
        "prefix",
        "workflows",
        "role",
        "publish_secrets",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    rows = [dict(zip(columns, row, strict=True)) for row in conn.execute(LIST_KEYS)]
    # read_only stays in the listing (derived from the role) for older readers.
    return [{**row, "read_only": row["role"] == Role.VIEWER} for row in rows]


def revoke(conn: psycopg.Connection, key_id: int) -> None:
    """Revoke a key; the next request that presents it is refused."""
    if conn.execute(REVOKE_KEY, {"id": key_id}).rowcount == 0:
        raise NotFound(f"API key {key_id} does not exist")


def authenticate(conn: psycopg.Connection, presented: str) -> ApiKey | None:
    """The key a bearer token stands for, or None."""
    if not presented.startswith(PREFIX):
        return None
    row = conn.execute(AUTHENTICATE, {"key_hash": _hash(presented)}).fetchone()
    if row is None:
        return None
    return from_row(row)


def from_row(row: tuple[Any, ...]) -> ApiKey:
    """The key of a (id, name, workflows, role, publish_secrets) row."""
    key_id, name, workflows, role, publish_secrets = row
    scope = tuple(workflows) if workflows is not None else None
    return ApiKey(key_id, name, scope, Role(role), publish_secrets)


def role_of(role: Role | str | None, read_only: bool, publish_secrets: bool) -> Role:
    """The role a new key gets: the one asked for, else the old flags' (read_only is a
    viewer); a role that contradicts read_only, or secrets without admin, is refused."""
    if role is None:
        chosen = from_legacy(read_only)
    else:
        try:
            chosen = Role(role)
        except ValueError:
            choices = ", ".join(Role)
            raise InvalidParameter("Invalid role", f"role must be one of {choices}") from None
        if read_only and chosen is not Role.VIEWER:
            raise InvalidParameter("Invalid role", "read_only means the viewer role")
    if publish_secrets and chosen is not Role.ADMIN:
        raise InvalidParameter("Invalid role", "publishing secrets needs the admin role")
    return chosen
