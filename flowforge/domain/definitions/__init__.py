"""Workflow definition parsing and validation: shape, DAG, templates and limits
(docs/contract.md#templates). One module per section of a definition, each a mixin of the one
parser below; the bounds in `bounds`, the shapes built in `shapes`. Every name is importable
from here, as it was from the single module this package replaced."""

from __future__ import annotations

from typing import Any

from flowforge.domain.definitions.attributes import (
    AttributeFilterInvalid,
    AttributesSection,
    attribute_filter,
    attribute_value,
    is_attribute_name,
    render_attributes,
)
from flowforge.domain.definitions.bounds import (
    ATTRIBUTE_NAME,
    DEFAULT_CATCHUP_WINDOW_S,
    DEFAULT_MAP_PARALLEL,
    DEFAULT_MAX_WAIT_WINDOWS,
    DEFAULT_PRIORITY,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_RETENTION_DAYS,
    EARLIEST_INSTANT,
    EVENT_NAME_PATTERN,
    LATEST_INSTANT,
    MAX_ASSIGNEES,
    MAX_ATTEMPTS,
    MAX_ATTRIBUTE_CHARS,
    MAX_ATTRIBUTES,
    MAX_BACKOFF_COEFFICIENT,
    MAX_BATCH_ITEMS,
    MAX_CATCHUP_WINDOW_S,
    MAX_CIRCUIT_FAILURES,
    MAX_CIRCUIT_S,
    MAX_CONCURRENCY_LIMIT,
    MAX_DEBOUNCE_WAIT_S,
    MAX_DEFINITION_BYTES,
    MAX_DELAY_S,
    MAX_EVENT_KEY_CHARS,
    MAX_EVENT_LOOKBACK_S,
    MAX_EVENT_NAME_CHARS,
    MAX_EVERY_S,
    MAX_FORM_CHOICES,
    MAX_FORM_FIELDS,
    MAX_FORM_TEXT,
    MAX_GROUP_WINDOW_S,
    MAX_HOLD_S,
    MAX_INITIAL_INTERVAL_S,
    MAX_JITTER_S,
    MAX_KEY_CHARS,
    MAX_LIMIT_RATE,
    MAX_LIMITS,
    MAX_MAP_ITEMS,
    MAX_MAP_PARALLEL,
    MAX_NAME_CHARS,
    MAX_NESTING_DEPTH,
    MAX_PARENTS,
    MAX_PRIORITY,
    MAX_QUEUED,
    MAX_REQUEST_TIMEOUT_S,
    MAX_RETENTION_DAYS,
    MAX_RETRY_INTERVAL_S,
    MAX_STEPS,
    MAX_STRING_CHARS,
    MAX_TEMPLATE_CHARS,
    MAX_TIME_LIMIT_S,
    MAX_WAIT_S,
    MIN_BACKOFF_COEFFICIENT,
    MIN_GROUP_WINDOW_S,
    MIN_LIMIT_RATE,
    MIN_PRIORITY,
)
from flowforge.domain.definitions.checks import Checks, DefinitionInvalid
from flowforge.domain.definitions.children import ChildSection
from flowforge.domain.definitions.delays import DelaySection, parse_until
from flowforge.domain.definitions.document import DocumentSection
from flowforge.domain.definitions.events import EventsSection
from flowforge.domain.definitions.flowcontrol import (
    FlowControlSection,
    KeyUnrendered,
    PriorityInvalid,
    execution_priority,
    render_concurrency_key,
)
from flowforge.domain.definitions.forms import (
    FormSection,
    FormValuesInvalid,
    asks_alike,
    check_values,
    form_schema,
    from_html,
    may_decide,
    require_values,
)
from flowforge.domain.definitions.graph import count_steps
from flowforge.domain.definitions.http_request import RequestSection
from flowforge.domain.definitions.limits import LimitsSection
from flowforge.domain.definitions.maps import MapSection
from flowforge.domain.definitions.retry import RetrySection
from flowforge.domain.definitions.schedules import ScheduleSection
from flowforge.domain.definitions.shapes import (
    EPOCH,
    EXECUTION_FIELDS,
    ITEM_NAMES,
    ITEM_ROW,
    ITEM_STEP_TYPES,
    METHODS,
    ON_EXHAUSTED,
    ON_FULL,
    ON_ITEM_FAILURE,
    ON_TIMEOUT,
    OPS,
    OVERLAP,
    RESERVED_NAMES,
    RESUME_AUTH,
    SAFE_METHODS,
    SCHEDULE_KEY,
    SHARED_LIMIT_NAME,
    STEP_ID,
    STEP_TYPES,
    ApprovalForm,
    Circuit,
    Concurrency,
    Definition,
    EventEmit,
    EventWait,
    FormField,
    Grouping,
    LimitSpec,
    RetryPolicy,
    Schedule,
    Step,
    is_step_id,
    is_step_row,
    item_row,
    split_item_row,
)
from flowforge.domain.definitions.steps import StepsSection
from flowforge.domain.definitions.waits import WaitSection
from flowforge.domain.definitions.webhooks import WebhookSection

__all__ = [
    "ATTRIBUTE_NAME",
    "DEFAULT_CATCHUP_WINDOW_S",
    "DEFAULT_MAP_PARALLEL",
    "DEFAULT_MAX_WAIT_WINDOWS",
    "DEFAULT_PRIORITY",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_RETENTION_DAYS",
    "EARLIEST_INSTANT",
    "EPOCH",
    "EVENT_NAME_PATTERN",
    "EXECUTION_FIELDS",
    "ITEM_NAMES",
    "ITEM_ROW",
    "ITEM_STEP_TYPES",
    "LATEST_INSTANT",
    "MAX_ASSIGNEES",
    "MAX_ATTEMPTS",
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_CHARS",
    "MAX_BACKOFF_COEFFICIENT",
    "MAX_BATCH_ITEMS",
    "MAX_CATCHUP_WINDOW_S",
    "MAX_CIRCUIT_FAILURES",
    "MAX_CIRCUIT_S",
    "MAX_CONCURRENCY_LIMIT",
    "MAX_DEBOUNCE_WAIT_S",
    "MAX_DEFINITION_BYTES",
    "MAX_DELAY_S",
    "MAX_EVENT_KEY_CHARS",
    "MAX_EVENT_LOOKBACK_S",
    "MAX_EVENT_NAME_CHARS",
    "MAX_EVERY_S",
    "MAX_FORM_CHOICES",
    "MAX_FORM_FIELDS",
    "MAX_FORM_TEXT",
    "MAX_GROUP_WINDOW_S",
    "MAX_HOLD_S",
    "MAX_INITIAL_INTERVAL_S",
    "MAX_JITTER_S",
    "MAX_KEY_CHARS",
    "MAX_LIMITS",
    "MAX_LIMIT_RATE",
    "MAX_MAP_ITEMS",
    "MAX_MAP_PARALLEL",
    "MAX_NAME_CHARS",
    "MAX_NESTING_DEPTH",
    "MAX_PARENTS",
    "MAX_PRIORITY",
    "MAX_QUEUED",
    "MAX_REQUEST_TIMEOUT_S",
    "MAX_RETENTION_DAYS",
    "MAX_RETRY_INTERVAL_S",
    "MAX_STEPS",
    "MAX_STRING_CHARS",
    "MAX_TEMPLATE_CHARS",
    "MAX_TIME_LIMIT_S",
    "MAX_WAIT_S",
    "METHODS",
    "MIN_BACKOFF_COEFFICIENT",
    "MIN_GROUP_WINDOW_S",
    "MIN_LIMIT_RATE",
    "MIN_PRIORITY",
    "ON_EXHAUSTED",
    "ON_FULL",
    "ON_ITEM_FAILURE",
    "ON_TIMEOUT",
    "OPS",
    "OVERLAP",
    "RESERVED_NAMES",
    "RESUME_AUTH",
    "SAFE_METHODS",
    "SCHEDULE_KEY",
    "SHARED_LIMIT_NAME",
    "STEP_ID",
    "STEP_TYPES",
    "ApprovalForm",
    "AttributeFilterInvalid",
    "Circuit",
    "Concurrency",
    "Definition",
    "DefinitionInvalid",
    "EventEmit",
    "EventWait",
    "FormField",
    "FormValuesInvalid",
    "Grouping",
    "KeyUnrendered",
    "LimitSpec",
    "PriorityInvalid",
    "RetryPolicy",
    "Schedule",
    "Step",
    "asks_alike",
    "attribute_filter",
    "attribute_value",
    "check_values",
    "execution_priority",
    "form_schema",
    "from_html",
    "is_attribute_name",
    "is_step_id",
    "is_step_row",
    "item_row",
    "may_decide",
    "parse_definition",
    "parse_operator_limit",
    "parse_schedule",
    "parse_until",
    "render_attributes",
    "render_concurrency_key",
    "require_values",
    "split_item_row",
]

_TOP_KEYS = frozenset(
    {
        "name",
        "input_schema",
        "description",
        "trigger",
        "steps",
        "concurrency",
        "deadline_s",
        "start_within_s",
        "retention_days",
        "limits",
        "archive_days",
        "priority",
        "attributes",
        "emits",
    }
)


class _Parser(
    Checks,
    DocumentSection,
    WebhookSection,
    ScheduleSection,
    FlowControlSection,
    LimitsSection,
    StepsSection,
    RequestSection,
    RetrySection,
    DelaySection,
    WaitSection,
    FormSection,
    EventsSection,
    MapSection,
    ChildSection,
    AttributesSection,
):
    """Walks one definition, each section in the order an author reads them."""

    def parse(self, doc: Any) -> Definition | None:
        """Validate the whole document; return a Definition only when nothing is wrong."""
        if not isinstance(doc, dict):
            self.error("$", "a definition must be a JSON object")
            return None
        # Limits come first and alone: they bound the work of every check after them.
        self.check_limits(doc, "$", 1)
        steps = doc.get("steps")
        if isinstance(steps, list) and count_steps(steps) > MAX_STEPS:
            self.error(
                "$.steps",
                f"{count_steps(steps)} steps (a map's item steps included) exceed the limit "
                f"of {MAX_STEPS} steps",
            )
        if self.errors:
            return None
        self.unknown_keys(doc, _TOP_KEYS, "$")
        name: Any = doc.get("name")
        if not isinstance(name, str) or not name.strip():
            self.error("$.name", "name is required: a non-empty string")
        elif len(name) > MAX_NAME_CHARS:
            self.error("$.name", f"name exceeds the limit of {MAX_NAME_CHARS} characters")
        if "description" in doc and not isinstance(doc["description"], str):
            self.error("$.description", "description must be a string")
        auth = self.webhook_auth(doc)
        grouping = self.grouping(doc)
        schedule = self.schedule(doc)
        if not isinstance(steps, list) or not steps:
            self.error("$.steps", "steps is required: a non-empty array")
            return None
        concurrency = self.concurrency(doc)
        deadline_s = self.time_limit(doc, "deadline_s")
        start_within_s = self.time_limit(doc, "start_within_s")
        retention_days = self.retention_days(doc)
        archive_days = self.archive_days(doc)
        priority = self.priority(doc)
        attributes = self.attributes(doc)
        input_schema = self.input_schema(doc)
        self.limit_names = (
            frozenset(doc["limits"]) if isinstance(doc.get("limits"), dict) else frozenset()
        )
        limits = self.limits(doc)
        emits = self.emits(doc)
        if emits is not None and (auth == "none" or grouping is not None):
            self.error(
                "$.emits",
                "emits needs signed webhooks that start one execution each (an auth other"
                " than none, no debounce or batch): only a verified delivery emits an event",
            )
        parsed = self.parse_steps(steps)
        if self.errors:
            return None
        return Definition(
            name=name,
            webhook_auth=auth,
            steps=parsed,
            concurrency=concurrency,
            deadline_s=deadline_s,
            start_within_s=start_within_s,
            retention_days=retention_days,
            archive_days=archive_days,
            schedule=schedule,
            input_schema=input_schema,
            grouping=grouping,
            limits=limits,
            priority=priority,
            attributes=attributes,
            emits=emits,
        )


def parse_definition(doc: Any, *, stored: bool = False) -> Definition:
    """Turn a client's JSON into a Definition, or report every problem in it at once.

    `stored` parses a version that was published already: rules added since it was
    published (such as the range of a literal `until`) must not make it unloadable, so
    they apply to new versions only and are checked again at run time.
    """
    parser = _Parser(stored)
    definition = parser.parse(doc)
    if parser.errors or definition is None:
        raise DefinitionInvalid(parser.errors)
    return definition


def parse_operator_limit(raw: Any, where: str) -> LimitSpec:
    """Check an operator's host or shared limit (FLOWFORGE_OUTBOUND_LIMITS,
    FLOWFORGE_SHARED_LIMITS) against the bounds a definition's limit has."""
    parser = _Parser(stored=False)
    spec = parser.limit_spec(raw, where)
    if parser.errors or spec is None:
        raise DefinitionInvalid(parser.errors)
    return spec


def parse_schedule(raw: Any) -> Schedule:
    """A stored `trigger.schedule` object back as a Schedule (validated when published)."""
    parser = _Parser(stored=True)
    schedule = parser.schedule({"trigger": {"schedule": raw}})
    if parser.errors or schedule is None:
        raise DefinitionInvalid(parser.errors)
    return schedule
