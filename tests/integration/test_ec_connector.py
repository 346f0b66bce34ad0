"""The EC connector's scheduler side (services/extensions/vllm/ec_connector.py) on real Redis and real
NIXL, driven as vLLM's scheduler drives it: a request computes up to its first streamed image not yet
arrived, later images are read ahead as soon as they are indexed, inline items are left to vLLM, a
request whose image never comes fails at the wait bound, and arrived features reach the worker side
in the step's metadata and land in the encoder cache. (The real engine: tests/contracts/
test_qwen3_omni_encoders.py.)"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import redis
import torch

from kv_store.features import FeaturePool
from services.extensions.vllm.ec_connector import OmniEcConnector
from services.extensions.vllm.specs import EC_ITEM_PREFIX


def _connector(redis_url: str, wait_s: float = 30.0) -> OmniEcConnector:
    config = SimpleNamespace(
        ec_transfer_config=SimpleNamespace(
            is_ec_producer=False,
            is_ec_consumer=True,
            engine_id=f"test-{time.monotonic_ns()}",
            ec_connector_extra_config={"redis_url": redis_url, "wait_s": wait_s},
        ),
        model_config=SimpleNamespace(dtype=torch.float32),
    )
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole

    return OmniEcConnector(config, ECConnectorRole.SCHEDULER)


def _request(items: list[tuple[str, int, int]], rid: str = "r1") -> SimpleNamespace:
    """A vLLM request as the connector reads it: (identifier, offset, length) per media item."""
    features = [
        SimpleNamespace(identifier=ident, mm_position=SimpleNamespace(offset=offset, length=length))
        for ident, offset, length in items
    ]
    return SimpleNamespace(request_id=rid, mm_features=features)


@pytest.fixture
def pool(redis_url):
    pool = FeaturePool(
        f"enc-ec{time.monotonic_ns()}", 8 << 20, redis.Redis.from_url(redis_url), hold_s=60, ttl_s=120
    )
    stop = threading.Event()
    progress = threading.Thread(
        target=lambda: [pool.pool.progress() for _ in iter(lambda: stop.wait(0.001), True)]
    )
    progress.start()  # the encoder replica's serve loop
    yield pool
    stop.set()
    progress.join()


def _until(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_prefill_goes_up_to_the_first_image_not_arrived_and_reads_ahead(pool, redis_url):
    ec = _connector(redis_url)
    key = f"k{time.monotonic_ns()}"
    a, b, c = (EC_ITEM_PREFIX + f"{key}/{n}" for n in range(3))
    request = _request([("inline-image", 5, 10), (a, 20, 10), (b, 40, 10), (c, 60, 10)])
    # Nothing written: text and the inline image (vLLM's own) may be computed, up to image a.
    assert ec.computable_tokens(request, 0) == 20
    assert ec.ensure_cache_available(request, 0)
    assert ec.computable_tokens(request, 20) == 0 and not ec.ensure_cache_available(request, 20)
    assert ec.waiting
    features = {n: np.random.default_rng(n).standard_normal((10, 32)).astype(np.float32) for n in range(3)}
    pool.put(f"{key}/1", features[1])  # b before a: read ahead, still bound at a
    _until(lambda: ec.computable_tokens(request, 20) == 0 and ec.has_cache_item(b))
    pool.put(f"{key}/0", features[0])
    _until(lambda: ec.computable_tokens(request, 20) == 40)  # up to c
    assert ec.ensure_cache_available(request, 20) and not ec.waiting
    assert [outcome for outcome, _ in ec.waits] == ["arrived"]
    # vLLM allocates a's and b's encoder cache entries: their features go to the worker.
    ec.update_state_after_alloc(request, 1)
    ec.update_state_after_alloc(request, 2)
    meta = ec.build_connector_meta(None)
    assert set(meta.features) == {a, b} and ec.build_connector_meta(None).features == {}
    worker = _connector(redis_url)
    worker.bind_connector_metadata(meta)
    cache: dict[str, torch.Tensor] = {}
    worker.start_load_caches(cache)
    assert torch.equal(cache[a], torch.from_numpy(features[0])) and torch.equal(
        cache[b], torch.from_numpy(features[1])
    )
    assert not ec.has_cache_item("inline-image")  # never a streamed item: vLLM encodes it


def test_an_image_that_never_comes_fails_its_request_alone(pool, redis_url):
    ec = _connector(redis_url, wait_s=0.3)
    lost = _request([(EC_ITEM_PREFIX + f"never/{time.monotonic_ns()}", 10, 10)], rid="lost")
    other = _request([], rid="other")
    assert not ec.ensure_cache_available(lost, 10)
    time.sleep(0.35)
    assert not ec.ensure_cache_available(lost, 10)
    assert ec.take_unavailable_requests() == {"lost"} and ec.take_unavailable_requests() == set()
    assert ec.ensure_cache_available(other, 0)
    assert [outcome for outcome, _ in ec.waits] == ["timed_out"]


def test_a_stalled_redis_never_stalls_the_scheduler():
    """Redis that accepts and never answers (paused): every look waits out its timeout on the reader
    thread, while the scheduler's calls return at once and the request keeps waiting."""
    import socket

    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(16)  # connections complete in the backlog; nothing is ever read or written
    try:
        ec = _connector(f"redis://127.0.0.1:{stalled.getsockname()[1]}/0")
        request = _request([(EC_ITEM_PREFIX + "stalled/0", 10, 10)])
        slowest = 0.0
        deadline = time.monotonic() + 1.5  # three of the client's 0.5 s timeouts
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            assert ec.computable_tokens(request, 10) == 0 and not ec.ensure_cache_available(request, 10)
            slowest = max(slowest, time.perf_counter() - t0)
            time.sleep(0.005)
        assert slowest < 0.05, slowest
        ec.shutdown()
    finally:
        stalled.close()
