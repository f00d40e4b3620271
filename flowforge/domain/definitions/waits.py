"""A wait step's own fields: how long it waits for a resume, what its timeout does, how
resumes prove who sent them."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions.bounds import MAX_WAIT_S
from flowforge.domain.definitions.checker import Checker
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
        on_timeout = self.choice(
            raw, "on_timeout", OnTimeout.FAIL, path, 'on_timeout must be "fail" or "continue"'
        )
        auth = self.choice(
            raw,
            "auth",
            ResumeAuth.TOKEN,
            path,
            'auth must be "token" (the resume URL alone) or "signature" (also signed'
            " with the workflow's webhook secret)",
        )
        return timeout_s, on_timeout, auth
