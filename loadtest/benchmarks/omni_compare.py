"""`make bench-omni`: the Qwen3-Omni serving workload of vLLM-Omni's blog (seed 003) — a 100-token
text prompt answered with text and audio, streamed, seeded, at concurrency 1 / 4 / 10 — with the
speech stages' optimization layers switched on one at a time, on one cluster (each layer a
redeploy of the same profile with one more setting changed):

1. serial: the talker steps one stream per forward (`step_batch: 1`), code2wav decodes one chunk per
   forward (`max_batch: 1`), frames are handed over on the step's thread;
2. batched talker: every stream of a talker replica in one forward (talker + code predictor);
3. batched code2wav: the streams' chunks alike in shape in one forward, dispatch aligned to the
   talker's steps;
4. async output: frames handed to the stage (device-to-host included) while the next step runs.

Per layer and concurrency: req/s, mean audio TTFP, mean and median RTF, and streams per forward
(the talker's and code2wav's own histograms, `omniray_stage_step_streams`), from one run. On a GPU
node, `--profile qwen3-omni` (the default) is the seed's workload; vLLM-Omni's published H800
figures print beside ours for reference only — another machine, not a baseline. On a CPU,
`--profile qwen3-omni-tiny --levels 1,4,8 --max-tokens 16` runs the same code paths at a tiny
random size (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from loadtest import results
from loadtest.benchmarks.bench import chat_bodies, measured_level
from loadtest.benchmarks.profiles import derive
from loadtest.clients.client import run_closed_loop
from loadtest.clients.workload import _WORDS, ChatPrompt
from services import runtime
from services.models.profile import load_profile

# vLLM-Omni's published Qwen3-Omni figures (H800; concurrency -> (TTFP ms, RTF)).
VLLM_OMNI_H800 = {1: (523, 0.22), 4: (786, 0.29), 10: (1629, 0.41)}
STEP_STREAMS = "omniray_stage_step_streams"


def _talker(**options) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["models"]["talker"].setdefault("options", {}).update(options)

    return edit


def _vocoder(**settings) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["models"]["vocoder"].update(settings)

    return edit


# Each layer adds its edits to the ones before it.
LAYERS: list[tuple[str, list[Callable[[dict], None]]]] = [
    ("serial", [_talker(step_batch=1, async_output=False), _vocoder(max_batch=1)]),
    ("batched talker", [_talker(step_batch=None)]),
    ("batched code2wav", [_vocoder(max_batch=16)]),
    ("async output", [_talker(async_output=True)]),
]


def token_prompts(tokenizer_path, n: int, tokens: int, max_tokens: int, seed: int = 0) -> list[ChatPrompt]:
    """`n` seeded prompts of exactly `tokens` tokens in the profile's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = tok.encode(" ".join(rng.choice(_WORDS, 4 * tokens)), add_special_tokens=False)[:tokens]
        out.append(ChatPrompt(tok.decode(ids), max_tokens))
    return out


def layer_profiles(profile: str, tmp: Path) -> list[tuple[str, Path]]:
    """One derived profile per layer, each with the edits of the layers before it."""
    done: list[Callable[[dict], None]] = []
    out = []
    for i, (name, edits) in enumerate(LAYERS):
        done = done + edits

        def edit(data: dict, edits=tuple(done)) -> None:
            for e in edits:
                e(data)

        out.append((name, derive(profile, tmp, f"{profile}-layer{i}", edit)))
    return out


def step_buckets(metrics_url: str) -> dict[str, dict[float, float]]:
    """`omniray_stage_step_streams`' cumulative buckets per stage, summed over replicas."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.removeprefix("ray_") != STEP_STREAMS:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                by_le = out.setdefault(sample.labels["stage"], {})
                le = float(sample.labels["le"])
                by_le[le] = by_le.get(le, 0.0) + sample.value
    return out


def per_forward(before: dict, after: dict, stage: str) -> float | None:
    """Mean streams per forward between two scrapes, from the buckets (one per count up to 16:
    exact there; Ray's exported sum is of bucket midpoints)."""
    a, b = after.get(stage, {}), before.get(stage, {})
    total = weighted = previous = 0.0
    for le in sorted(a):
        cumulative = a[le] - b.get(le, 0.0)
        n = cumulative - previous
        previous = cumulative
        if math.isfinite(le):
            total += n
            weighted += n * le
    return weighted / total if total else None


def run_level(url: str, metrics_url: str, bodies: list[dict], c: int, n: int) -> dict:
    before = step_buckets(metrics_url)
    s = measured_level(url, bodies[:n], c)
    after = step_buckets(metrics_url)
    s["talker_streams_per_forward"] = per_forward(before, after, "talker")
    s["vocoder_chunks_per_forward"] = per_forward(before, after, "vocoder")
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="qwen3-omni")
    ap.add_argument("--levels", default="1,4,10")
    ap.add_argument("--per-level", type=int, default=20, help="requests per level (at least 3x c)")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--layers", default=",".join(name for name, _ in LAYERS),
        help="the layers to run (each still has the edits of those before it)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    profile = load_profile(args.profile)
    n = max(args.per_level, 3 * max(levels))
    prompts = token_prompts(
        profile.model_path(profile.models.thinker), n, args.prompt_tokens, args.max_tokens
    )
    bodies = chat_bodies(profile.served_model_name, prompts, True, profile.pipeline.default_voice)
    for i, body in enumerate(bodies):
        body["seed"] = i  # the talker draws from the request's seed: the same speech in every layer
    report = results.header(
        args.profile, levels=levels, prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, layers={}
    )
    tmp = Path(tempfile.mkdtemp(prefix="omniray-omni-"))
    wanted = args.layers.split(",")
    layers = [(name, path) for name, path in layer_profiles(args.profile, tmp) if name in wanted]
    print(f"[bench-omni] {args.profile}: {args.prompt_tokens}-token prompts -> text + audio, levels {levels}")
    with runtime.temporary(
        str(layers[0][1]), prefix="omniray-omni-", app_args={"async_chunk": True}
    ) as cluster:
        url = f"{cluster.http_url}/v1/chat/completions"
        for i, (name, path) in enumerate(layers):
            if i:
                runtime.deploy(cluster, str(path), app_args={"async_chunk": True}, timeout_s=900)
            asyncio_warmup(url, bodies)
            report["layers"][name] = {}
            for c in levels:
                s = report["layers"][name][c] = run_level(
                    url, cluster.metrics_url, bodies, c, max(args.per_level, 3 * c)
                )
                print(
                    f"  {name:17s} c={c:<3} req/s {s['req_per_s']:6.3f}  TTFP mean {_ms(s['ttfp_mean'])} ms"
                    f"  RTF mean {_x(s['rtf_mean'])} p50 {_x(s['rtf_p50'])}  streams/forward talker "
                    f"{_x(s['talker_streams_per_forward'])} code2wav {_x(s['vocoder_chunks_per_forward'])}"
                    f"  errors {s['errors']} {s['error_sample']}\n    CPU {s['cpu_busy']:.2f} cores busy, ms per"
                    f" request: {s['cpu_ms_per_request']}",
                    flush=True,
                )
    print_table(report, levels)
    print(f"\n[bench-omni] wrote {results.write('omni-layers', args.profile, report)}")
    return 0


def asyncio_warmup(url: str, bodies: list[dict]) -> None:
    asyncio.run(run_closed_loop(url, bodies[:4], 2))


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_table(report: dict, levels: list[int]) -> None:
    print(f"\n[bench-omni] same run, {report['machine']}, commit {report['commit']}")
    print(f"{'layer':17s} | {'c':>3} | {'req/s':>6} | {'TTFP mean':>9} | {'RTF mean':>8} | {'RTF p50':>7} | "
          f"{'talker streams/fwd':>18} | {'code2wav chunks/fwd':>19} | errors")  # fmt: skip
    for name, by_level in report["layers"].items():
        for c in levels:
            s = by_level[c]
            print(f"{name:17s} | {c:>3} | {s['req_per_s']:6.3f} | {_ms(s['ttfp_mean']):>9} | {_x(s['rtf_mean']):>8} | "
                  f"{_x(s['rtf_p50']):>7} | {_x(s['talker_streams_per_forward']):>18} | "
                  f"{_x(s['vocoder_chunks_per_forward']):>19} | {s['errors']}")  # fmt: skip
    last = list(report["layers"].values())[-1]
    low, high = min(levels), max(levels)
    a, b = last[low], last[high]
    if a["req_per_s"] and a["rtf_p50"] and a["ttfp_p50"]:
        print(
            f"\n[bench-omni] last layer, c={high} vs c={low}: req/s {b['req_per_s'] / a['req_per_s']:.2f}x, "
            f"RTF p50 {b['rtf_p50'] / a['rtf_p50']:.2f}x, first audio p50 {b['ttfp_p50'] / a['ttfp_p50']:.2f}x"
        )
    ref = [c for c in levels if c in VLLM_OMNI_H800]
    if ref:
        print("vLLM-Omni's H800 figures, for reference only: " + ", ".join(
            f"c={c} TTFP {VLLM_OMNI_H800[c][0]} ms RTF {VLLM_OMNI_H800[c][1]}" for c in ref))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
