"""The Python client generated from /openapi.json (flowforge/api/client.py, made by
flowforge/api/clientgen.py) is the shipped one, and works end to end against a live
bin/api and bin/worker: publish, a webhook, the execution read back until it succeeded."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flowforge.api import clientgen, openapi
from tests.support.processes import Process

SHIPPED = Path(clientgen.__file__).with_name("client.py")


def test_the_shipped_client_is_the_generated_one() -> None:
    """Regenerate with `python -m flowforge.api.clientgen > flowforge/api/client.py`."""
    assert SHIPPED.read_text() == clientgen.generate(openapi.DOCUMENT)


def test_every_operation_is_a_client_method() -> None:
    from flowforge.api.client import Client

    for item in openapi.PATHS.values():
        for operation in item.values():
            assert callable(getattr(Client, operation["operationId"]))


def _generated(tmp_path: Path) -> ModuleType:
    """The client generated afresh from the document, imported from its own file."""
    source = tmp_path / "flowforge_client.py"
    source.write_text(clientgen.generate(openapi.DOCUMENT))
    spec = importlib.util.spec_from_file_location("flowforge_client", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_client_publishes_sends_a_webhook_and_reads_the_execution(
    api: str, api_key: str, workers: Callable[..., Process], tmp_path: Path
) -> None:
    workers()
    generated = _generated(tmp_path)
    client = generated.Client(api, api_key=api_key)
    published = client.post_workflows_by_key_versions(
        "orders",
        {
            "name": "Orders",
            "trigger": {"webhook": {"auth": "none"}},
            "steps": [{"id": "shape", "type": "transform", "output": {"n": "{{ input.n }}"}}],
        },
    )
    assert published["workflow"] == "orders" and published["version"] == 1

    hooks = generated.Client(api)  # webhooks need no API key
    accepted = hooks.post_hooks_by_key("orders", {"n": 7}, idempotency_key="order-7")
    assert accepted["status"] == "queued"

    execution: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        execution = client.get_executions_by_id(accepted["execution_id"])
        if execution["status"] == "succeeded":
            break
        time.sleep(0.1)
    assert execution["status"] == "succeeded", execution
    assert execution["steps"][0]["output"] == {"n": 7}
    listed = client.get_executions(workflow="orders", limit=10)
    assert [item["id"] for item in listed["items"]] == [accepted["execution_id"]]

    with pytest.raises(generated.ApiError) as refused:
        client.get_workflows_by_key("missing")
    assert refused.value.status == 404
    assert refused.value.problem["status"] == 404
