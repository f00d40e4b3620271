"""The webhook token bucket, on a clock the test controls."""

from __future__ import annotations

from flowforge.api.ratelimit import RateLimiter


def test_bursts_then_refills_at_the_rate() -> None:
    limiter = RateLimiter(rate=2.0, burst=2.0)
    assert limiter.retry_after("a", now=0.0) is None
    assert limiter.retry_after("a", now=0.0) is None
    assert limiter.retry_after("a", now=0.0) == 1
    assert limiter.retry_after("b", now=0.0) is None  # keys are independent
    assert limiter.retry_after("a", now=0.5) is None  # half a second = one token
    assert limiter.retry_after("a", now=0.5) == 1


def test_slow_rates_ask_for_longer_waits() -> None:
    limiter = RateLimiter(rate=0.1, burst=1.0)
    assert limiter.retry_after("a", now=0.0) is None
    assert limiter.retry_after("a", now=0.0) == 10


def test_buckets_of_made_up_keys_do_not_pile_up() -> None:
    """Every well-formed key in a URL gets a bucket; a flood of made-up keys must not keep
    one each forever (a memory leak anyone can drive)."""
    limiter = RateLimiter(rate=1.0, burst=5.0, max_keys=100)
    for index in range(10_000):
        assert limiter.retry_after(f"nonexistent-{index}", now=0.0) is None
    assert len(limiter) <= 100


def test_refilled_buckets_are_forgotten_first() -> None:
    limiter = RateLimiter(rate=1.0, burst=2.0, max_keys=1_000)
    for index in range(500):
        limiter.retry_after(f"idle-{index}", now=0.0)
    # Two seconds later every one of them is full again, as good as absent.
    limiter.retry_after("busy", now=2.0)
    assert len(limiter) == 1


def test_a_drained_bucket_in_use_survives_a_flood_of_new_keys() -> None:
    """Least recently used buckets go first: a key under attack stays limited."""
    limiter = RateLimiter(rate=0.001, burst=1.0, max_keys=3)
    assert limiter.retry_after("victim", now=0.0) is None
    assert limiter.retry_after("victim", now=0.0) is not None
    for index in range(50):
        limiter.retry_after(f"flood-{index}", now=0.0)
        # Keep the victim recently used, as a key under attack is.
        assert limiter.retry_after("victim", now=0.0) is not None
    assert len(limiter) <= 3
