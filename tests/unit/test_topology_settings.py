"""The settings of a topology of several hosts (issue 26) fail fast when wrong."""

from __future__ import annotations

import pytest

from flowforge.store.config import ConfigError, Settings
from flowforge.worker.broker import broker_urls


def test_a_transaction_pooler_needs_a_direct_url() -> None:
    with pytest.raises(ConfigError, match="FLOWFORGE_DATABASE_DIRECT_URL"):
        Settings.from_env({"FLOWFORGE_DATABASE_POOLER": "transaction"})
    settings = Settings.from_env(
        {
            "FLOWFORGE_DATABASE_URL": "postgresql://pgbouncer:6432/ff",
            "FLOWFORGE_DATABASE_POOLER": "transaction",
            "FLOWFORGE_DATABASE_DIRECT_URL": "postgresql://db:5432/ff",
        }
    )
    assert settings.behind_pooler and settings.direct_url == "postgresql://db:5432/ff"
    plain = Settings.from_env({"FLOWFORGE_DATABASE_URL": "postgresql://db/ff"})
    assert not plain.behind_pooler and plain.direct_url == "postgresql://db/ff"


def test_unknown_pooler_and_queue_type_are_refused() -> None:
    with pytest.raises(ConfigError, match="FLOWFORGE_DATABASE_POOLER"):
        Settings.from_env({"FLOWFORGE_DATABASE_POOLER": "session"})
    with pytest.raises(ConfigError, match="FLOWFORGE_AMQP_QUEUE_TYPE"):
        Settings.from_env({"FLOWFORGE_AMQP_QUEUE_TYPE": "stream"})
    assert Settings.from_env({}).amqp_queue_type == "quorum"
    assert Settings.from_env({"FLOWFORGE_AMQP_QUEUE_TYPE": "Classic"}).amqp_queue_type == "classic"


def test_a_url_list_is_split_on_commas() -> None:
    assert broker_urls("amqp://a/%2F, amqp://b/%2F,") == ["amqp://a/%2F", "amqp://b/%2F"]
    assert broker_urls("amqp://u:p%2Cq@a/%2F") == ["amqp://u:p%2Cq@a/%2F"]


def test_synchronous_commit_levels_per_transaction_kind() -> None:
    default = Settings.from_env({})
    assert default.sync_unsafe_claims == "" and default.sync_intake == ""
    assert Settings.from_env({"FLOWFORGE_SYNC_UNSAFE_CLAIMS": "OFF"}).sync_unsafe_claims == ""
    raised = Settings.from_env(
        {"FLOWFORGE_SYNC_UNSAFE_CLAIMS": "remote_apply", "FLOWFORGE_SYNC_INTAKE": " on "}
    )
    assert raised.sync_unsafe_claims == "remote_apply" and raised.sync_intake == "on"
    for bad in ("local", "true", "remote"):
        with pytest.raises(ConfigError, match="FLOWFORGE_SYNC_INTAKE must be off or one of"):
            Settings.from_env({"FLOWFORGE_SYNC_INTAKE": bad})
