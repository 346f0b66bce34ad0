"""Contract: the Ray internals in services/extensions/ray/ (written for Ray 2.60), driven against a real
Ray: an out-of-band reference keeps its object alive until released; a tensor whose object cannot
be fetched gives up within its bound (services/dataplane/tensors.py); a counter exported at 0 is a
series Ray's metrics pipeline accepts."""

from __future__ import annotations

import asyncio
import gc
import time

import numpy as np
import pytest
import ray

from services.extensions.ray import object_refs


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def test_written_for_this_ray():
    assert ".".join(ray.__version__.split(".")[:2]) == object_refs.WRITTEN_FOR


def _gone(data: bytes, within_s: float = 10.0) -> bool:
    """The object is freed (asynchronously: polled)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get(object_refs.loads(data), timeout=1)
        except (
            ray.exceptions.ObjectFreedError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.GetTimeoutError,
        ):
            return True
        gc.collect()
        time.sleep(0.5)
    return False


def test_out_of_band_reference_pins_until_released(local_ray):
    """As services/dataplane/tensors.py uses it: the producer keeps `ref`, sends `dumps(ref)`, and
    releases `ref` when no consumer can still need it."""
    pinned = ray.put(np.arange(1_000_000))  # in the object store (not inlined)
    data = object_refs.dumps(pinned)
    del pinned
    gc.collect()
    assert ray.get(object_refs.loads(data), timeout=30)[-1] == 999_999  # alive with no reference

    released = ray.put(np.arange(1_000_000))
    data = object_refs.dumps(released)
    object_refs.release(released)
    del released
    gc.collect()
    assert _gone(data)


def test_a_tensor_whose_object_never_comes_gives_up_within_its_bound(local_ray, monkeypatch):
    from omni.v1 import common_pb2

    from services.dataplane import tensors

    never = ray.remote(lambda: time.sleep(3600)).remote()  # an object that is never ready
    desc = common_pb2.TensorDescriptor(
        shape=[1], dtype=common_pb2.DTYPE_FLOAT32, object_ref=object_refs.dumps(never)
    )
    monkeypatch.setattr(tensors, "FETCH_TIMEOUT_S", 1.0)
    start = time.monotonic()
    try:
        with pytest.raises(ray.exceptions.GetTimeoutError):
            tensors.materialize(desc)
        assert time.monotonic() - start < 5
        big = np.arange(200_000, dtype=np.float32)  # past the inline limit: in the object store
        assert np.array_equal(asyncio.run(tensors.materialized(tensors.describe(big))), big)
        start = time.monotonic()  # awaited (the gateway's loop): bounded alike
        with pytest.raises(ray.exceptions.GetTimeoutError):
            asyncio.run(tensors.materialized(desc))
        assert time.monotonic() - start < 5
    finally:
        ray.cancel(never, force=True)


def test_zero_records_a_counter_series(local_ray):
    from ray.util import metrics

    from services.extensions.ray.metrics import zero

    counter = metrics.Counter("omniray_contract_zero_total", description="contract test", tag_keys=("k",))
    zero(counter, k="v")  # accepted by Ray's recorder (no error), unlike inc(0)
    with pytest.raises(ValueError):
        counter.inc(0, tags={"k": "v"})


def test_at_zero_metrics_are_made_with_their_series_at_zero(local_ray):
    from services.extensions.ray.metrics import metric

    streams = metric("omniray_talker_streams_total", end=("codec_eos", "error"))
    assert metric("omniray_talker_streams_total", end="max_frames") is streams  # one object per name
    metric("omniray_engine_session_kv_requests").set(2)  # a gauge's zero is its first value


def test_a_replica_sees_its_drain_while_a_request_is_ongoing(local_ray):
    """The drain is visible inside the replica while it waits for its ongoing requests (a realtime
    session, services/realtime/hub.py), before `__del__`; outside a replica there is nothing to see."""
    from ray import serve

    from services.extensions.ray.replica_drain import replica_draining

    assert replica_draining() is None  # the driver is no replica

    @serve.deployment(ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=30)
    class Held:
        def state(self) -> bool | None:
            return replica_draining()

        async def hold(self) -> bool:
            for _ in range(600):
                if replica_draining():
                    return True
                await asyncio.sleep(0.05)
            return False

    serve.start(proxy_location="Disabled")
    try:
        handle = serve.run(Held.bind(), name="drain_contract", route_prefix=None)
        assert handle.state.remote().result(timeout_s=30) is False
        held = handle.hold.remote()
        time.sleep(0.5)  # the request is ongoing when the drain begins
        serve.delete("drain_contract", _blocking=False)
        assert held.result(timeout_s=30) is True
    finally:
        serve.shutdown()
