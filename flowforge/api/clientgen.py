"""Generates FlowForge's Python client (flowforge/api/client.py) from /openapi.json.

The client is generated rather than written so that it is the document, read by a
machine: a route, a parameter or a status code missing from the document is missing from
the client too, which tests/integration/test_generated_client.py would show. One method
per operation, named by its operationId; path parameters and a required body are
positional, query parameters and headers keyword-only. It needs only `requests`.

    python -m flowforge.api.clientgen > flowforge/api/client.py
"""

from __future__ import annotations

import keyword
import sys
import textwrap
from typing import Any

from flowforge.api.openapi import DOCUMENT

HEADER = '''"""FlowForge's HTTP API client, generated from /openapi.json by clientgen.py.

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
'''


def _name(text: str) -> str:
    name = text.replace("-", "_").lower()
    return f"{name}_" if keyword.iskeyword(name) else name


def _method(path: str, method: str, operation: dict[str, Any]) -> str:
    """One operation as a Client method, laid out as `ruff format` would."""
    parameters = operation.get("parameters", [])
    in_path = [p for p in parameters if p["in"] == "path"]
    optional = [p for p in parameters if p["in"] in ("query", "header")]
    body = operation.get("requestBody")
    arguments = [f"{_name(p['name'])}: {_python_type(p['schema'])}" for p in in_path]
    if body is not None and body.get("required"):
        arguments.append("body: Any")
    keywords = [f"{_name(p['name'])}: Any = None" for p in optional]
    if body is not None and not body.get("required"):
        keywords.append("body: Any = _NO_BODY")
    if keywords:
        arguments += ["*", *keywords]
    name = operation["operationId"]
    if arguments:
        signature = [f"    def {name}(", "        self,", *(f"        {a}," for a in arguments)]
        signature.append("    ) -> Any:")
    else:
        signature = [f"    def {name}(self) -> Any:"]
    expected = sorted(int(status) for status in operation["responses"] if status.startswith("2"))
    statuses = f"({expected[0]},)" if len(expected) == 1 else f"({', '.join(map(str, expected))})"
    lines = [*signature, *_docstring(f"{method.upper()} {path}: {operation['summary']}")]
    lines += ["        return self._call(", f'            "{method.upper()}",']
    if in_path:
        lines.append("            _path(")
        lines.append(f'                "{path}",')
        lines += [f"                {p['name']}={_name(p['name'])}," for p in in_path]
        lines.append("            ),")
    else:
        lines.append(f'            "{path}",')
    lines.append(f"            {statuses},")
    for where, argument in (("query", "query"), ("header", "headers")):
        given = [p for p in optional if p["in"] == where]
        if given:
            lines.append(f"            {argument}={{")
            lines += [_entry(p) for p in given]
            lines.append("            },")
    if body is not None:
        lines.append("            body=body,")
    lines.append("        )")
    return "\n".join(lines)


def _entry(parameter: dict[str, Any]) -> str:
    """A parameter's entry in the query or headers; an object with x-flowforge-prefix (the
    list's `attr.NAME=VALUE`) is one entry per property, its name after the prefix."""
    name = parameter["name"]
    prefix = parameter.get("x-flowforge-prefix")
    if prefix is None:
        return f'                "{name}": {_name(name)},'
    return f'                **{{f"{prefix}{{k}}": v for k, v in ({_name(name)} or {{}}).items()}},'


def _python_type(schema: dict[str, Any]) -> str:
    return "int" if schema.get("type") == "integer" else "str"


def _docstring(text: str) -> list[str]:
    """A method's docstring, wrapped within the line length."""
    text = text.replace("\\", "\\\\").replace('"""', "'''")
    lines = textwrap.wrap(text, width=80)
    if len(lines) == 1:
        return [f'        """{lines[0]}"""']
    return ['        """' + lines[0], *(f"        {line}" for line in lines[1:]), '        """']


def generate(document: dict[str, Any]) -> str:
    """The client module's source for `document`."""
    methods = [
        _method(path, method, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]
    return HEADER + "\n" + "\n\n".join(methods) + "\n"


if __name__ == "__main__":
    sys.stdout.write(generate(DOCUMENT))
