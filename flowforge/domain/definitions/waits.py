"""A wait step's own fields: how long it waits for a resume, what its timeout does, how
resumes prove who sent them."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions.bounds import MAX_WAIT_S
from flowforge.domain.definitions.checker import Checker
from flowforge.domain.definitions.shapes import ON_TIMEOUT, RESUME_AUTH
from flowforge.domain.jsonvalues import is_number
from flowforge.domain.model import OnTimeout, ResumeAuth


class WaitSection(Checker):
    """`timeout_s`, `on_timeout`, `auth`."""

    def wait(self, raw: dict[str, Any], path: str) -> tuple[float | None, OnTimeout, ResumeAuth]:
        """Check a wait step: a bounded timeout, what the timeout does, how resumes prove
        themselves."""
        timeout_s: Any = raw.get("timeout_s")
        if not is_number(timeout_s) or not 0 < timeout_s <= MAX_WAIT_S:
            self.error(
                f"{path}.timeout_s",
                f"timeout_s is required: a number of seconds with 0 < timeout_s <= {MAX_WAIT_S}",
            )
            timeout_s = None
        on_timeout: Any = raw.get("on_timeout", "fail")
        if on_timeout not in ON_TIMEOUT:
            self.error(f"{path}.on_timeout", 'on_timeout must be "fail" or "continue"')
            on_timeout = OnTimeout.FAIL
        auth: Any = raw.get("auth", "token")
        if auth not in RESUME_AUTH:
            self.error(
                f"{path}.auth",
                'auth must be "token" (the resume URL alone) or "signature" (also signed'
                " with the workflow's webhook secret)",
            )
            auth = ResumeAuth.TOKEN
        return timeout_s, OnTimeout(on_timeout), ResumeAuth(auth)
