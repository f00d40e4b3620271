"""Every bound of a workflow definition, named once (docs/reference/definition.md): the parser
checks them, and /openapi.json (flowforge/api/openapi), the console and the reference pages
state them from here, so a bound changed here changes everywhere it is said."""

from __future__ import annotations

from datetime import UTC, datetime

MAX_DEFINITION_BYTES = 262_144
MAX_STEPS = 100
MAX_PARENTS = 20
MAX_TEMPLATE_CHARS = 2_048
MAX_NESTING_DEPTH = 20
MAX_STRING_CHARS = 65_536
MAX_NAME_CHARS = 200
# docs/contract.md#map: the cap on a map's items, refused at publish (a literal array) and at
# run time (what `items` rendered to); and on how many items run at once.
MAX_MAP_ITEMS = 10_000
MAX_MAP_PARALLEL = 1_000
DEFAULT_MAP_PARALLEL = 10
MAX_WAIT_S = 31_536_000  # a year, like a delay
# docs/contract.md#approvals: an approval form's size, and its assignees.
MAX_FORM_FIELDS = 30
MAX_FORM_TEXT = 10_000  # a string field's maxLength at most; also its default
MAX_FORM_CHOICES = 100
MAX_ASSIGNEES = 50
# docs/contract.md#events: an event's name (a closed alphabet, so names are safe in paths,
# logs and metrics), its rendered key, and a wait step's own lookback (the setting
# FLOWFORGE_EVENT_LOOKBACK_S caps it at run time: an event is kept no longer than that).
MAX_EVENT_NAME_CHARS = 200
MAX_EVENT_KEY_CHARS = 200
EVENT_NAME_PATTERN = r"^[a-z0-9][a-z0-9._:-]{0,199}$"
# A sent event's key and id: no control characters.
EVENT_TEXT_PATTERN = r"^[^\u0000-\u001f\u007f]+$"
MAX_EVENT_LOOKBACK_S = 2_592_000  # thirty days
# docs/contract.md#priority: an execution's priority, a literal or "{{ input.<path> }}" rendered
# when the execution is created; higher is claimed first among ready steps, with ageing
# (flowforge/worker/executor.py). The range keeps the ageing's arithmetic small and
# the column a smallint (sql/0032_priorities.sql).
MIN_PRIORITY = -100
MAX_PRIORITY = 100
DEFAULT_PRIORITY = 0
# docs/contract.md#outbound-limits: outbound limits, by name; a step names one with `limit`.
# Bounds (docs/reference/security.md, "Who owns a limit"): a rate of at least one request
# an hour (1e-9/s spaced requests 31 years apart), a burst and a concurrency up to
# MAX_LIMIT_RATE, and a Retry-After hold of at most MAX_HOLD_S (a limit may lower it
# with max_hold_s; 0: a Retry-After never holds the key).
MAX_CIRCUIT_S = 86_400
MAX_LIMITS = 100
MAX_LIMIT_RATE = 100_000
MIN_LIMIT_RATE = 1 / 3600
MAX_HOLD_S = 3600.0
MAX_CIRCUIT_FAILURES = 1000
# `concurrency` (docs/reference/definition.md): its limit and its queue.
MAX_CONCURRENCY_LIMIT = 100_000
MAX_QUEUED = 10**9
# An http_request step's request and retry policy; /openapi.json reads these bounds.
MAX_REQUEST_TIMEOUT_S = 300
DEFAULT_REQUEST_TIMEOUT_S = 30
MAX_ATTEMPTS = 20
MAX_INITIAL_INTERVAL_S = 3600
MIN_BACKOFF_COEFFICIENT = 1
MAX_BACKOFF_COEFFICIENT = 10
MAX_RETRY_INTERVAL_S = 86_400
# A delay's duration_s: a year at most.
MAX_DELAY_S = 31_536_000
MAX_EVERY_S = 31_536_000
MAX_CATCHUP_WINDOW_S = 604_800  # a week
MAX_JITTER_S = 3_600
DEFAULT_CATCHUP_WINDOW_S = 60
# Time limits reach a year at most, like a delay.
MAX_TIME_LIMIT_S = 31_536_000
# How long finished executions are kept (docs/contract.md#retention). Fractions are allowed: a test
# or a soak keeps them for minutes. The newest version's value applies to every execution of
# the workflow (flowforge/worker/retention.py reads it from the stored definition).
DEFAULT_RETENTION_DAYS = 30.0
MAX_RETENTION_DAYS = 3650.0
# A concurrency key is stored and shown; a bounded length keeps index entries small.
MAX_KEY_CHARS = 255
# docs/contract.md#debounce-batch: debounce and batch bounds. A window is seconds to a day; a
# debounce's max wait a week at most (its group's events are kept until it starts); a batch's size
# bounds the execution input it builds (max_items bodies under the webhook body limit each).
MIN_GROUP_WINDOW_S = 1.0
MAX_GROUP_WINDOW_S = 86_400.0
MAX_DEBOUNCE_WAIT_S = 604_800.0
DEFAULT_MAX_WAIT_WINDOWS = 10  # max_wait_s defaults to ten windows (capped at the maximum)
MAX_BATCH_ITEMS = 1_000
# Instants every part of FlowForge can store and load again. PostgreSQL holds timestamps
# up to the year 294276, Python's datetime only years 1 to 9999 — in whatever time zone a
# session reads them, so a day of margin at each end.
EARLIEST_INSTANT = datetime(1, 1, 2, tzinfo=UTC)
LATEST_INSTANT = datetime(9999, 12, 30, tzinfo=UTC)
# docs/contract.md#search-attributes: named values rendered from a webhook's body when its
# execution is created and stored indexed, so an operator finds "the execution of order
# 4711" without scanning inputs. A few per version; a value is short text (an id, a name).
MAX_ATTRIBUTES = 8
MAX_ATTRIBUTE_CHARS = 200
ATTRIBUTE_NAME = r"[a-z][a-z0-9_]{0,39}"
