"""The KV metadata's breaker: after Redis fails, calls within the cool-down fail without I/O; the
first call after it goes to Redis again."""

from __future__ import annotations

from kv_store.metadata import Breaker


def test_breaker_opens_for_its_cooldown_and_closes_on_success():
    now = [0.0]
    breaker = Breaker(1.0, clock=lambda: now[0])
    assert breaker.closed
    breaker.failed(None)
    now[0] = 0.99
    assert not breaker.closed
    now[0] = 1.0
    assert breaker.closed  # one call may try Redis again
    breaker.failed()  # still away: another cool-down from now
    now[0] = 1.5
    assert not breaker.closed
    now[0] = 2.0
    breaker.succeeded()
    assert breaker.closed
