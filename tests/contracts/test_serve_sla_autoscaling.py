"""Contract: Serve's controller (Ray 2.60's custom autoscaling policy API) runs omniray's SLA policy
(services/extensions/ray/sla_autoscaling.py) from a deployment's `autoscaling_config.policy`, as the
generated Serve config names it: load counters rising in Redis grow the deployment before any request
reaches it, and their stopping brings it back down."""

from __future__ import annotations

import threading
import time

from services.app import SLA_POLICY
from services.extensions.ray.sla_autoscaling import KEY


def _replicas(serve) -> int:
    status = serve.status().applications["sla"].deployments["Stage"]
    return status.replica_states.get("RUNNING", 0)


def test_offered_load_grows_and_shrinks_a_deployment_with_an_empty_queue(serve_up, redis_url):
    serve = serve_up
    from services.common.redis_config import sync_client

    redis = sync_client(redis_url)
    redis.delete(KEY)

    @serve.deployment(
        ray_actor_options={"num_cpus": 0},
        autoscaling_config={
            "min_replicas": 1, "max_replicas": 3, "upscale_delay_s": 0, "downscale_delay_s": 0,
            "policy": {"policy_function": SLA_POLICY,
                       "policy_kwargs": {"per_replica": {"image_tiles": 10.0}, "window_s": 5.0,
                                         "downscale_after_s": 2.0, "redis_url": redis_url}},
        },
    )  # fmt: skip
    class Stage:
        def __call__(self) -> str:
            return "ok"

    serve.run(Stage.bind(), name="sla", route_prefix=None)
    assert _replicas(serve) == 1
    stop = threading.Event()

    def offer() -> None:  # 25 tiles a second: 2.5 replicas' worth, 3 with the headroom
        while not stop.is_set():
            redis.hincrbyfloat(KEY, "image_tiles", 5.0)
            time.sleep(0.2)

    feeder = threading.Thread(target=offer, daemon=True)
    feeder.start()
    try:
        deadline = time.monotonic() + 60
        while _replicas(serve) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _replicas(serve) == 3
    finally:
        stop.set()
        feeder.join()
    deadline = time.monotonic() + 60
    while _replicas(serve) > 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _replicas(serve) == 1
    serve.delete("sla")
