"""`make bench`: serving figures for a profile, each against a baseline measured in the same run.

1. Text out, omniray vs vLLM's own OpenAI server (loadtest/benchmarks/vllm_server.py: the same thinker with the
   decode engine's arguments) driven by the same streaming client with the same requests, in
   interleaved rounds (A B, B A, ...) at each concurrency: req/s, TTFT, their ratios (medians over
   rounds), and where the CPU went (CPU ms per request of every process group, loadtest/benchmarks/process_cpu.py).
2. Audio out with async chunk: audio TTFP, RTF, req/s.
3. Audio out without async chunk (each stage waits for the whole previous output): audio TTFP, and
   the ratio to (2).

Results print as tables and go to loadtest/results/bench-<profile>-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from loadtest import results
from loadtest.benchmarks import process_cpu, vllm_server
from loadtest.clients.client import Result, run_closed_loop
from loadtest.clients.workload import chat_prompts
from services import runtime
from services.models.profile import load_profile


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _summary(results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok]
    ttfp = [r.ttfp for r in ok if r.ttfp is not None]
    rtf = [r.rtf for r in ok if r.rtf is not None]
    return {
        "n": len(results),
        "errors": len(results) - len(ok),
        "wall_s": wall,
        "req_per_s": len(ok) / wall,
        "ttft_p50": _pct(ttft, 0.5),
        "ttft_p90": _pct(ttft, 0.9),
        "ttfp_mean": statistics.fmean(ttfp) if ttfp else None,
        "ttfp_p50": _pct(ttfp, 0.5),
        "ttfp_p90": _pct(ttfp, 0.9),
        "rtf_p50": _pct(rtf, 0.5),
        "e2e_p50": _pct([r.e2e for r in ok], 0.5),
        "error_sample": sorted({r.error for r in results if not r.ok})[:3],
        "completion_tokens_mean": statistics.fmean(r.completion_tokens for r in ok) if ok else 0.0,
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def chat_bodies(model: str, prompts, audio: bool, voice: str) -> list[dict]:
    out = []
    for p in prompts:
        b = {
            "model": model,
            "messages": [{"role": "user", "content": p.text}],
            "max_tokens": p.max_tokens,
            "temperature": 0,
        }
        if audio:
            b.update(modalities=["text", "audio"], audio={"voice": voice, "format": "pcm16"})
        out.append(b)
    return out


def requests_for(c: int, per_level: int) -> int:
    return max(per_level, 3 * c)


# vLLM's engine processes spin on their shared-memory queue for 1 s after their last step: a round
# starts once what ran before has gone quiet. The other server is left idle, not stopped: a vLLM
# engine stopped (SIGSTOP) and resumed in the middle of a run came back slower in some runs.
SETTLE_S = 2.0


def _round(url: str, bodies: list[dict], c: int, roots: dict[int, str]) -> tuple[dict, dict[str, float]]:
    time.sleep(SETTLE_S)
    before = process_cpu.snapshot(roots)
    res, wall = asyncio.run(run_closed_loop(url, bodies, c))
    return _summary(res, wall), process_cpu.between(before, process_cpu.snapshot(roots))


def _versus(targets: dict[str, str], bodies: list[dict], levels, per_level, rounds, roots) -> dict:
    """Interleaved rounds of the same requests against each server (name -> chat URL); medians per
    server and level."""
    # Warm-up: each engine creates its CPU kernels per batch shape on first use, and a fresh vLLM
    # engine is several times slower at a new concurrency for its first few dozen requests.
    for url in targets.values():
        for _ in range(2):
            for c in levels:
                asyncio.run(run_closed_loop(url, bodies[: requests_for(c, per_level)], c))
    runs: dict[str, dict[int, list]] = {name: {c: [] for c in levels} for name in targets}
    for r in range(rounds):
        order = list(targets) if r % 2 == 0 else list(reversed(targets))
        for c in levels:
            for name in order:
                s, cpu = _round(targets[name], bodies[: requests_for(c, per_level)], c, roots)
                runs[name][c].append({**s, "cpu_s": cpu})
                print(
                    f"  round {r} c={c:<3} {name:8s} req/s {s['req_per_s']:7.2f}  TTFT p50 {_ms(s['ttft_p50'])} ms"
                    f"  tokens/request {s['completion_tokens_mean']:.1f}  errors {s['errors']} {s['error_sample']}",
                    flush=True,
                )
    out: dict = {}
    for name, by_level in runs.items():
        out[name] = {}
        for c, rs in by_level.items():
            requests = sum(x["n"] - x["errors"] for x in rs)
            cpu: dict[str, float] = {}
            for x in rs:
                for label, s in x["cpu_s"].items():
                    cpu[label] = cpu.get(label, 0.0) + s
            out[name][c] = {
                "rounds": rs,
                "req_per_s": statistics.median(x["req_per_s"] for x in rs),
                "ttft_p50": statistics.median(x["ttft_p50"] for x in rs if x["ttft_p50"] is not None),
                "cpu_ms_per_request": {k: 1000 * v / max(requests, 1) for k, v in cpu.items()},
            }
    return out


def measured_level(url: str, bodies: list[dict], c: int) -> dict:
    """One closed-loop run of `bodies` at concurrency `c`: its summary, and the CPU every process
    group spent per request meanwhile (ms) and the cores busy on average."""
    before = process_cpu.snapshot()
    res, wall = asyncio.run(run_closed_loop(url, bodies, c))
    spent = process_cpu.between(before, process_cpu.snapshot())
    s = _summary(res, wall)
    done = max(s["n"] - s["errors"], 1)
    s["rtf_mean"] = (
        statistics.fmean(rtf) if (rtf := [r.rtf for r in res if r.ok and r.rtf is not None]) else None
    )
    s["cpu_ms_per_request"] = {
        k: round(1000 * v / done) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v >= 0.05 * done
    }
    s["cpu_busy"] = sum(spent.values()) / wall
    return s


def audio_levels(url: str, bodies: list[dict], levels, per_level, label: str) -> dict:
    asyncio.run(run_closed_loop(url, bodies[:4], 2))  # warm-up
    out = {}
    for c in levels:
        s = out[c] = measured_level(url, bodies[: requests_for(c, per_level)], c)
        print(
            f"  {label:11s} c={c:<3} req/s {s['req_per_s']:7.2f}  TTFT p50 {_ms(s['ttft_p50'])} ms"
            f"  TTFP mean {_ms(s['ttfp_mean'])} p90 {_ms(s['ttfp_p90'])} ms  RTF p50 {_ratio(s['rtf_p50'])}"
            f"  errors {s['errors']}\n    CPU {s['cpu_busy']:.2f} cores busy, ms per request: {s['cpu_ms_per_request']}",
            flush=True,
        )
    return out


def _print_cpu(text: dict, c: int) -> None:
    print(f"\n[bench] CPU ms per request at c={c} (all rounds), by process")
    for name in text:
        cpu = text[name][c]["cpu_ms_per_request"]
        top = sorted(cpu.items(), key=lambda kv: -kv[1])
        shown = [(k, v) for k, v in top if v >= 0.5]
        print(f"  {name}: total {sum(cpu.values()):.1f}")
        for label, ms in shown:
            print(f"    {ms:7.1f}  {label}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument(
        "--per-level", type=int, default=32, help="requests per concurrency level and round (at least 3x c)"
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of omniray vs vLLM's server")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--audio-max-tokens", type=int, default=48)
    ap.add_argument("--no-audio", action="store_true", help="text only (skip phases 2 and 3)")
    ap.add_argument("--audio-only", action="store_true", help="phase 2 only: audio out with async chunk")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    profile = load_profile(args.profile)
    model, voice = profile.served_model_name, profile.pipeline.default_voice
    n_max = requests_for(max(levels), args.per_level)
    text_bodies = chat_bodies(model, chat_prompts(n_max, seed=0, max_tokens=args.max_tokens), False, voice)
    audio_bodies = chat_bodies(
        model, chat_prompts(n_max, seed=1, max_tokens=args.audio_max_tokens), True, voice
    )

    report = results.header(args.profile, levels=levels, rounds=args.rounds, max_tokens=args.max_tokens)
    print(f"[bench] profile {args.profile}, levels {levels}, commit {report['commit']}", flush=True)
    if args.audio_only:
        with runtime.temporary(
            args.profile, prefix="omniray-bench-", app_args={"async_chunk": True}
        ) as cluster:
            url = f"{cluster.http_url}/v1/chat/completions"
            report["audio_async"] = audio_levels(url, audio_bodies, levels, args.per_level, "async chunk")
        print(f"\n[bench] wrote {results.write('bench-audio', args.profile, report)}")
        return 0
    log = Path(tempfile.mkdtemp(prefix="omniray-bench-")) / "vllm-server.log"
    with (
        runtime.temporary(args.profile, prefix="omniray-bench-", app_args={"async_chunk": True}) as cluster,
        vllm_server.running(profile, runtime.free_port(), log) as vllm,
    ):
        vllm_url = f"{vllm.url}/v1/chat/completions"
        url = f"{cluster.http_url}/v1/chat/completions"
        roots = {vllm.pid: "vllm server", os.getpid(): "client"}
        print(f"[bench] 1/3 text out: omniray vs vLLM's OpenAI server, {args.rounds} interleaved rounds")
        targets = {"vllm": vllm_url, "omniray": url}
        report["text"] = _versus(targets, text_bodies, levels, args.per_level, args.rounds, roots)
        if not args.no_audio:
            print("[bench] 2/3 service, audio out, async chunk", flush=True)
            report["audio_async"] = audio_levels(url, audio_bodies, levels, args.per_level, "async chunk")
            print("[bench] 3/3 service, audio out, no async chunk (redeploying)", flush=True)
            runtime.deploy(cluster, args.profile, app_args={"async_chunk": False}, timeout_s=600)
            report["audio_sync"] = audio_levels(url, audio_bodies, levels, args.per_level, "no async")

    print("\n[bench] summary (same run, same machine; medians over rounds)")
    print(
        f"{'c':>3} | {'vLLM req/s':>10} | {'omniray req/s':>13} | {'ratio':>5} | {'vLLM TTFT':>9} | {'+TTFT ms':>8}"
    )
    report["comparison"] = {}
    text = report["text"]
    for c in levels:
        v, o = text["vllm"][c], text["omniray"][c]
        ratio = o["req_per_s"] / v["req_per_s"]
        added = o["ttft_p50"] - v["ttft_p50"]
        report["comparison"][c] = {"throughput_ratio": ratio, "added_ttft_s": added}
        print(
            f"{c:>3} | {v['req_per_s']:>10.2f} | {o['req_per_s']:>13.2f} | {ratio:>5.2f} | "
            f"{_ms(v['ttft_p50']):>9} | {_ms(added):>8}"
        )
    _print_cpu(text, max(levels))
    if not args.no_audio:
        print(f"\n{'c':>3} | {'TTFP async':>10} | {'TTFP sync':>9} | {'sync/async':>10} | {'RTF':>6}")
        for c in levels:
            a, y = report["audio_async"][c], report["audio_sync"][c]
            speedup = (y["ttfp_mean"] / a["ttfp_mean"]) if a["ttfp_mean"] and y["ttfp_mean"] else None
            report["comparison"][c]["ttfp_sync_over_async"] = speedup
            print(
                f"{c:>3} | {_ms(a['ttfp_mean']):>10} | {_ms(y['ttfp_mean']):>9} | "
                f"{'-' if speedup is None else f'{speedup:.1f}x':>10} | {_ratio(a['rtf_p50']):>6}"
            )
    print(f"\n[bench] wrote {results.write('bench', args.profile, report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
