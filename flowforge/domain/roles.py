"""Roles of API keys and console users, and the access each route declares
(docs/contract.md#roles, docs/reference/security.md#roles).

A role is a rank: a viewer reads, an operator also acts on executions, an admin also
changes what runs (definitions, secrets, sources, notification endpoints, limits). A route
declares the one Access it needs (api/auth.requires); the key's workflow scope applies on
top, in the view, as before.
"""

from __future__ import annotations

from enum import Enum, StrEnum


class Role(StrEnum):
    """What an API key (and a console session signed in with it) may do; sql/0064's CHECK."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


# The order of the roles: each may do everything the one before it may.
RANKS = {Role.VIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}


class Access(Enum):
    """What a route needs; its value is the least role that has it (None: no key at all)."""

    PUBLIC = None  # webhooks, health, the OpenAPI document, the sign-in form: no key
    READ = Role.VIEWER  # every read: lists, details, pages
    OPERATE = Role.OPERATOR  # act on executions: cancel, retry, replay, resume, waits, pause
    ADMINISTER = Role.ADMIN  # publish, secrets, sources, notification endpoints, limits

    @property
    def role(self) -> Role | None:
        """The least role that has this access; None for a public route."""
        return self.value

    def allows(self, role: Role) -> bool:
        """Whether a key of this role may use a route that declares this access."""
        return self.value is None or RANKS[role] >= RANKS[self.value]


# What each role may do, in words, for `flowforge apikey create --help` and the docs.
CAN = {
    Role.VIEWER: "read executions, workflows, schedules, limits and settings",
    Role.OPERATOR: "a viewer's reads, and act on executions: cancel, retry, replay, "
    "resume, complete and fail waits, resolve, pause workflows and schedules, trigger, "
    "backfill, reingest, bulk actions",
    Role.ADMIN: "an operator's actions, and publish workflows, webhook secrets, sources, "
    "notification endpoints, close circuits",
}


def from_legacy(read_only: bool) -> Role:
    """The role of a key made the old way: read-only is a viewer, read-write an admin
    (it could publish and manage secrets), as sql/0064 backfilled existing keys."""
    return Role.VIEWER if read_only else Role.ADMIN
