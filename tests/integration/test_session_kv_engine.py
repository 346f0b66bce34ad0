"""A realtime session's turns as one long-lived streaming-input request on the bounded-KV decode
engine (services/engine/session_kv.py), through ThinkerEngine.decode on the tiny thinker: each turn
appends only its new tokens to the same vLLM request (no recompute of the history), the request's
resident blocks stay within the sinks + window bound while the conversation grows far past it, an
edited history restarts the request from sinks + window, a reply the history tokenizes to other ids
(same text) still continues it, a turn whose consumer leaves ends it, an idle one is closed with
no turn to notice it, and a request vLLM gives up on (aborted under its reader) ends its stream with
no finish reason — for the pipeline to resume, not to report as an answer — and is not kept."""

from __future__ import annotations

import asyncio
import random

import pytest
from omni.v1 import common_pb2, stages_pb2

from services.engine.session_kv import REAP_EVERY_S
from services.engine.thinker import FRAME
from services.extensions.vllm import engine_metrics, sink_window, stat_logger
from tests.integration.bounded_engine import bounded_engine

SINKS, WINDOW, BLOCK, POOL = 32, 64, 32, 64
BOUND = sink_window.max_resident_blocks(BLOCK, SINKS, WINDOW)
USER_TOKENS, REPLY_TOKENS, TURNS = 24, 12, 12
COMPUTED = "omniray_scheduler_prompt_tokens_computed_total{}"


@pytest.fixture(scope="module")
def engine(redis_url):
    from services.models.profile import SessionKvSpec

    kv = SessionKvSpec(max_sessions=4, idle_s=600)
    e = bounded_engine(
        redis_url, sinks=SINKS, window=WINDOW, block=BLOCK, pool=POOL, max_model_len=2048, session_kv=kv
    )
    yield e
    e.shutdown()


def _prompt(ids: list[int]) -> stages_pb2.Prompt:
    return stages_pb2.Prompt(segments=[stages_pb2.PromptSegment(tokens=stages_pb2.TokenSpan(ids=ids))])


async def _turn(engine, session: str, ids: list[int], n: int, stop_after: int | None = None):
    """(reply token ids, the turn's finish reason, the most blocks the pool held meanwhile)."""
    ctx = common_pb2.RequestContext(request_id=f"{session}-t{n}", session_id=session, tenant="t")
    sampling = common_pb2.SamplingParams(max_tokens=REPLY_TOKENS, temperature=0)
    reply, finish, most = [], None, 0.0
    deltas = engine.decode(ctx.request_id, _prompt(ids), sampling, "", ctx)
    async for d in deltas:
        reply += d.token_ids
        finish = d.finish_reason or finish
        most = max(most, engine_metrics.TOTALS.values.get(stat_logger.occupancy_key(), 0.0))
        if stop_after is not None and len(reply) >= stop_after:
            await deltas.aclose()  # the consumer goes away mid-turn (a barge-in)
            break
    return reply, finish, round(most * (POOL - 1))  # vLLM's pool keeps one null block


def _computed(engine) -> float:
    """Prompt tokens the engine computed so far (streaming-input chunks included)."""
    return engine_metrics.TOTALS.values.get(COMPUTED, 0.0)


async def test_a_growing_session_appends_to_one_request_within_the_bound(engine):
    rng = random.Random(1)
    kv = engine.session_kv
    ids: list[int] = [rng.randrange(5, 2000) for _ in range(40)]
    computed, appended = [], []
    for n in range(TURNS):
        before = _computed(engine)
        reply, finish, most = await _turn(engine, "grow", ids, n)
        assert finish in ("stop", "length") and reply
        assert most <= BOUND, (n, most)
        assert engine.unfinished_requests() == 1  # the session's request waits for its next turn
        computed.append(_computed(engine) - before)
        new = [rng.randrange(5, 2000) for _ in range(USER_TOKENS)]
        appended.append(len(new) + 1)  # the reply's last token comes back with the next turn
        ids = ids + reply + new  # the history renders the reply as generated
    assert len(ids) > 4 * (SINKS + WINDOW)  # grown far past what the engine keeps
    assert kv.outcomes["started"] == 1 and kv.outcomes["appended"] == TURNS - 1 and kv.requests() == 1
    # every later turn computed only what it appended (its new tokens), never the history
    assert computed[0] == 40 and computed[1:] == appended[:-1], (computed, appended)


async def test_an_edited_history_restarts_windowed_and_a_left_turn_ends_the_request(engine):
    rng = random.Random(2)
    kv = engine.session_kv
    await kv.close_all()  # the pool's occupancy is this session's alone
    assert engine.unfinished_requests() == 0
    ids = [rng.randrange(5, 2000) for _ in range(300)]  # longer than sinks + window
    before = _computed(engine)
    reply, _, most = await _turn(engine, "edit", ids, 0)
    assert most <= BOUND and _computed(engine) - before <= SINKS + WINDOW + REPLY_TOKENS
    truncated = ids + reply[: len(reply) // 2] + [rng.randrange(5, 2000) for _ in range(USER_TOKENS)]
    restarted = kv.outcomes["restarted"]
    reply, finish, most = await _turn(engine, "edit", truncated, 1)  # the reply cut (a barge-in)
    assert kv.outcomes["restarted"] == restarted + 1 and finish and most <= BOUND
    open_before = kv.requests()
    await _turn(engine, "edit", truncated + reply + [7, 8, 9], 2, stop_after=1)
    assert kv.requests() == open_before - 1  # the session's request is gone with its turn


async def test_a_reply_tokenized_again_to_other_ids_continues_the_request(engine):
    tok = engine.engine.tokenizer
    rng = random.Random(3)
    kv = engine.session_kv
    await kv.close_all()
    appended, differed = kv.outcomes["appended"], 0
    ids = [rng.randrange(5, 2000) for _ in range(40)]
    for n in range(8):
        reply, _, _ = await _turn(engine, "retok", ids, n)
        # the history renders the reply's text (random ids rarely tokenize back to themselves)
        again = tok.encode(tok.decode(reply[:-1]), add_special_tokens=False)
        differed += again != reply[:-1]
        ids = ids + again + reply[-1:] + [rng.randrange(5, 2000) for _ in range(USER_TOKENS)]
    assert differed >= 3  # the other-ids path taken, not only the same-ids one
    assert kv.outcomes["appended"] == appended + 7 and kv.requests() == 1


async def test_an_idle_request_is_closed_without_another_turn(engine):
    from services.models.profile import SessionKvSpec

    kv = engine.session_kv
    await kv.close_all()
    spec = kv.spec
    kv.spec = SessionKvSpec(max_sessions=spec.max_sessions, idle_s=0.5)
    try:
        await _turn(engine, "idle", [random.Random(4).randrange(5, 2000) for _ in range(40)], 0)
        assert kv.requests() == 1
        deadline = asyncio.get_running_loop().time() + REAP_EVERY_S + 5  # the reaper's current sleep
        while (
            kv.requests() or engine.unfinished_requests()
        ) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
        assert kv.requests() == 0  # no turn came: the reaper closed it
        assert engine.unfinished_requests() == 0  # and the engine's request is gone with it
    finally:
        kv.spec = spec


@pytest.mark.parametrize("session", ["gaveup", ""], ids=["session request", "one-off request"])
async def test_a_request_the_engine_gives_up_ends_its_stream_unanswered(engine, session):
    kv = engine.session_kv
    await kv.close_all()
    started = kv.outcomes["started"]
    ids = [random.Random(6).randrange(5, 2000) for _ in range(40)]
    ctx = common_pb2.RequestContext(request_id="gaveup-t0", session_id=session, tenant="t")
    sampling = common_pb2.SamplingParams(max_tokens=200, temperature=0)
    got, finishes = [], []
    async for d in engine.decode(ctx.request_id, _prompt(ids), sampling, "", ctx):
        if not got:  # vLLM aborts it under its reader: its `abort` finish comes instead of tokens
            await engine.engine.abort(f"{ctx.request_id}-session" if session else ctx.request_id)
        got += d.token_ids
        finishes.append(d.finish_reason)
    assert got and len(got) < 200 and finishes[-1] is None  # ended, unanswered
    assert kv.requests() == 0 and engine.unfinished_requests() == 0  # nothing kept of it
    if session:  # its next turn starts a request anew, not appending to the one gone
        reply, finish, _ = await _turn(engine, session, ids + got + [7, 8, 9], 1)
        assert kv.outcomes["started"] == started + 2 and reply and finish in ("stop", "length")


async def test_the_engine_measures_its_frame_time(engine):
    """The scheduler's step period while busy reaches the front end (AIMD admission's signal)."""
    frames = engine_metrics.TOTALS.values.get(FRAME + "_count", 0.0)
    await _turn(engine, "frames", [random.Random(5).randrange(5, 2000) for _ in range(40)], 0)
    # a frame per step after a busy run's first; the last rides the next step's stats
    assert engine_metrics.TOTALS.values[FRAME + "_count"] - frames >= REPLY_TOKENS - 3
    assert 0 < engine.frame_s() < 1.0
