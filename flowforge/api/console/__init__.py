"""The operator console under /ui/ (docs/contract.md#console): server-rendered pages over the same
reads and actions as the API, signed in with an API key."""

from flowforge.api.console import approvals_page, live, notify_page, views, workflow_pages
from flowforge.api.console.site import bp

# The page modules register their routes on bp when imported; the notifications page by
# install, and so is the approvals page.
notify_page.install(bp)
approvals_page.install(bp)

__all__ = ["bp", "live", "views", "workflow_pages"]
