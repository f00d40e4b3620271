"""The error root of FlowForge; HTTP mapping lives in the API layer."""

from __future__ import annotations


class FlowForgeError(Exception):
    """Something FlowForge refused or could not do."""


class NotFound(FlowForgeError):
    """The resource does not exist."""


class Conflict(FlowForgeError):
    """The request conflicts with the current state."""


class DatabaseUnavailable(FlowForgeError):
    """PostgreSQL cannot be reached right now."""


class BrokerUnavailable(FlowForgeError):
    """RabbitMQ cannot be reached right now."""
