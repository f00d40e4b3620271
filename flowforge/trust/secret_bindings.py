"""Which workflows may use which step secret.

The worker holds every secret value, and anyone who may publish a definition chooses
where its requests go: a secret usable by every workflow is readable by every publisher
(send it to a host you control, read it back in any encoding, no redactor can keep up).
So a secret is usable only by the workflows named beside it in configuration:

    FLOWFORGE_SECRET_HOOKS_TOKEN_WORKFLOWS=orders,billing

The binding is not secret, so it is always an environment variable, also when the value
comes from a systemd credential. A secret without a binding is usable by no workflow.
The worker enforces it when it renders a request; the API, given the same environment
file, refuses at publish a definition whose workflow may not use a secret it names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from flowforge.domain import templating
from flowforge.domain.definitions import DefinitionInvalid
from flowforge.domain.model import WORKFLOW_KEY
from flowforge.errors import ConfigError

_PREFIX = "FLOWFORGE_SECRET_"
SUFFIX = "_WORKFLOWS"
_BINDING = re.compile(re.escape(_PREFIX) + r"(.+)" + re.escape(SUFFIX))

Bindings = Mapping[str, frozenset[str]]  # upper-cased secret name -> workflow keys


class BindingInvalid(ConfigError):
    """A FLOWFORGE_SECRET_<NAME>_WORKFLOWS variable names something that is no workflow key."""


def variable(name: str) -> str:
    """The environment variable that binds secret `name` to workflows."""
    return f"{_PREFIX}{name.upper()}{SUFFIX}"


def parse(env: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """Every binding in an environment; strict, so a typo fails at start-up."""
    bindings: dict[str, frozenset[str]] = {}
    for key, raw in env.items():
        match = _BINDING.fullmatch(key)
        if match is None:
            continue
        keys = frozenset(part.strip() for part in raw.split(",") if part.strip())
        bad = sorted(k for k in keys if not WORKFLOW_KEY.fullmatch(k))
        if bad:
            raise BindingInvalid(
                f"{key} must be a comma list of workflow keys; {len(bad)} entries are not"
            )
        bindings[match.group(1).upper()] = keys
    return bindings


def may_use(bindings: Bindings, name: str, workflow: str) -> bool:
    """Whether workflow `workflow` may render `{{ secrets.<name> }}`."""
    return workflow in bindings.get(name.upper(), frozenset())


def knows(bindings: Bindings, name: str) -> bool:
    """Whether this environment binds `name` at all (the API may run without bindings)."""
    return name.upper() in bindings


def references(document: Any) -> Iterator[tuple[str, str]]:
    """(JSON path, secret name) of every `{{ secrets.NAME }}` in a validated definition."""
    for index, step in enumerate(document.get("steps", ())):
        request = step.get("request") if isinstance(step, dict) else None
        if not isinstance(request, dict):
            continue
        path = f"$.steps[{index}].request"
        for where, text in templating.iter_template_strings(request, path):
            for placeholder in templating.find_placeholders(text):
                head, _, name = placeholder.partition(".")
                if head == "secrets" and name:
                    yield where, name


def check(references_: Iterable[tuple[str, str]], workflow: str, bindings: Bindings) -> None:
    """Refuse (422, one entry per use) secrets this environment binds to other workflows
    only; a name it does not bind at all is left to the worker, which refuses it too."""
    errors = [
        {
            "path": path,
            "message": f"secret {name!r} is not bound to workflow {workflow!r} "
            f"(add it to {variable(name)})",
        }
        for path, name in references_
        if knows(bindings, name) and not may_use(bindings, name, workflow)
    ]
    if errors:
        raise DefinitionInvalid(errors)
