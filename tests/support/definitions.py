"""Workflow definitions the tests publish again and again."""

from __future__ import annotations

from typing import Any


def unsigned(steps: list[dict[str, Any]], name: str = "t", **fields: Any) -> dict[str, Any]:
    """A definition with these steps behind an unsigned (auth "none") webhook; `fields`
    are its other top-level keys (concurrency, priority, input_schema...)."""
    return {"name": name, "trigger": {"webhook": {"auth": "none"}}, "steps": steps, **fields}


def workflow(
    *steps: dict[str, Any], auth: str = "none", name: str = "fault test", **fields: Any
) -> dict[str, Any]:
    """A definition with a webhook trigger (unsigned unless asked) and these steps."""
    return {"name": name, "trigger": {"webhook": {"auth": auth}}, "steps": list(steps), **fields}


def http(
    step_id: str,
    method: str,
    url: str,
    *,
    after: tuple[str, ...] = (),
    retry: dict[str, Any] | None = None,
    **request: Any,
) -> dict[str, Any]:
    """An http_request step; extra keyword arguments go into its `request`."""
    fields = {} if retry is None else {"retry": retry}
    return _step(
        step_id, "http_request", after, request={"method": method, "url": url, **request}, **fields
    )


def transform(
    step_id: str, output: Any, *, after: tuple[str, ...] = (), **fields: Any
) -> dict[str, Any]:
    """A transform step rendering `output`; `fields` are its other keys (`when`...)."""
    return _step(step_id, "transform", after, output=output, **fields)


def wait(
    step_id: str, timeout_s: float, *, after: tuple[str, ...] = (), **fields: Any
) -> dict[str, Any]:
    """A wait step (resumed by its URL or the API, or ended by its timeout)."""
    return _step(step_id, "wait", after, timeout_s=timeout_s, **fields)


def delay(
    step_id: str, duration_s: float, *, after: tuple[str, ...] = (), **fields: Any
) -> dict[str, Any]:
    """A delay step of `duration_s` seconds, a durable timer the worker's scanner wakes."""
    return _step(step_id, "delay", after, duration_s=duration_s, **fields)


def github_source(*subscriptions: dict[str, Any]) -> dict[str, Any]:
    """A source verified as GitHub signs (auth "github") with these subscriptions."""
    return {"auth": "github", "subscriptions": list(subscriptions)}


def subscription(workflow: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    """A source's subscription: `workflow` starts when every condition holds (each one
    `{"path", "op", "value"}`)."""
    return {"workflow": workflow, "filter": {"all": list(conditions)}}


def github_event(event: str) -> dict[str, Any]:
    """The condition that a GitHub delivery's X-GitHub-Event is `event`."""
    return {"path": "headers.x-github-event", "op": "eq", "value": event}


def _step(step_id: str, kind: str, after: tuple[str, ...], **fields: Any) -> dict[str, Any]:
    step: dict[str, Any] = {"id": step_id, "type": kind, **fields}
    if after:
        step["depends_on"] = list(after)
    return step


# One transform behind an unsigned webhook: the smallest workflow that makes executions.
OPEN = workflow(transform("shape", {"x": "{{ input.x }}"}), name="Open intake")

# One transform of input.n, workflow "t": what the failover tests' steady load starts.
NUMBERED = workflow(transform("a", {"n": "{{ input.n }}"}), name="t")

# Two http_request steps, a GET then a POST, to port 9 of the loopback (nothing listens):
# the worker components' tests and the relay's drive them by hand.
CALLS = workflow(
    http("fetch", "GET", "http://127.0.0.1:9/f"),
    http("charge", "POST", "http://127.0.0.1:9/c"),
    name="calls",
)
