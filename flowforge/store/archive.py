"""The webhook archive (docs/contract.md#archive): what an accepted webhook was, kept for re-ingest.

When the newest version of a workflow has `archive_days` > 0, the intake statement
(intake.CREATE_EXECUTION, flowcontrol.GATED_INTAKE) writes one more row in the same
statement, hence the same transaction, as the execution: the body exactly as received,
the headers in KEPT_HEADERS, and how it was verified (auth scheme and the id of the
secret that verified it). The execution's `delivery_id` names that row.

The headers are an allow-list, not a deny-list: a credential (Authorization, a cookie,
Stripe-Signature, X-Hub-Signature-256, webhook-signature, ...) is never kept because it is
never named here, whatever a provider invents next.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Headers that say what a delivery was, none of which proves who sent it.
KEPT_HEADERS = (
    "content-type",
    "user-agent",
    "idempotency-key",
    "webhook-id",
    "webhook-timestamp",
    "x-github-delivery",
    "x-github-event",
    "x-github-hook-id",
    "x-shopify-webhook-id",
    "x-shopify-topic",
    "x-shopify-shop-domain",
    "x-slack-request-timestamp",
    "x-slack-retry-num",
)
MAX_HEADER_VALUE = 1024

# The archive row, one more CTE of the intake statement: written only when the execution
# is (`accepted`) and the workflow archives (%(archive)s); its id becomes the execution's
# delivery_id (see DELIVERY_ID).
ARCHIVE_CTE = """archived AS (
    INSERT INTO webhook_deliveries (workflow_id, execution_id, body, headers, auth_scheme,
                                    secret_id, source_id)
    SELECT %(workflow_id)s, %(id)s, %(archive_body)s, %(archive_headers)s::jsonb,
           %(auth_scheme)s, coalesce(%(archive_secret_id)s::bigint, %(secret_id)s),
           %(archive_source_id)s
    FROM accepted WHERE %(archive)s
    RETURNING id
)"""
# An execution's delivery: the one it re-ingests, else the one its intake just archived.
DELIVERY_ID = "coalesce(%(delivery_id)s::bigint, (SELECT id FROM archived))"

# Not archived: the intake parameters of a schedule's tick or a re-ingest.
NO_ARCHIVE: dict[str, Any] = {
    "archive": False,
    "archive_body": None,
    "archive_headers": None,
    "auth_scheme": None,
    "delivery_id": None,
    "archive_secret_id": None,
    "archive_source_id": None,
}


def kept_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a request worth keeping (KEPT_HEADERS), names lower-cased, values
    cut to MAX_HEADER_VALUE characters."""
    lowered = {name.lower(): value for name, value in headers.items()}
    return {name: lowered[name][:MAX_HEADER_VALUE] for name in KEPT_HEADERS if name in lowered}


@dataclass(frozen=True)
class Via:
    """A source that verified a routed webhook: its id, its auth scheme and the id of the
    source secret that verified it (the workflow's own secrets played no part)."""

    source_id: int
    auth_scheme: str
    secret_id: int | None


def intake_params(
    archive_days: float,
    body: bytes,
    headers: Mapping[str, str],
    auth_scheme: str,
    via: Via | None = None,
) -> dict[str, Any]:
    """The archive's part of a webhook's intake parameters (NO_ARCHIVE when it keeps none).
    A webhook routed through a source (`via`) is archived with the source's scheme and
    secret, once per execution it started."""
    if archive_days <= 0:
        return NO_ARCHIVE
    return {
        "archive": True,
        "archive_body": body,
        "archive_headers": json.dumps(kept_headers(headers)),
        "auth_scheme": auth_scheme if via is None else via.auth_scheme,
        "delivery_id": None,
        "archive_secret_id": None if via is None else via.secret_id,
        "archive_source_id": None if via is None else via.source_id,
    }


# expire_archive: one batch of archived webhooks older than their workflow's archive_days,
# read from its newest version like retention_days (0 or absent: nothing is kept, so
# publishing archive_days 0 clears the archive). Through webhook_deliveries_workflow;
# rows a re-ingest is reading are skipped, not waited for.
EXPIRE_ARCHIVE = """
WITH policy AS (
    SELECT w.id AS workflow_id,
           now() - make_interval(secs => 86400 * coalesce(
               CASE WHEN jsonb_typeof(v.definition -> 'archive_days') = 'number'
                    THEN (v.definition ->> 'archive_days')::float8 END, 0)) AS cutoff
    FROM workflows w
    JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.latest_version
), doomed AS (
    SELECT d.id
    FROM policy p
    CROSS JOIN LATERAL (
        SELECT d.id FROM webhook_deliveries d
        WHERE d.workflow_id = p.workflow_id AND d.received_at < p.cutoff
        ORDER BY d.received_at
        LIMIT %(limit)s
        FOR UPDATE OF d SKIP LOCKED
    ) d
    LIMIT %(limit)s
)
DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM doomed)
"""
