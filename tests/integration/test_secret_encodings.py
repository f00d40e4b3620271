"""docs/contract.md#secret-redaction: a secret echoed in the encodings servers really apply — an
HTML error page (`&amp;`, `&lt;`), XML character references, a sign-in redirect whose `?next=` holds
it %-encoded twice, `+` for space, Go's JSON (`\\u0026amp;`), any case — is readable from
nothing FlowForge stores or shows. A real bin/worker against a 127.0.0.1 target that
echoes the secret it was sent; the API's answers, the worker's log and a pg_dump are then
decoded independently (the standard library's unescape and unquote, repeatedly) and
searched, case-insensitively."""

from __future__ import annotations

import html
import json
import secrets
import warnings
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, quote_plus, unquote

from tests.integration.test_secrets_never_persist import pg_dump
from tests.support.api import Api, step
from tests.support.definitions import unsigned
from tests.support.processes import Process
from tests.support.target import Received, Reply, Target

WORKFLOW = "echoes"


def q(text: str) -> str:
    return quote(text, safe="")


SPELLINGS: dict[str, Callable[[str], str]] = {
    "html escaped": html.escape,
    "html escaped twice": lambda v: html.escape(html.escape(v)),
    "xml decimal references": lambda v: "".join(f"&#{ord(c)};" for c in v),
    "xml hex references, upper case": lambda v: "".join(f"&#X{ord(c):X};" for c in v),
    "%-encoded once": q,
    "%-encoded twice": lambda v: q(q(v)),
    "%-encoded three times": lambda v: q(q(q(v))),
    "+ for space": lambda v: quote_plus(v, safe=""),
    "+ for space, then %-encoded": lambda v: q(quote_plus(v, safe="")),
    "html escaped, then %-encoded": lambda v: q(html.escape(v)),
    "Go's JSON of an html escape": lambda v: (
        json.dumps(html.escape(v))[1:-1]
        .replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
    ),
    "\\u escapes, upper case": lambda v: "".join(f"\\U{ord(c):04X}" for c in v),
    "upper case, html escaped": lambda v: html.escape(v.upper()),
}


def echo(request: Received) -> Reply:
    """Answers with the token it was sent, in the spelling its path names, the way each
    kind of server does: an HTML error page, XML, a redirect's Location, JSON. All 200:
    a failed step would stop the execution before the other spellings were asked for."""
    token = request.headers.get("x-api-token", "")
    name = unquote(request.path.rsplit("/", 1)[-1])
    form = SPELLINGS[name](token)
    if name.startswith("%-encoded twice"):
        # A sign-in redirect: the URL that held the token, %-encoded again in ?next=.
        return Reply(headers={"Location": f"/login?next={form}"})
    if "xml" in name:
        body = f"<?xml version='1.0'?><error><token>{form}</token></error>"
        return Reply(body=body.encode(), headers={"Content-Type": "application/xml"})
    if "JSON" in name or "\\u" in name:
        body = '{"error": "bad token ' + form + '"}'
        return Reply(body=body.encode(), headers={"Content-Type": "application/json"})
    page = f"<html><body><p>Token {form} is not valid</p></body></html>"
    return Reply(body=page.encode(), headers={"Content-Type": "text/html"})


def call(n: int, url: str) -> dict[str, Any]:
    return {
        "id": f"s{n}",
        "type": "http_request",
        "request": {"method": "GET", "url": url, "headers": {"X-Api-Token": "{{ secrets.tok }}"}},
        "retry": {"max_attempts": 1},
    }


def decodings(text: str) -> list[str]:
    """The text and what repeated unescaping and unquoting (and JSON's \\u) make of it."""
    stages = [text]
    for _ in range(5):
        text = html.unescape(unquote(text.replace("+", " ")))
        if "\\u" in text:
            with warnings.catch_warnings():
                # Other backslashes in an echo are not escapes: decoding them only warns.
                warnings.simplefilter("ignore", DeprecationWarning)
                text = text.encode().decode("unicode_escape", "ignore")
        stages.append(text)
    return [s.lower() for s in stages]


def test_a_secret_echoed_in_every_encoding_servers_apply_is_stored_nowhere(
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    database_url: str,
) -> None:
    value = "Tok &<x>\"y'" + secrets.token_hex(8) + "+/="
    target.script = echo
    worker = workers(FLOWFORGE_SECRET_TOK=value, FLOWFORGE_SECRET_TOK_WORKFLOWS=WORKFLOW)
    client = Api(api, api_key)
    names = list(SPELLINGS)
    steps = [call(n, f"{target.url}/echo/{q(name)}") for n, name in enumerate(names)]
    client.publish(WORKFLOW, unsigned(steps, name="Echoes"))
    done = client.wait(client.start(WORKFLOW, {"n": 1}), timeout=60)
    assert len(target.received) == len(names)
    for n in range(len(names)):
        assert step(done, f"s{n}")["attempts"], step(done, f"s{n}")
    places = {
        "API answers": client.session.get(f"{api}/api/v1/executions/{done['id']}", timeout=10).text,
        "worker log": worker.log(),
        "pg_dump": pg_dump(database_url),
    }
    needles = {value.lower(), value.lower().replace("+", " ")}
    for where, text in places.items():
        for name, spell in SPELLINGS.items():
            assert spell(value) not in text, f"the secret ({name}) leaked into the {where}"
        for stage in decodings(text):
            for needle in needles:
                assert needle not in stage, f"the secret decodes out of the {where}"
