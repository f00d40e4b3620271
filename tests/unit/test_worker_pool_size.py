"""FLOWFORGE_WORKER_POOL_SIZE: the worker's database budget, not its concurrency."""

from __future__ import annotations

import pytest

from flowforge.store.config import ConfigError, Settings


def test_the_pool_size_is_its_own_setting_whatever_the_concurrency() -> None:
    settings = Settings.from_env({"FLOWFORGE_WORKER_CONCURRENCY": "1000"})
    assert settings.worker_pool_size == 10
    sized = Settings.from_env(
        {"FLOWFORGE_WORKER_CONCURRENCY": "1000", "FLOWFORGE_WORKER_POOL_SIZE": "4"}
    )
    assert (sized.worker_concurrency, sized.worker_pool_size) == (1000, 4)


@pytest.mark.parametrize("raw", ["1", "0", "ten"])
def test_a_pool_too_small_to_run_a_worker_is_refused_at_start(raw: str) -> None:
    with pytest.raises(ConfigError, match="FLOWFORGE_WORKER_POOL_SIZE"):
        Settings.from_env({"FLOWFORGE_WORKER_POOL_SIZE": raw})


def test_the_background_services_have_a_third_of_the_pool_one_to_three() -> None:
    from flowforge.worker.supervisor import services_pool_size

    assert [services_pool_size(n) for n in (2, 5, 6, 9, 10, 100)] == [1, 1, 2, 3, 3, 3]
