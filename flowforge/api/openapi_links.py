"""The links of /openapi.json's answers: what a client (and schemathesis's stateful phase,
tests/integration/test_openapi_contract.py) may call next with values from an answer."""

from __future__ import annotations

from typing import Any

from flowforge.domain.operations import ACTIONS


def _link(path: str, method: str, description: str, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link to the operation at `path`: what a client (and schemathesis's
    stateful phase) may call next with values from this answer."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    return {
        "operationRef": f"#/paths/{pointer}/{method}",
        "description": description,
        "parameters": parameters,
    }


# The actions on a whole execution, by their path's last segment.
_EXECUTION_ACTIONS = tuple(action.route for action in ACTIONS if action.step is None)


def _execution_links(source: str) -> dict[str, Any]:
    """Links from an answer naming an execution (its id at `source`) to reading it and to
    the operator actions on it."""
    links = {"GetExecution": _link("/api/v1/executions/{id}", "get", "Read it", id=source)}
    for action in _EXECUTION_ACTIONS:
        links[f"{action.title()}Execution"] = _link(
            f"/api/v1/executions/{{id}}/{action}", "post", f"{action.title()} it", id=source
        )
    return links


LINKS: dict[tuple[str, str, str], dict[str, Any]] = {
    ("/api/v1/workflows/{key}/versions", "post", "201"): {
        "SendWebhook": _link(
            "/hooks/{key}", "post", "Start an execution", key="$response.body#/workflow"
        ),
        "GetWorkflow": _link(
            "/api/v1/workflows/{key}", "get", "Read the workflow", key="$response.body#/workflow"
        ),
        "GetVersion": _link(
            "/api/v1/workflows/{key}/versions/{version}",
            "get",
            "Read the version",
            key="$response.body#/workflow",
            version="$response.body#/version",
        ),
        "CreateSecret": _link(
            "/api/v1/workflows/{key}/webhook-secrets",
            "post",
            "Give it a signing secret",
            key="$response.body#/workflow",
        ),
        "ListGroups": _link(
            "/api/v1/workflows/{key}/groups", "get", "Its groups", key="$response.body#/workflow"
        ),
    },
    ("/api/v1/workflows", "get", "200"): {
        "SendWebhook": _link(
            "/hooks/{key}",
            "post",
            "Start an execution of the first workflow listed",
            key="$response.body#/items/0/workflow",
        )
    },
    ("/api/v1/executions", "get", "200"): _execution_links("$response.body#/items/0/id"),
    ("/hooks/{key}", "post", "202"): _execution_links("$response.body#/execution_id"),
    ("/api/v1/executions/{id}", "get", "200"): _execution_links("$response.body#/id"),
    ("/api/v1/workflows/{key}/webhook-secrets", "post", "201"): {
        "RevokeSecret": _link(
            "/api/v1/workflows/{key}/webhook-secrets/{secret_id}",
            "delete",
            "Revoke it",
            key="$request.path.key",
            secret_id="$response.body#/id",
        )
    },
    ("/api/v1/sources/{name}", "post", "200"): {
        "GetSource": _link("/api/v1/sources/{name}", "get", "Read it", name="$request.path.name"),
        "CreateSourceSecret": _link(
            "/api/v1/sources/{name}/webhook-secrets",
            "post",
            "Give it a signing secret",
            name="$request.path.name",
        ),
    },
    ("/api/v1/sources/{name}/webhook-secrets", "post", "201"): {
        "RevokeSourceSecret": _link(
            "/api/v1/sources/{name}/webhook-secrets/{secret_id}",
            "delete",
            "Revoke it",
            name="$request.path.name",
            secret_id="$response.body#/id",
        )
    },
}
