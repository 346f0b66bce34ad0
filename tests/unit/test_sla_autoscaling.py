"""The SLA autoscaling policy (services/extensions/ray/sla_autoscaling.py) as Serve's controller calls
it: replicas from the gateways' load counters in Redis (a real server) and a stage's capacity, within
the deployment's bounds; down only after the lower target held; Serve's default without counters."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from services.extensions.ray.sla_autoscaling import KEY, SlaAutoscaling


def _ctx(now: float, state: dict, current: int = 1, lo: int = 1, hi: int = 8, queued: float = 0.0):
    from ray.serve._private.common import DeploymentID

    return AutoscalingContext(
        deployment_id=DeploymentID(name="Encoder", app_name="omniray"), deployment_name="Encoder", app_name="omniray",
        current_num_replicas=current, target_num_replicas=current, running_replicas=[], total_num_requests=queued,
        total_queued_requests=0.0, aggregated_metrics={}, raw_metrics={}, capacity_adjusted_min_replicas=lo,
        capacity_adjusted_max_replicas=hi, policy_state=state, last_scale_up_time=None, last_scale_down_time=None,
        current_time=now, config=AutoscalingConfig(min_replicas=lo, max_replicas=hi),
    )  # fmt: skip


@pytest.fixture
def redis(redis_url):
    from services.common.redis_config import sync_client

    client = sync_client(redis_url)
    client.delete(KEY)
    yield client
    client.delete(KEY)


def _tick(policy, redis, now: float, state: dict, tiles: float, **kw) -> tuple[int, dict]:
    redis.hset(KEY, "image_tiles", tiles)
    return policy(_ctx(now, state, **kw))


def test_replicas_follow_the_offered_tiles_not_the_queue(redis, redis_url):
    """100 tiles/s against 40 a replica (headroom 1.2): 3 replicas, while the queue is still empty."""
    policy = SlaAutoscaling({"image_tiles": 40.0}, headroom=1.2, window_s=20, redis_url=redis_url)
    _, state = _tick(policy, redis, 1000.0, {}, 0.0)
    target, state = _tick(policy, redis, 1010.0, state, 1000.0)
    assert target == 3 and state["sla_rates"] == {"image_tiles": 100.0}


def test_bounds_hold_and_the_lower_target_waits(redis, redis_url):
    policy = SlaAutoscaling({"image_tiles": 10.0}, headroom=1.0, downscale_after_s=30, redis_url=redis_url)
    _, state = _tick(policy, redis, 0.0, {}, 0.0)
    target, state = _tick(policy, redis, 10.0, state, 10_000.0, hi=4)
    assert target == 4  # 100 replicas' worth, capped at max
    # the load stops: the lower target (the minimum) must hold 30 s before replicas go
    t = 10.0
    for _ in range(3):
        t += 10.0
        target, state = _tick(policy, redis, t, state, 10_000.0, current=4, hi=4)
    assert target == 4
    t += 20.0  # within the rate window: the counters still read, no new load
    target, state = _tick(policy, redis, t, state, 10_000.0, current=4, hi=4)
    assert target == 1


def test_it_scales_to_zero_when_the_minimum_is_zero(redis, redis_url):
    policy = SlaAutoscaling({"image_tiles": 10.0}, downscale_after_s=0, redis_url=redis_url)
    _, state = _tick(policy, redis, 0.0, {}, 50.0, lo=0)
    target, _ = _tick(policy, redis, 5.0, state, 50.0, lo=0, current=1)
    assert target == 0


def test_without_counters_it_grows_by_queue_length_and_never_shrinks(redis_url):
    """Redis that does not answer: up as Serve's default policy would go, never down (an idle queue
    is no reason to drop replicas while the load cannot be read), no exception."""
    policy = SlaAutoscaling({"image_tiles": 10.0}, redis_url="redis://127.0.0.1:1/0")
    assert policy(_ctx(0.0, {}, current=2, lo=1, hi=8))[0] == 2
    policy._retry_at = 0.0
    assert policy(_ctx(1.0, {}, current=2, lo=1, hi=8, queued=500.0))[0] > 2


@given(rates=st.dictionaries(st.sampled_from(["requests", "image_tiles", "session_seconds"]),
                             st.floats(0, 1e4), min_size=1),
       caps=st.floats(0.1, 1e3), headroom=st.floats(1.0, 2.0))  # fmt: skip
def test_capacity_added_covers_the_offered_load(rates, caps, headroom):
    policy = SlaAutoscaling(dict.fromkeys(rates, caps), headroom=headroom, redis_url="redis://127.0.0.1:1/0")
    n = policy.needed(rates)
    load = sum(r / caps for r in rates.values())
    assert n * caps >= headroom * load * caps - 1e-6 * caps and (n == 0 or (n - 1) < headroom * load + 1e-9)


def test_a_stalled_redis_costs_the_controller_one_short_timeout_not_one_per_period():
    """A Redis that accepts and never answers: the first read gives up within the policy's bound,
    the next ones do not wait at all (Serve's default decides), until the retry time."""
    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(16)  # connections complete in the backlog; nothing is ever read or written
    try:
        policy = SlaAutoscaling(
            {"image_tiles": 10.0}, redis_url=f"redis://127.0.0.1:{stalled.getsockname()[1]}/0"
        )
        started = time.monotonic()
        policy(_ctx(0.0, {}, current=2))
        first = time.monotonic() - started
        started = time.monotonic()
        for i in range(10):
            target, _ = policy(_ctx(0.1 * (i + 1), {}, current=2))
            assert 1 <= target <= 8
        rest = time.monotonic() - started
    finally:
        stalled.close()
    assert first < 1.0 and rest < 0.1
