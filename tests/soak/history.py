"""What the randomized run did, written down as it happens: every API answer, every fault
and every operator action. The checker judges the run from this history, the target's
log and the database — never from what the harness assumed would happen."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests

# Generous: the API is never faulted, so a request that gets no answer in this time is news.
API_TIMEOUT_S = 30.0


@dataclass
class ApiCall:
    """One HTTP exchange with a bin/api process (status None: no answer at all)."""

    at: float
    who: str
    method: str
    url: str
    status: int | None
    error: str | None = None
    body: str | None = None  # kept for 5xx answers only, to debug them


@dataclass
class OperatorAction:
    """A cancel, retry or resolve the nemesis issued, with what it saw just before."""

    at: float
    # time.time() before the snapshot below was read: from here on the step was settled,
    # so no request for it was legitimately in flight (compared with the target's log).
    wall: float
    action: str
    execution_id: str
    status: int | None
    step_id: str | None = None
    outcome: str | None = None
    # Step statuses read through the API right before the action: the checker counts a
    # re-sent unsafe request as asked for only when its step was failed or unknown here.
    steps_before: dict[str, str] = field(default_factory=dict)
    # time.time() once the answer came: a pause is in force from here on.
    answered: float | None = None
    # What the action made (a replay's new executions), or other detail.
    made: list[str] = field(default_factory=list)


@dataclass
class Fault:
    """One nemesis event: a fault starting, or its heal."""

    at: float
    op: str
    target: str
    detail: str = ""


class History:
    """Thread-safe lists of what happened, mirrored to history.jsonl for debugging."""

    def __init__(self, path: Path) -> None:
        self.started = time.monotonic()
        self.wall_started = time.time()  # the target stamps requests with wall time
        self.calls: list[ApiCall] = []
        self.actions: list[OperatorAction] = []
        self.faults: list[Fault] = []
        self._lock = threading.Lock()
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def now(self) -> float:
        """Seconds since the run started (the clock every record uses)."""
        return round(time.monotonic() - self.started, 3)

    def _write(self, kind: str, record: Any) -> None:
        self._file.write(json.dumps({"kind": kind, **asdict(record)}) + "\n")
        self._file.flush()

    def call(self, record: ApiCall) -> None:
        with self._lock:
            self.calls.append(record)
            self._write("api", record)

    def action(self, record: OperatorAction) -> None:
        with self._lock:
            self.actions.append(record)
            self._write("operator", record)

    def fault(self, op: str, target: str, detail: str = "") -> None:
        with self._lock:
            record = Fault(self.now(), op, target, detail)
            self.faults.append(record)
            self._write("fault", record)

    def close(self) -> None:
        with self._lock:
            self._file.close()


class RecordingClient:
    """requests against the API processes; every answer (or its absence) goes to History.

    One requests.Session per thread: sessions are not thread-safe.
    """

    def __init__(self, history: History, api_key: str) -> None:
        self.history = history
        self.api_key = api_key
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session

    def request(
        self,
        who: str,
        method: str,
        url: str,
        *,
        auth: bool = True,
        **kwargs: Any,
    ) -> requests.Response | None:
        """Send one request; None when no answer came (recorded as such)."""
        headers = dict(kwargs.pop("headers", None) or {})
        if auth:
            headers["Authorization"] = f"Bearer {self.api_key}"
        at = self.history.now()
        try:
            response = self._session().request(
                method, url, headers=headers, timeout=API_TIMEOUT_S, **kwargs
            )
        except requests.RequestException as exc:
            self.history.call(ApiCall(at, who, method, url, None, error=repr(exc)[:300]))
            return None
        body = response.text[:2000] if response.status_code >= 500 else None
        self.history.call(ApiCall(at, who, method, url, response.status_code, body=body))
        return response
