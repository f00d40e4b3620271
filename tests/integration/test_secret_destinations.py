"""docs/contract.md#secret-destinations: a request that carries a secret or a resume URL goes where
the publisher said. Publishing one whose scheme, host or port is templated from the execution's data
is refused by a real bin/api with 422 and the path, unless the definition opts in."""

from __future__ import annotations

from typing import Any

import requests

from tests.support.definitions import unsigned


def request_step(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "notify",
        "type": "http_request",
        "request": {
            "method": "POST",
            "url": url,
            "headers": {"Authorization": "Bearer {{ secrets.chat_token }}"},
            **extra,
        },
    }


def publish(api: str, api_key: str, step: dict[str, Any]) -> requests.Response:
    return requests.post(
        f"{api}/api/v1/workflows/dest/versions",
        json=unsigned([step], name="Destinations"),
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    )


REFUSED = [
    "{{ input.callback_url }}",
    "https://{{ input.host }}/post",
    "https://chat.example.com:{{ input.port }}/post",
    "{{ input.scheme }}://chat.example.com/post",
    "https://{{ input.tenant }}.chat.example.com/post",
]
ALLOWED = [
    "https://chat.example.com/post/{{ input.channel }}",
    "https://chat.example.com/post?c={{ input.channel }}",
    "{{ secrets.chat_url }}",
    "https://{{ secrets.chat_host }}/post",
]


def test_a_secret_bearing_request_to_a_templated_destination_is_refused_at_publish(
    api: str, api_key: str
) -> None:
    for url in REFUSED:
        r = publish(api, api_key, request_step(url))
        assert r.status_code == 422, (url, r.text)
        [error] = [e for e in r.json()["errors"] if e["path"].endswith(".request.url")]
        assert error["path"] == "$.steps[0].request.url", error
        assert "secrets.chat_token" in error["message"], error
    # A resume URL is a credential too.
    wait_call = request_step("https://{{ input.host }}/post", json={"u": "{{ waits.w.url }}"})
    wait_call["request"]["headers"] = {}
    r = requests.post(
        f"{api}/api/v1/workflows/dest/versions",
        json=unsigned(
            [wait_call, {"id": "w", "type": "wait", "depends_on": ["notify"]}], name="Waits"
        ),
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    )
    assert r.status_code == 422 and "waits.w.url" in r.text, r.text


def test_fixed_destinations_and_the_explicit_opt_in_publish(api: str, api_key: str) -> None:
    for url in ALLOWED:
        r = publish(api, api_key, request_step(url))
        assert r.status_code == 201, (url, r.text)
    opted = request_step("{{ input.callback_url }}", allow_templated_destination=True)
    assert publish(api, api_key, opted).status_code == 201
    bad = request_step("https://x.example/", allow_templated_destination="yes")
    r = publish(api, api_key, bad)
    assert r.status_code == 422 and "allow_templated_destination" in r.text
    # Without a secret or a resume URL, the input may choose the destination as before.
    plain = request_step("{{ input.callback_url }}")
    plain["request"]["headers"] = {}
    assert publish(api, api_key, plain).status_code == 201
