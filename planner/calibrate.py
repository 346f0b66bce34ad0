"""`make calibrate`: the simulator (planner/sim) predicts this machine's own benchmarks, and each is
measured in the same run beside its prediction (issue 60 part 3; docs/planner.md#calibration).

- `make bench`'s text figure: req/s of a closed loop of chat requests at c = 1, 4, 16 against a
  local deployment (`tiny`; `bench.chat_bodies` over `chat_prompts(seed=0)`, 64 tokens, greedy).
- `make bench-encoder`'s: chat p99 while a document is encoded, FIFO and the tile scheduler (`small`,
  one in-process encoder replica; `encoder_hol`).
- `make bench-voice`'s: P90 TTFP at p = 0 and 0.5 and wasted tokens a turn at p = 0.5, 8 sessions,
  both policy sets (`tiny`; `voice_bench`, one run of its alternating blocks); the simulator runs
  the same sessions with the serving path's costs the chat runs measured.

What the simulator is given: the hardware profile's step curves (`make profile-stages`), each
request's prompt and output tokens as the server counted them, and — where the cores are few, so the
serving path shares them with the engine (planner/sim/cores.py) — costs measured on the same
deployment in runs that are not predicted (`serving_cost`): the request path's CPU per request, per
engine step and per token from the processes' CPU time at c = 1 (16 and 32 tokens), 2 and 8, the
background's cores, and the deployed engine's extra work per step and per running request fitted to
the rates at c = 2 and 8 (the bare curve lacks omniray's scheduler hook, KV connector and output
hand-off). No predicted figure is fitted to itself. A figure passes within `--tolerance` (±20%) of its measurement.

    python -m planner.calibrate [--profile tiny] [--levels 1,4,16] [--rounds 3] [--no-encoder] [--no-voice]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import scipy.optimize

from loadtest import results
from loadtest.benchmarks import bench, encoder_hol, process_cpu, voice_bench
from loadtest.clients.client import run_closed_loop
from loadtest.clients.speech import RATE, SENTENCES, speech
from loadtest.clients.workload import chat_prompts
from planner import costs
from planner.sim import report as sim_report
from planner.sim.cluster import BASELINE, INTERACTION, Cluster, Deployment
from planner.sim.speech import piece_steps_s
from planner.sim.workload import CLOSED_LOOP, ClosedLoop, VoiceSpec, Workload
from services.models.profile import load_profile
from services.models.tiny.vocoder import SAMPLE_RATE, SAMPLES_PER_UNIT
from services.pipeline.text_chunker import BOUNDARIES
from services.quota import LOCAL_API_KEY

TOLERANCE = 0.2
MAX_TOKENS = 64  # make bench's
SIM_BOUND = 4  # a simulated voice cell ends with its last block, or after this many times its measured wall
KV_TOKENS = 1 << 20  # tiny's and small's KV never bounds these workloads (no memory section on CPU)


@dataclass
class Figure:
    bench: str
    what: str
    measured: float  # the median of its rounds
    predicted: float
    spread: float | None = None  # how far its rounds lay apart (max / min - 1)

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    def within(self, tolerance: float = TOLERANCE) -> bool:
        return abs(self.error) <= tolerance


# ---- make bench: closed-loop chat ---------------------------------------------------------------


def prompt_tokens(url: str, bodies: list[dict]) -> list[int]:
    """Each body's prompt tokens as the server counts them (its usage), one token asked."""
    headers = {"Authorization": f"Bearer {LOCAL_API_KEY}"}
    out = []
    with httpx.Client(timeout=120, headers=headers) as client:
        for body in bodies:
            r = client.post(url, json={**body, "max_tokens": 1, "stream": False})
            r.raise_for_status()
            out.append(r.json()["usage"]["prompt_tokens"])
    return out


# The processes a chat request passes through outside the engines (process_cpu's labels); the rest
# of Ray's and Serve's processes run whether requests come or not (their CPU is per second).
REQUEST_PATH = ("gateway replica", "decode replica", "client", "haproxy")
SPEECH_STAGES = ("talker replica", "vocoder replica")  # a spoken reply's pieces pass these too
_NOT_OURS = ("other",)  # processes that are neither omniray's, Ray's nor the client's (a shell, an editor)


def _is_engine(label: str) -> bool:
    """A vLLM engine process of the decode replica (`decode/<title>`: its engine core, its worker)."""
    return label.startswith("decode/")


def _round(url: str, bodies: list[dict], c: int) -> dict:
    """One closed loop: req/s, TTFT p50, mean output tokens, and the CPU seconds spent meanwhile on
    the request path and in the background."""
    roots = {os.getpid(): "client"}
    before = process_cpu.snapshot(roots)
    res, wall = asyncio.run(run_closed_loop(url, bodies, c))
    spent = process_cpu.between(before, process_cpu.snapshot(roots))
    ok = [r for r in res if r.ok]
    if len(ok) != len(res):
        raise RuntimeError(
            f"{len(res) - len(ok)} of {len(res)} requests failed: {[r.error for r in res if not r.ok][:2]}"
        )
    return {
        "req_per_s": len(ok) / wall,
        "ttft_p50_s": statistics.median(r.ttft for r in ok),
        "tokens_mean": statistics.fmean(r.completion_tokens for r in ok),
        "path_cpu_s": sum(spent.get(k, 0.0) for k in REQUEST_PATH),
        "speech_cpu_s": sum(spent.get(k, 0.0) for k in SPEECH_STAGES),
        "background_cpu_s": sum(
            s
            for k, s in spent.items()
            if k not in REQUEST_PATH + SPEECH_STAGES and k not in _NOT_OURS and not _is_engine(k)
        ),  # fmt: skip
        "wall_s": wall,
        "n": len(ok),
    }


# The serving path's cost is fitted to these runs' CPU time and the engine's extra work to the
# FIT_LEVELS' rates — never to a predicted figure. Each (concurrency, max_tokens).
# c = 1 at two lengths short of MAX_TOKENS (so the predicted c = 1 run is not among them) splits
# the CPU per request from that per token.
COST_RUNS = ((1, 16), (1, 32), (2, MAX_TOKENS), (8, MAX_TOKENS))
FIT_LEVELS = (2, 8)
# The same requests answered in speech too (text and audio, as make bench's --audio asks): the CPU
# they spend beyond what the text runs' fit predicts is the speech path's, per voiced token.
SPEECH_RUN = ("speech", 4, MAX_TOKENS)
ENGINE_FIT_STEPS, ENGINE_STEP_MAX_S, ENGINE_REQUEST_MAX_S = 14, 0.05, 0.005


def measure(url: str, bodies: list[dict], levels: list[int], rounds: int, per_level: int,
            spoken: list[dict]) -> dict:  # fmt: skip
    """`make bench`'s closed loops at `levels`, the COST_RUNS and the SPEECH_RUN (`spoken`: the
    bodies asking for audio too), after its warm-up, in `rounds` interleaved rounds (each round runs
    every one once, so a machine that drifts moves them alike). Returns (c, max_tokens) or
    SPEECH_RUN -> each round's _round."""
    runs = sorted({(c, MAX_TOKENS) for c in levels} | set(COST_RUNS))
    _, speech_c, speech_tokens = SPEECH_RUN
    for _ in range(2):  # each engine makes its CPU kernels per batch shape on first use
        for c in levels:
            asyncio.run(run_closed_loop(url, bodies[: bench.requests_for(c, per_level)], c))
    asyncio.run(run_closed_loop(url, spoken[:speech_c], speech_c))
    out: dict = {run: [] for run in [*runs, SPEECH_RUN]}
    for _ in range(rounds):
        for c, tokens in runs:
            n = bench.requests_for(c, per_level)
            out[(c, tokens)].append(_round(url, [{**b, "max_tokens": tokens} for b in bodies[:n]], c))
        n = bench.requests_for(speech_c, per_level)
        out[SPEECH_RUN].append(
            _round(url, [{**b, "max_tokens": speech_tokens} for b in spoken[:n]], speech_c)
        )
    return out


def serving_cost(rounds: dict, cores: int, speech_model_s: float) -> costs.Serving:
    """The request path's CPU per request, per engine step and per token, and the background's
    cores, from the COST_RUNS (medians over rounds; least squares). A request of T tokens at
    concurrency c takes about T/c of the engine's steps: CPU per request = request + (T/c)·step +
    T·token. The SPEECH_RUN's CPU beyond that, less the speech models' steps (`speech_model_s` a
    token), is the speech path's per voiced token."""
    rows, cpu, background, wall = [], [], 0.0, 0.0
    for c, tokens in COST_RUNS:
        runs = rounds[(c, tokens)]
        t = statistics.median(r["tokens_mean"] for r in runs)
        rows.append([1.0, t / c, t])
        cpu.append(statistics.median(r["path_cpu_s"] / r["n"] for r in runs))
        background += sum(r["background_cpu_s"] for r in runs)
        wall += sum(r["wall_s"] for r in runs)
    if np.linalg.matrix_rank(np.array(rows)) < 3:  # e.g. the model stopped every reply alike early
        raise RuntimeError(f"the cost runs cannot tell request, step and token apart: {rows}")
    request_s, step_s, token_s = (float(x) for x in scipy.optimize.nnls(np.array(rows), np.array(cpu))[0])
    # the spoken run: its CPU per voiced token beyond the text path's and the speech models' steps
    _, c, _ = SPEECH_RUN
    speech = []
    for r in rounds[SPEECH_RUN]:
        t = r["tokens_mean"]
        text_s = request_s + t / c * step_s + t * token_s
        speech.append(((r["path_cpu_s"] + r["speech_cpu_s"]) / r["n"] - text_s) / t - speech_model_s)
    return costs.Serving(cores=cores, request_cpu_s=request_s, step_cpu_s=step_s, token_cpu_s=token_s,
                         background_cores=background / wall, speech_token_cpu_s=max(0.0, statistics.median(speech)),
                         source="measured: CPU time of the request path's processes at c = 1 (16 and 32 tokens), "
                                "2 and 8, and of Ray's and the idle replicas' (the background); the speech path's "
                                "from a spoken run at c = 4; the engine's extra work fitted to c = 2's and 8's "
                                "rates")  # fmt: skip


def speech_steps_per_token(hardware: costs.HardwareProfile, profile) -> float:
    """What the talker's and vocoder's model steps take per voiced token, as the simulated text talker
    charges them (`piece_steps_s`) for the longest piece, which a random-weight thinker's replies are
    made of (a clause end is rare); 0 where the profile has no text talker."""
    talker = profile.models.talker
    if talker is None or hardware.stages.talker_units is None:
        return 0.0
    _, chars = reply_text(profile)
    tokens = profile.pipeline.chunk_max_tokens
    units = tokens * getattr(talker.options, "units_per_char", 1) * chars
    return piece_steps_s(hardware.stages, units, getattr(talker.options, "chunk_units", 10**9)) / tokens


def fit_engine(
    hardware: costs.HardwareProfile, profile: str, runs: list[dict]
) -> tuple[costs.HardwareProfile, bool]:
    """The hardware profile with the deployed engine's extra work per step and per running request
    that make the simulated closed loops of `runs` (a low and a high concurrency: c, requests,
    req_per_s) run at their measured rates, and whether it does (False: no such work explains both
    rates — noise apart, the two runs disagree — and the work per step alone is fitted to the high
    c's rate). Nested bisections: more work per step, fewer req/s at the high
    c; work moved from the step to its requests, more req/s at the low c."""
    low, high = sorted(runs, key=lambda r: r["c"])

    def at(step_s: float, request_s: float) -> costs.HardwareProfile:
        extra = {"engine_step_s": step_s, "engine_request_s": request_s}
        return hardware.model_copy(update={"serving": hardware.serving.model_copy(update=extra)})

    def rate(hw: costs.HardwareProfile, run: dict) -> float:
        return predict_chat(hw, profile, run["requests"], [run["c"]], len(run["requests"]))[run["c"]][
            "req_per_s"
        ]

    def bisect(hi: float, too_fast) -> float:
        lo = 0.0
        for _ in range(ENGINE_FIT_STEPS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if too_fast(mid) else (lo, mid)
        return (lo + hi) / 2

    def step_for(request_s: float) -> float:
        return bisect(ENGINE_STEP_MAX_S, lambda a: rate(at(a, request_s), high) > high["req_per_s"])

    def too_little_per_request(request_s: float) -> bool:
        hw = at(step_for(request_s), request_s)
        if rate(hw, high) < 0.99 * high["req_per_s"]:  # too much: the high c is slow with no work per step
            return False
        return rate(hw, low) < low["req_per_s"]

    request_s = bisect(ENGINE_REQUEST_MAX_S, too_little_per_request)
    fitted = at(step_for(request_s), request_s)
    if all(abs(rate(fitted, r) / r["req_per_s"] - 1) < 0.02 for r in runs):
        return fitted, True
    return at(step_for(0.0), 0.0), False  # work per step alone, fitted to the high c's rate


def closed_loop(hardware: costs.HardwareProfile, profile: str, concurrency: int,
                requests: list[tuple[int, int]]) -> Cluster:  # fmt: skip
    """A closed loop of `requests` at `concurrency`, run on the simulated clock: one decode replica,
    the serving path on the cores (its records: `cluster.requests[CLOSED_LOOP]`)."""
    workload = Workload(closed_loop=ClosedLoop(concurrency=concurrency, requests=requests), duration_s=3600,
                        warmup_s=0)  # fmt: skip
    cluster = Cluster(Deployment(hardware=hardware.name, profile=profile, kv_tokens=KV_TOKENS, admission=False),
                      workload, hardware=hardware)  # fmt: skip
    cluster.run()
    return cluster


def predict_chat(hardware: costs.HardwareProfile, profile: str, requests: list[tuple[int, int]], levels: list[int],
                 per_level: int) -> dict[int, dict]:  # fmt: skip
    """make bench's closed loops at `levels`, simulated: req/s and TTFT p50."""
    out = {}
    for c in levels:
        records = closed_loop(hardware, profile, c, requests[: bench.requests_for(c, per_level)]).requests[
            CLOSED_LOOP
        ]
        if not all("end" in r for r in records):
            raise RuntimeError(f"the simulated closed loop at c = {c} did not finish in an hour")
        span = max(r["end"] for r in records) - min(r["arrival"] for r in records)
        out[c] = {
            "req_per_s": len(records) / span,
            "ttft_p50_s": statistics.median(r["ttft"] for r in records),
        }
    return out


def _run_name(run: tuple) -> str:
    """A run's key in the report: c=..,max_tokens=.. (the SPEECH_RUN's: speech,c=..,max_tokens=..)."""
    *kind, c, tokens = run
    return ",".join([*kind, f"c={c}", f"max_tokens={tokens}"])


def spread(values: list[float]) -> float:
    """How far a measurement's rounds lie apart: max / min - 1."""
    return max(values) / min(values) - 1


def chat(url: str, model: str, voice: str, hardware: costs.HardwareProfile, profile: str, levels: list[int],
         rounds: int, per_level: int) -> tuple[list[Figure], dict]:  # fmt: skip
    """Measure and predict `make bench`'s req/s at each level against the deployment at `url`."""
    if fitted := set(levels) & set(FIT_LEVELS):
        raise ValueError(f"levels {sorted(fitted)} are what the engine's work is fitted to: not predictions")
    n = bench.requests_for(max(levels + [c for c, _ in COST_RUNS]), per_level)
    asked = chat_prompts(n, seed=0, max_tokens=MAX_TOKENS)
    bodies = bench.chat_bodies(model, asked, False, voice)
    prompts = prompt_tokens(url, bodies)
    runs = measure(url, bodies, levels, rounds, per_level, bench.chat_bodies(model, asked, True, voice))
    median = {run: statistics.median(r["req_per_s"] for r in rs) for run, rs in runs.items()}
    tokens = {run: round(statistics.median(r["tokens_mean"] for r in rs)) for run, rs in runs.items()}
    fits = [{"c": c, "requests": [(p, tokens[(c, MAX_TOKENS)]) for p in prompts[: bench.requests_for(c, per_level)]],
             "req_per_s": median[(c, MAX_TOKENS)]} for c in FIT_LEVELS]  # fmt: skip
    serving = serving_cost(runs, os.cpu_count() or 1, speech_steps_per_token(hardware, load_profile(profile)))
    given, fit_ok = fit_engine(hardware.model_copy(update={"serving": serving}), profile, fits)
    figures, predicted = [], {}
    for c in levels:
        # each request's output as the server ended it (a real model may stop before max_tokens)
        requests = [(p, tokens[(c, MAX_TOKENS)]) for p in prompts]
        predicted[c] = predict_chat(given, profile, requests, [c], per_level)[c]
        figures.append(Figure("make bench", f"req/s at c = {c}", median[(c, MAX_TOKENS)], predicted[c]["req_per_s"],
                              spread([r["req_per_s"] for r in runs[(c, MAX_TOKENS)]])))  # fmt: skip
    measured = {_run_name(run): [r["req_per_s"] for r in rs] for run, rs in runs.items()}
    return figures, {"measured_rounds": measured, "predicted": predicted, "fit_inside_bounds": fit_ok,
                     "fitted_to": {f["c"]: f["req_per_s"] for f in fits}, "prompt_tokens": prompts,
                     "serving": given.serving.model_dump()}  # fmt: skip


# ---- make bench-encoder: chat p99 behind a document ----------------------------------------------


def predict_encoder(hardware: costs.HardwareProfile, profile: str, policy: str, doc_tiles: int, chats: int,
                    interval_s: float) -> dict:  # fmt: skip
    """encoder_hol's run on one simulated encoder replica (the real TileScheduler, the profile's
    batch size and aging; the hardware profile's encoder curves: each request's tiles cut on a thread
    of its own, then batched), its threads sharing this machine's cores."""
    if hardware.serving is None:  # the bench's one process: nothing but the encoder's threads
        alone = costs.Serving(cores=os.cpu_count() or 1, request_cpu_s=0.0, token_cpu_s=0.0)
        hardware = hardware.model_copy(update={"serving": alone})
    cluster = Cluster(Deployment(hardware=hardware.name, profile=profile, kv_tokens=KV_TOKENS, admission=False),
                      Workload(duration_s=3600, warmup_s=0), hardware=hardware)  # fmt: skip
    env, encoder = cluster.env, cluster.encoders[0]
    pool = cluster.profile.encoder_pool
    encoder.scheduler = type(encoder.scheduler)(
        pool.batch_size, policy, pool.aging_tiles_per_s, clock=lambda: env.now
    )
    times: dict[str, float] = {}

    def request(rid: str, tiles: int):
        start = env.now
        yield encoder.encode(rid, tiles)
        times[rid] = env.now - start

    def arrivals():
        env.process(request("doc", doc_tiles))
        for i in range(chats):
            yield env.timeout(interval_s)
            env.process(request(f"chat{i}", 1))

    env.process(arrivals())
    env.run(until=3600)
    chat_s = sorted(v for k, v in times.items() if k != "doc")
    return {"chat_p99_s": encoder_hol.p99(chat_s), "doc_s": times["doc"]}


def _encoder_run(profile: str, doc_tiles: int, chats: int, interval_ms: float) -> dict:
    """One `make bench-encoder` run, in a process of its own as the target runs it (a second run in
    the same process meets the first one's threads and caches: its FIFO p99 came out 4x lower)."""
    argv = ["--profile", profile, "--doc-tiles", str(doc_tiles), "--chats", str(chats),
            "--chat-interval-ms", str(interval_ms)]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "loadtest.benchmarks.encoder_hol", *argv], capture_output=True,
                          text=True, timeout=600, check=True)  # fmt: skip
    print(done.stdout, end="", flush=True)
    (path,) = re.findall(r"^\[encoder-hol\] wrote (\S+)$", done.stdout, re.M)
    return json.loads(Path(path).read_text())


def encoder(hardware: costs.HardwareProfile, profile: str, rounds: int = 3, doc_tiles: int = 200, chats: int = 40,
            interval_ms: float = 20.0) -> tuple[list[Figure], dict]:  # fmt: skip
    """`make bench-encoder`'s chat p99 for both policies, measured (medians of `rounds` runs) and
    predicted from the hardware profile's encoder curve."""
    runs = [_encoder_run(profile, doc_tiles, chats, interval_ms) for _ in range(rounds)]
    figures, predicted = [], {}
    for policy in encoder_hol.POLICIES:
        predicted[policy] = predict_encoder(
            hardware, profile, policy, runs[0]["doc_tiles"], chats, interval_ms / 1000
        )
        p99s = [r[policy]["chat_p99_s"] for r in runs]
        figures.append(Figure("make bench-encoder", f"chat p99, {policy}", statistics.median(p99s),
                              predicted[policy]["chat_p99_s"], spread(p99s)))  # fmt: skip
    return figures, {"measured_rounds": runs, "predicted": predicted}


# ---- make bench-voice: P90 TTFP and wasted tokens, 8 sessions, both policy sets ------------------

VOICE_POLICIES = {"baseline": BASELINE, "interaction": INTERACTION}  # voice_bench.DEFAULT_SETS
UNIT_MS = 1000 * SAMPLES_PER_UNIT / SAMPLE_RATE  # the tiny talker's speech unit (its vocoder's)


def reply_text(profile) -> tuple[float, float]:
    """A random-weight thinker's replies (it samples its vocabulary nearly uniformly): the share of
    its tokens that end a clause as the TextChunker sees it, and their mean length in characters."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(profile.model_path(profile.models.thinker))
    texts = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    ends = sum(1 for t in texts if t.rstrip() and t.rstrip()[-1] in BOUNDARIES)
    return ends / len(texts), sum(len(t) for t in texts) / len(texts)


def sentence_seconds() -> list[float]:
    """voice_bench's utterances (its espeak-ng sentences), in seconds."""
    return [len(speech(s)) / 2 / RATE for s in SENTENCES]


def prompt_shape(run: dict) -> tuple[float, float] | None:
    """A realtime turn's prompt as the server counted it, from a voice run's first turns at p = 0 (a
    session's first prompt is the template and its audio alone): (tokens before the audio, audio
    tokens per second of speech), fitted by least squares over the sentences' lengths; None for a
    run that did not record prompts (or one sentence's length alone)."""
    args, seconds = run["args"], sentence_seconds()
    sessions = args["sessions"]
    firsts = [first for first, _ in voice_bench.blocks(args["turns"], args["blocks"])]
    points = []
    for name, cell in run["runs"].items():
        if not name.endswith(",p=0.0"):
            continue  # a barge-in can leave a turn without a prompt count, or book it to the next
        for k, turns in enumerate(cell.get("prompt_tokens_by_turn", [])):
            # row k: session k % sessions of block k // sessions
            first = firsts[min(k // sessions, len(firsts) - 1)]
            for turn, tokens in turns:
                if turn == first:  # its sentence: the session's own rotation of them
                    points.append((seconds[(k % sessions + turn) % len(seconds)], tokens))
    if len({x for x, _ in points}) < 2:
        return None
    curve = costs.Curve.fit("speech seconds", points)
    return curve.intercept_s, curve.slope_s


def voice_spec(profile, run: dict, p: float) -> VoiceSpec:
    """A voice_bench run's sessions as the simulator's workload: its espeak-ng sentences' lengths,
    its staggered starts, its VAD's silence, its blocks of fresh sessions with their turns, the
    prompts the server counted, the thinker's reply text, the talker's audio per character."""
    args = run["args"]
    sizes = {count for _, count in voice_bench.blocks(args["turns"], args["blocks"])}
    if len(sizes) != 1:
        raise ValueError(f"{args['turns']} turns in {args['blocks']} blocks: blocks of unequal turns")
    clause_p, chars = reply_text(profile)
    seconds = sentence_seconds()
    units_per_char = getattr(profile.models.talker.options, "units_per_char", 1)
    shape = {}
    if (fitted := prompt_shape(run)) is not None:
        shape = {"system_tokens": max(1, round(fitted[0])), "audio_tokens_per_s": max(fitted[1], 1e-3)}
    return VoiceSpec(sessions=args["sessions"], ramp_s=0.2 * args["sessions"], barge_p=p,
                     speech_s=(min(seconds), max(seconds)), turns=sizes.pop(),
                     vad_silence_s=voice_bench.VAD_SILENCE_MS / 1000,
                     blocks=min(args["blocks"], args["turns"]), ms_per_token=chars * units_per_char * UNIT_MS,
                     clause_p=clause_p, chars_per_token=chars, **shape)  # fmt: skip


def predict_voice(hardware: costs.HardwareProfile, profile: str, policy: str, spec: VoiceSpec,
                  duration_s: float) -> dict:  # fmt: skip
    """A voice_bench cell on the simulated clock: one decode replica, the profile's talker; it
    ends with its sessions' last block (or at `duration_s`)."""
    workload = Workload(voice=spec, duration_s=duration_s, warmup_s=0)
    cluster = Cluster(Deployment(hardware=hardware.name, profile=profile, kv_tokens=KV_TOKENS, admission=False,
                                 policies=VOICE_POLICIES[policy]), workload, hardware=hardware)  # fmt: skip
    cluster.run()
    return sim_report.voice(cluster)


def _voice_run(profile: str, sessions: int, turns: int, blocks: int) -> dict:
    """One `make bench-voice` run, in a process of its own as the target runs it."""
    argv = ["--profile", profile, "--sessions", str(sessions), "--turns", str(turns), "--blocks", str(blocks)]
    done = subprocess.run([sys.executable, "-m", "loadtest.benchmarks.voice_bench", *argv], capture_output=True,
                          text=True, check=True, timeout=3600)  # fmt: skip
    (path,) = re.findall(r"^saved (\S+)$", done.stdout, re.M)
    return json.loads(Path(path).read_text())


def voice(hardware: costs.HardwareProfile, profile: str, sessions: int = 8, turns: int = 8, blocks: int = 2,
          run: dict | None = None) -> tuple[list[Figure], dict]:  # fmt: skip
    """`make bench-voice`'s figures, measured (one run, or `run`: one made before) and predicted.
    The bench keeps every policy set's deployment up for the whole run: the idle one's background
    (Ray's processes, its replicas and vLLM's polling) adds to the one serving. A realtime session's
    own cost while open is measured from the run's CPU time (session_cores)."""
    run = run or _voice_run(profile, sessions, turns, blocks)
    if hardware.serving is not None:
        sets = len(run["args"]["sets"])
        per_session = session_cores(
            run, hardware.serving, speech_steps_per_token(hardware, load_profile(profile))
        )
        serving = hardware.serving.model_copy(
            update={"background_cores": sets * hardware.serving.background_cores, "session_cores": per_session}
        )  # fmt: skip
        hardware = hardware.model_copy(update={"serving": serving})

    figures, predicted, sessions_spec = [], {}, voice_spec(load_profile(profile), run, 0.0)
    sessions = run["args"]["sessions"]
    for p in (0.0, 0.5):
        spec = sessions_spec.model_copy(update={"barge_p": p})
        for policy in (name for name in VOICE_POLICIES if f"{name}@c={sessions},p={p}" in run["runs"]):
            measured = run["runs"][f"{policy}@c={sessions},p={p}"]
            got = predicted[f"{policy}@p={p}"] = predict_voice(
                hardware, profile, policy, spec, SIM_BOUND * measured["wall_s"]
            )
            figures.append(Figure("make bench-voice", f"TTFP P90, {policy}, p = {p}", measured["ttfp_p90_s"],
                                  got["ttfp_p90_s"]))  # fmt: skip
            if p:  # the cells' turns differ in number: tokens a turn
                figures.append(Figure("make bench-voice", f"wasted tokens a turn, {policy}, p = {p}",
                                      measured["wasted_tokens"] / max(1, measured["turns"]),
                                      got["wasted_tokens"] / max(1, got["turns"])))  # fmt: skip
    return figures, {"measured": run, "predicted": predicted, "workload": spec.model_dump(),
                     "serving": hardware.serving.model_dump() if hardware.serving else None}  # fmt: skip


def session_cores(run: dict, serving: costs.Serving, speech_model_s: float) -> float:
    """The cores an open realtime session keeps busy beyond what the simulator charges its turns,
    engine steps and voiced tokens (`serving`, `speech_model_s` a token): over a voice_bench run's
    cells, the CPU time of each set's request path, speech stages and Redis and of the bench's
    client, less those charges, per session-second. 0 for a run made before the bench recorded CPU
    time."""
    spent = charged = session_s = 0.0
    for cell_name, cell in run["runs"].items():
        if "cpu_s" not in cell:
            return 0.0
        policy, sessions = re.fullmatch(r"([^@]+)@c=(\d+),p=.*", cell_name).groups()
        spent += cell["cpu_s"].get("client", 0.0)
        spent += sum(
            cell["cpu_s"].get(f"{policy}: {k}", 0.0) for k in (*REQUEST_PATH, *SPEECH_STAGES, "redis")
        )
        charged += (cell["turns"] * serving.request_cpu_s + cell["frames"] * serving.step_cpu_s
                    + cell["generated_tokens"] * (serving.token_cpu_s + serving.speech_token_cpu_s + speech_model_s))  # fmt: skip
        session_s += int(sessions) * cell["wall_s"]
    return max(0.0, spent - charged) / session_s if session_s else 0.0


# ---- the table -----------------------------------------------------------------------------------


def print_table(figures: list[Figure], tolerance: float) -> None:
    print(
        f"\n{'bench':20s} {'figure':28s} {'measured':>10s} {'rounds apart':>12s} {'predicted':>10s} {'error':>7s}"
    )
    for f in figures:
        apart = "-" if f.spread is None else f"{f.spread:.0%}"
        mark = "" if f.within(tolerance) else f"  OUTSIDE ±{tolerance:.0%}"
        print(
            f"{f.bench:20s} {f.what:28s} {f.measured:10.3f} {apart:>12s} {f.predicted:10.3f} {f.error:+7.1%}{mark}"
        )


def main(argv: list[str] | None = None) -> int:
    from services import runtime

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny", help="the chat deployment's profile")
    ap.add_argument("--hardware", default=None, help="its hardware profile (default cpu-2core-<profile>)")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-level", type=int, default=32)
    ap.add_argument("--encoder-profile", default="small")
    ap.add_argument("--no-encoder", action="store_true")
    ap.add_argument("--no-chat", action="store_true")
    ap.add_argument("--no-voice", action="store_true")
    ap.add_argument("--voice-turns", type=int, default=8)
    ap.add_argument("--voice-run", type=Path, help="a voice_bench result to predict instead of a new run")
    ap.add_argument("--serving-from", type=Path,
                    help="with --no-chat: the serving path's costs of an earlier calibrate run's JSON")  # fmt: skip
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    hardware = costs.load(args.hardware or f"cpu-2core-{args.profile}")
    profile = load_profile(args.profile)
    report = results.header(args.profile, levels=levels, rounds=args.rounds, hardware=hardware.name)
    figures: list[Figure] = []
    if not args.no_chat:
        with runtime.temporary(
            args.profile, prefix="omniray-calibrate-", app_args={"async_chunk": True}
        ) as cluster:
            url = f"{cluster.http_url}/v1/chat/completions"
            figures, report["chat"] = chat(url, profile.served_model_name, profile.pipeline.default_voice, hardware,
                                           args.profile, levels, args.rounds, args.per_level)  # fmt: skip
    if not args.no_encoder:
        more, report["encoder"] = encoder(
            costs.load(f"cpu-2core-{args.encoder_profile}"), args.encoder_profile, args.rounds
        )
        figures += more
    if not args.no_voice:
        # the serving path's costs as this run's chat runs (or an earlier run's) measured them
        chat_report = report.get("chat")
        if chat_report is None and args.serving_from:
            chat_report = json.loads(args.serving_from.read_text())["chat"]
        given = hardware
        if chat_report is not None:
            given = hardware.model_copy(update={"serving": costs.Serving(**chat_report["serving"])})
        run = json.loads(args.voice_run.read_text()) if args.voice_run else None
        more, report["voice"] = voice(given, args.profile, turns=args.voice_turns, run=run)
        figures += more
    print_table(figures, args.tolerance)
    if "chat" in report and not report["chat"]["fit_inside_bounds"]:
        print("[calibrate] no extra engine work per step and per request explains both fitted rates "
              f"({report['chat']['fitted_to']} req/s): work per step alone, fitted to the higher")  # fmt: skip
    report["figures"] = [{**asdict(f), "error": f.error, "within": f.within(args.tolerance)} for f in figures]
    print(f"\n[calibrate] wrote {results.write('calibrate', args.profile, report)}")
    return 0 if all(f.within(args.tolerance) for f in figures) else 1


if __name__ == "__main__":
    raise SystemExit(main())
