"""Long-lived streaming sessions (WORKLOADS.md, Metronome): unbounded vs sink + window KV, the N*
sweep, and AIMD admission against it.

Each session is one long-lived vLLM request (streaming input: `AsyncLLM.generate()` over an async
generator of `StreamingInput`). Every frame budget B it appends a chunk of C token ids standing for
that frame's audio (streaming input does not take prompt embeddings, so the encoder's output is
replaced by distinct token ids of the same count) and decodes D tokens; sessions are
phase-staggered over one B and their content differs (no prefix sharing). A frame's latency runs
from its tick (when its audio is due) to its D-th token; it is late past B. Pool occupancy is
vLLM's KV usage of the engine (the `omniray_kv_pool_occupancy_ratio{tier="engine"}` stat logger).

Parts (each on a fresh engine, the tiny profile's thinker, one core):
  unbounded  full KV: occupancy grows at N·(C+D)/B tokens/s until the pool is full, then requests
             are preempted and frames stall; predicted t_sat = (pool − ρ0)/(N·r) vs measured.
  bounded    sinks + window (services/extensions/vllm/sink_window.py): occupancy plateaus.
  sweep      bounded, N in --sweep: p95 frame latency per N; N* = the largest N with p95 ≤ B.
  aimd       bounded, sessions arrive every --arrival-s and live --life-s; the realtime hub's
             AimdAdmission (fed each frame's latency / B) admits or refuses them; where its limit
             settles vs N*.

    python -m loadtest.benchmarks.long_sessions            # all parts, ~8 min on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest import results
from services.extensions.vllm.specs import SinkWindowParams
from services.models.profile import load_profile
from services.policies.admission import AdmissionParams, AimdAdmission


@dataclass
class Shape:
    frame_s: float  # B
    chunk: int  # C: token ids appended per frame
    decode: int  # D: tokens decoded per frame
    prompt: int  # initial context per session
    block: int
    pool_blocks: int
    sinks: int
    window: int

    @property
    def rate(self) -> float:
        """Tokens per second one session adds to its KV (r)."""
        # vLLM keeps a chunk's decoded tokens but the last (sampled, never fed back) in the context.
        return (self.chunk + self.decode - 1) / self.frame_s


@dataclass
class Run:
    frames: list[tuple[float, float]] = field(default_factory=list)  # (tick since start, latency s)
    occupancy: list[tuple[float, float]] = field(default_factory=list)  # (s since start, ratio)
    preempted: int = 0
    active: list[tuple[float, int, float]] = field(default_factory=list)  # (s, sessions, AIMD limit)
    refused: int = 0
    admitted: int = 0
    t0: float = 0.0  # perf_counter of the run's start
    stalled: int = 0


def _preemptions() -> float:
    """vLLM's own count of preempted requests in this process (its Prometheus stat logger)."""
    from prometheus_client import REGISTRY

    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "vllm:num_preemptions"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def _engine(shape: Shape, bounded: bool, max_num_seqs: int):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from services.extensions.vllm import sink_window
    from services.extensions.vllm.specs import EnginePayload
    from services.extensions.vllm.stat_logger import EngineStatLogger

    profile = load_profile("tiny")
    path = profile.model_path(profile.models.thinker)
    extra = {"enable_prefix_caching": False}
    if bounded:
        layers = json.loads((path / "config.json").read_text())["num_hidden_layers"]
        spec = SinkWindowParams(sink_tokens=shape.sinks, window_tokens=shape.window)
        extra = {
            **sink_window.engine_args(spec, layers),
            "scheduler_cls": "services.extensions.vllm.scheduler.OmnirayScheduler",
            "additional_config": EnginePayload(sink_window=spec).additional_config(),
        }
    args = AsyncEngineArgs(
        model=str(path),
        dtype="float32",
        enforce_eager=True,
        max_model_len=4096,
        max_num_batched_tokens=1024,
        max_num_seqs=max_num_seqs,
        block_size=shape.block,
        num_gpu_blocks_override=shape.pool_blocks,
        disable_log_stats=False,
        **extra,
    )
    return AsyncLLM.from_engine_args(args, stat_loggers=[EngineStatLogger])


async def _session(
    engine, sid: int, shape: Shape, start: float, frames: int, run: Run, on_frame=None
) -> None:
    from vllm import SamplingParams
    from vllm.engine.protocol import StreamingInput
    from vllm.sampling_params import RequestOutputKind

    rng = random.Random(sid)
    params = SamplingParams(
        max_tokens=shape.decode,
        temperature=0,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    ticks: list[float] = []

    async def inputs():
        for f in range(frames):
            tick = start + f * shape.frame_s
            await asyncio.sleep(max(0.0, tick - time.perf_counter()))
            ticks.append(tick)
            ids = [rng.randrange(5, 2000) for _ in range((shape.prompt if f == 0 else 0) + shape.chunk)]
            yield StreamingInput(prompt={"prompt_token_ids": list(ids)}, sampling_params=params)

    got = done = 0
    try:
        async for out in engine.generate(inputs(), params, request_id=f"s{sid}"):
            got += len(out.outputs[0].token_ids)
            while got >= (done + 1) * shape.decode and done < len(ticks):
                latency = time.perf_counter() - ticks[done]
                run.frames.append((ticks[done] - run.t0, latency))
                if on_frame:
                    on_frame(latency / shape.frame_s)
                done += 1
    finally:
        run.stalled += len(ticks) - done  # frames sent whose tokens never came


async def _sample(run: Run, stop: asyncio.Event, admission: AimdAdmission | None = None) -> None:
    from services.extensions.vllm import engine_metrics, stat_logger

    while not stop.is_set():
        now = time.perf_counter() - run.t0
        run.occupancy.append((now, engine_metrics.TOTALS.values.get(stat_logger.occupancy_key(), 0.0)))
        if admission is not None:
            run.active.append((now, admission.active, admission.limit))
        await asyncio.sleep(0.1)


async def _fixed(shape: Shape, n: int, seconds: float, bounded: bool) -> Run:
    """N sessions for `seconds` on a fresh engine."""
    engine = _engine(shape, bounded, max_num_seqs=max(n, 8))
    run = Run()
    preempted = _preemptions()
    try:
        await _warm(engine, shape)
        run.t0 = time.perf_counter() + 0.5
        frames = int(seconds / shape.frame_s)
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample(run, stop))
        # Phase-staggered: session i's frames tick at i/N of B.
        tasks = [
            asyncio.create_task(_session(engine, i, shape, run.t0 + i * shape.frame_s / n, frames, run))
            for i in range(n)
        ]
        # A full pool can stall sessions for good (paused streaming requests hold their blocks while
        # the ones with new input wait for blocks): what has not come by the end counts as stalled.
        _, pending = await asyncio.wait(tasks, timeout=seconds + 3)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        stop.set()
        await sampler
    finally:
        run.preempted = int(_preemptions() - preempted)
        engine.shutdown()
    return run


async def _warm(engine, shape: Shape) -> None:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=shape.decode, temperature=0, ignore_eos=True, detokenize=False)
    async for _ in engine.generate(
        {"prompt_token_ids": list(range(5, 5 + shape.prompt))}, params, request_id="warm"
    ):
        pass


async def _aimd(
    shape: Shape, seconds: float, arrival_s: float, life_s: float, params: AdmissionParams
) -> Run:
    """Sessions arrive every `arrival_s` until `seconds`; each is admitted or refused by the hub's
    AIMD controller fed with every frame's latency / B."""
    admission = AimdAdmission(params)
    engine = _engine(shape, True, max_num_seqs=int(params.max))
    run = Run()
    preempted = _preemptions()
    try:
        await _warm(engine, shape)
        run.t0 = time.perf_counter()
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample(run, stop, admission))
        tasks = []

        async def one(sid: int) -> None:
            try:
                await _session(
                    engine,
                    sid,
                    shape,
                    time.perf_counter(),
                    int(life_s / shape.frame_s),
                    run,
                    admission.observe,
                )
            finally:
                admission.release()

        sid = 0
        while time.perf_counter() - run.t0 < seconds:
            if admission.try_admit():
                run.admitted += 1
                tasks.append(asyncio.create_task(one(sid)))
                sid += 1
            else:
                run.refused += 1
            await asyncio.sleep(arrival_s)
        stop.set()
        await sampler
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        run.preempted = int(_preemptions() - preempted)
        engine.shutdown()
    return run


def _p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))] if xs else float("nan")


def _steady(run: Run, shape: Shape, skip_s: float) -> list[float]:
    return [lat for tick, lat in run.frames if tick >= skip_s]


def _plot(unbounded: Run, bounded: Run, t_pred: float, out: Path, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(*zip(*unbounded.occupancy, strict=True), label="unbounded KV")
    ax.plot(*zip(*bounded.occupancy, strict=True), label="sinks + window")
    ax.axvline(t_pred, color="grey", ls="--", lw=1, label=f"predicted t_sat {t_pred:.1f} s")
    ax.set_xlabel("seconds")
    ax.set_ylabel("engine KV pool occupancy")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{n} long-lived streaming sessions (tiny thinker, vLLM CPU)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


async def main_async(args) -> dict:
    shape = Shape(
        frame_s=args.frame_s,
        chunk=args.chunk,
        decode=args.decode,
        prompt=args.prompt,
        block=args.block,
        pool_blocks=args.pool_blocks,
        sinks=args.sinks,
        window=args.window,
    )
    data: dict = {"shape": asdict(shape), "machine": f"{os.cpu_count()} cores", "parts": {}}
    pool_tokens = (shape.pool_blocks - 1) * shape.block
    print(f"shape {asdict(shape)}  r = {shape.rate:.0f} tokens/s per session, pool {pool_tokens} tokens")

    if "kv" in args.parts:
        n = args.sessions
        unb = await _fixed(shape, n, args.seconds, bounded=False)
        # ρ0: occupancy once every session has its first frame in (one B after the start).
        rho0 = next(r for t, r in unb.occupancy if t >= shape.frame_s)
        t_pred = shape.frame_s + (1 - rho0) * pool_tokens / (n * shape.rate)
        full = next((t for t, r in unb.occupancy if r >= args.full), None)
        late_after = [lat for tick, lat in unb.frames if full is not None and tick >= full]
        late_before = [lat for tick, lat in unb.frames if full is None or tick < full]
        bnd = await _fixed(shape, n, args.seconds, bounded=True)
        plateau = [
            r for t, r in bnd.occupancy if args.seconds / 2 <= t <= args.seconds - 1
        ]  # sessions end at `seconds`
        part = {
            "sessions": n,
            "rho0": rho0,
            "t_sat_predicted_s": t_pred,
            "t_sat_measured_s": full,
            "t_sat_error": (full - t_pred) / t_pred if full else None,
            "unbounded_preempted": unb.preempted,
            "unbounded_stalled_frames": unb.stalled,
            "unbounded_frames": len(unb.frames),
            "unbounded_p95_before_full_s": _p95(late_before),
            "unbounded_p95_after_full_s": _p95(late_after),
            "unbounded_late_after_full": sum(lat > shape.frame_s for lat in late_after)
            / max(1, len(late_after)),
            "bounded_occupancy_max": max(r for _, r in bnd.occupancy),
            "bounded_occupancy_second_half": [min(plateau), max(plateau)],
            "bounded_preempted": bnd.preempted,
            "bounded_p95_s": _p95(_steady(bnd, shape, 1.0)),
            "unbounded_occupancy": unb.occupancy,
            "bounded_occupancy": bnd.occupancy,
        }
        data["parts"]["kv"] = part
        print(
            f"[unbounded] N={n}: ρ0={rho0:.3f}, predicted t_sat {t_pred:.1f} s, measured "
            f"{full if full is None else round(full, 1)} s ({part['t_sat_error'] and round(100 * part['t_sat_error'], 1)}%); "
            f"preempted {unb.preempted}, {unb.stalled} frames never answered ({len(unb.frames)} answered); p95 frame {part['unbounded_p95_before_full_s']:.3f} s before full, "
            f"{part['unbounded_p95_after_full_s']:.3f} s after ({100 * part['unbounded_late_after_full']:.0f}% late)"
        )
        print(
            f"[bounded]   N={n}: occupancy max {part['bounded_occupancy_max']:.3f}, second half "
            f"{min(plateau):.3f}–{max(plateau):.3f}; preempted {bnd.preempted}; p95 frame {part['bounded_p95_s']:.3f} s"
        )
        png = results.RESULTS / f"long_sessions_occupancy-{time.strftime('%Y%m%d-%H%M%S')}.png"
        results.RESULTS.mkdir(parents=True, exist_ok=True)
        _plot(unb, bnd, t_pred, png, n)
        print(f"plot: {png}")

    # The sweep and AIMD measure compute capacity: a pool that the bounded sessions never fill.
    roomy = dataclasses.replace(shape, pool_blocks=args.roomy_pool_blocks)
    if "sweep" in args.parts:
        sweep: dict[int, dict] = {}

        async def point(n: int) -> bool:
            run = await _fixed(roomy, n, args.sweep_seconds, bounded=True)
            lat = _steady(run, shape, 1.0)
            p95 = _p95(lat) if lat and not run.stalled else float("inf")
            sweep[n] = {
                "p95_s": p95,
                "median_s": statistics.median(lat) if lat else float("inf"),
                "frames": len(lat),
                "stalled": run.stalled,
            }
            print(
                f"[sweep] N={n}: p95 frame {p95:.3f} s, median {sweep[n]['median_s']:.3f} s ({len(lat)} frames)"
            )
            return p95 <= shape.frame_s

        # Double N until frames turn late, then bisect to ~10%: N* = the largest N whose p95 ≤ B.
        lo, hi = 0, None
        n = args.sweep_start
        while hi is None and n <= args.sweep_max:
            if await point(n):
                lo, n = n, n * 2
            else:
                hi = n
        while hi is not None and hi - lo > max(1, lo // 10):
            mid = (lo + hi) // 2
            if await point(mid):
                lo = mid
            else:
                hi = mid
        n_star = lo
        data["parts"]["sweep"] = {"points": sweep, "n_star": n_star}
        print(f"[sweep] N* = {n_star} (largest N with p95 ≤ B = {shape.frame_s} s; first late N: {hi})")

    if "aimd" in args.parts:
        params = AdmissionParams(
            initial=args.aimd_initial,
            min=1,
            max=256,
            increase=args.aimd_increase,
            decrease=args.aimd_decrease,
            window=args.aimd_window,
            late_ratio=1.0,
        )
        n_star = data["parts"].get("sweep", {}).get("n_star") or args.n_star
        arrival_s = args.arrival_s or args.life_s / (2 * max(n_star or 8, 1))
        run = await _aimd(roomy, args.aimd_seconds, arrival_s, args.life_s, params)
        # Settled: from the limit's first decrease on (the climb before it is the start-up).
        drops = [
            t2 for (_, _, lim), (t2, _, lim2) in zip(run.active, run.active[1:], strict=False) if lim2 < lim
        ]
        since = drops[0] if drops else args.aimd_seconds / 2
        settle = [(a, lim) for t, a, lim in run.active if t >= since]
        limit = statistics.mean(lim for _, lim in settle)
        part = {
            "params": params.model_dump(),
            "settled_since_s": since,
            "settled_limit_mean": limit,
            "settled_limit_range": [min(lim for _, lim in settle), max(lim for _, lim in settle)],
            "active_mean": statistics.mean(a for a, _ in settle),
            "admitted": run.admitted,
            "refused": run.refused,
            "trace": run.active,
        }
        part["arrival_s"] = arrival_s
        if n_star:
            part["limit_vs_n_star"] = limit / n_star
        data["parts"]["aimd"] = part
        print(
            f"[aimd] from its first decrease at {since:.0f} s the limit averages {limit:.1f} (range {part['settled_limit_range'][0]:.1f}–{part['settled_limit_range'][1]:.1f}), "
            f"active sessions {part['active_mean']:.1f} on average; admitted {run.admitted}, refused {run.refused}"
            + (f"; limit / N* = {limit / n_star:.2f}" if n_star else "")
        )
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=["kv", "sweep", "aimd"], choices=["kv", "sweep", "aimd"])
    ap.add_argument("--frame-s", type=float, default=0.25)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--decode", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--pool-blocks", type=int, default=257)
    ap.add_argument("--sinks", type=int, default=32)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--sessions", type=int, default=8, help="N of the unbounded / bounded runs")
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--full", type=float, default=0.98, help="occupancy taken as a full pool")
    ap.add_argument("--roomy-pool-blocks", type=int, default=4096, help="pool of the sweep and AIMD engines")
    ap.add_argument("--sweep-start", type=int, default=4)
    ap.add_argument("--sweep-max", type=int, default=128)
    ap.add_argument("--sweep-seconds", type=float, default=10)
    ap.add_argument(
        "--n-star", type=int, default=None, help="N* of an earlier sweep (AIMD without the sweep)"
    )
    ap.add_argument("--aimd-seconds", type=float, default=90)
    ap.add_argument("--arrival-s", type=float, default=None, help="default: life / (2 N*), twice N* offered")
    ap.add_argument("--life-s", type=float, default=6)
    ap.add_argument("--aimd-initial", type=float, default=8)
    ap.add_argument("--aimd-increase", type=float, default=2)
    ap.add_argument("--aimd-decrease", type=float, default=0.9)
    # A decision must see the sessions follow the last one (they leave as their lives end): ~1 s of
    # frames at N*.
    ap.add_argument("--aimd-window", type=int, default=200)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    data = asyncio.run(main_async(args))
    data["command"] = "python -m loadtest.benchmarks.long_sessions " + " ".join(sys.argv[1:])
    print(f"results: {results.write('long_sessions', 'tiny', data)}")


if __name__ == "__main__":
    main()
