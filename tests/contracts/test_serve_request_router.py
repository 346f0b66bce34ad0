"""Contract: omniray's request router (services/extensions/ray/request_router.py) and stage handles
(services/extensions/ray/stage_handle.py) on Serve's real router (Ray 2.60), found by the `small`
profile's voice-agent test, whose turn waited minutes on an idle encoder:
- two calls one client request makes to one stage at once are both routed (Serve matches a waiting
  call by its internal request id, which a call inherits from the request it is made in);
- a call that finds every replica full waits, and Serve backs off between the router's rankings: it
  does not ask again in a tight loop on the event loop that carries every other call's replies."""

from __future__ import annotations

import asyncio
import time

from services.extensions.ray.request_router import ScoredRequestRouter

HOLD_S = 3.0


class CountingRouter(ScoredRequestRouter):
    """The router as deployed, counting its rankings (it runs in this process: the caller's)."""

    rankings = 0

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        CountingRouter.rankings += 1
        return await super().choose_replicas(candidate_replicas, pending_request)


def _stage(serve, max_ongoing_requests: int):
    @serve.deployment(
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=max_ongoing_requests,
        request_router_config={
            "request_router_class": f"{__name__}:CountingRouter",
            "request_router_kwargs": {"scorers": [{"name": "queue_length"}], "deployment": "Stage"},
        },
    )
    class Stage:
        async def hold(self, seconds: float) -> float:
            await asyncio.sleep(seconds)
            return seconds

    return Stage


def test_calls_one_request_makes_to_one_stage_at_once_are_all_routed(serve_up):
    serve = serve_up

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Caller:  # a gateway: stage calls made while it serves a request
        def __init__(self, stage):
            from services.extensions.ray.stage_handle import StageHandle

            self.stage = StageHandle(stage)

        async def both(self) -> list[float]:
            calls = [self.stage.hold.remote(0.5), self.stage.options(stream=False).hold.remote(0.5)]
            return await asyncio.gather(*calls)

    handle = serve.run(Caller.bind(_stage(serve, 8).bind()), name="router", route_prefix=None)
    assert handle.both.remote().result(timeout_s=60) == [0.5, 0.5]
    serve.delete("router")


def test_a_call_waiting_for_a_full_replica_backs_off(serve_up):
    serve = serve_up
    handle = serve.run(_stage(serve, 1).bind(), name="router", route_prefix=None)
    assert handle.hold.remote(0).result(timeout_s=60) == 0  # the router has its replica

    holding = handle.hold.remote(HOLD_S)
    time.sleep(0.5)  # the first call holds the replica's one seat
    CountingRouter.rankings = 0
    t0 = time.monotonic()
    assert handle.hold.remote(0).result(timeout_s=60) == 0
    waited = time.monotonic() - t0
    assert holding.result(timeout_s=60) == HOLD_S

    assert waited > 1.0, waited  # it did wait for the seat
    # Serve's backoff (25 ms doubling to 500 ms) asks a few times a second; the tight loop asked
    # 483 times in 2.5 s
    assert CountingRouter.rankings < 15 * waited, (CountingRouter.rankings, waited)
    serve.delete("router")
