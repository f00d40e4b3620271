"""The console's sign-in `next` field with CR/LF or other control characters (a header
injection attempt) is answered with a redirect to the safe default through a real
bin/api: never a 500, never a Location or header built from it."""

from __future__ import annotations

import re

import psycopg
import pytest
import requests

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.mark.parametrize(
    "target",
    [
        "/ui/executions\r\nSet-Cookie: injected=1",
        "/ui/executions\nX-Injected: 1",
        "/ui/\x1b]52;c;ZXZpbA==\x07",
        "/ui/workflows\x85",
    ],
)
def test_control_characters_in_next_redirect_to_the_default(
    api: str, api_key: str, db: psycopg.Connection, target: str
) -> None:
    session = requests.Session()
    page = session.get(f"{api}/ui/signin", timeout=10)
    match = CSRF.search(page.text)
    assert match is not None
    r = session.post(
        f"{api}/ui/signin",
        data={"csrf": match.group(1), "api_key": api_key, "next": target},
        allow_redirects=False,
        timeout=10,
    )
    assert r.status_code == 303, r.text
    assert r.headers["Location"].endswith("/ui/executions"), r.headers["Location"]
    assert "injected" not in r.headers.get("Set-Cookie", "")
    assert "X-Injected" not in r.headers
    # A session was opened for the valid key, and only one.
    assert db.execute("SELECT count(*) FROM console_sessions").fetchone() == (1,)
