"""FlowForge's HTTP API client, generated from /openapi.json by clientgen.py.

Do not edit: regenerate with `python -m flowforge.api.clientgen > flowforge/api/client.py`.
Every method answers the decoded JSON body (text for text/plain, None when empty) of a
status the document lists as success, and raises ApiError with the problem details of
any other.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import requests

_NO_BODY = object()


def _path(template: str, **values: Any) -> str:
    """The path with each {name} replaced by its value, percent-encoded."""
    for name, value in values.items():
        template = template.replace(f"{{{name}}}", quote(str(value), safe=""))
    return template


class ApiError(Exception):
    """An answer outside the operation's documented successes: `problem` is its RFC 9457
    body (or {} when it had none)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status}: {problem.get('detail') or problem.get('title') or ''}")
        self.status = status
        self.problem = problem


class Client:
    """One FlowForge API at `base_url`; `api_key` for the management endpoints."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        if api_key is not None:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _call(
        self,
        method: str,
        path: str,
        expected: tuple[int, ...],
        *,
        query: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        body: Any = _NO_BODY,
    ) -> Any:
        sent = {k: str(v) for k, v in (headers or {}).items() if v is not None}
        data = None
        if body is not _NO_BODY:  # JSON null included
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        response = self.session.request(
            method,
            self.base_url + path,
            params={k: v for k, v in (query or {}).items() if v is not None},
            headers=sent,
            data=data,
            timeout=self.timeout,
            # A redirect is no FlowForge answer: followed, a 307/308 would re-send the
            # body (a secret) to the Location's origin (docs/reference/security.md).
            allow_redirects=False,
        )
        if response.status_code not in expected:
            try:
                problem = response.json()
            except ValueError:
                problem = {}
            raise ApiError(response.status_code, problem if isinstance(problem, dict) else {})
        if not response.content:
            return None
        if response.headers.get("Content-Type", "").startswith("text/"):
            return response.text
        return response.json()

    def post_hooks_by_key(
        self,
        key: str,
        body: Any,
        *,
        webhook_id: Any = None,
        webhook_timestamp: Any = None,
        webhook_signature: Any = None,
        idempotency_key: Any = None,
    ) -> Any:
        """POST /hooks/{key}: Start an execution of the workflow's newest version; for a
        source's name, one per matching subscription (202 lists them as executions[]);
        for a workflow with trigger.webhook.debounce or .batch, record the event in its
        group (202 status grouped, with the group and the execution it was recorded
        against; Location names the group)
        """
        return self._call(
            "POST",
            _path(
                "/hooks/{key}",
                key=key,
            ),
            (200, 202),
            headers={
                "webhook-id": webhook_id,
                "webhook-timestamp": webhook_timestamp,
                "webhook-signature": webhook_signature,
                "Idempotency-Key": idempotency_key,
            },
            body=body,
        )

    def post_hooks_resume_by_token(
        self,
        token: str,
        body: Any,
        *,
        webhook_id: Any = None,
        webhook_timestamp: Any = None,
        webhook_signature: Any = None,
        idempotency_key: Any = None,
    ) -> Any:
        """POST /hooks/resume/{token}: Resume a waiting wait step with the JSON body as its
        output
        """
        return self._call(
            "POST",
            _path(
                "/hooks/resume/{token}",
                token=token,
            ),
            (200, 202),
            headers={
                "webhook-id": webhook_id,
                "webhook-timestamp": webhook_timestamp,
                "webhook-signature": webhook_signature,
                "Idempotency-Key": idempotency_key,
            },
            body=body,
        )

    def get_workflows(self) -> Any:
        """GET /api/v1/workflows: Workflows the API key may see, each with its newest
        version
        """
        return self._call(
            "GET",
            "/api/v1/workflows",
            (200,),
        )

    def get_me(self) -> Any:
        """GET /api/v1/me: The calling API key: its role, workflow scope and secrets grant"""
        return self._call(
            "GET",
            "/api/v1/me",
            (200,),
        )

    def get_workflows_by_key(
        self,
        key: str,
    ) -> Any:
        """GET /api/v1/workflows/{key}: One workflow and its versions"""
        return self._call(
            "GET",
            _path(
                "/api/v1/workflows/{key}",
                key=key,
            ),
            (200,),
        )

    def post_workflows_by_key_versions(
        self,
        key: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/workflows/{key}/versions: Publish the next immutable version (409
        when the key is a source's name)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/versions",
                key=key,
            ),
            (201,),
            body=body,
        )

    def post_workflows_by_key_check(
        self,
        key: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/workflows/{key}/check: Check a draft definition as publishing
        would, publishing nothing: 200 with its changes against the newest version and
        its steps, or the 422 publishing answers
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/check",
                key=key,
            ),
            (200,),
            body=body,
        )

    def get_workflows_by_key_versions_by_version(
        self,
        key: str,
        version: int,
    ) -> Any:
        """GET /api/v1/workflows/{key}/versions/{version}: One immutable version, with its
        definition
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/workflows/{key}/versions/{version}",
                key=key,
                version=version,
            ),
            (200,),
        )

    def post_workflows_by_key_webhook_secrets(
        self,
        key: str,
        *,
        body: Any = _NO_BODY,
    ) -> Any:
        """POST /api/v1/workflows/{key}/webhook-secrets: Create a signing secret (shown
        once; at most two active), or store a provider's secret sent as {"value": "..."}
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/webhook-secrets",
                key=key,
            ),
            (201,),
            body=body,
        )

    def get_workflows_by_key_webhook_secrets(
        self,
        key: str,
    ) -> Any:
        """GET /api/v1/workflows/{key}/webhook-secrets: The workflow's signing secrets,
        without their values
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/workflows/{key}/webhook-secrets",
                key=key,
            ),
            (200,),
        )

    def delete_workflows_by_key_webhook_secrets_by_secret_id(
        self,
        key: str,
        secret_id: int,
    ) -> Any:
        """DELETE /api/v1/workflows/{key}/webhook-secrets/{secret_id}: Revoke a signing
        secret
        """
        return self._call(
            "DELETE",
            _path(
                "/api/v1/workflows/{key}/webhook-secrets/{secret_id}",
                key=key,
                secret_id=secret_id,
            ),
            (204,),
        )

    def get_workflows_by_key_schedule(
        self,
        key: str,
    ) -> Any:
        """GET /api/v1/workflows/{key}/schedule: The schedule: next 10 fire times (its zone
        and UTC) and the last 100 ledger rows
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/workflows/{key}/schedule",
                key=key,
            ),
            (200,),
        )

    def get_workflows_by_key_groups(
        self,
        key: str,
        *,
        status: Any = None,
    ) -> Any:
        """GET /api/v1/workflows/{key}/groups: The workflow's debounce or batch groups,
        newest first (at most 100); ?status=open for those still gathering events
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/workflows/{key}/groups",
                key=key,
            ),
            (200,),
            query={
                "status": status,
            },
        )

    def get_workflows_by_key_groups_by_group_id(
        self,
        key: str,
        group_id: int,
    ) -> Any:
        """GET /api/v1/workflows/{key}/groups/{group_id}: One debounce or batch group with
        its first 100 events
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/workflows/{key}/groups/{group_id}",
                key=key,
                group_id=group_id,
            ),
            (200,),
        )

    def post_workflows_by_key_pause(
        self,
        key: str,
    ) -> Any:
        """POST /api/v1/workflows/{key}/pause: Pause the workflow: webhooks are still
        accepted and queue (max_queued and start_within_s apply); nothing of it starts
        or continues until resumed
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/pause",
                key=key,
            ),
            (200,),
        )

    def post_workflows_by_key_reingest(
        self,
        key: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/workflows/{key}/reingest: Re-ingest archived webhooks of a range as
        new executions of the newest version (system keys reingest:<delivery id>; at
        most limit per call, follow next), or count them with dry_run
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/reingest",
                key=key,
            ),
            (200,),
            body=body,
        )

    def post_workflows_by_key_resume(
        self,
        key: str,
        *,
        body: Any = _NO_BODY,
    ) -> Any:
        """POST /api/v1/workflows/{key}/resume: Resume the workflow: its paused executions
        in arrival order, then its queues through flow control. With a body {onto}, its
        executions that never started a step are first re-pinned onto that version (409
        unless the workflow is paused)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/resume",
                key=key,
            ),
            (200,),
            body=body,
        )

    def post_workflows_by_key_schedule_pause(
        self,
        key: str,
    ) -> Any:
        """POST /api/v1/workflows/{key}/schedule/pause: Pause: due ticks are ledgered
        paused and do not fire (idempotent)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/schedule/pause",
                key=key,
            ),
            (200,),
        )

    def post_workflows_by_key_schedule_resume(
        self,
        key: str,
    ) -> Any:
        """POST /api/v1/workflows/{key}/schedule/resume: Resume: ticks fire again from now
        on (idempotent)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/schedule/resume",
                key=key,
            ),
            (200,),
        )

    def post_workflows_by_key_schedule_trigger(
        self,
        key: str,
    ) -> Any:
        """POST /api/v1/workflows/{key}/schedule/trigger: Fire a tick now, under the
        overlap policy
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/schedule/trigger",
                key=key,
            ),
            (200, 201),
        )

    def post_workflows_by_key_schedule_backfill(
        self,
        key: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/workflows/{key}/schedule/backfill: Fire the ticks of a past range
        that have not fired (at most 1000; dry run lists)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/workflows/{key}/schedule/backfill",
                key=key,
            ),
            (200,),
            body=body,
        )

    def get_executions(
        self,
        *,
        workflow: Any = None,
        status: Any = None,
        limit: Any = None,
        cursor: Any = None,
        since: Any = None,
        until: Any = None,
        attr: Any = None,
    ) -> Any:
        """GET /api/v1/executions: Executions, newest first (keyset pagination)"""
        return self._call(
            "GET",
            "/api/v1/executions",
            (200,),
            query={
                "workflow": workflow,
                "status": status,
                "limit": limit,
                "cursor": cursor,
                "since": since,
                "until": until,
                **{f"attr.{k}": v for k, v in (attr or {}).items()},
            },
        )

    def get_executions_by_id(
        self,
        id: str,
    ) -> Any:
        """GET /api/v1/executions/{id}: The execution with its steps, every attempt and its
        event history
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/executions/{id}",
                id=id,
            ),
            (200,),
        )

    def get_circuits(self) -> Any:
        """GET /api/v1/circuits: Outbound limits with an open or half-open circuit or a
        Retry-After hold in force; a key scoped to workflows sees only theirs
        """
        return self._call(
            "GET",
            "/api/v1/circuits",
            (200,),
        )

    def post_circuits_by_key_close(
        self,
        key: str,
        *,
        workflow: Any = None,
    ) -> Any:
        """POST /api/v1/circuits/{key}/close: Close a limit's circuit and end its hold by
        hand; its waiting steps go at once (a workflow's own limit: a key that may write
        it; host: and shared: limits: a key for every workflow)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/circuits/{key}/close",
                key=key,
            ),
            (200,),
            query={
                "workflow": workflow,
            },
        )

    def post_executions_by_id_replay(
        self,
        id: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/executions/{id}/replay: Replay / fork from a step onto a version:
        the steps upstream keep their recorded outputs and are never re-run or re-sent
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/replay",
                id=id,
            ),
            (201,),
            body=body,
        )

    def post_executions_replay(
        self,
        body: Any,
    ) -> Any:
        """POST /api/v1/executions/replay: Bulk replay by filter: a dry run previews the
        count and the upto; a call with that upto replays one batch, oldest first
        """
        return self._call(
            "POST",
            "/api/v1/executions/replay",
            (200,),
            body=body,
        )

    def get_executions_by_id_steps_by_step_items(
        self,
        id: str,
        step: str,
        *,
        status: Any = None,
        after: Any = None,
        limit: Any = None,
    ) -> Any:
        """GET /api/v1/executions/{id}/steps/{step}/items: A page of a map step's items:
        counts by status, then items in index order
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/executions/{id}/steps/{step}/items",
                id=id,
                step=step,
            ),
            (200,),
            query={
                "status": status,
                "after": after,
                "limit": limit,
            },
        )

    def get_healthz(self) -> Any:
        """GET /healthz: Liveness: the process answers"""
        return self._call(
            "GET",
            "/healthz",
            (200,),
        )

    def get_readyz(self) -> Any:
        """GET /readyz: Readiness: the database answers"""
        return self._call(
            "GET",
            "/readyz",
            (200,),
        )

    def get_metrics(self) -> Any:
        """GET /metrics: Prometheus metrics"""
        return self._call(
            "GET",
            "/metrics",
            (200,),
        )

    def post_sources_by_name(
        self,
        name: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/sources/{name}: Create or replace a source: one /hooks/{name}
        routed to several workflows; a name that is a workflow key is refused (409)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/sources/{name}",
                name=name,
            ),
            (200,),
            body=body,
        )

    def get_sources_by_name(
        self,
        name: str,
    ) -> Any:
        """GET /api/v1/sources/{name}: One source: auth, subscriptions, revision, active
        secret ids
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/sources/{name}",
                name=name,
            ),
            (200,),
        )

    def post_sources_by_name_webhook_secrets(
        self,
        name: str,
    ) -> Any:
        """POST /api/v1/sources/{name}/webhook-secrets: Add a signing secret to a source
        ({"value": ...}, or none to have one made)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/sources/{name}/webhook-secrets",
                name=name,
            ),
            (201,),
        )

    def delete_sources_by_name_webhook_secrets_by_secret_id(
        self,
        name: str,
        secret_id: int,
    ) -> Any:
        """DELETE /api/v1/sources/{name}/webhook-secrets/{secret_id}: Revoke a source's
        signing secret
        """
        return self._call(
            "DELETE",
            _path(
                "/api/v1/sources/{name}/webhook-secrets/{secret_id}",
                name=name,
                secret_id=secret_id,
            ),
            (204,),
        )

    def get_openapi_json(self) -> Any:
        """GET /openapi.json: This document"""
        return self._call(
            "GET",
            "/openapi.json",
            (200,),
        )

    def post_executions_by_id_cancel(
        self,
        id: str,
    ) -> Any:
        """POST /api/v1/executions/{id}/cancel: Cancel: 202 while work is stopping, 200
        once terminal
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/cancel",
                id=id,
            ),
            (200, 202),
        )

    def post_executions_by_id_retry(
        self,
        id: str,
    ) -> Any:
        """POST /api/v1/executions/{id}/retry: Re-run failed and cancelled steps, reusing
        every checkpoint; unknown stays unknown
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/retry",
                id=id,
            ),
            (202,),
        )

    def post_executions_by_id_pause(
        self,
        id: str,
    ) -> Any:
        """POST /api/v1/executions/{id}/pause: Pause: nothing of it starts or continues; a
        request in flight finishes
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/pause",
                id=id,
            ),
            (200,),
        )

    def post_executions_by_id_resume(
        self,
        id: str,
    ) -> Any:
        """POST /api/v1/executions/{id}/resume: Resume a paused execution; a step whose
        tries ran out runs again
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/resume",
                id=id,
            ),
            (200,),
        )

    def post_executions_by_id_fail(
        self,
        id: str,
    ) -> Any:
        """POST /api/v1/executions/{id}/fail: Fail an execution paused at a step whose
        tries ran out (retry.on_exhausted pause)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/fail",
                id=id,
            ),
            (200,),
        )

    def post_executions_by_id_steps_by_step_resolve(
        self,
        id: str,
        step: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/executions/{id}/steps/{step}/resolve: Settle a step whose remote
        effect is unknown (a map item's step too)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/steps/{step}/resolve",
                id=id,
                step=step,
            ),
            (200,),
            body=body,
        )

    def post_executions_by_id_steps_by_step_complete(
        self,
        id: str,
        step: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/executions/{id}/steps/{step}/complete: End a waiting wait step as a
        resume would, recorded with the API key
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/steps/{step}/complete",
                id=id,
                step=step,
            ),
            (200,),
            body=body,
        )

    def post_executions_by_id_steps_by_step_fail(
        self,
        id: str,
        step: str,
    ) -> Any:
        """POST /api/v1/executions/{id}/steps/{step}/fail: Fail a waiting wait step (and so
        its execution), recorded with the API key
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/executions/{id}/steps/{step}/fail",
                id=id,
                step=step,
            ),
            (200,),
        )

    def get_notifications(self) -> Any:
        """GET /api/v1/notifications: Notification endpoints (a key for every workflow)"""
        return self._call(
            "GET",
            "/api/v1/notifications",
            (200,),
        )

    def post_notifications(
        self,
        body: Any,
    ) -> Any:
        """POST /api/v1/notifications: Subscribe an endpoint to event kinds; the answer
        shows its whsec_ signing secret once
        """
        return self._call(
            "POST",
            "/api/v1/notifications",
            (201,),
            body=body,
        )

    def get_notifications_by_name(
        self,
        name: str,
    ) -> Any:
        """GET /api/v1/notifications/{name}: One endpoint and its newest 50 messages
        (delivery history)
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/notifications/{name}",
                name=name,
            ),
            (200,),
        )

    def delete_notifications_by_name(
        self,
        name: str,
    ) -> Any:
        """DELETE /api/v1/notifications/{name}: Remove an endpoint and its history"""
        return self._call(
            "DELETE",
            _path(
                "/api/v1/notifications/{name}",
                name=name,
            ),
            (204,),
        )

    def post_notifications_by_name_rotate(
        self,
        name: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/notifications/{name}/rotate: A new whsec_ signing secret, shown
        once (standard), or a Slack endpoint's new URL; the old one stops at once (409:
        the other one for this shape)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/notifications/{name}/rotate",
                name=name,
            ),
            (200,),
            body=body,
        )

    def post_notifications_by_name_enable(
        self,
        name: str,
    ) -> Any:
        """POST /api/v1/notifications/{name}/enable: Enable an endpoint again (a 410 or
        long failure disabled it)
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/notifications/{name}/enable",
                name=name,
            ),
            (200,),
        )

    def post_notifications_by_name_disable(
        self,
        name: str,
    ) -> Any:
        """POST /api/v1/notifications/{name}/disable: Disable an endpoint; what waited for
        it is dropped
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/notifications/{name}/disable",
                name=name,
            ),
            (200,),
        )

    def get_approvals(
        self,
        *,
        assignee: Any = None,
    ) -> Any:
        """GET /api/v1/approvals: Open approvals (wait steps with a form), soonest to
        expire first
        """
        return self._call(
            "GET",
            "/api/v1/approvals",
            (200,),
            query={
                "assignee": assignee,
            },
        )

    def post_approvals_by_id_by_step(
        self,
        id: str,
        step: str,
        body: Any,
    ) -> Any:
        """POST /api/v1/approvals/{id}/{step}: Approve (the form's values) or reject an
        open approval; an operator action
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/approvals/{id}/{step}",
                id=id,
                step=step,
            ),
            (200,),
            body=body,
        )

    def get_failure_groups(
        self,
        *,
        workflow: Any = None,
        status: Any = None,
        limit: Any = None,
    ) -> Any:
        """GET /api/v1/failure-groups: Failure groups, the most recently seen first"""
        return self._call(
            "GET",
            "/api/v1/failure-groups",
            (200,),
            query={
                "workflow": workflow,
                "status": status,
                "limit": limit,
            },
        )

    def get_failure_groups_by_group_id(
        self,
        group_id: int,
    ) -> Any:
        """GET /api/v1/failure-groups/{group_id}: One failure group with its newest
        executions
        """
        return self._call(
            "GET",
            _path(
                "/api/v1/failure-groups/{group_id}",
                group_id=group_id,
            ),
            (200,),
        )

    def post_failure_groups_by_group_id_resolve(
        self,
        group_id: int,
    ) -> Any:
        """POST /api/v1/failure-groups/{group_id}/resolve: Resolve a group: its next
        failure reopens it and alerts once
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/failure-groups/{group_id}/resolve",
                group_id=group_id,
            ),
            (200,),
        )

    def post_failure_groups_by_group_id_ignore(
        self,
        group_id: int,
    ) -> Any:
        """POST /api/v1/failure-groups/{group_id}/ignore: Ignore a group: it counts on,
        silently
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/failure-groups/{group_id}/ignore",
                group_id=group_id,
            ),
            (200,),
        )

    def post_failure_groups_by_group_id_reopen(
        self,
        group_id: int,
    ) -> Any:
        """POST /api/v1/failure-groups/{group_id}/reopen: Open a group again (no alert)"""
        return self._call(
            "POST",
            _path(
                "/api/v1/failure-groups/{group_id}/reopen",
                group_id=group_id,
            ),
            (200,),
        )

    def post_failure_groups_by_group_id_replay(
        self,
        group_id: int,
        body: Any,
    ) -> Any:
        """POST /api/v1/failure-groups/{group_id}/replay: Replay one batch of the group's
        failed executions onto a version
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/failure-groups/{group_id}/replay",
                group_id=group_id,
            ),
            (200,),
            body=body,
        )

    def post_failure_groups_by_group_id_retry(
        self,
        group_id: int,
        body: Any,
    ) -> Any:
        """POST /api/v1/failure-groups/{group_id}/retry: Retry one batch of the group's
        failed executions in place
        """
        return self._call(
            "POST",
            _path(
                "/api/v1/failure-groups/{group_id}/retry",
                group_id=group_id,
            ),
            (200,),
            body=body,
        )

    def post_events(
        self,
        body: Any,
    ) -> Any:
        """POST /api/v1/events: Send an event: kept for FLOWFORGE_EVENT_LOOKBACK_S and
        taken by every wait step open for its name and key (a key scoped to workflows
        reaches only theirs)
        """
        return self._call(
            "POST",
            "/api/v1/events",
            (200, 202),
            body=body,
        )

    def get_events(
        self,
        *,
        name: Any = None,
        key: Any = None,
        limit: Any = None,
    ) -> Any:
        """GET /api/v1/events: The events kept, newest first (a key scoped to workflows:
        those they may take or emitted)
        """
        return self._call(
            "GET",
            "/api/v1/events",
            (200,),
            query={
                "name": name,
                "key": key,
                "limit": limit,
            },
        )
