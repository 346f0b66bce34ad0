"""The simulator (planner/sim): vLLM-like batching on the simulated clock, the KV pool under the real
eviction policies, and whole deployments driving omniray's own policies."""

from __future__ import annotations

import random
import statistics

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import calibrate, costs
from planner.sim import report
from planner.sim.cluster import BASELINE, INTERACTION, Cluster, Deployment
from planner.sim.engine import EngineReplica, SimRequest
from planner.sim.kv import KvPool
from planner.sim.speech import TextTalkerReplica
from planner.sim.workload import CLOSED_LOOP, Arrivals, RequestSpec, VoiceSpec, Workload

GPU = "h100-qwen3-omni-published"
CURVES = costs.load(GPU).stages


def _replica(env, pages=64, page_tokens=16, seats=4, budget=64, policy="lru") -> EngineReplica:
    kv = KvPool(env, pages, page_tokens, 1.0, policy=policy)
    return EngineReplica(env, "r", CURVES, kv, max_num_seqs=seats, max_num_batched_tokens=budget)


def _run(env, replica, requests) -> dict:
    done = {}

    def owner(r, what):
        if what == "finished":
            done[r.rid] = env.now

    for r in requests:
        r.owner = owner
        replica.add(r)
    env.run(until=1000)
    return done


@settings(max_examples=30, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 300), min_size=1, max_size=10),
    outputs=st.lists(st.integers(1, 40), min_size=10, max_size=10),
    seats=st.integers(1, 4),
    budget=st.integers(8, 128),
)
def test_every_request_finishes_with_its_tokens_within_the_seats_and_budget(prompts, outputs, seats, budget):
    env = simpy.Environment()
    replica = _replica(env, pages=200, seats=seats, budget=budget)
    most = []
    original = replica._schedule

    def watched(held):
        out = original(held)
        most.append((len(replica.running), out[2]))
        return out

    replica._schedule = watched
    requests = [SimRequest(f"r{i}", None, p, outputs[i], 0.0) for i, p in enumerate(prompts)]
    done = _run(env, replica, requests)
    assert set(done) == {r.rid for r in requests}
    assert all(r.num_output_tokens == r.max_tokens for r in requests)
    assert all(running <= seats and tokens <= budget for running, tokens in most)
    assert replica.kv.pinned == 0


def test_a_long_prompt_is_prefilled_in_chunks_beside_decoding_requests():
    env = simpy.Environment()
    replica = _replica(env, pages=200, budget=64)
    short, long = SimRequest("short", None, 8, 30, 0.0), SimRequest("long", None, 640, 2, 0.0)
    done = _run(env, replica, [short, long])
    # 640 prompt tokens at most 63 a step beside the short one's decode: the short one is not stuck
    assert replica.steps >= 11
    assert done["short"] < done["long"] or short.first_token_at < long.first_token_at


def test_a_full_pool_preempts_the_last_admitted_and_it_recomputes():
    env = simpy.Environment()
    replica = _replica(env, pages=6, page_tokens=16, seats=2, budget=256)
    a, b = SimRequest("a", None, 40, 40, 0.0), SimRequest("b", None, 40, 40, 0.0)
    done = _run(env, replica, [a, b])
    assert replica.preempted >= 1 and b.preemptions >= 1 and a.preemptions == 0
    assert set(done) == {"a", "b"} and b.num_output_tokens == 40


def test_a_conversations_cached_pages_skip_their_prefill_and_eviction_follows_the_policy():
    env = simpy.Environment()
    kv = KvPool(env, 8, 16, 1.0, policy="lru")
    first = SimRequest("t1", "s", 64, 1, 0.0, chain="s#0")
    assert kv.admit(first) == 0
    first.pages, first.num_computed_tokens = 4, 64
    assert kv.take(4)
    kv.release(first)
    assert kv.cached == {("s#0", i) for i in range(4)} and kv.pinned == 0
    second = SimRequest("t2", "s", 100, 1, 0.0, chain="s#0")
    assert kv.admit(second) == 64  # four whole pages
    assert kv.pinned == 4 and not kv.cached


def test_next_use_eviction_keeps_the_page_predicted_sooner():
    env = simpy.Environment()
    kv = KvPool(env, 2, 16, 1.0, policy="next_use", follower={"preload": False})
    kv.follower.sessions.clear()
    for sid, soon in (("soon", 1.0), ("late", 100.0)):
        r = SimRequest(sid, sid, 17, 1, 0.0, chain=sid)
        r.pages, r.num_computed_tokens = 1, 16
        kv.pinned += 1
        kv.release(r)
        kv.follower.sessions[sid].next_use = soon
    kv.policy.update_many(list(kv.cached))
    assert kv.take(1)
    assert ("soon", 0) in kv.cached and ("late", 0) not in kv.cached


@pytest.mark.parametrize("kind", ["poisson", "bursty"])
def test_arrivals_have_the_asked_rate_and_bursts_their_spread(kind):
    gaps = list(
        zip(range(20000), Arrivals(kind=kind, burst_cv=3.0).gaps(5.0, random.Random(1)), strict=False)
    )
    values = [g for _, g in gaps]
    mean = statistics.fmean(values)
    cv = statistics.pstdev(values) / mean
    assert mean == pytest.approx(0.2, rel=0.1)
    assert cv == pytest.approx(1.0 if kind == "poisson" else 3.0, rel=0.15)


def _voice(policies, sessions=24, barge_p=1.0, seed=0) -> Cluster:
    cluster = Cluster(
        Deployment(hardware=GPU, profile="qwen3-omni", policies=policies, admission=False),
        Workload(
            voice=VoiceSpec(sessions=sessions, barge_p=barge_p, ramp_s=2),
            duration_s=60,
            warmup_s=5,
            seed=seed,
        ),
    )
    cluster.run()
    return cluster


def test_the_interaction_aware_set_paces_replies_so_barge_ins_waste_less():
    """The real LiveServe policy holds replies ahead of playback; FCFS generates them whole."""
    base, live = report.voice(_voice(BASELINE)), report.voice(_voice(INTERACTION))
    assert base["barge_ins"] >= 20 and live["barge_ins"] >= 20
    assert live["wasted_share"] < 0.5 * base["wasted_share"]
    assert live["continuity"] > 0.95


def test_sessions_of_a_number_of_turns_come_in_blocks_and_their_last_reply_is_heard_whole():
    """make bench-voice's cell: `blocks` of fresh sessions, each block once the last has ended; a
    session's last reply is never talked over; the run ends with the last block."""
    cluster = Cluster(
        Deployment(hardware=GPU, profile="qwen3-omni", policies=BASELINE, admission=False),
        Workload(
            voice=VoiceSpec(sessions=3, barge_p=1.0, ramp_s=1, turns=3, blocks=2), duration_s=3600, warmup_s=0
        ),
    )
    opened, most = cluster.session, []

    def session(delta: int) -> None:
        opened(delta)
        most.append(cluster.open_sessions)

    cluster.session = session
    cluster.run()
    turns = cluster.voice.turns
    assert len(turns) == 2 * 3 * 3 and cluster.env.now < 3600
    sessions = {t.session for t in turns}
    assert len(sessions) == 2 * 3  # fresh ones in each block
    for sid in sessions:
        *before, last = [t for t in turns if t.session == sid]
        assert last.heard_whole and not last.barged
        assert all(0 < t.ttft_s < t.ttfp_s for t in (*before, last))  # its first token, then its audio
        assert all(t.barged or t.heard_whole for t in before)
    assert sum(t.barged for t in turns) >= 3  # p = 1: every earlier turn unless the cut fell past its end
    assert max(most) == 3 and most.count(0) == 2  # one block at a time, each closed before the next
    with pytest.raises(ValueError, match="give turns"):
        VoiceSpec(sessions=3, blocks=2)  # blocks of sessions that never end


def test_speculative_prefill_runs_the_turn_so_far_while_the_user_speaks():
    """`tiny` prefills each completed second of speech (realtime.speculative_prefill): a 2.5 s turn
    sends two requests of one token ahead of its own, which then finds their pages cached (its
    session's only turn: nothing else cached them)."""
    cluster = Cluster(
        Deployment(
            hardware="cpu-2core-tiny", profile="tiny", kv_tokens=1 << 20, page_tokens=16, admission=False
        ),
        Workload(
            voice=VoiceSpec(sessions=1, speech_s=(2.5, 2.5), turns=1, system_tokens=8),
            duration_s=600,
            warmup_s=0,
        ),  # fmt: skip
    )
    assert cluster.ahead_chunk_s == 1.0
    added = []
    replica = cluster.replicas[0]
    add = replica.add
    replica.add = lambda request: (
        added.append((request.rid, request.prompt, request.max_tokens)),
        add(request),
    )
    cluster.run()
    ahead = [a for a in added if "/ahead-" in a[0]]
    assert len(ahead) == 2 and all(tokens == 1 for _, _, tokens in ahead)
    prompts = [prompt for _, prompt, _ in added]
    assert len(prompts) == 3 and prompts[0] < prompts[1] < prompts[2]  # 1 s, 2 s, then the whole turn
    assert replica.kv.stats["hit_pages"] > 0  # one turn: only the requests ahead of it cached pages


def test_a_run_is_determined_by_its_seed():
    a, b = (
        report.voice(_voice(INTERACTION, sessions=8, seed=3)),
        report.voice(_voice(INTERACTION, sessions=8, seed=3)),
    )
    assert a == b and a["turns"] > 0


def test_small_images_pass_a_document_in_the_encoder_with_the_tile_scheduler():
    """Documents and single images on one encoder replica (the tiny profile's CPU costs): the tile
    scheduler's fewest-pending order answers single images sooner than FIFO."""

    def run(policy: str) -> dict:
        cluster = Cluster(
            Deployment(hardware="cpu-2core-tiny", profile="tiny", kv_tokens=1 << 20, admission=False),
            Workload(requests={"image": RequestSpec(rate=20, tiles=(1, 1), prompt_tokens=(20, 40), output_tokens=(1, 2),
                                                    tokens_per_tile=4),
                               "document": RequestSpec(rate=40, tiles=(60, 80), prompt_tokens=(20, 40),
                                                       output_tokens=(1, 2), tokens_per_tile=4)},
                     duration_s=30, warmup_s=5),
        )  # fmt: skip
        for e in cluster.encoders:
            e.scheduler.policy = policy
        cluster.run()
        return report.requests(cluster)

    fewest, fifo = run("fewest_pending"), run("fifo")
    assert fewest["image"]["requests"] > 100
    assert fewest["image"]["encode_p99_s"] < 0.5 * fifo["image"]["encode_p99_s"]


@pytest.mark.parametrize("slo_class", ["interactive", "batch"])
def test_the_quota_services_token_buckets_meter_a_tenant_over_its_budget(redis_url, slo_class):
    """Twice a tenant's text-token budget offered (real Redis, the buckets' own Lua at the simulated
    time): interactive requests over it are refused; batch ones wait for their bucket, and what is
    admitted comes to the budget plus the burst."""
    from services.quota.tenants import Limits, TenantSpec

    budget = 48_000  # per minute; ~320 tokens a request at 5 a second is ~96,000
    quota = TenantSpec(id="sim", per_minute=Limits(text_tokens=budget), burst_s=10)
    cluster = Cluster(
        Deployment(hardware=GPU, profile="qwen3-omni", admission=False),
        Workload(
            requests={"chat": RequestSpec(rate=5, slo_class=slo_class)},
            quota=quota,
            duration_s=60,
            warmup_s=0,
        ),
        redis_url=redis_url,
    )
    cluster.run()
    records = cluster.requests["chat"]
    refused = sum(1 for r in records if r.get("refused")) / len(records)
    admitted = cluster.quota.stats["admitted"]
    if slo_class == "interactive":
        assert 0.3 < refused < 0.7
    else:
        assert refused == 0 and cluster.quota.stats["queued_s"] > 0
    assert sum(1 for r in records if "admitted" in r) == admitted
    # what was charged: at most the minute's budget and one burst (the bucket starts full), and near it
    charged = sum(r["charged"].text_tokens for r in records if "charged" in r)
    assert 0.85 * (budget + budget * 10 / 60) < charged <= budget + budget * 10 / 60


def _closed_loop(hardware: costs.HardwareProfile, concurrency: int, requests: list) -> list[dict]:
    return calibrate.closed_loop(hardware, "tiny", concurrency, requests).requests[CLOSED_LOOP]


def test_a_closed_loop_at_one_is_the_serving_path_then_prefill_then_decode_steps():
    """With cores to spare, a request is the serving path's work, its prefill, then a decode step a
    token, and the last token's handling."""
    cpu = costs.load("cpu-2core-tiny")
    serving = costs.Serving(cores=8, request_cpu_s=0.02, step_cpu_s=0.001, token_cpu_s=0.0005)
    records = _closed_loop(cpu.model_copy(update={"serving": serving}), 1, [(100, 10)] * 3)
    s = cpu.stages
    one = 0.02 + s.prefill.at(100) + 9 * s.decode_step.at(1) + 0.0015
    assert [r["e2e"] for r in records] == pytest.approx([one] * 3)
    assert [r["arrival"] for r in records] == pytest.approx([0, one, 2 * one])  # each after the last


@given(
    concurrency=st.integers(1, 8),
    cores=st.integers(1, 3),
    request_ms=st.floats(0, 50),
    step_ms=st.floats(0, 2),
    token_ms=st.floats(0, 2),
)
@settings(max_examples=25, deadline=None)
def test_a_closed_loop_finishes_and_its_cores_do_no_more_than_they_can(
    concurrency, cores, request_ms, step_ms, token_ms
):
    """Every request finishes, and the run lasts at least its work (the serving path's and the
    engine's steps) spread over its cores."""
    cpu = costs.load("cpu-2core-tiny")
    requests = [(50 + 17 * i % 200, 5 + i % 20) for i in range(12)]
    serving = costs.Serving(cores=cores, request_cpu_s=request_ms / 1000, step_cpu_s=step_ms / 1000,
                            token_cpu_s=token_ms / 1000)  # fmt: skip
    cluster = calibrate.closed_loop(
        cpu.model_copy(update={"serving": serving}), "tiny", concurrency, requests
    )
    records = cluster.requests[CLOSED_LOOP]
    assert len(records) == len(requests) and all("end" in r for r in records)
    work = sum(r.work_s for r in cluster.replicas) + len(requests) * serving.request_cpu_s
    work += sum(r.steps for r in cluster.replicas) * serving.step_cpu_s
    work += sum(out for _, out in requests) * serving.token_cpu_s
    assert max(r["end"] for r in records) >= work / cores - 1e-9


@pytest.mark.parametrize(("clause_p", "every", "first_piece"), [(0.0, 1, 24), (1.0, 1, 4), (1.0, 8, 8)])
def test_a_text_talkers_first_audio_waits_for_its_first_piece(clause_p, every, first_piece):
    """`tiny`'s text talker voices the reply in pieces as the TextChunker cuts them (4 tokens at a
    clause end, else 24; it sees the tokens `every` at a time, as the engine streams them): no audio
    before the first piece is cut, then its tokens' audio together."""
    env = simpy.Environment()
    costs_tiny = costs.load("cpu-2core-tiny").stages
    talker = TextTalkerReplica(
        env, "t", costs_tiny, None, (4, 24), clause_p, 9.0, 25, random.Random(0), every
    )
    heard: list[tuple[float, int]] = []

    def reply():
        for i in range(30):
            talker.token("s", lambda i=i: heard.append((env.now, i)))
            yield env.timeout(0.01)  # a decode step
        talker.end("s")

    env.process(reply())
    env.run(until=10)
    assert [i for _, i in heard] == list(range(30))  # every token voiced, in order
    first = [t for t, i in heard if i < first_piece]
    assert len(set(first)) == 1 and first[0] >= (first_piece - 1) * 0.01  # together, once cut
    assert heard[first_piece][0] > first[0]  # the next piece comes later
    assert "s" not in talker.streams  # its reply ended: nothing held


def test_a_text_talkers_piece_costs_the_speech_paths_serving_per_token_too():
    """A piece's audio reaches the client after its model steps and the speech path's handling of
    each of its tokens (Serving.speech_token_cpu_s: the replicas' and the gateway's)."""

    def first_audio(speech_s: float) -> float:
        env = simpy.Environment()
        talker = TextTalkerReplica(env, "t", costs.load("cpu-2core-tiny").stages, None, (4, 24), 0.0, 9.0, 25,
                                   random.Random(0), 1, speech_s)  # fmt: skip
        heard: list[float] = []
        for _ in range(24):  # one whole piece, at once
            talker.token("s", lambda: heard.append(env.now))
        env.run(until=10)
        return heard[0]

    assert first_audio(0.002) == pytest.approx(first_audio(0.0) + 24 * 0.002)
