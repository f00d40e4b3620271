"""An operator action is declared once (flowforge/domain/operations.py, docs/architecture.md):
every surface offers exactly the declared actions, each from its declaration, and each
declaration names a unit of work the store has, taking the declared params."""

from __future__ import annotations

import inspect

import pytest
from flask import Flask

from flowforge.api import executions, openapi, paths
from flowforge.api.console import views
from flowforge.cli import build_parser
from flowforge.cli.apiclient import ApiClient
from flowforge.cli.direct import Database
from flowforge.domain import operations
from flowforge.domain.operations import ACTIONS, Action, Answer, Done, Kind, Shown
from flowforge.usecases import actions

ID = "01a233ee-a3de-71f1-8ccd-4191093a47ad"
SAMPLE = {Kind.STEP: "charge", Kind.STEP_ROW: "charge", Kind.OUTCOME: "failed", Kind.OUTPUT: "{}"}


def _app() -> Flask:
    app = Flask("declared")
    paths.install(app)
    app.register_blueprint(executions.bp)
    app.register_blueprint(views.bp)
    return app


def _routes(app: Flask, prefix: str) -> dict[str, str]:
    """POST routes under `prefix` by endpoint."""
    return {
        rule.endpoint: rule.rule
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith(prefix) and "POST" in (rule.methods or ())
    }


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.name)
def test_the_unit_of_work_takes_the_declared_params(action: Action) -> None:
    unit = getattr(actions, action.does)
    taken = [
        p.name
        for p in inspect.signature(unit).parameters.values()
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]
    assert taken[:2] == ["conn", "execution_id"]
    assert len(taken) == 2 + len(action.params)
    assert "actor" in inspect.signature(unit).parameters


def test_names_commands_and_paths_are_each_declared_once() -> None:
    for attribute in ("name", "command"):
        values = [getattr(action, attribute) for action in ACTIONS]
        assert len(values) == len(set(values))
    routes = [action.path("{id}", "{step}") for action in ACTIONS]
    assert len(routes) == len(set(routes))


@pytest.mark.parametrize(
    ("prefix", "blueprint"), [("/api/v1/executions/", "executions"), ("/ui/executions/", "console")]
)
def test_the_api_and_the_console_route_each_declared_action(prefix: str, blueprint: str) -> None:
    routes = _routes(_app(), prefix)
    for action in ACTIONS:
        rule = routes[f"{blueprint}.{action.name}"]
        step = "/steps/<step_id>" if action.step else ""
        assert rule == f"{prefix}<execution_id:execution_id>{step}/{action.route}"


def test_the_openapi_document_has_each_declared_action_with_its_body() -> None:
    document = openapi.DOCUMENT
    for action in ACTIONS:
        post = document["paths"]["/api/v1/executions/" + action.path("{id}", "{step}")]["post"]
        assert post["summary"] == action.summary
        assert set(action.answers) <= set(post["responses"])
        if action.body is None:
            assert "requestBody" not in post
            continue
        schema = document["components"]["schemas"][action.body]
        assert set(schema["properties"]) == {p.field for p in action.fields}
        assert schema["additionalProperties"] is False


def test_the_cli_has_a_command_for_each_declared_action_remote_and_on_the_box() -> None:
    parser = build_parser()
    for action in ACTIONS:
        args = parser.parse_args([action.command, ID, *(SAMPLE[p.kind] for p in action.params)])
        assert (args.handler, args.operation) == ("actions.act", action.name)
    assert callable(ApiClient.act) and callable(Database.act)


def test_a_cancel_answers_by_whether_it_had_finished() -> None:
    cancel = operations.BY_NAME["cancel"]
    assert cancel.answer is Answer.CANCEL
    assert cancel.code(Done(ID, "cancelled", already_finished=True)) == 200
    assert cancel.code(Done(ID, "running")) == 202
    assert operations.BY_NAME["retry"].code(Done(ID, "queued")) == 202
    assert operations.BY_NAME["fail_paused"].code(Done(ID, "failed")) == 200


@pytest.mark.parametrize(
    ("shown", "offered"),
    [
        (Shown("running", (("a", "running"),)), {"cancel", "pause"}),
        (Shown("paused", (("a", "failed"),)), {"cancel", "resume", "fail_paused"}),
        (Shown("paused", (("a", "pending"),)), {"cancel", "resume"}),
        (Shown("failed", (("a", "failed"),)), {"retry"}),
        (Shown("needs_attention", (("a", "unknown"),)), {"cancel", "pause"}),
        (Shown("running", (), cancel_requested=True), {"cancel"}),
        (Shown("succeeded", (("a", "succeeded"),)), set()),
    ],
)
def test_the_console_offers_an_action_by_its_rule(shown: Shown, offered: set[str]) -> None:
    buttons = {a.name for a in ACTIONS if a.button is not None and a.button.offered(shown)}
    assert buttons == offered
