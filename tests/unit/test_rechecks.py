"""cache.Rechecks: the re-reads a failed signature verification may ask for (issue 22
item 11): a burst, then one per interval, per key."""

from __future__ import annotations

from flowforge.cache import Rechecks


def test_a_burst_then_none_until_the_interval_refills_one() -> None:
    rechecks: Rechecks[str] = Rechecks(interval_s=3600.0, burst=3, max_entries=10)
    assert [rechecks.allow("a") for _ in range(5)] == [True, True, True, False, False]
    assert rechecks.allow("b")  # per key


def test_a_refilled_bucket_allows_again() -> None:
    rechecks: Rechecks[str] = Rechecks(interval_s=0.0001, burst=1, max_entries=10)
    assert rechecks.allow("a")
    while not rechecks.allow("a"):  # refills after 0.1 ms
        pass


def test_the_table_is_bounded() -> None:
    rechecks: Rechecks[int] = Rechecks(interval_s=3600.0, burst=1, max_entries=4)
    for key in range(100):
        assert rechecks.allow(key)
    assert len(rechecks._buckets) <= 4
