"""The one error tree of FlowForge: whose fault it is decides how the API answers.

- `ClientError`: the request cannot be served as sent; it carries its HTTP status and
  problem title, and its message is safe to show the caller.
- `Unavailable`: a dependency or a piece of configuration the request needs is missing
  right now; a 503 with a fixed public detail (and Retry-After when waiting helps).
- anything else under `FlowForgeError` (configuration, migrations, templates rendered by
  the worker, outbound requests): a server fault, which the API logs and answers with a
  500 that names nothing.

The mapping to HTTP is done once, by class, in `flowforge.api.problems`. A class's
docstring is its default message (as in dramatiq's and procrastinate's error modules).
"""

from __future__ import annotations


class FlowForgeError(Exception):
    """Something FlowForge refused or could not do."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message if message is not None else _default_message(type(self)))


def _default_message(cls: type) -> str:
    return " ".join((cls.__doc__ or cls.__name__).split())


class ClientError(FlowForgeError):
    """The request cannot be served as sent."""

    status = 400
    title = "Bad request"
    errors: list[dict[str, str]] | None = None

    @property
    def extensions(self) -> dict[str, str]:
        """RFC 9457 extension members of the problem document beyond the standard ones."""
        return {}

    @property
    def detail(self) -> str:
        """What the problem document says; the message unless a subclass knows better."""
        return str(self)


class NotFound(ClientError):
    """The resource does not exist."""

    status = 404
    title = "Not found"


class Forbidden(ClientError):
    """This API key (or console session) may not do this."""

    status = 403
    title = "Forbidden"


class RoleRequired(Forbidden):
    """The key's role lacks what the route needs (docs/contract.md#roles); the problem
    document names the role in `required_role`, and the detail says it in words."""

    def __init__(self, required: str, held: str) -> None:
        super().__init__(f"this needs the {required} role; this API key is a {held}")
        self.required = required
        self.held = held

    @property
    def extensions(self) -> dict[str, str]:
        """RFC 9457 extension members of the problem document."""
        return {"required_role": self.required, "role": self.held}


class Conflict(ClientError):
    """The request conflicts with the current state."""

    status = 409
    title = "Conflict"


class InvalidRequest(ClientError):
    """A request's parameter or body is not what its route takes. Each refusal names its
    own title (the problem's `type` follows from it) and may list, in `errors`, each
    field at fault by its JSON path; the API renders it (flowforge/api/problems.py)."""

    def __init__(
        self, title: str, detail: str, *, errors: list[dict[str, str]] | None = None
    ) -> None:
        super().__init__(detail)
        self.title = title
        self.errors = errors


class InvalidParameter(InvalidRequest):
    """A query parameter, a path segment or the framing of a request is unusable."""

    status = 400


class InvalidBody(InvalidRequest):
    """A request body is well-formed JSON but breaks the route's rules."""

    status = 422


class UnsupportedMediaType(ClientError):
    """The body is not identity-encoded application/json."""

    status = 415
    title = "Unsupported media type"


class PayloadTooLarge(ClientError):
    """The body is larger than FLOWFORGE_MAX_BODY_BYTES."""

    status = 413
    title = "Payload too large"


class Unavailable(FlowForgeError):
    """The service cannot answer this request right now."""

    status = 503
    title = "Service unavailable"
    detail = "the service cannot answer right now; try again"
    # Seconds for Retry-After, or None when waiting does not help (the operator must act).
    retry_after: int | None = 5


class DatabaseUnavailable(Unavailable):
    """PostgreSQL cannot be reached right now."""

    detail = "the database cannot be reached; try again"


class DatabaseFull(DatabaseUnavailable):
    """PostgreSQL has no room left to write (SQLSTATE 53100, its disk is full): the
    database is reachable, and saying otherwise sends an operator to the network."""

    detail = "the database's disk is full: nothing was stored; try again later"
    retry_after = 30


class StatementCancelled(DatabaseUnavailable):
    """A statement ran past its statement_timeout and PostgreSQL cancelled it."""


class BrokerUnavailable(Unavailable):
    """RabbitMQ cannot be reached right now."""

    detail = "the message broker cannot be reached; try again"


class ConfigError(FlowForgeError):
    """A FLOWFORGE_* environment variable has an unusable value."""


class DatabaseError(FlowForgeError):
    """PostgreSQL refused a statement or a connection string (store/db.wrap_exceptions
    with every_error, for the command-line tools that report instead of crashing)."""


class SchemaMissing(DatabaseError):
    """This database has no FlowForge schema yet: run bin/migrate."""


class DatabaseExists(DatabaseError):
    """The database to create exists already."""
