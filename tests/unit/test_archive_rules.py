"""`archive_days` (docs/contract.md#archive) is validated at its JSON path like `retention_days`,
and the archive keeps only allow-listed headers: never a credential, whatever its spelling."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.definitions import DefinitionInvalid, parse_definition
from flowforge.store import archive

STEPS = [{"id": "shape", "type": "transform", "output": {}}]


def test_no_archive_by_default_and_fractions_allowed() -> None:
    assert parse_definition({"name": "t", "steps": STEPS}).archive_days == 0
    for days in (0, 0.5, 7, 3650):
        parsed = parse_definition({"name": "t", "steps": STEPS, "archive_days": days})
        assert parsed.archive_days == days


@pytest.mark.parametrize("days", [-1, 3650.5, "7", True, None, [7]])
def test_a_bad_archive_days_is_refused_at_its_path(days: Any) -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition({"name": "t", "steps": STEPS, "archive_days": days})
    assert [e["path"] for e in caught.value.errors] == ["$.archive_days"]


def test_only_allow_listed_headers_are_kept() -> None:
    credentials = {
        "Authorization": "Bearer x",
        "Proxy-Authorization": "Basic x",
        "Cookie": "s=x",
        "webhook-signature": "v1,x",
        "Stripe-Signature": "t=1,v1=x",
        "X-Hub-Signature-256": "sha256=x",
        "X-Hub-Signature": "sha1=x",
        "X-Shopify-Hmac-Sha256": "x",
        "X-Slack-Signature": "v0=x",
        "X-Api-Key": "x",
    }
    kept = archive.kept_headers(
        {**credentials, "Content-Type": "application/json", "X-GitHub-Delivery": "d-1"}
    )
    assert kept == {"content-type": "application/json", "x-github-delivery": "d-1"}
    long = archive.kept_headers({"User-Agent": "a" * 5000})
    assert len(long["user-agent"]) == archive.MAX_HEADER_VALUE


def test_nothing_is_archived_without_archive_days() -> None:
    assert archive.intake_params(0, b"{}", {"Content-Type": "x"}, "none") == archive.NO_ARCHIVE
    params = archive.intake_params(1, b"{}", {"Content-Type": "x"}, "github")
    assert params["archive"] is True and params["auth_scheme"] == "github"
