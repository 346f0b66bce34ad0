"""Calibration's fitting (planner/calibrate.py), round trip on the simulated clock: closed loops run
with known extra engine work per step and per request give rates; fit_engine, given only those
rates at the fitting levels, finds work that reproduces them and predicts the other levels as the
known work does. And the serving cost's least squares recovers per-request, per-step and per-token
CPU, and the speech path's per voiced token, from runs that obey its model. (`make calibrate` compares against this machine's own runs.)"""

from __future__ import annotations

import pytest

from loadtest.benchmarks import voice_bench
from planner import calibrate, costs
from planner.sim.workload import VoiceSpec
from services.models.profile import load_profile

SERVING = costs.Serving(
    cores=2, request_cpu_s=0.015, step_cpu_s=0.001, token_cpu_s=0.0002, background_cores=0.2
)
REQUESTS = [(40 + 13 * i % 150, 16) for i in range(10)]


def _rate(hw: costs.HardwareProfile, c: int) -> float:
    return calibrate.predict_chat(hw, "tiny", REQUESTS, [c], len(REQUESTS))[c]["req_per_s"]


def test_fit_engine_recovers_rates_it_was_not_given():
    base = costs.load("cpu-2core-tiny").model_copy(update={"serving": SERVING})
    truth = base.model_copy(update={"serving": SERVING.model_copy(update={"engine_step_s": 0.003,
                                                                           "engine_request_s": 0.0004})})  # fmt: skip
    runs = [{"c": c, "requests": REQUESTS, "req_per_s": _rate(truth, c)} for c in calibrate.FIT_LEVELS]
    fitted, inside = calibrate.fit_engine(base, "tiny", runs)
    assert inside
    for c in (1, 4, 16):
        assert _rate(fitted, c) == pytest.approx(_rate(truth, c), rel=0.05)


def test_fit_engine_says_when_no_work_explains_the_rates():
    base = costs.load("cpu-2core-tiny").model_copy(update={"serving": SERVING})
    runs = [
        {"c": 2, "requests": REQUESTS, "req_per_s": 1.0},
        {"c": 8, "requests": REQUESTS, "req_per_s": 500.0},
    ]
    assert calibrate.fit_engine(base, "tiny", runs)[1] is False


def test_serving_cost_recovers_the_cpu_per_request_step_and_token_and_the_speech_paths():
    speech_model_s, speech_s = 0.0008, 0.0015  # a voiced token: the speech models' steps, and the rest

    def run(c: int, tokens: int, spoken: bool = False) -> dict:
        n = 10
        path = n * (SERVING.request_cpu_s + tokens / c * SERVING.step_cpu_s + tokens * SERVING.token_cpu_s)
        speech = n * tokens * (speech_model_s + speech_s) if spoken else 0.0
        return {"tokens_mean": tokens, "n": n, "path_cpu_s": path + 0.4 * speech, "speech_cpu_s": 0.6 * speech,
                "background_cpu_s": 0.5, "wall_s": 2.5}  # fmt: skip

    rounds = {(c, t): [run(c, t)] * 3 for c, t in calibrate.COST_RUNS}
    _, c, t = calibrate.SPEECH_RUN
    rounds[calibrate.SPEECH_RUN] = [run(c, t, spoken=True)] * 3
    got = calibrate.serving_cost(rounds, cores=2, speech_model_s=speech_model_s)
    assert got.request_cpu_s == pytest.approx(SERVING.request_cpu_s)
    assert got.step_cpu_s == pytest.approx(SERVING.step_cpu_s)
    assert got.token_cpu_s == pytest.approx(SERVING.token_cpu_s)
    assert got.speech_token_cpu_s == pytest.approx(speech_s)
    assert got.background_cores == pytest.approx(0.2)


def test_chats_that_arrive_while_a_documents_tiles_are_cut_are_encoded_before_it_under_fifo():
    """make bench-encoder's mechanism: the encoder stage cuts a request's tiles on a thread before
    they reach its batch scheduler, so under FIFO a chat that arrives while a document's tiles are
    still being cut goes first; one that arrives after waits for the whole document."""
    two_cores = costs.Serving(cores=2, request_cpu_s=0.0, token_cpu_s=0.0)  # whatever runs the test
    small = costs.load("cpu-2core-small").model_copy(update={"serving": two_cores})
    cut = costs.Curve(unit="tiles", intercept_s=0.0, slope_s=0.01)  # 100 tiles: 1 s
    with_prep = small.model_copy(update={"stages": small.stages.model_copy(update={"encoder_prep": cut})})
    without = small.model_copy(update={"stages": small.stages.model_copy(update={"encoder_prep": None})})

    early = calibrate.predict_encoder(with_prep, "small", "fifo", doc_tiles=100, chats=5, interval_s=0.1)
    uncut = calibrate.predict_encoder(without, "small", "fifo", doc_tiles=100, chats=5, interval_s=0.1)
    assert early["chat_p99_s"] < 0.1 * early["doc_s"], early  # in before the document's tiles
    assert uncut["chat_p99_s"] > 0.5 * uncut["doc_s"], uncut  # behind them
    assert early["doc_s"] > uncut["doc_s"] + 0.9  # the document's own cutting is on its clock
    # chats from 1.1 s on arrive after the document's tiles were cut (1 s): behind them
    late = calibrate.predict_encoder(with_prep, "small", "fifo", doc_tiles=100, chats=15, interval_s=0.1)
    assert late["chat_p99_s"] > 0.5 * (late["doc_s"] - 1.0), late


def test_a_voice_cell_on_tiny_waits_for_its_text_talkers_first_piece():
    """`make bench-voice`'s cell as make calibrate predicts it: on `tiny` (a text talker; pieces of
    24 tokens unless a clause ends at 8 or 16) first audio comes after the first piece's decode
    steps, and the interaction-aware set's pacing wastes fewer tokens a turn when users barge in."""
    hw = costs.load("cpu-2core-tiny").model_copy(update={"serving": SERVING})
    spec = calibrate.VoiceSpec(sessions=8, ramp_s=1.6, barge_p=0.5, speech_s=(2.0, 2.3), ms_per_token=182,
                               clause_p=0.0166, chars_per_token=4.54)  # fmt: skip
    base, live = (
        calibrate.predict_voice(hw, "tiny", policy, spec, 240.0) for policy in ("baseline", "interaction")
    )
    first_piece_s = 24 * hw.stages.decode_step.at(1)
    assert base["ttfp_p90_s"] > first_piece_s and live["ttfp_p90_s"] > first_piece_s
    assert base["barge_ins"] >= 10 and live["barge_ins"] >= 10
    assert live["wasted_tokens"] / live["turns"] < base["wasted_tokens"] / base["turns"]


def test_a_realtime_sessions_own_cost_is_what_its_cells_spent_beyond_the_charges():
    """Per session-second: the set's request path, speech stages, Redis and the bench's client, less
    what the simulator charges the cells' turns, steps and voiced tokens; the other set's processes
    and Ray's are left out (the background has them)."""
    cell = {"turns": 10, "frames": 1000, "generated_tokens": 500, "wall_s": 50.0}
    charged = 10 * SERVING.request_cpu_s + 1000 * SERVING.step_cpu_s + 500 * (SERVING.token_cpu_s + 0.001)
    run = {"runs": {
        "baseline@c=4,p=0.0": {**cell, "cpu_s": {"baseline: gateway replica": charged + 2.0, "client": 1.0,
                                                 "interaction: gateway replica": 7.0, "ray: gcs": 3.0}},
        "interaction@c=4,p=0.0": {**cell, "cpu_s": {"interaction: vocoder replica": charged - 0.5, "client": 1.0,
                                                    "interaction: redis": 0.5, "baseline: redis": 9.0}},
    }}  # fmt: skip
    assert calibrate.session_cores(run, SERVING, 0.001) == pytest.approx(4.0 / (2 * 4 * 50.0))
    del run["runs"]["interaction@c=4,p=0.0"]["cpu_s"]  # a run from before the bench recorded it
    assert calibrate.session_cores(run, SERVING, 0.001) == 0.0


def test_a_turns_prompt_shape_is_fitted_to_the_sessions_first_prompts():
    """A session's first prompt is the template and its audio: the fit over the sentences' lengths
    recovers both (session k of a block starts at sentence k + its first turn)."""
    seconds = calibrate.sentence_seconds()
    rows = [[(turn, 9 + 25 * seconds[(k % 4 + turn) % len(seconds)]), (turn + 1, 900)]
            for k, turn in enumerate([0, 0, 0, 0, 2, 2, 2, 2])]  # fmt: skip
    # at p = 0.5 a barged first reply may count no prompt: its session's next prompt is no first one
    barged = [[(turn + 1, 900)] for turn in [0, 0, 0, 0, 2, 2, 2, 2]]
    args = {"sessions": 4, "turns": 4, "blocks": 2}  # blocks of turns 0-1 and 2-3
    run = {"args": args, "runs": {"baseline@c=4,p=0.0": {"prompt_tokens_by_turn": rows},
                                  "baseline@c=4,p=0.5": {"prompt_tokens_by_turn": barged}}}  # fmt: skip
    head, rate = calibrate.prompt_shape(run)
    assert head == pytest.approx(9) and rate == pytest.approx(25)
    assert calibrate.prompt_shape({"args": args, "runs": {"baseline@c=4,p=0.0": {}}}) is None


def test_a_voice_runs_sessions_are_the_simulators_workload():
    """What the bench's sessions do, the simulated ones do: its blocks of turns, its VAD's silence
    (the turn's TTFP counts from its end), its prompts' shape."""
    seconds = calibrate.sentence_seconds()
    rows = [
        [(turn, 9 + 25 * seconds[(k % 4 + turn) % len(seconds)])] for k, turn in enumerate([0] * 4 + [2] * 4)
    ]
    run = {"args": {"sessions": 4, "turns": 4, "blocks": 2},
           "runs": {"baseline@c=4,p=0.0": {"prompt_tokens_by_turn": rows}}}  # fmt: skip
    spec = calibrate.voice_spec(load_profile("tiny"), run, 0.5)
    assert (spec.sessions, spec.turns, spec.blocks, spec.barge_p) == (4, 2, 2, 0.5)
    assert (
        spec.vad_silence_s
        == voice_bench.VAD_SILENCE_MS / 1000
        != VoiceSpec.model_fields["vad_silence_s"].default
    )
    assert (spec.system_tokens, spec.audio_tokens_per_s) == (9, pytest.approx(25))
