"""The access matrix (docs/contract.md#roles): every route of the app, API and console,
as enumerated from its url_map (never from a list), by every role, answers as the route's
declared access says: a role below it is refused with 403 naming the role needed, a role
at or above it is not refused for its role. A route that declares nothing fails here:
declare it with `@requires(Access.X)` under its route decorator (flowforge/api/auth.py).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask import Flask
from werkzeug.routing import Rule

from flowforge.api.auth import declared
from flowforge.domain.roles import Access, Role
from flowforge.errors import InvalidParameter
from flowforge.store import apikeys
from flowforge.store.migrate import discover
from tests.integration.test_api_keys import cli, create_with_cli
from tests.integration.test_migrate import empty_db  # noqa: F401  (fixture)
from tests.support.definitions import OPEN

SECURITY = Path(__file__).resolve().parents[2] / "docs" / "reference" / "security.md"
ROW = re.compile(r"^\| `(GET|POST|PUT|PATCH|DELETE) (/[^`]*)` \| (\w+) \|", re.MULTILINE)
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
# A valid value per converter (path arguments not otherwise known: "open").
VALID = {"workflow_key": "open", "int": "1"}
# Routes that change nothing, or only the caller's own session, may be READ.
READ_WRITES = {"console.signout"}
# Pages that only show a form whose POST acts, so they need what the POST needs.
ACTING_PAGES = {"console.bulk", "console.reingest_page", "console.edit"}


def _rules(app: Flask) -> list[Rule]:
    # Sign-out last: it ends the role's console session the later requests use.
    rules = list(app.url_map.iter_rules())
    return sorted(rules, key=lambda r: (r.endpoint == "console.signout", r.rule))


def _access(app: Flask, rule: Rule) -> Access | None:
    return declared(app.view_functions[rule.endpoint], rule.endpoint)


def _url(rule: Rule, execution_id: str) -> str:
    def value(match: re.Match[str]) -> str:
        converter = match.group(1) or "default"
        if converter.startswith("execution_id"):
            return execution_id
        return VALID.get(converter.split("(")[0], "open")

    return re.sub(r"<(?:([^>:]+):)?[^>]+>", value, rule.rule)


def _signed_in(app: Flask, key: str) -> tuple[Any, str]:
    """A console client signed in with this key, and its session's CSRF token."""
    client = app.test_client()
    page = client.get("/ui/signin")
    token = CSRF.search(page.get_data(as_text=True)).group(1)
    done = client.post("/ui/signin", data={"csrf": token, "api_key": key})
    assert done.status_code == 303, done.get_data(as_text=True)
    listing = client.get("/ui/executions").get_data(as_text=True)
    return client, CSRF.search(listing).group(1)


def test_every_route_declares_its_access_as_the_reference_says(app_client: Any) -> None:
    app = app_client.application
    undeclared = sorted(r.endpoint for r in app.url_map.iter_rules() if not _access(app, r))
    assert not undeclared, f"declare with @requires(Access.X) (api/auth.py): {undeclared}"
    for rule in app.url_map.iter_rules():
        access = _access(app, rule)
        methods = set(rule.methods or ()) - {"HEAD", "OPTIONS"}
        # A route that changes something never needs only READ; a page that offers an
        # action needs what the action needs.
        if access is Access.READ and methods != {"GET"}:
            assert rule.endpoint in READ_WRITES, rule.endpoint
        if rule.endpoint in ACTING_PAGES:
            assert access in (Access.OPERATE, Access.ADMINISTER), rule.endpoint
    _check_the_security_reference(app)


def _check_the_security_reference(app: Flask) -> None:
    declared_rows = {}
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith(("/ui", "/static")):
            continue
        path = re.sub(r"<(?:[^>:]+:)?([^>]+)>", r"{\1}", rule.rule)
        access = _access(app, rule)
        for method in sorted(set(rule.methods or ()) - {"HEAD", "OPTIONS"}):
            declared_rows[(method, path)] = access.name.lower() if access else "undeclared"
    documented = {(m, p): a for m, p, a in ROW.findall(SECURITY.read_text())}
    wrong = [
        f"| `{method} {path}` | {access} |"
        for (method, path), access in sorted(declared_rows.items())
        if documented.get((method, path)) != access
    ]
    assert not wrong, f"docs/reference/security.md#roles should have these rows: {wrong}"
    assert not documented.keys() - declared_rows.keys()


def test_every_route_answers_every_role_as_declared(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    app = app_client.application
    admin = {"Authorization": f"Bearer {api_key}"}
    published = app_client.post("/api/v1/workflows/open/versions", json=OPEN, headers=admin)
    assert published.status_code == 201, published.get_data(as_text=True)
    execution_id = app_client.post("/hooks/open", json={"x": 1}).get_json()["execution_id"]
    keys = {role: apikeys.create(db, role.value, role=role)[1] for role in Role}
    consoles = {role: _signed_in(app, key) for role, key in keys.items()}
    mismatches: list[str] = []
    checked = 0
    for rule in _rules(app):
        access = _access(app, rule)
        assert access is not None, rule.endpoint
        path = _url(rule, execution_id)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            for role in Role:
                if rule.rule.startswith("/ui"):
                    client, csrf = consoles[role]
                    form = {"csrf": csrf} if method == "POST" else None
                    r = client.open(path, method=method, data=form)
                    text = r.get_data(as_text=True)
                    refused = r.status_code == 403 and "role; this API key is a" in text
                    named = access.role is not None and f"needs the {access.role} role" in text
                else:
                    bearer = {"Authorization": f"Bearer {keys[role]}"}
                    r = app_client.open(path, method=method, headers=bearer)
                    body = r.get_json(silent=True) or {}
                    refused = r.status_code == 403 and "required_role" in body
                    named = access.role is not None and body.get("required_role") == access.role
                checked += 1
                expected = "allowed" if access.allows(role) else "refused"
                if expected == "refused" and not (refused and named):
                    mismatches.append(f"{method} {rule.rule} {role}: {r.status_code}, not refused")
                elif expected == "allowed" and (refused or r.status_code in (401, 500)):
                    mismatches.append(f"{method} {rule.rule} {role}: {r.status_code}, refused")
    assert checked >= 3 * 85  # the whole app, API and console
    assert not mismatches, "\n".join(mismatches)


# (role, read_only, publish_secrets) -> the role made: the old flags still decide without one.
MADE = [
    ((None, False, False), Role.ADMIN),  # as before roles: read-write
    ((None, True, False), Role.VIEWER),  # read_only: true means viewer
    ((None, False, True), Role.ADMIN),
    (("operator", False, False), Role.OPERATOR),
    (("viewer", True, False), Role.VIEWER),
]
REFUSED = [("operator", True, False), ("operator", False, True), ("root", False, False)]


def test_a_new_keys_role_comes_from_role_or_the_old_flags(db: psycopg.Connection) -> None:
    for (role, read_only, secrets), made in MADE:
        key_id, _ = apikeys.create(db, "k", read_only=read_only, publish_secrets=secrets, role=role)
        row = db.execute("SELECT role FROM api_keys WHERE id = %s", (key_id,)).fetchone()
        assert row == (made.value,)
        listed = next(k for k in apikeys.list_keys(db) if k["id"] == key_id)
        assert (listed["role"], listed["read_only"]) == (made.value, made is Role.VIEWER)
    made_before = db.execute("SELECT count(*) FROM api_keys").fetchone()
    for role, read_only, secrets in REFUSED:
        with pytest.raises(InvalidParameter, match="role") as refused:
            apikeys.create(db, "k", read_only=read_only, publish_secrets=secrets, role=role)
        assert refused.value.status == 400
    assert db.execute("SELECT count(*) FROM api_keys").fetchone() == made_before
    # The database holds the same rules whatever writes the row.
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(
            "INSERT INTO api_keys (name, key_hash, key_prefix, role, publish_secrets)"
            " VALUES ('x', 'x', 'x', 'operator', true)"
        )


def test_0064_gives_every_existing_key_the_role_of_its_powers(
    empty_db: Callable[[], str],  # noqa: F811
) -> None:
    url = empty_db()
    migrations = discover()
    at = next(i for i, m in enumerate(migrations) if m.version == "0064_api_key_roles")

    def apply(upto: slice) -> None:
        for migration in migrations[upto]:
            command = ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(migration.path)]
            subprocess.run(command, check=True, capture_output=True)

    apply(slice(0, at))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO api_keys (name, key_hash, key_prefix, read_only, publish_secrets)"
            " VALUES ('ro', 'a', 'a', true, false), ('rw', 'b', 'b', false, false),"
            " ('rws', 'c', 'c', false, true), ('ros', 'd', 'd', true, true)"
        )
    apply(slice(at, at + 1))
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT name, role, publish_secrets FROM api_keys ORDER BY id")
        # Read-only: a viewer (its secrets grant could never publish); read-write: an admin.
        assert rows.fetchall() == [
            ("ro", "viewer", False),
            ("rw", "admin", False),
            ("rws", "admin", True),
            ("ros", "viewer", False),
        ]


def test_the_console_shows_the_role_and_offers_only_what_it_may_do(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    app = app_client.application
    admin = {"Authorization": f"Bearer {api_key}"}
    app_client.post("/api/v1/workflows/open/versions", json=OPEN, headers=admin)
    execution_id = app_client.post("/hooks/open", json={"x": 1}).get_json()["execution_id"]
    for role in Role:
        client, _ = _signed_in(app, apikeys.create(db, role.value, role=role)[1])
        workflow = client.get("/ui/workflows/open").get_data(as_text=True)
        assert f'id="role">{role}</span>' in workflow
        operates = Access.OPERATE.allows(role)
        assert ('id="pause-workflow"' in workflow) is operates, role
        assert ('id="reingest-link"' in workflow) is operates, role
        assert ('id="edit-link"' in workflow) is (role is Role.ADMIN), role
        execution = client.get(f"/ui/executions/{execution_id}").get_data(as_text=True)
        assert (f"/ui/executions/{execution_id}/cancel" in execution) is operates, role
        listing = client.get("/ui/executions").get_data(as_text=True)
        assert ('id="bulk-cancel"' in listing) is operates, role


def test_me_answers_the_calling_keys_role_and_scope(
    app_client: Any, db: psycopg.Connection
) -> None:
    for role in Role:
        key_id, key = apikeys.create(db, f"k-{role}", ["a", "b"], role=role)
        me = app_client.get("/api/v1/me", headers={"Authorization": f"Bearer {key}"})
        assert me.get_json() == {
            "id": key_id,
            "name": f"k-{role}",
            "role": role.value,
            "workflows": ["a", "b"],
            "publish_secrets": False,
        }


def test_the_workflow_scope_still_applies_within_the_role(
    app_client: Any, api_key: str, db: psycopg.Connection
) -> None:
    admin = {"Authorization": f"Bearer {api_key}"}
    app_client.post("/api/v1/workflows/open/versions", json=OPEN, headers=admin)
    execution_id = app_client.post("/hooks/open", json={"x": 1}).get_json()["execution_id"]
    elsewhere = apikeys.create(db, "elsewhere", ["other"], role=Role.OPERATOR)[1]
    refused = app_client.post(
        f"/api/v1/executions/{execution_id}/cancel",
        headers={"Authorization": f"Bearer {elsewhere}"},
    )
    assert refused.status_code == 403
    assert "required_role" not in refused.get_json()  # the scope's refusal, not the role's
    here = apikeys.create(db, "here", ["open"], role=Role.OPERATOR)[1]
    done = app_client.post(
        f"/api/v1/executions/{execution_id}/cancel", headers={"Authorization": f"Bearer {here}"}
    )
    assert done.status_code in (200, 202), done.get_data(as_text=True)


def test_the_cli_makes_a_key_of_a_role_and_lists_it(
    app_client: Any, database_url: str, db: psycopg.Connection
) -> None:
    key = create_with_cli(database_url, "--name", "oncall", "--role", "operator")
    me = app_client.get("/api/v1/me", headers={"Authorization": f"Bearer {key}"}).get_json()
    assert me["role"] == "operator"
    listing = cli(database_url, "apikey", "list").stdout
    assert "operator" in next(line for line in listing.splitlines() if "oncall" in line)
    refused = cli(database_url, "apikey", "create", "--name", "x", "--role", "viewer", "--secrets")
    assert refused.returncode == 2 and "admin role" in refused.stderr, refused  # as typed
    assert db.execute("SELECT count(*) FROM api_keys WHERE name = 'x'").fetchone() == (0,)


# Routes that declare READ but show nothing: the console's start only redirects.
SHOWS_NOTHING = {"console.index"}


def test_every_route_but_the_public_ones_refuses_a_caller_without_a_key(app_client: Any) -> None:
    # The role matrix cannot see a READ route that forgot its key check (every role is
    # "allowed" there): here nobody signed in may get past one.
    app = app_client.application
    anonymous = app.test_client()
    let_in = []
    for rule in app.url_map.iter_rules():
        access = _access(app, rule)
        if access is Access.PUBLIC or rule.endpoint in SHOWS_NOTHING:
            continue
        path = _url(rule, "01a252e8-b558-7554-9b81-c86b427137fe")
        for method in sorted((rule.methods or set()) - {"OPTIONS"}):
            r = anonymous.open(path, method=method)
            signin = r.status_code == 303 and "/ui/signin" in r.headers.get("Location", "")
            if not (r.status_code in (401, 403) or signin):
                let_in.append(f"{method} {rule.rule}: {r.status_code}")
    assert not let_in, "\n".join(let_in)
