"""Contract: omniray's scheduler hooks on vLLM's real scheduler (services/extensions/vllm/scheduler.py,
written for vLLM 0.32). A real `Scheduler` is built from a VllmConfig of the tiny thinker with a real
KV cache config and real `Request`s, no engine process: the urgency hook reorders and holds running
requests by their sessions' playback, vLLM then schedules in that order; the sink + window hook turns
sliding-window groups into its own spec; the scheduler's metrics leave with vLLM's SchedulerStats
and the front end's stat logger takes them out and exports them, with no KV connector."""

from __future__ import annotations

import time

import pytest
import torch

from kv_store.metrics import Recorder
from services.common.paths import data_dir
from services.extensions.vllm import engine_metrics, pins, scheduler, sink_window, stat_logger
from services.extensions.vllm.specs import EnginePayload, SinkWindowParams
from services.playback.board import BoardView
from services.policies import urgency

BLOCK = 32


def test_written_for_this_vllm():
    import vllm

    assert pins.release() == pins.WRITTEN_FOR, vllm.__version__


def _config(payload: EnginePayload, blocks: int = 256, caching: bool = False):
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model = str(data_dir() / "models" / "tiny" / "thinker")
    model_config = ModelConfig(model=model, dtype="float32", max_model_len=1024, enforce_eager=True)
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=caching)
    cache.num_gpu_blocks = blocks
    sched = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        max_model_len=1024,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    return VllmConfig(
        model_config=model_config,
        cache_config=cache,
        scheduler_config=sched,
        additional_config=payload.additional_config(),
    )


def _kv_cache_config(spec, blocks: int = 256):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)]
    )


def _full_attention():
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.float32)


def _scheduler(
    payload: EnginePayload, spec=None, blocks: int = 256, caching: bool = False
) -> scheduler.OmnirayScheduler:
    from vllm.v1.structured_output import StructuredOutputManager

    config = _config(payload, blocks, caching)
    return scheduler.OmnirayScheduler(
        vllm_config=config,
        kv_cache_config=_kv_cache_config(spec or _full_attention(), blocks),
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=True,
    )


def _request(
    rid: str, session: str | None, arrival: float, prompt: int = 40, hashed: bool = False, first: int = 5
):
    """`hashed`: with the block hashes prefix caching needs (the engine gives every request them)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    extra = {scheduler.SESSION_ARG: session} if session else None
    params = SamplingParams(max_tokens=32, extra_args=extra)
    hasher = None
    if hashed:
        init_none_hash(sha256)
        hasher = get_request_block_hasher(BLOCK, sha256)
    tokens = [first + i % 1000 for i in range(prompt)]
    return Request(rid, tokens, params, None, arrival_time=arrival, block_hasher=hasher)


def _view(buffered_ms: float, first_audio: bool = True, ms_per_token: float | None = None) -> BoardView:
    return BoardView(session_id="s", played_ms=0.0, age_s=0.0, ms_per_token=ms_per_token, buffered_ms=buffered_ms,
                     playing=True, speaking=False, responding=True, first_audio=first_audio, barge_ins=0,
                     responses=1, reply_gap_ms=None, at=time.time())  # fmt: skip


def _urgent(redis_url: str, blocks: int = 256, block_order: bool = False, caching: bool = False):
    """A scheduler with the urgency hook (LiveServe), its board views set by the test; with
    `block_order`, the free blocks in next-use order."""
    from services.extensions.vllm.specs import BlockOrderParams, UrgencyPayload

    payload = EnginePayload(
        urgency=UrgencyPayload(
            policy="liveserve",
            params={},
            board_url=redis_url,
            poll_s=0.05,
            block_order=BlockOrderParams() if block_order else None,
        )  # fmt: skip
    )
    s = _scheduler(payload, blocks=blocks, caching=caching)
    (order,) = [h for h in s.hooks if isinstance(h, scheduler.UrgencyOrder)]
    views: dict = {}
    order.views = lambda: views
    return s, views


@pytest.fixture
def urgent(redis_url):
    return _urgent(redis_url)


def _run_prefill(s) -> None:
    """Schedule until every request has its prompt computed (running, decoding)."""
    from vllm.v1.outputs import ModelRunnerOutput

    for _ in range(8):
        out = s.schedule()
        if not out.num_scheduled_tokens:
            break
        ids = list(out.num_scheduled_tokens)
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
        )
        s.update_from_output(out, runner)
        if all(r.num_computed_tokens >= r.num_prompt_tokens for r in s.running) and not s.waiting:
            break


def test_urgency_orders_vllm_running_queue_and_holds_the_well_buffered(urgent):
    s, views = urgent
    now = time.time()
    s.add_request(_request("fcfs-first", "t/a", now - 3))  # its session is well buffered: U2, held
    s.add_request(_request("starving", "t/b", now - 1))  # playing, buffer empty: U0
    s.add_request(_request("no-audio-yet", "t/c", now - 2))  # U1
    _run_prefill(s)
    assert {r.request_id for r in s.running} == {"fcfs-first", "starving", "no-audio-yet"}
    # t/a: its generated token is 5 s of audio past what was played, over LiveServe's hold (3 s)
    ahead = _view(60_000.0, ms_per_token=5_000.0)
    views.update({"t/a": ahead, "t/b": _view(0.0), "t/c": _view(0.0, first_audio=False)})
    out = s.schedule()
    scheduled = list(out.num_scheduled_tokens)
    assert "fcfs-first" not in scheduled  # held back this round: far ahead of playback
    assert scheduled[:2] == ["starving", "no-audio-yet"]  # U0 before U1, vLLM kept the order
    assert {r.request_id for r in s.running} == {"fcfs-first", "starving", "no-audio-yet"}  # not dropped
    stats = s.make_stats()
    drained = engine_metrics.detach(stats)
    assert drained["decision"] and dict((tuple(k), v) for k, v in drained["ranked"])[("U0",)] == [1]
    assert stats.kv_connector_stats is None  # nothing left for vLLM's connector logging


@pytest.mark.parametrize("telemetry", [True, False])
def test_a_free_seat_goes_to_the_most_urgent_waiting_request(urgent, telemetry):
    """One seat (max_num_seqs full but one): a new turn (U1: no audio yet) that arrived after a
    well-buffered session's request (U2) is admitted first; without telemetry, the older one (FCFS)."""
    s, views = urgent
    s.max_num_active_reqs = 1
    now = time.time()
    s.add_request(_request("buffered", "t/a", now - 3))
    s.add_request(_request("new-turn", "t/b", now - 1))
    if telemetry:
        views.update({"t/a": _view(60_000.0), "t/b": _view(0.0, first_audio=False)})
    (admitted,) = s.schedule().num_scheduled_tokens
    assert admitted == ("new-turn" if telemetry else "buffered")
    assert [r.request_id for r in s.waiting] == ["buffered" if telemetry else "new-turn"]


def test_an_urgent_arrival_preempts_the_least_urgent_well_buffered_request(urgent):
    """Seats full of well-buffered work (U2): a new turn (U1) takes the seat of the least urgent one,
    which goes back to waiting with its id in the round's `preempted_req_ids` (the workers drop its
    state); it resumes when a seat frees, with every token it had."""
    s, views = urgent
    s.max_num_active_reqs = 2
    now = time.time()
    s.add_request(_request("calm", "t/a", now - 3))
    s.add_request(_request("barger", "t/b", now - 2))
    _run_prefill(s)
    generated = {r.request_id: r.num_output_tokens for r in s.running}
    views.update({"t/a": _view(60_000.0), "t/b": BoardView(**{**_view(60_000.0).__dict__, "barge_ins": 3}),
                  "t/c": _view(0.0, first_audio=False)})  # fmt: skip
    s.add_request(_request("new-turn", "t/c", now))
    out = s.schedule()
    assert out.preempted_req_ids == {"barger"}  # U2 ranks a frequent barger last
    assert "new-turn" in out.num_scheduled_tokens and "barger" not in out.num_scheduled_tokens
    assert {r.request_id for r in s.running} == {"calm", "new-turn"}
    (resumed,) = s.waiting
    assert resumed.request_id == "barger" and resumed.num_output_tokens == generated["barger"]
    stats = engine_metrics.detach(s.make_stats())
    assert dict((tuple(k), v) for k, v in stats["preempted"])[("U1",)] == [1]


def test_an_urgent_arrival_that_finds_no_kv_blocks_preempts_held_replies(redis_url):
    """Seats free but the pool full of held replies (paced: each keeps its blocks through its
    playback): a new turn whose first chunk needs more blocks than are free preempts the least
    urgent held ones until it fits, and runs this round. Without this it waited for a reply to end
    (the simulator's finding at 128 sessions: docs/planner.md)."""
    s, views = _urgent(redis_url, blocks=8)  # 7 usable: three 40-token replies hold 6
    now = time.time()
    for rid, session, age in (("a", "t/a", 3), ("b", "t/b", 2), ("c", "t/c", 1)):
        s.add_request(_request(rid, session, now - age))
    _run_prefill(s)
    assert len(s.running) == 3
    ahead = _view(60_000.0, ms_per_token=5_000.0)  # far ahead of playback: held
    views.update({"t/a": ahead, "t/b": ahead, "t/c": ahead, "t/d": _view(0.0, first_audio=False)})
    s.add_request(_request("turn", "t/d", now, prompt=100))  # 4 blocks
    out = s.schedule()
    assert len(out.preempted_req_ids) == 2 and "turn" in out.num_scheduled_tokens
    assert {r.request_id for r in s.waiting} == out.preempted_req_ids
    stats = engine_metrics.detach(s.make_stats())
    assert dict((tuple(k), v) for k, v in stats["preempted"])[("U1",)] == [2]


@pytest.mark.parametrize("block_order", [True, False])
def test_a_speaking_sessions_cached_blocks_outlive_an_idle_ones(redis_url, block_order):
    """Two sessions' turns ended, the speaking one's first (vLLM's LRU would evict its cached block
    first). With next-use block order, its blocks go to the free queue's tail the round it speaks and
    the long-idle session's to the head: a request that needs all but one free block evicts the idle
    one's. Without it, LRU keeps the later one's."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
    from vllm.v1.request import RequestStatus

    s, views = _urgent(redis_url, blocks=8, block_order=block_order, caching=True)  # 7 usable
    now = time.time()
    idle = BoardView(**{**_view(0.0).__dict__, "playing": False, "responding": False, "age_s": 100.0})
    speaking = BoardView(**{**_view(0.0).__dict__, "playing": False, "responding": False, "speaking": True})
    views.update({"t/a": _view(0.0, first_audio=False), "t/b": _view(0.0, first_audio=False)})
    a = _request("a", "t/a", now - 2, hashed=True)
    b = _request("b", "t/b", now - 1, hashed=True, first=1000)  # other tokens: its own block hash
    for r in (a, b):
        s.add_request(r)
    _run_prefill(s)
    hashes = {"a": a.block_hashes[0], "b": b.block_hashes[0]}
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    s.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    views.update({"t/a": speaking, "t/b": idle})
    s.add_request(
        _request("c", None, now, prompt=180, hashed=True, first=3000)
    )  # 6 blocks: all free ones but the last
    s.schedule()
    pool = s.kv_cache_manager.block_pool
    kept = {k for k, h in hashes.items()
            if pool.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(h, 0)) is not None}  # fmt: skip
    assert kept == ({"a"} if block_order else {"b"})
    if block_order:
        reordered = dict((tuple(k), v) for k, v in engine_metrics.detach(s.make_stats())["reordered"])
        assert reordered[("tail",)] == [1] and reordered[("head",)] == [1]


def test_well_buffered_requests_sit_out_while_a_new_turn_runs(urgent):
    """A new turn in the queues: a well-buffered request whose refill is not due (a minute of audio
    at its client) sits the round out, keeping its seat; one whose buffer nears safe_ms (due) runs.
    Once the turn has its first audio, everything runs again."""
    s, views = urgent
    now = time.time()
    for rid, session, age in (("calm", "t/a", 3), ("due", "t/b", 2), ("turn", "t/c", 1)):
        s.add_request(_request(rid, session, now - age))
    _run_prefill(s)
    # t/b: 1.7 s buffered reaches safe_ms (1.5 s) in 0.2 s, within the lead (0.25 s): its refill is due
    views.update({"t/a": _view(60_000.0), "t/b": _view(1_700.0), "t/c": _view(0.0, first_audio=False)})
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == ["turn", "due"] and not out.preempted_req_ids
    assert {r.request_id for r in s.running} == {"calm", "due", "turn"}  # a seat kept
    assert engine_metrics.detach(s.make_stats())["yielded"] == [([], [1])]
    (order,) = [h for h in s.hooks if isinstance(h, scheduler.UrgencyOrder)]
    heard = {**views, "t/c": _view(2_000.0)}  # the turn's first audio (a new poll of the board)
    order.views = lambda: heard
    assert "calm" in s.schedule().num_scheduled_tokens


def test_held_requests_keep_their_seats(urgent):
    """A held request sits a round out but keeps its seat: a waiting request no more urgent than it
    (well buffered too) is not admitted in its place (the workers' batch is sized for the seats)."""
    s, views = urgent
    s.max_num_active_reqs = 1
    now = time.time()
    s.add_request(_request("ahead", "t/a", now - 3))
    _run_prefill(s)
    views.update({"t/a": _view(60_000.0, ms_per_token=5_000.0), "t/b": _view(60_000.0)})
    s.add_request(_request("buffered", "t/b", now))
    out = s.schedule()
    assert not out.num_scheduled_tokens and not out.preempted_req_ids
    assert [r.request_id for r in s.running] == ["ahead"] and [r.request_id for r in s.waiting] == [
        "buffered"
    ]
    assert s.max_num_active_reqs == 1


def test_without_telemetry_the_order_is_fcfs(urgent):
    s, _ = urgent
    now = time.time()
    for i in range(3):
        s.add_request(_request(f"r{i}", f"t/{i}", now + i))
    _run_prefill(s)
    assert list(s.schedule().num_scheduled_tokens) == ["r0", "r1", "r2"]


def _three_decoding(s) -> scheduler.UrgencyOrder:
    """Three requests of sessions t/0..t/2 past their prefill; the scheduler's urgency hook."""
    now = time.time()
    for i in range(3):
        s.add_request(_request(f"r{i}", f"t/{i}", now + i))
    _run_prefill(s)
    (order,) = [h for h in s.hooks if isinstance(h, scheduler.UrgencyOrder)]
    return order


def test_the_plans_start_over_when_telemetry_returns(urgent):
    """Rounds without telemetry run in vLLM's order, uncounted by the plans while requests generate
    (a paced request's hold check counts rounds): when views return, every request is classified
    afresh."""
    s, views = urgent
    order = _three_decoding(s)
    seen = {f"t/{i}": _view(60_000.0) for i in range(3)}
    views.update(seen)
    s.schedule()
    s.schedule()
    assert order.running.classified == 0  # nothing changed
    views.clear()
    assert list(s.schedule().num_scheduled_tokens) == ["r0", "r1", "r2"]  # FCFS
    views.update(seen)  # the same views back
    s.schedule()
    assert order.running.classified == 3


def test_a_fault_of_the_urgency_order_leaves_the_engine_running_in_vllms_order(urgent, caplog):
    """A policy that raises (a bug) costs its order, not the engine core: the round runs every
    request in vLLM's order, held ones too, and the next round orders again."""
    s, views = urgent
    order = _three_decoding(s)
    views.update({f"t/{i}": _view(60_000.0 if i == 0 else 100.0, ms_per_token=5_000.0) for i in range(3)})
    assert set(s.schedule().num_scheduled_tokens) == {"r1", "r2"}  # r0 well ahead of playback: held
    classify = order.policy.classify
    order.policy.classify = lambda *a: 1 / 0
    s.add_request(_request("r3", "t/3", time.time() + 3))  # a new request: a classification, which fails
    assert set(s.schedule().num_scheduled_tokens) == {"r0", "r1", "r2", "r3"}
    assert "urgency order failed" in caplog.text
    assert order.recorder.drain()["fault"] == [
        ([], [1.0])
    ]  # counted (omniray_scheduler_urgency_faults_total)
    order.policy.classify = classify
    assert "r0" not in s.schedule().num_scheduled_tokens  # ordered (and held) again


def test_sink_window_hook_gives_vllm_its_spec():
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    spec = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.float32, sliding_window=65
    )
    s = _scheduler(EnginePayload(sink_window=SinkWindowParams(sink_tokens=32, window_tokens=64)), spec)
    group = s.kv_cache_manager.kv_cache_config.kv_cache_groups[0]
    assert isinstance(group.kv_cache_spec, sink_window.SinkWindowSpec)
    assert group.kv_cache_spec.sink_tokens == 32


def test_stat_logger_exports_what_the_engine_core_recorded():
    from vllm.v1.metrics.stats import SchedulerStats

    recorder = Recorder(engine_metrics.ENGINE_SPEC)
    recorder.record("ranked", ("U2",), 3)
    stats = SchedulerStats(kv_cache_usage=0.25, kv_connector_stats={"lookup": []})
    engine_metrics.attach(stats, recorder.drain())
    before = engine_metrics.TOTALS.values.get("omniray_scheduler_ranked_total{U2}", 0.0)
    stat_logger.EngineStatLogger(None).record(stats, None)
    assert engine_metrics.TOTALS.values["omniray_scheduler_ranked_total{U2}"] == before + 3
    assert engine_metrics.TOTALS.values[stat_logger.occupancy_key()] == 0.25
    assert stats.kv_connector_stats == {"lookup": []}  # a connector's own stats stay for vLLM


def test_urgency_policy_names_are_the_registry():
    assert urgency.create("fcfs").name == "fcfs"
