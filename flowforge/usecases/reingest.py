"""Re-ingest archived webhooks (docs/contract.md#reingest) as new executions of the newest version.

Each re-ingest has an identity in the system's key space (docs/contract.md#system-keys): the key
`reingest:<delivery id>` with origin `system`, which no client key can equal, claim or
block (a client's `Idempotency-Key: reingest:5` is origin `client`, another key). The
same delivery re-ingested again is answered with the execution it made, for as long as
that key is remembered; after that, the execution's `delivery_id` still says it exists,
so a delivery is re-ingested at most once while either lasts.

One request does bounded work: it reads at most SCAN_LIMIT archived rows of the range
and creates at most MAX_PER_REQUEST executions; `next` is the cursor to continue from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from flowforge.domain import inputschema, templating
from flowforge.domain.definitions import OPS
from flowforge.domain.model import ExecutionStatus, KeyOrigin
from flowforge.errors import ClientError, Conflict
from flowforge.usecases import intake

MAX_PER_REQUEST = 500
SCAN_LIMIT = 5000
SAMPLE_SIZE = 10
MAX_CURSOR = 2**63 - 1  # a delivery id is a bigint

# One page of a workflow's archive in the range, after the cursor, each with whether a
# re-ingest of it already exists (an execution linked to it that its intake did not make).
RANGE = """
SELECT d.id, d.received_at, d.body,
       (SELECT x.id::text FROM executions x
        WHERE x.delivery_id = d.id AND x.id <> d.execution_id LIMIT 1) AS reingested_as
FROM webhook_deliveries d
JOIN workflows w ON w.id = d.workflow_id
WHERE w.key = %(key)s AND d.received_at >= %(from)s AND d.received_at < %(to)s
  AND d.id > %(after)s
ORDER BY d.id
LIMIT %(scan)s
"""


class InvalidReingest(ClientError):
    """The re-ingest request is malformed: its range, filter or cursor."""

    status = 422
    title = "Invalid re-ingest"

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['path']}: {e['message']}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class Request:
    """A validated re-ingest request."""

    start: datetime
    end: datetime
    condition: dict[str, Any] | None
    dry_run: bool
    after: int
    limit: int


def parse(body: Any) -> Request:
    """Validate `{"from", "to", "filter"?, "dry_run"?, "after"?, "limit"?}`, naming each
    problem's path; nothing is done with a request that has any."""
    errors: list[dict[str, str]] = []
    if not isinstance(body, dict):
        raise InvalidReingest([{"path": "$", "message": "the body must be an object"}])
    unknown = set(body) - {"from", "to", "filter", "dry_run", "after", "limit"}
    errors += [{"path": f"$.{name}", "message": "unknown field"} for name in sorted(unknown)]
    bounds = []
    for name in ("from", "to"):
        value = body.get(name)
        try:
            moment = datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            errors.append({"path": f"$.{name}", "message": "an RFC 3339 time with an offset"})
        bounds.append(moment)
    condition = body.get("filter")
    if "filter" in body:  # null is no filter's spelling: /openapi.json says object
        errors += _condition_problems(condition)
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        errors.append({"path": "$.dry_run", "message": "true or false"})
    after = body.get("after", 0)
    if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= MAX_CURSOR:
        errors.append({"path": "$.after", "message": "the `next` of a previous answer"})
    limit = body.get("limit", MAX_PER_REQUEST)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PER_REQUEST:
        errors.append({"path": "$.limit", "message": f"an integer in [1, {MAX_PER_REQUEST}]"})
    if errors:
        raise InvalidReingest(errors)
    start, end = bounds
    assert start is not None and end is not None
    return Request(start, end, condition, dry_run, after, limit)


def _condition_problems(condition: Any) -> list[dict[str, str]]:
    """What is wrong with a `when`-style filter over the archived body (`input.…`)."""
    if not isinstance(condition, dict) or set(condition) - {"path", "op", "value"}:
        return [{"path": "$.filter", "message": "an object with path, op and value"}]
    path, op = condition.get("path"), condition.get("op")
    problems = []
    if not isinstance(path, str) or not templating.is_path(path) or path.split(".")[0] != "input":
        problems.append({"path": "$.filter.path", "message": "a dotted path such as input.type"})
    if op not in OPS:
        problems.append({"path": "$.filter.op", "message": f"one of {', '.join(OPS)}"})
    elif op != "exists" and "value" not in condition:
        problems.append({"path": "$.filter.value", "message": f"required for op {op!r}"})
    elif op == "in" and not isinstance(condition["value"], list):
        problems.append({"path": "$.filter.value", "message": "an array for op 'in'"})
    return problems


def _matches(condition: dict[str, Any] | None, body: Any) -> bool:
    """Whether an archived body passes the filter; a path it lacks does not match."""
    if condition is None:
        return True
    try:
        return templating.evaluate_condition(condition, {"input": body})
    except templating.TemplateError:
        return False


def reingest(
    conn: psycopg.Connection, key: str, request: Request, actor: dict[str, Any]
) -> dict[str, Any]:
    """Dry run: how many archived deliveries of this page match, and a sample. Otherwise:
    one execution of the newest version per matching delivery not re-ingested yet."""
    target = intake.unsigned_target(conn, key)  # NotFound for an unknown workflow
    rows = conn.execute(
        RANGE,
        {
            "key": key,
            "from": request.start,
            "to": request.end,
            "after": request.after,
            "scan": SCAN_LIMIT,
        },
    ).fetchall()
    matched: list[tuple[int, datetime, bytes, Any, str | None]] = []
    last_read = request.after
    for delivery_id, received_at, body, reingested_as in rows:
        last_read = delivery_id
        parsed = json.loads(bytes(body))
        if _matches(request.condition, parsed):
            matched.append((delivery_id, received_at, bytes(body), parsed, reingested_as))
            if len(matched) == request.limit:
                break
    more = len(rows) == SCAN_LIMIT or len(matched) == request.limit
    answer: dict[str, Any] = {
        "dry_run": request.dry_run,
        "matched": len(matched),
        "already_reingested": sum(1 for m in matched if m[4] is not None),
        "next": last_read if more else None,
    }
    if request.dry_run:
        answer["sample"] = [
            {"delivery_id": d, "received_at": at.isoformat(), "input": parsed}
            for d, at, _, parsed, _ in matched[:SAMPLE_SIZE]
        ]
        return answer
    created: list[dict[str, Any]] = []
    existing: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for delivery_id, _, body, parsed, reingested_as in matched:
        if reingested_as is not None:
            # Also after its system key was forgotten: never a second re-ingest.
            existing.append({"delivery_id": delivery_id, "execution_id": reingested_as})
            continue
        try:
            if target.input_checker is not None:
                inputschema.check(target.input_checker, parsed)
            accepted = _accept(conn, key, target, delivery_id, body, actor)
        except ClientError as exc:
            refused.append({"delivery_id": delivery_id, "detail": exc.detail})
            continue
        entry = {"delivery_id": delivery_id, "execution_id": accepted.execution_id}
        (existing if accepted.replayed else created).append(entry)
    answer.update(created=created, existing=existing, refused=refused, version=target.version)
    return answer


def _accept(
    conn: psycopg.Connection,
    key: str,
    target: intake.Target,
    delivery_id: int,
    body: bytes,
    actor: dict[str, Any],
) -> intake.Accepted:
    """One delivery's execution through the intake, keyed in the system's key space."""
    for attempt in range(2):
        if attempt:
            target = intake.unsigned_target(conn, key)
        event = {
            "to": ExecutionStatus.QUEUED.value,
            "version": target.version,
            "reingest_of": delivery_id,
            "actor": actor,
        }
        system = {"delivery_id": delivery_id, "event": json.dumps(event)}
        try:
            return intake.accept(
                conn,
                target,
                body,
                f"reingest:{delivery_id}",
                None,
                system=system,
                origin=KeyOrigin.SYSTEM,
            )
        except intake.StaleTarget:
            continue
    raise Conflict(f"workflow {key!r} changed during the re-ingest; send it again")
