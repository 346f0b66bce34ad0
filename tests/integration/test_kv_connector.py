"""The store's vLLM connector with real engines (tiny profile), real Redis and real NIXL between
engine processes: P/D hands the whole prompt over, a session's next turn on another engine computes
only the new tokens, and a killed page holder costs a recompute, never a wrong answer."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time

import pytest

from services.extensions.vllm import engine_metrics

BLOCK = 32  # tiny's engine.block_size


def _prompt(ids: list[int]):
    from omni.v1 import stages_pb2

    return stages_pb2.Prompt(segments=[stages_pb2.PromptSegment(tokens=stages_pb2.TokenSpan(ids=ids))])


def _sampling(max_tokens: int):
    from omni.v1 import common_pb2

    return common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0)


def _ctx(rid: str, session: str = ""):
    from omni.v1 import common_pb2

    return common_pb2.RequestContext(request_id=rid, tenant="t1", session_id=session)


async def _answer(
    engine, rid: str, ids: list[int], max_tokens: int, kv_params: str = "", ctx=None
) -> list[int]:
    deltas = [
        d async for d in engine.decode(rid, _prompt(ids), _sampling(max_tokens), kv_params, ctx or _ctx(rid))
    ]
    return [t for d in deltas for t in d.token_ids]


async def _reference(engine, rid: str, ids: list[int], max_tokens: int) -> list[int]:
    """The answer computed from scratch (the store bypassed, the engine's own prefix cache emptied)."""
    await engine.engine.reset_prefix_cache()
    params = engine.sampling_params(
        _sampling(max_tokens), kv_transfer_params={"omniray": {"bypass": True}}, max_tokens=max_tokens
    )
    out = []
    async for o in engine.engine.generate({"prompt_token_ids": ids}, params, request_id=rid):
        out.extend(o.outputs[0].token_ids)
    await engine.engine.reset_prefix_cache()
    return out


def patient(redis_url: str) -> str:
    """The URL with long Redis timeouts: these tests are about what the connector hands over, and on
    a loaded 2-core CI machine the agent's loop can lag past the 0.5 s default, which (by design,
    tests/integration/test_redis_faults.py) turns a lookup into a recompute."""
    return f"{redis_url}?socket_timeout=10&socket_connect_timeout=10"


def _delta(engine, before: dict) -> dict:
    after = engine.prompt_token_sources()
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def _totals(key: str) -> float:
    return sum(v for k, v in engine_metrics.TOTALS.values.items() if k.startswith(key))


async def _wait_totals(key: str, above: float, timeout: float = 10.0) -> float:
    """The connector's stats reach the front end with engine outputs: wait for them."""
    deadline = time.monotonic() + timeout
    while _totals(key) <= above and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return _totals(key)


@pytest.fixture(scope="module")
def engines(redis_url):
    from services.engine.thinker import ThinkerEngine
    from services.models.profile import load_profile

    os.environ["OMNIRAY_REDIS_URL"] = patient(redis_url)
    profile = load_profile("tiny")
    if not profile.model_path(profile.models.thinker).exists():
        pytest.skip("run `make models PROFILE=tiny` first")
    prefill, decode = ThinkerEngine(profile, "prefill"), ThinkerEngine(profile, "decode")
    yield prefill, decode
    prefill.shutdown()
    decode.shutdown()


async def test_decode_loads_the_whole_prompt_from_prefill(engines):
    prefill, decode = engines
    ids = [(i * 7) % 1500 + 3 for i in range(300)]  # 9 full pages and a partial one
    expected = await _reference(decode, "pd-ref", ids, 8)
    before = decode.prompt_token_sources()
    n, handed = await prefill.prefill("pd-p", _prompt(ids), _sampling(8), _ctx("pd"))
    got = await _answer(decode, "pd-d", ids, 8, handed)
    sources = _delta(decode, before)
    assert sources["external_kv_transfer"] == n == 300, sources
    assert sources["local_compute"] == 0, sources
    assert got == expected
    assert await _wait_totals("omniray_kv_request_tokens_total{pd,hit}", 0) >= 300


async def test_next_turn_on_another_engine_computes_only_new_tokens(engines, redis_url):
    first, second = engines
    session = "t1/conversation-1"
    turn1 = [(i * 11) % 1500 + 3 for i in range(400)]
    reply = await _answer(first, "s-1", turn1, 24, ctx=_ctx("s-1", session))
    new = [(i * 13) % 1500 + 3 for i in range(40)]
    turn2 = turn1 + reply + new
    expected = await _reference(second, "s-ref", turn2, 8)
    before = second.prompt_token_sources()
    got = await _answer(second, "s-2", turn2, 8, ctx=_ctx("s-2", session))
    sources = _delta(second, before)
    history = len(turn1) + len(reply) - 1  # the last reply token's KV is never computed
    assert sources["external_kv_transfer"] == history // BLOCK * BLOCK, sources
    assert sources["local_compute"] <= len(new) + BLOCK, sources
    assert got == expected
    # The session's chain in Redis names its pages in order: what a prefetch by session brings in.
    import redis.asyncio as aioredis

    from kv_store.metadata import KvMetadata

    chain = await KvMetadata(aioredis.Redis.from_url(redis_url)).chain(session)
    assert len(chain) >= history // BLOCK


def _holder(redis_url: str, ids: list[int], conn) -> None:
    """Another process that answers turn 1 (its engine saves the session's pages), then waits to die."""
    os.setsid()  # its own process group: the test kills it with its engine processes
    os.environ["OMNIRAY_REDIS_URL"] = redis_url
    from services.engine.thinker import ThinkerEngine
    from services.models.profile import load_profile

    engine = ThinkerEngine(load_profile("tiny"), "decode")
    conn.send(asyncio.run(_answer(engine, "holder-1", ids, 16, ctx=_ctx("holder-1", "t1/doomed"))))
    time.sleep(600)


async def test_dead_holder_means_recompute_not_a_wrong_answer(engines, redis_url):
    _, survivor = engines
    turn1 = [(i * 17) % 1500 + 3 for i in range(320)]
    parent, child = multiprocessing.get_context("spawn").Pipe()
    proc = multiprocessing.get_context("spawn").Process(
        target=_holder, args=(patient(redis_url), turn1, child)
    )
    proc.start()
    try:
        assert parent.poll(240), "holder did not answer turn 1"
        reply = parent.recv()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the holder and its engine processes, pages and all
        proc.join(10)
    turn2 = turn1 + reply + [5, 6, 7, 8]
    expected = await _reference(survivor, "dead-ref", turn2, 8)
    fallbacks = _totals("omniray_kv_fallback_recompute_total")
    before = survivor.prompt_token_sources()
    got = await _answer(survivor, "dead-2", turn2, 8, ctx=_ctx("dead-2", "t1/doomed"))
    sources = _delta(survivor, before)
    assert got == expected
    assert sources["external_kv_transfer"] == 0, sources  # nothing could be loaded
    assert sources["local_compute"] == len(turn2), sources
    assert await _wait_totals("omniray_kv_fallback_recompute_total", fallbacks) == fallbacks + 1


async def test_segments_that_do_not_match_the_prompt_skip_the_store_not_the_request(engines):
    _, decode = engines
    ids = [(i * 19) % 1500 + 3 for i in range(70)]
    expected = await _reference(decode, "naming-ref", ids, 4)
    params = decode.sampling_params(
        _sampling(4), kv_transfer_params={"omniray": {"segments": [ids[:10]], "salt": "t1"}}, max_tokens=4
    )
    got = []
    async for o in decode.engine.generate({"prompt_token_ids": ids}, params, request_id="naming-bad"):
        got.extend(o.outputs[0].token_ids)
    assert got == expected
    assert await _wait_totals("omniray_kv_errors_total{naming}", 0) == 1
