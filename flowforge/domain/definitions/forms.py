"""A wait step's approval form and assignees (docs/contract.md#approvals), checked at
publish; and the values a person (or a machine) submits, checked against it.

The form's fields are a small subset of JSON Schema, so an author can read it as one: an
object of `properties`, each a string (`maxLength`, or a closed set by `enum`, or by
`oneOf` of `{"const", "title"}` to give each choice a title), a `number` or an `integer`
(`minimum`, `maximum`) or a `boolean`; and `required`. Nothing else is accepted, so
every form renders as plain HTML and checks in a few comparisons. A submission is
refused whole, with every bad field's JSON path: messages name the rule, never the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flowforge.domain.definitions.bounds import (
    MAX_ASSIGNEES,
    MAX_FORM_CHOICES,
    MAX_FORM_FIELDS,
    MAX_FORM_TEXT,
    MAX_NAME_CHARS,
)
from flowforge.domain.definitions.checker import Checker, is_whole
from flowforge.domain.definitions.shapes import STEP_ID, ApprovalForm, FormField
from flowforge.domain.jsonvalues import is_number, storable_text
from flowforge.errors import ClientError

FIELD_TYPES = ("string", "number", "integer", "boolean")
# What the console's form posts beside the fields (its CSRF token, the button pressed): a
# field of either name would be read from them (the token stored in the step's output).
RESERVED_NAMES = frozenset({"csrf", "decision"})
_FORM_KEYS = frozenset({"title", "description", "fields"})
_FIELDS_KEYS = frozenset({"type", "properties", "required"})
_COMMON = frozenset({"type", "title", "description"})
_PROPERTY_KEYS = {
    "string": _COMMON | {"maxLength", "enum", "oneOf"},
    "number": _COMMON | {"minimum", "maximum"},
    "integer": _COMMON | {"minimum", "maximum"},
    "boolean": _COMMON,
}


def _text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS


class FormSection(Checker):
    """`form` and `assignees` of a wait step."""

    def approval(self, raw: dict[str, Any], path: str) -> ApprovalForm | None:
        """Check a wait step's form and assignees; None when it declares no form."""
        form, assignees = raw.get("form"), raw.get("assignees")
        if form is None:
            if assignees is not None:
                self.error(f"{path}.assignees", "assignees need a form to decide")
            return None
        where = f"{path}.form"
        if not isinstance(form, dict):
            self.error(where, "form must be an object with a title and fields")
            return None
        self.unknown_keys(form, _FORM_KEYS, where)
        title, description = form.get("title"), form.get("description")
        if not _text(title):
            self.error(f"{where}.title", f"title is required: 1 to {MAX_NAME_CHARS} characters")
        if description is not None and not isinstance(description, str):
            self.error(f"{where}.description", "description must be a string")
        fields = self._fields(form.get("fields"), f"{where}.fields")
        return ApprovalForm(
            title=title if isinstance(title, str) else "",
            description=description if isinstance(description, str) else None,
            fields=fields,
            assignees=self._assignees(assignees, f"{path}.assignees"),
        )

    def _assignees(self, assignees: Any, path: str) -> tuple[str, ...]:
        if assignees is None:
            return ()
        if not isinstance(assignees, list) or len(assignees) > MAX_ASSIGNEES:
            self.error(path, f"assignees must be a list of at most {MAX_ASSIGNEES} key names")
            return ()
        for index, name in enumerate(assignees):
            if not _text(name):
                self.error(f"{path}[{index}]", "an assignee is an API key's name")
        if len(set(map(str, assignees))) != len(assignees):
            self.error(path, "assignees must not repeat a name")
        return tuple(name for name in assignees if isinstance(name, str))

    def _fields(self, fields: Any, path: str) -> tuple[FormField, ...]:
        if not isinstance(fields, dict):
            self.error(path, 'fields must be a JSON Schema {"type": "object", "properties": …}')
            return ()
        self.unknown_keys(fields, _FIELDS_KEYS, path)
        if fields.get("type", "object") != "object":
            self.error(f"{path}.type", 'a form is an object: type must be "object"')
        properties = fields.get("properties")
        if not isinstance(properties, dict) or not 0 < len(properties) <= MAX_FORM_FIELDS:
            self.error(f"{path}.properties", f"properties must hold 1 to {MAX_FORM_FIELDS} fields")
            return ()
        required = fields.get("required", [])
        if not isinstance(required, list) or any(
            not isinstance(name, str) or name not in properties for name in required
        ):
            self.error(f"{path}.required", "required must list names of properties")
            required = []
        return tuple(
            self._field(name, prop, f"{path}.properties.{name}", name in required)
            for name, prop in properties.items()
        )

    def _field(self, name: str, prop: Any, path: str, required: bool) -> FormField:
        if STEP_ID.fullmatch(name) is None:
            self.error(path, "a field's name is a letter or _, then letters, digits or _")
        elif name in RESERVED_NAMES:
            self.error(path, "csrf and decision are the console form's own names")
        kind = prop.get("type") if isinstance(prop, dict) else None
        if kind not in FIELD_TYPES:
            self.error(f"{path}.type", f"type must be one of {', '.join(FIELD_TYPES)}")
            return FormField(name=name, type="string", title=name)
        self.unknown_keys(prop, _PROPERTY_KEYS[kind], path)
        title, description = prop.get("title", name), prop.get("description")
        if not _text(title):
            self.error(f"{path}.title", f"title must be 1 to {MAX_NAME_CHARS} characters")
        if description is not None and not isinstance(description, str):
            self.error(f"{path}.description", "description must be a string")
        field = FormField(
            name=name,
            type=kind,
            title=title if isinstance(title, str) else name,
            description=description if isinstance(description, str) else None,
            required=required,
        )
        if kind == "string":
            return self._string(prop, path, field)
        if kind != "boolean":
            return self._number(prop, path, field)
        return field

    def _string(self, prop: dict[str, Any], path: str, field: FormField) -> FormField:
        max_length = prop.get("maxLength", MAX_FORM_TEXT)
        if not is_whole(max_length) or not 0 < max_length <= MAX_FORM_TEXT:
            self.error(f"{path}.maxLength", f"maxLength must be an integer 1 to {MAX_FORM_TEXT}")
            max_length = MAX_FORM_TEXT
        choices: list[tuple[str, str]] = []
        if "enum" in prop and "oneOf" in prop:
            self.error(path, "give the choices by enum or by oneOf, not both")
        elif "enum" in prop:
            enum = prop["enum"]
            if isinstance(enum, list):
                choices = [(value, value) for value in enum if isinstance(value, str)]
            if not isinstance(enum, list) or len(choices) != len(enum):
                self.error(f"{path}.enum", "enum must be a list of strings")
        elif "oneOf" in prop:
            choices = self._one_of(prop["oneOf"], f"{path}.oneOf")
        if "enum" in prop or "oneOf" in prop:
            values = [value for value, _ in choices]
            if not 0 < len(values) <= MAX_FORM_CHOICES or len(set(values)) != len(values):
                self.error(path, f"1 to {MAX_FORM_CHOICES} choices, each once")
        return FormField(**{**field.__dict__, "max_length": max_length, "choices": tuple(choices)})

    def _one_of(self, one_of: Any, path: str) -> list[tuple[str, str]]:
        if not isinstance(one_of, list):
            self.error(path, 'oneOf must be a list of {"const": "…", "title": "…"}')
            return []
        choices = []
        for index, option in enumerate(one_of):
            if (
                not isinstance(option, dict)
                or set(option) - {"const", "title"}
                or not isinstance(option.get("const"), str)
                or not _text(option.get("title", option.get("const")))
            ):
                self.error(f"{path}[{index}]", 'a choice is {"const": "<string>", "title": "…"}')
                continue
            choices.append((str(option["const"]), str(option.get("title", option["const"]))))
        return choices

    def _number(self, prop: dict[str, Any], path: str, field: FormField) -> FormField:
        bounds: dict[str, float | None] = {}
        for key in ("minimum", "maximum"):
            value = prop.get(key)
            if value is not None and not _finite(value):
                # A bound no float holds (an integer of 400 digits) could not be compared
                # or named in a message; refused here rather than crash a submission.
                self.error(f"{path}.{key}", f"{key} must be a number a 64-bit float holds")
                value = None
            bounds[key] = value
        low, high = bounds["minimum"], bounds["maximum"]
        if low is not None and high is not None and low > high:
            self.error(path, "minimum must not be more than maximum")
        return FormField(**{**field.__dict__, "minimum": low, "maximum": high})


def may_decide(form: ApprovalForm, user: str) -> bool:
    """Whether a console user (an API key's name) may decide: an assignee, or anyone when
    the form names nobody (any operator); the key must also be one that may act on the
    workflow, which the callers check as for every operator action."""
    return not form.assignees or user in form.assignees


def _values(field: FormField) -> tuple[str, ...]:
    return tuple(value for value, _ in field.choices)


def asks_alike(first: ApprovalForm | None, second: ApprovalForm | None) -> bool:
    """Whether two versions of a wait ask the same people the same thing: both no form, or
    the same assignees and fields but for their words (title, description). A replay keeps
    a decision only then (docs/contract.md#replay)."""
    if first is None or second is None:
        return first is second

    def rules(form: ApprovalForm) -> tuple[Any, ...]:
        fields = tuple(
            (f.name, f.type, f.required, f.max_length, f.minimum, f.maximum, _values(f))
            for f in form.fields
        )
        return form.assignees, fields

    return rules(first) == rules(second)


class FormValuesInvalid(ClientError):
    """A submission does not fit its approval form; nothing was decided."""

    status = 422
    title = "Form values invalid"

    def __init__(self, problems: list[dict[str, str]]) -> None:
        super().__init__(f"the form's values have {len(problems)} problem(s); nothing was decided")
        self.errors = problems


def require_values(form: ApprovalForm, values: Any, path: str) -> None:
    """Raise FormValuesInvalid (422, every problem by its path) unless `values` fit."""
    problems = check_values(form, values, path)
    if problems:
        raise FormValuesInvalid(problems)


def check_values(form: ApprovalForm, values: Any, path: str) -> list[dict[str, str]]:
    """Every problem of a submission (empty when it is good), each with its JSON path below
    `path`; messages say the rule, never the value sent."""
    if not isinstance(values, dict):
        return [{"path": path, "message": "the form's values must be a JSON object"}]
    known = {field.name: field for field in form.fields}
    problems = [
        {"path": f"{path}.{name}", "message": "not a field of this form"}
        for name in values
        if name not in known
    ]
    for field in form.fields:
        where = f"{path}.{field.name}"
        if field.name not in values:
            if field.required:
                problems.append({"path": where, "message": f"{field.title} is required"})
            continue
        message = _field_problem(field, values[field.name])
        if message is not None:
            problems.append({"path": where, "message": message})
    return problems


def _field_problem(field: FormField, value: Any) -> str | None:
    if field.type == "boolean":
        return None if isinstance(value, bool) else "must be true or false"
    if field.type == "string":
        if not isinstance(value, str):
            return "must be a string"
        if not storable_text(value):
            # A posted form is not parsed as JSON: its NUL would fail the insert (a 500).
            return "must not contain NUL characters or unpaired surrogates"
        if field.choices:
            if value not in {choice for choice, _ in field.choices}:
                return "must be one of: " + ", ".join(choice for choice, _ in field.choices)
        elif field.max_length is not None and len(value) > field.max_length:
            return f"must be at most {field.max_length} characters"
        return None
    if field.type == "integer" and not is_whole(value):
        return "must be an integer"
    if not is_number(value):
        return "must be a number"
    if not _finite(value):
        return "must be a number a 64-bit float holds"
    if field.minimum is not None and value < field.minimum:
        return f"must be at least {field.minimum:g}"
    if field.maximum is not None and value > field.maximum:
        return f"must be at most {field.maximum:g}"
    return None


def _finite(value: Any) -> bool:
    """A JSON number a float holds: math.isfinite raises OverflowError on an integer of
    hundreds of digits, which an API body (up to 4300 digits) or a posted form may carry."""
    if not is_number(value):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def from_html(
    form: ApprovalForm, posted: Mapping[str, str], path: str
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """A form posted by a browser (every value a string, an unchecked box absent) as the
    JSON values it stands for, with every problem of parsing and checking it; an empty
    text box is a value left out."""
    values: dict[str, Any] = {}
    problems = []
    for field in form.fields:
        text = posted.get(field.name, "")
        if field.type == "boolean":
            values[field.name] = text == "true"
        elif text == "":
            continue
        elif field.type == "string":
            values[field.name] = text
        else:
            try:
                number: float | int = int(text) if field.type == "integer" else float(text)
            except ValueError:
                problems.append({"path": f"{path}.{field.name}", "message": f"must be {_a(field)}"})
                continue
            values[field.name] = number
    seen = {problem["path"] for problem in problems}
    problems += [found for found in check_values(form, values, path) if found["path"] not in seen]
    return values, problems


def _a(field: FormField) -> str:
    return "an integer" if field.type == "integer" else "a number"


def form_schema(form: ApprovalForm) -> dict[str, Any]:
    """The form as its declaration spells it (choices as `oneOf`), for the API's answers."""
    properties: dict[str, Any] = {}
    for field in form.fields:
        prop: dict[str, Any] = {"type": field.type, "title": field.title}
        if field.description is not None:
            prop["description"] = field.description
        if field.choices:
            prop["oneOf"] = [{"const": value, "title": title} for value, title in field.choices]
        elif field.max_length is not None:
            prop["maxLength"] = field.max_length
        for key in ("minimum", "maximum"):
            if getattr(field, key) is not None:
                prop[key] = getattr(field, key)
        properties[field.name] = prop
    fields = {
        "type": "object",
        "properties": properties,
        "required": [field.name for field in form.fields if field.required],
    }
    shown: dict[str, Any] = {"title": form.title, "fields": fields}
    if form.description is not None:
        shown["description"] = form.description
    return shown
