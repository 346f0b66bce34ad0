"""`make bench-omni`: vLLM-Omni's Qwen3-Omni serving workload on omniray — a 100-token text prompt
answered with text and audio, at concurrency 1 / 4 / 10 — with the first-audio time (TTFP) and the
real-time factor (RTF), async chunk on and off (the off run is the same-run baseline: each stage
waits for the whole output of the one before).

Meant for the `qwen3-omni` profile on a GPU node, where vLLM-Omni's published figures (H800,
Qwen3-Omni-30B-A3B) are the yardstick; those are printed beside ours for reference only — another
machine and another run, not a baseline. On a CPU, `--profile qwen3-omni-tiny` runs the same code
paths at a tiny random size (figures that say where time goes, not how the model performs).
"""

from __future__ import annotations

import argparse

import numpy as np

from loadtest import results
from loadtest.bench import audio_levels, chat_bodies
from loadtest.workload import _WORDS, ChatPrompt
from services import runtime
from services.models.profile import load_profile

# vLLM-Omni's published Qwen3-Omni figures (H800; concurrency -> (TTFP ms, RTF)).
VLLM_OMNI_H800 = {1: (523, 0.22), 4: (786, 0.29), 10: (1629, 0.41)}


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="qwen3-omni")
    ap.add_argument("--levels", default="1,4,10")
    ap.add_argument("--per-level", type=int, default=20, help="requests per level (at least 3x c)")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    profile = load_profile(args.profile)
    n = max(args.per_level, 3 * max(levels))
    prompts = token_prompts(
        profile.model_path(profile.models.thinker), n, args.prompt_tokens, args.max_tokens
    )
    bodies = chat_bodies(profile.served_model_name, prompts, True, profile.pipeline.default_voice)
    report = results.header(
        args.profile, levels=levels, prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens
    )
    print(f"[bench-omni] {args.profile}: {args.prompt_tokens}-token prompts -> text + audio, levels {levels}")
    with runtime.temporary(args.profile, prefix="omniray-omni-", app_args={"async_chunk": True}) as cluster:
        url = f"{cluster.http_url}/v1/chat/completions"
        report["async"] = audio_levels(url, bodies, levels, args.per_level, "async chunk")
        runtime.deploy(cluster, args.profile, app_args={"async_chunk": False}, timeout_s=600)
        report["sync"] = audio_levels(url, bodies, levels, args.per_level, "no async")

    ms = lambda x: "-" if x is None else f"{x * 1000:.0f}"  # noqa: E731
    print(f"\n[bench-omni] same run, {report['machine']}; vLLM-Omni's H800 figures for reference only")
    print(f"{'c':>3} | {'TTFP p50':>8} | {'TTFP p90':>8} | {'RTF p50':>7} | {'no-async TTFP p50':>17} | "
          f"{'vLLM-Omni TTFP / RTF (H800)':>27}")  # fmt: skip
    for c in levels:
        a, s = report["async"][c], report["sync"][c]
        ref = VLLM_OMNI_H800.get(c)
        rtf = "-" if a["rtf_p50"] is None else f"{a['rtf_p50']:.2f}"
        print(f"{c:>3} | {ms(a['ttfp_p50']):>8} | {ms(a['ttfp_p90']):>8} | {rtf:>7} | {ms(s['ttfp_p50']):>17} | "
              f"{'-' if ref is None else f'{ref[0]} ms / {ref[1]}':>27}")  # fmt: skip
    print(f"\n[bench-omni] wrote {results.write('omni-compare', args.profile, report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
