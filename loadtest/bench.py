"""`make bench`: serving figures for a profile, each compared against a baseline from the same run.

1. Bare vLLM engine (no Serve, no HTTP) on the thinker: req/s and TTFT at each concurrency.
2. The whole service (Serve, gateway, prefill -> NIXL -> decode), text out: req/s, TTFT; the
   overhead against (1): throughput ratio and added per-request latency.
3. Audio out with async chunk: audio TTFP, RTF, req/s.
4. Audio out without async chunk (each stage waits for the whole previous output): audio TTFP,
   and the ratio to (3).

Results print as tables and go to loadtest/results/bench-<profile>-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import time

from omni.v1 import omni_pb2

from loadtest import baseline_vllm, results
from loadtest.client import Result, run_closed_loop
from loadtest.workload import chat_prompts
from services import runtime
from services.gateway.prompt import PromptBuilder
from services.models.profile import REPO_ROOT, load_profile


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
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _bodies(model: str, prompts, audio: bool, voice: str) -> list[dict]:
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


def _requests_for(c: int, per_level: int) -> int:
    return max(per_level, 3 * c)


async def _bare(profile, token_prompts, max_tokens, levels, per_level) -> dict:
    engine = baseline_vllm.make_engine(profile)
    try:
        await baseline_vllm.run(engine, token_prompts[:4], max_tokens, 2)  # warm-up
        out = {}
        for c in levels:
            n = _requests_for(c, per_level)
            ttfts, wall = await baseline_vllm.run(engine, token_prompts[:n], max_tokens, c)
            out[c] = {
                "n": n,
                "req_per_s": n / wall,
                "ttft_p50": _pct(ttfts, 0.5),
                "ttft_p90": _pct(ttfts, 0.9),
            }
            print(
                f"  bare vLLM   c={c:<3} req/s {n / wall:7.2f}  TTFT p50 {_ms(out[c]['ttft_p50'])} ms",
                flush=True,
            )
        return out
    finally:
        engine.shutdown()


async def _service(url: str, bodies: list[dict], levels, per_level, label: str) -> dict:
    await run_closed_loop(url, bodies[:4], 2)  # warm-up
    out = {}
    for c in levels:
        results, wall = await run_closed_loop(url, bodies[: _requests_for(c, per_level)], c)
        s = out[c] = _summary(results, wall)
        print(
            f"  {label:11s} c={c:<3} req/s {s['req_per_s']:7.2f}  TTFT p50 {_ms(s['ttft_p50'])} ms"
            f"  TTFP mean {_ms(s['ttfp_mean'])} p90 {_ms(s['ttfp_p90'])} ms  RTF p50 {_ratio(s['rtf_p50'])}"
            f"  errors {s['errors']}",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument(
        "--per-level", type=int, default=16, help="requests per concurrency level (at least 3x c)"
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--audio-max-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    profile = load_profile(args.profile)
    model, voice = profile.served_model_name, profile.pipeline.default_voice
    n_max = _requests_for(max(levels), args.per_level)
    prompts = chat_prompts(n_max, seed=0, max_tokens=args.max_tokens)
    audio_prompts = chat_prompts(n_max, seed=1, max_tokens=args.audio_max_tokens)

    builder = PromptBuilder(str(profile.model_path(profile.models.thinker)))
    token_prompts = []
    for p in prompts:
        rendered = builder.render(
            [omni_pb2.Message(role="user", content=[omni_pb2.ContentPart(text=p.text)])], []
        )
        token_prompts.append([t for s in rendered.segments for t in s.tokens.ids])

    report: dict = {
        "profile": args.profile,
        "levels": levels,
        "max_tokens": args.max_tokens,
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
        ).stdout.strip(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"[bench] profile {args.profile}, levels {levels}, commit {report['commit']}", flush=True)
    print("[bench] 1/4 bare vLLM engine", flush=True)
    report["bare"] = asyncio.run(_bare(profile, token_prompts, args.max_tokens, levels, args.per_level))

    with runtime.temporary(args.profile, prefix="omniray-bench-", app_args={"async_chunk": True}) as cluster:
        url = f"{cluster.http_url}/v1/chat/completions"
        print("[bench] 2/4 service, text out", flush=True)
        report["service_text"] = asyncio.run(
            _service(url, _bodies(model, prompts, False, voice), levels, args.per_level, "service")
        )
        print("[bench] 3/4 service, audio out, async chunk", flush=True)
        report["audio_async"] = asyncio.run(
            _service(url, _bodies(model, audio_prompts, True, voice), levels, args.per_level, "async chunk")
        )
        print("[bench] 4/4 service, audio out, no async chunk (redeploying)", flush=True)
        runtime.deploy(cluster, args.profile, app_args={"async_chunk": False}, timeout_s=600)
        report["audio_sync"] = asyncio.run(
            _service(url, _bodies(model, audio_prompts, True, voice), levels, args.per_level, "no async")
        )

    print("\n[bench] summary (same run, same machine)")
    print(
        f"{'c':>3} | {'bare req/s':>10} | {'svc req/s':>9} | {'thru ratio':>10} | {'+TTFT ms':>8} | "
        f"{'TTFP async':>10} | {'TTFP sync':>9} | {'sync/async':>10} | {'RTF':>6}"
    )
    report["comparison"] = {}
    for c in levels:
        b, s, a, y = (
            report["bare"][c],
            report["service_text"][c],
            report["audio_async"][c],
            report["audio_sync"][c],
        )
        ratio = s["req_per_s"] / b["req_per_s"]
        added = (s["ttft_p50"] - b["ttft_p50"]) if s["ttft_p50"] and b["ttft_p50"] else None
        speedup = (y["ttfp_mean"] / a["ttfp_mean"]) if a["ttfp_mean"] and y["ttfp_mean"] else None
        report["comparison"][c] = {
            "throughput_ratio": ratio,
            "added_ttft_s": added,
            "ttfp_sync_over_async": speedup,
        }
        print(
            f"{c:>3} | {b['req_per_s']:>10.2f} | {s['req_per_s']:>9.2f} | {ratio:>10.2f} | {_ms(added):>8} | "
            f"{_ms(a['ttfp_mean']):>10} | {_ms(y['ttfp_mean']):>9} | "
            f"{'-' if speedup is None else f'{speedup:.1f}x':>10} | "
            f"{_ratio(a['rtf_p50']):>6}"
        )
    print(f"\n[bench] wrote {results.write('bench', args.profile, report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
