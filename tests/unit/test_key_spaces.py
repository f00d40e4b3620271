"""Every place FlowForge makes an idempotency key, enumerated from the code, and the key
space each one writes (docs/reference/security.md, identity spaces).

A client's key (`Idempotency-Key`, `webhook-id`, a provider's delivery id on a workflow's
own /hooks/<key>) is `client`; every identity the system makes for itself (schedule ticks,
child workflows, source deliveries, re-ingests, a debounce or batch group's execution,
replays) is `system`, a column in the primary key and never a prefix, so no client key
can claim, block or be handed one. This test finds the sites from the source, not from a
list it trusts: a new site fails it until it is classified here, and a system site that
writes the client space fails it too. tests/integration/test_source_identity.py and
test_system_key_space.py show the same against real processes."""

from __future__ import annotations

import ast
from pathlib import Path

import flowforge

ROOT = Path(flowforge.__file__).parent
# Each site: (module, function) -> the key space it writes ("none": no key at all).
SITES = {
    ("api/hooks.py", "_accept"): "client",  # a workflow's own webhook: the sender's key
    ("usecases/routing.py", "route"): "system",  # source:<name>:<delivery id>
    ("usecases/reingest.py", "_accept"): "system",  # reingest:<delivery id>
    ("store/children.py", "start"): "system",  # child:<parent>:<step>:<fencing token>
    ("usecases/ticks.py", "params_for"): "system",  # schedule:<instant>
    ("usecases/grouping.py", "_params"): "none",  # a group's execution: the group row is its key
    # origin= accept's caller's, client by default
    ("usecases/intake.py", "_execution_params"): "parameter",
    ("usecases/grouping.py", "record"): "parameter",
}
# The statements that write idempotency_keys: each takes the origin as a parameter.
CLAIMS = {("store/creation.py", "CLAIM_KEY"), ("usecases/grouping.py", "CLAIM_KEY")}
# Where replay makes its executions: no idempotency key of any space.
KEYLESS = ("usecases/replay.py",)


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def _origin_of(node: ast.AST) -> str | None:
    """KeyOrigin.SYSTEM(.value) -> system, KeyOrigin.CLIENT(.value) -> client."""
    text = ast.unparse(node)
    for space in ("system", "client"):
        if text in (f"KeyOrigin.{space.upper()}", f"KeyOrigin.{space.upper()}.value"):
            return space
    return None


def sites() -> dict[tuple[str, str], str]:
    """Every function that calls intake.accept or grouping.record, or builds parameters
    with a `key_origin`, and the space it chooses ("parameter": passed through)."""
    found: dict[tuple[str, str], str] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        for function in _functions(tree):
            for node in ast.walk(function):
                space = None
                if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                    "intake.accept",
                    "grouping.record",
                ):
                    chosen = [k.value for k in node.keywords if k.arg == "origin"]
                    chosen += [a for a in node.args if _origin_of(a)]
                    space = _origin_of(chosen[0]) if chosen else "client"
                elif isinstance(node, ast.Dict):
                    for key, value in zip(node.keys, node.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "key_origin":
                            space = _origin_of(value) or "parameter"
                            keyless = any(
                                isinstance(k, ast.Constant)
                                and k.value == "key"
                                and isinstance(v, ast.Constant)
                                and v.value is None
                                for k, v in zip(node.keys, node.values, strict=True)
                            )
                            space = "none" if keyless else space
                if space is not None:
                    found[(module, function.name)] = found.get((module, function.name), space)
    return found


def test_every_site_that_makes_a_key_is_known_and_writes_its_space() -> None:
    found = sites()
    assert found == SITES, "a key-making site changed: classify it in SITES"


def test_only_a_workflows_own_webhook_writes_the_client_space() -> None:
    client = {site for site, space in sites().items() if space == "client"}
    assert client == {("api/hooks.py", "_accept")}


def test_every_statement_claiming_a_key_takes_its_origin_as_a_parameter() -> None:
    claims = set()
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                text = ast.unparse(node.value)
                if "INSERT INTO idempotency_keys" in text:
                    claims.add((str(path.relative_to(ROOT)), node.targets[0].id))
        source = path.read_text()
        if "INSERT INTO idempotency_keys" in source:
            # The origin is a parameter of the statement, never a literal in its SQL.
            assert "%(key_origin)s" in source, path
            assert "'client'" not in source and "'{KeyOrigin." not in source, path
    assert claims == CLAIMS
    for module in KEYLESS:
        assert "idempotency_keys" not in (ROOT / module).read_text()
