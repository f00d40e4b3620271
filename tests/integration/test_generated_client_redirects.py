"""The generated client (flowforge/api/client.py) trusts nothing but a FlowForge answer,
as the remote CLI does (docs/reference/security.md): a redirect is an ApiError with its
status, never followed. requests would re-send a 307/308's body — a signing secret, a
resume's data — to whatever origin the Location names (it drops only the Authorization
header), and hand back that origin's JSON as the API's answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowforge.api.client import ApiError, Client
from tests.support.target import Reply, Target

SECRET = "whsec_" + "c2VjcmV0LXNlbnQtdG8tdGhlLXdyb25nLW9yaWdpbg=="


@pytest.fixture
def elsewhere() -> Iterator[Target]:
    server = Target()
    server.script = lambda _r: Reply(status=201, json={"id": 1, "status": "active"})
    yield server
    server.close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_an_error_and_nothing_reaches_its_location(
    target: Target, elsewhere: Target, status: int
) -> None:
    target.script = lambda r: Reply(status=status, headers={"Location": elsewhere.url + r.path})
    client = Client(target.url, api_key="ff_" + "0" * 64)
    with pytest.raises(ApiError) as raised:
        client.post_workflows_by_key_webhook_secrets("orders", body={"value": SECRET})
    assert raised.value.status == status
    with pytest.raises(ApiError):
        client.get_workflows_by_key_webhook_secrets("orders")
    assert elsewhere.received == []
    assert len(target.received) == 2
