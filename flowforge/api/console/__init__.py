"""The operator console under /ui/ (docs/contract.md#console): server-rendered pages over the same
reads and actions as the API, signed in with an API key."""

from flowforge.api.console.views import bp

__all__ = ["bp"]
