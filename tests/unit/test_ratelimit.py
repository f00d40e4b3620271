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
