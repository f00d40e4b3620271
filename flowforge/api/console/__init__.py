"""The operator console under /ui/ (docs/contract.md#console): server-rendered pages over the same
reads and actions as the API, signed in with an API key."""

from flowforge.api.console import notify_page
from flowforge.api.console.views import bp

notify_page.install(bp)

__all__ = ["bp"]
