"""A Slack endpoint's URL is its secret, shown only as its scheme and host (and port): no
userinfo, no query, no fragment."""

from __future__ import annotations

import pytest

from flowforge.store.notifications import EndpointInvalid, check_url, mask


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.slack.com/services/T/B/x", "https://hooks.slack.com/…"),
        ("https://chat.example.com?token=SECRET", "https://chat.example.com/…"),
        ("https://u:SECRET@chat.example.com/x", "https://chat.example.com/…"),
        ("https://chat.example.com#SECRET", "https://chat.example.com/…"),
        ("http://chat.example.com:8443/x?y", "http://chat.example.com:8443/…"),
        ("https://[::1]:8443/x", "https://[::1]:8443/…"),
    ],
)
def test_the_masked_url_shows_scheme_host_and_port_only(url: str, shown: str) -> None:
    assert mask(url) == shown
    assert "SECRET" not in mask(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://u:secret@hooks.example/x",
        "http://user@127.0.0.1:9/x",
        "ftp://x/y",
        "",
        "https://8[x",
    ],
)
def test_an_endpoint_url_with_userinfo_or_another_scheme_is_refused(url: str) -> None:
    with pytest.raises(EndpointInvalid):
        check_url(url)


def test_an_endpoint_url_with_a_query_is_taken() -> None:
    check_url("https://hooks.slack.com/services/T0/B0/x?token=1")
