"""The HTTP side of the `flowforge` CLI: each read and operator command as one API call, so
an operator needs an API key and a URL, never database access (docs/contract.md#remote-cli).

Every method returns the API's JSON answer. A problem+json answer becomes `ApiError`
(its title, detail and `errors[]`), a server that cannot be reached `ApiUnreachable`, and
so does anything a FlowForge API never answers (a redirect of a login proxy, an HTML page,
JSON that is not an object); nothing from `requests` leaks past this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

import requests

from flowforge.domain.model import ExecutionQuery
from flowforge.domain.operations import IN_PATH, Action, Answer
from flowforge.errors import FlowForgeError

EXECUTIONS = "/api/v1/executions"
WORKFLOWS = "/api/v1/workflows"
CIRCUITS = "/api/v1/circuits"
EVENTS = "/api/v1/events"
NOTIFICATIONS = "/api/v1/notifications"
FAILURE_GROUPS = "/api/v1/failure-groups"
# Long enough for a busy API (its own database wait is at most 5 s), short enough that a
# blackholed address is reported before an operator gives up on the command.
TIMEOUT_S = 15.0


class ApiError(FlowForgeError):
    """The API refused the request."""

    def __init__(
        self, status: int, title: str, detail: str, errors: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(f"{title}: {detail}")
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors or []


class ApiUnreachable(FlowForgeError):
    """The API did not answer, or what answered is not a FlowForge API."""


def _problem(response: requests.Response) -> ApiError:
    """The problem document of an error answer, or what can be said without one (a proxy's
    HTML 502, say)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "title" in body:
        errors = body.get("errors")
        return ApiError(
            response.status_code,
            str(body["title"]),
            str(body.get("detail", "")),
            errors if isinstance(errors, list) else None,
        )
    reason = response.reason or "error"
    return ApiError(response.status_code, f"HTTP {response.status_code}", reason)


class ApiClient:
    """One API base URL and one API key; methods named for the CLI commands they serve."""

    # Commands without an API endpoint (apikey) refuse this side (flowforge/cli/ops.py).
    remote = True

    def __init__(self, base_url: str, key: str, timeout_s: float = TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"
        self.session.headers["User-Agent"] = "flowforge-cli"

    def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        send_body: bool = False,
    ) -> requests.Response:
        """Send one request; an answer of 400 or above raises ApiError."""
        url = f"{self.base_url}{path}"
        try:
            response = self.session.request(
                method,
                url,
                params={k: v for k, v in (params or {}).items() if v is not None},
                json=body if send_body else None,
                timeout=self.timeout_s,
                allow_redirects=False,
            )
        except requests.exceptions.Timeout:
            raise ApiUnreachable(
                f"the API at {self.base_url} did not answer within {self.timeout_s:g} s"
            ) from None
        except requests.exceptions.ConnectionError as exc:
            raise ApiUnreachable(
                f"cannot connect to the API at {self.base_url}: {_reason(exc)}"
            ) from None
        except requests.exceptions.RequestException as exc:
            raise ApiUnreachable(f"cannot send to the API at {self.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise _problem(response)
        if not 200 <= response.status_code < 300:
            # The API never redirects: a proxy in front of it does (to a login page, to
            # https), and following it would send the API key elsewhere.
            where = response.headers.get("Location")
            to = f" to {where}" if where else ""
            raise ApiUnreachable(
                f"{url} answered {response.status_code}{to}: is this a FlowForge API? "
                "(set FLOWFORGE_API_URL to the API's own address)"
            )
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """The JSON object of a 2xx answer; anything else is not a FlowForge API's."""
        return self._object(path, self.call(method, path, **kwargs))

    def _object(self, path: str, response: requests.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ApiUnreachable(
                f"{self.base_url}{path} answered {response.status_code} without a JSON "
                "object: is this a FlowForge API?"
            )
        return body

    def _items(self, path: str, name: str) -> list[dict[str, Any]]:
        """The list `name` of a JSON answer."""
        items = self._json("GET", path).get(name)
        if not isinstance(items, list):
            raise ApiUnreachable(
                f"{self.base_url}{path} answered without {name!r}: is this a FlowForge API?"
            )
        return items

    # ---- executions ------------------------------------------------------------------

    def list_executions(self, query: ExecutionQuery) -> dict[str, Any]:
        """A page of executions, newest first (the API key's scope applies)."""
        params: dict[str, Any] = {
            "workflow": query.workflow,
            "status": query.status,
            "limit": query.limit,
            "cursor": query.cursor,
            "since": query.since.isoformat() if query.since else None,
            "until": query.until.isoformat() if query.until else None,
            # docs/contract.md#search-attributes: attr.NAME=VALUE, all of them.
            **{f"attr.{name}": value for name, value in query.attributes},
        }
        return dict(self._json("GET", EXECUTIONS, params=params))

    def execution(self, execution_id: str) -> dict[str, Any]:
        """One execution with its steps, attempts, history and flow-control state."""
        return dict(self._json("GET", f"{EXECUTIONS}/{execution_id}"))

    def act(self, action: Action, execution_id: str, values: Sequence[Any]) -> dict[str, Any]:
        """A declared action (flowforge/domain/operations.py) as its POST; its values in
        the order of its params (a step in the path, the rest in the body, left out when
        None); a cancel says `already_finished` (a 200, not a 202)."""
        step = ""
        body: dict[str, Any] = {}
        for param, value in zip(action.params, values, strict=True):
            if param.kind in IN_PATH:
                step = quote(value, safe="")
            elif value is not None:
                body[param.field] = value
        path = f"{EXECUTIONS}/{action.path(execution_id, step)}"
        if action.body is None:
            response = self.call("POST", path)
        else:
            response = self.call("POST", path, body=body, send_body=True)
        answer = self._object(path, response)
        if action.answer is Answer.CANCEL:
            answer["already_finished"] = response.status_code == 200
        return answer

    # ---- workflows and their signing secrets -----------------------------------------

    def replay(self, execution_id: str, from_step: str, version: int | None) -> dict[str, Any]:
        """Replay / fork from a step onto a version (None: the newest)."""
        body = {"from_step": from_step, "version": "latest" if version is None else version}
        path = f"{EXECUTIONS}/{execution_id}/replay"
        return dict(self._json("POST", path, body=body, send_body=True))

    def replay_bulk(self, body: dict[str, Any]) -> dict[str, Any]:
        """Bulk replay: a dry run (preview) or one confirmed batch."""
        return dict(self._json("POST", f"{EXECUTIONS}/replay", body=body, send_body=True))

    def pause_workflow(self, key: str) -> dict[str, Any]:
        """Pause a workflow: webhooks queue, nothing starts or continues."""
        return dict(self._json("POST", f"{WORKFLOWS}/{quote(key, safe='')}/pause"))

    def reingest(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        """Re-ingest archived webhooks of a range (one capped page), or count them."""
        return dict(
            self._json(
                "POST", f"{WORKFLOWS}/{quote(key, safe='')}/reingest", body=body, send_body=True
            )
        )

    def resume_workflow(self, key: str, onto: int | str | None = None) -> dict[str, Any]:
        """Resume a workflow: its paused executions in arrival order, then its queues;
        `onto` ("latest" or a number) re-pins its never-started executions first."""
        path = f"{WORKFLOWS}/{quote(key, safe='')}/resume"
        if onto is None:
            return dict(self._json("POST", path))
        return dict(self._json("POST", path, body={"onto": onto}, send_body=True))

    def circuits(self) -> list[dict[str, Any]]:
        """Limits whose circuit is open or half-open or that a Retry-After holds
        (docs/contract.md#circuits)."""
        return self._items(CIRCUITS, "circuits")

    def close_circuit(self, key: str, workflow: str | None = None) -> dict[str, Any]:
        """Close a limit's circuit and end its hold by hand."""
        path = f"{CIRCUITS}/{quote(key, safe='')}/close"
        if workflow is not None:
            path += f"?workflow={quote(workflow, safe='')}"
        return dict(self._json("POST", path))

    # ---- events (docs/contract.md#events) ------------------------------------------------

    def send_event(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send an event; its waits take it."""
        return self._json("POST", EVENTS, body=body, send_body=True)

    def events(self, name: str | None, key: str | None, limit: int) -> list[dict[str, Any]]:
        """The events kept, newest first."""
        query = {k: v for k, v in (("name", name), ("key", key)) if v is not None}
        path = f"{EVENTS}?{urlencode({**query, 'limit': limit})}"
        return self._items(path, "events")

    # ---- notifications (docs/contract.md#notifications) --------------------------------

    def notifications(self) -> list[dict[str, Any]]:
        """Every notification endpoint."""
        return self._items(NOTIFICATIONS, "endpoints")

    def notification(self, name: str) -> dict[str, Any]:
        """One endpoint and its delivery history."""
        return self._json("GET", f"{NOTIFICATIONS}/{quote(name, safe='')}")

    def subscribe(self, body: dict[str, Any]) -> dict[str, Any]:
        """A new endpoint, its signing secret in this answer only."""
        return self._json("POST", NOTIFICATIONS, body=body, send_body=True)

    def switch_notification(self, name: str, verb: str) -> dict[str, Any]:
        """Enable or disable an endpoint."""
        return self._json("POST", f"{NOTIFICATIONS}/{quote(name, safe='')}/{verb}")

    def rotate_notification(self, name: str, url: str | None) -> dict[str, Any]:
        """A new signing secret (in this answer only), or a Slack endpoint's new URL."""
        body = {} if url is None else {"url": url}
        path = f"{NOTIFICATIONS}/{quote(name, safe='')}/rotate"
        return self._json("POST", path, body=body, send_body=True)

    def unsubscribe(self, name: str) -> None:
        """Remove an endpoint."""
        self.call("DELETE", f"{NOTIFICATIONS}/{quote(name, safe='')}")

    def failure_groups(self, workflow: str | None, status: str | None) -> list[dict[str, Any]]:
        """Failure groups, newest first (docs/contract.md#failure-groups)."""
        query = {k: v for k, v in (("workflow", workflow), ("status", status)) if v}
        path = f"{FAILURE_GROUPS}?{urlencode(query)}" if query else FAILURE_GROUPS
        return self._items(path, "groups")

    def failure_group(self, group_id: int) -> dict[str, Any]:
        """One failure group and its newest executions."""
        return self._json("GET", f"{FAILURE_GROUPS}/{group_id}")

    def failure_group_status(self, group_id: int, verb: str) -> dict[str, Any]:
        """Resolve, ignore or reopen a group."""
        return self._json("POST", f"{FAILURE_GROUPS}/{group_id}/{verb}")

    def failure_group_act(self, group_id: int, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replay or retry one batch of a group's failed executions."""
        path = f"{FAILURE_GROUPS}/{group_id}/{verb}"
        return self._json("POST", path, body=body, send_body=True)

    def workflows(self) -> list[dict[str, Any]]:
        """The workflows the key may see."""
        return self._items(WORKFLOWS, "items")

    def workflow(self, key: str) -> dict[str, Any]:
        """One workflow with its versions."""
        return dict(self._json("GET", f"{WORKFLOWS}/{quote(key, safe='')}"))

    def version(self, key: str, version: int) -> dict[str, Any]:
        """One version with its definition."""
        return dict(self._json("GET", f"{WORKFLOWS}/{quote(key, safe='')}/versions/{version}"))

    def groups(self, key: str, status: str | None) -> dict[str, Any]:
        """The workflow's debounce or batch groups (docs/contract.md#debounce-batch), newest
        first."""
        path = f"{WORKFLOWS}/{quote(key, safe='')}/groups"
        return dict(self._json("GET", path, params={"status": status}))

    def publish(self, key: str, document: Any) -> dict[str, Any]:
        """Publish the next version; the API validates it."""
        path = f"{WORKFLOWS}/{quote(key, safe='')}/versions"
        return dict(self._json("POST", path, body=document, send_body=True))

    def check_draft(self, key: str, document: Any) -> dict[str, Any]:
        """The dry-run publish: what publishing would answer, with nothing published."""
        path = f"{WORKFLOWS}/{quote(key, safe='')}/check"
        return dict(self._json("POST", path, body=document, send_body=True))

    def create_secret(self, key: str) -> dict[str, Any]:
        """A new signing secret (its value is in this answer only), maybe with a warning."""
        return dict(self._json("POST", f"{WORKFLOWS}/{quote(key, safe='')}/webhook-secrets"))

    def secrets(self, key: str) -> list[dict[str, Any]]:
        """The workflow's signing secrets, without values."""
        path = f"{WORKFLOWS}/{quote(key, safe='')}/webhook-secrets"
        return self._items(path, "items")

    def revoke_secret(self, key: str, secret_id: int) -> None:
        """Revoke one signing secret."""
        self.call("DELETE", f"{WORKFLOWS}/{quote(key, safe='')}/webhook-secrets/{secret_id}")

    # ---- schedules -------------------------------------------------------------------

    def schedule(self, key: str) -> dict[str, Any]:
        """The schedule: next fire times and the recent ledger."""
        return dict(self._json("GET", f"{WORKFLOWS}/{quote(key, safe='')}/schedule"))

    def pause_schedule(self, key: str) -> dict[str, Any]:
        """Pause the schedule; answers the schedule."""
        return dict(self._json("POST", f"{WORKFLOWS}/{quote(key, safe='')}/schedule/pause"))

    def resume_schedule(self, key: str) -> dict[str, Any]:
        """Resume the schedule; answers the schedule."""
        return dict(self._json("POST", f"{WORKFLOWS}/{quote(key, safe='')}/schedule/resume"))

    def trigger_schedule(self, key: str) -> dict[str, Any]:
        """Fire a tick now; answers what became of it."""
        return dict(self._json("POST", f"{WORKFLOWS}/{quote(key, safe='')}/schedule/trigger"))

    def backfill_schedule(self, key: str, start: str, end: str, dry_run: bool) -> dict[str, Any]:
        """Fire (or, dry, list) the ticks of a past range that have not fired."""
        path = f"{WORKFLOWS}/{quote(key, safe='')}/schedule/backfill"
        body = {"from": start, "to": end, "dry_run": dry_run}
        return dict(self._json("POST", path, body=body, send_body=True))


def _reason(exc: requests.exceptions.ConnectionError) -> str:
    """The innermost cause, as one short phrase: `connection refused`, a DNS failure."""
    text = str(exc)
    for phrase in ("Connection refused", "Name or service not known", "No route to host"):
        if phrase in text:
            return phrase.lower()
    return text.splitlines()[0] if text else type(exc).__name__
