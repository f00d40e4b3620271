"""A thin HTTP client for the FlowForge API, used by tests that drive real processes."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import requests

from flowforge.domain.model import TERMINAL_EXECUTION, ExecutionStatus
from tests.support.processes import wait_for

# Settled: an execution stays so until someone acts; what tests wait for by default. The
# one definition in tests/ (tests/unit/test_settled_statuses.py holds the soak checker's
# copy to it), made of the model's own statuses as plain strings for SQL parameters.
TERMINAL = frozenset(
    status.value for status in (*TERMINAL_EXECUTION, ExecutionStatus.NEEDS_ATTENTION)
)

T = TypeVar("T")


def webhook(
    payload: Any, headers: dict[str, str] | None = None, raw: bytes | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a webhook as the tests send it: these exact bytes (`raw`),
    or the payload as JSON, as application/json unless `headers` say otherwise."""
    body = raw if raw is not None else json.dumps(payload).encode()
    return body, {"Content-Type": "application/json", **(headers or {})}


class Driver:
    """What a test does with FlowForge, whether it runs as processes (`Api`) or in the
    test's process (`inprocess.InProcess`): start an execution and wait for it. A driver
    says how it sends a webhook, reads an execution and waits on a condition."""

    def hook(self, workflow: str, payload: Any, **sent: Any) -> Any:
        raise NotImplementedError

    def execution(self, execution_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def until(self, condition: Callable[[], T | None], timeout: float, what: str) -> T:
        raise NotImplementedError

    def start(self, workflow: str, payload: Any, **sent: Any) -> str:
        r = self.hook(workflow, payload, **sent)
        assert r.status_code == 202, r.text
        return str(r.json()["execution_id"])

    def wait(
        self,
        execution_id: str,
        statuses: Collection[str] | str = TERMINAL,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Until the execution reaches one of `statuses` (settled, by default); return it."""
        wanted = {statuses} if isinstance(statuses, str) else set(statuses)

        def reached() -> dict[str, Any] | None:
            execution = self.execution(execution_id)
            return execution if execution["status"] in wanted else None

        return self.until(reached, timeout, f"execution {execution_id} to reach {sorted(wanted)}")


class Api(Driver):
    """Talks to a running bin/api with one API key."""

    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"

    def publish(self, workflow: str, definition: dict[str, Any]) -> dict[str, Any]:
        r = self.session.post(
            f"{self.base}/api/v1/workflows/{workflow}/versions", json=definition, timeout=10
        )
        assert r.status_code == 201, r.text
        return r.json()

    def hook(self, workflow: str, payload: Any, **sent: Any) -> requests.Response:
        """A webhook to `workflow` (`headers`, `raw` as in `webhook`), with no API key."""
        body, headers = webhook(payload, **sent)
        return requests.post(
            f"{self.base}/hooks/{workflow}", data=body, timeout=10, headers=headers
        )

    def start(self, workflow: str, payload: Any, **kwargs: Any) -> str:
        r = self.hook(workflow, payload, **kwargs)
        assert r.status_code == 202, r.text
        return r.json()["execution_id"]

    def execution(self, execution_id: str) -> dict[str, Any]:
        r = self.session.get(f"{self.base}/api/v1/executions/{execution_id}", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def text(self, path: str) -> str:
        """What a GET of `path` answers, as text (to search it, whatever its status)."""
        return self.session.get(f"{self.base}{path}", timeout=10).text

    def post(self, path: str, body: Any = None) -> requests.Response:
        return self.session.post(f"{self.base}{path}", json=body, timeout=10)

    def delete(self, path: str) -> requests.Response:
        return self.session.delete(f"{self.base}{path}", timeout=10)

    def until(self, condition: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll the running processes' answers until `condition` holds."""
        return wait_for(condition, timeout=timeout, interval=0.1, message=what)


def step(execution: dict[str, Any], step_id: str) -> dict[str, Any]:
    """One step of an execution document."""
    return next(s for s in execution["steps"] if s["id"] == step_id)
