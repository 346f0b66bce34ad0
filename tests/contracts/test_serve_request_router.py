"""Contract: omniray's request router (services/extensions/ray/request_router.py) and stage handles
(services/extensions/ray/stage_handle.py) on Serve's real router (Ray 2.60) as deployed (gRPC
between replicas: tests/contracts/deployed_serve.py), found by the `small` profile's voice-agent
test, whose turn waited minutes on an idle encoder (the router's rankings are counted in Serve's
default mode, in this process):
- two calls one client request makes to one stage at once are both routed (Serve matches a waiting
  call by its internal request id, which a call inherits from the request it is made in);
- a call that finds every replica full waits, and Serve backs off between the router's rankings: it
  does not ask again in a tight loop on the event loop that carries every other call's replies;
- the stage calls of a client request that is cancelled (its client went) are cancelled on their
  replicas, wherever the caller holds them (each call having an id of its own, Serve no longer
  finds them among the request's children by itself)."""

from __future__ import annotations

import asyncio
import time

from deployed_serve import run

from services.extensions.ray.request_router import ScoredRequestRouter

HOLD_S = 3.0


class CountingRouter(ScoredRequestRouter):
    """The router as deployed, counting its rankings (it runs in the caller's process)."""

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
        def __init__(self):
            self.started = self.cancelled = 0

        async def hold(self, seconds: float) -> float:
            self.started += 1
            try:
                await asyncio.sleep(seconds)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return seconds

        async def trickle(self):
            yield 0.0
            await self.hold(3600)

        def seen(self) -> tuple[int, int]:
            return self.started, self.cancelled

    return Stage


def _caller(serve):
    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Caller:  # a gateway: stage calls made while it serves a request
        def __init__(self, stage):
            from services.extensions.ray.stage_handle import StageHandle

            self.stage = StageHandle(stage)
            self.held = []

        async def both(self) -> list[float]:
            calls = [self.stage.hold.remote(0.5), self.stage.options(stream=False).hold.remote(0.5)]
            return await asyncio.gather(*calls)

        async def abandon(self) -> None:
            """Its stage calls held, not awaited, when its client goes (it was sending to it)."""
            stream = self.stage.options(stream=True).trickle.remote()
            self.held = [self.stage.hold.remote(3600), stream]
            await anext(stream)
            await asyncio.sleep(3600)

    return Caller


async def _eventually(check, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def both_routed(serve) -> list[float]:
    handle = serve.run(_caller(serve).bind(_stage(serve, 8).bind()), name="router", route_prefix=None)
    return await asyncio.wait_for(handle.both.remote(), 60)


async def calls_of_a_cancelled_request(serve) -> dict:
    handle = serve.run(_caller(serve).bind(_stage(serve, 8).bind()), name="router", route_prefix=None)
    stage = serve.get_deployment_handle("Stage", app_name="router")
    request = handle.abandon.remote()

    async def started():
        return (await stage.seen.remote())[0] == 2

    both_started = await _eventually(started)
    request.cancel()

    async def cancelled():
        return (await stage.seen.remote())[1] == 2

    await _eventually(cancelled)
    started_n, cancelled_n = await stage.seen.remote()
    return {"both_started": both_started, "started": started_n, "cancelled": cancelled_n}


def test_calls_one_request_makes_to_one_stage_at_once_are_all_routed():
    assert run(__file__, "both_routed") == [0.5, 0.5]


def test_a_call_waiting_for_a_full_replica_backs_off(serve_up):
    """In this process, in Serve's default mode: the router's rankings are counted here."""
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


def test_the_stage_calls_of_a_cancelled_request_are_cancelled_on_their_replica():
    seen = run(__file__, "calls_of_a_cancelled_request")
    assert seen == {"both_started": True, "started": 2, "cancelled": 2}
