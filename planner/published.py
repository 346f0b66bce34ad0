"""The GPU hardware profile, fitted to published figures (no GPU was lent to measure one): Qwen3-Omni-
30B-A3B serving on one H100-class GPU. Each curve names its source; where nothing was published for
an H100 the nearest figure is used and said. A GPU node replaces this file with one command:
`make profile-stages PROFILE=qwen3-omni` (planner/profile_stages.py).

    python -m planner.published   # writes configs/hardware/h100-qwen3-omni-published.yaml
"""

from __future__ import annotations

from planner.costs import HARDWARE_DIR, Curve, HardwareProfile, Memory, StageCosts

MS = 1e-3
SOURCES = {
    # vLLM-Omni's async-chunk design page: the thinker's TPOT at concurrency 1 / 4 / 10, H800 with
    # CUDA graphs (H800: an H100's compute and memory bandwidth), 100 tokens in and out.
    "decode_step": ("https://docs.vllm.ai/projects/vllm-omni/en/stable/design/feature/async_chunk/",
                    [(1, 8.3 * MS), (4, 9.1 * MS), (10, 12.7 * MS)]),
    # Qwen3-30B-A3B on vLLM, concurrency 1, time to first token by prompt length — on an A100 (nothing
    # published for an H100 at concurrency 1): an upper bound for an H100.
    "prefill": ("https://github.com/tenstorrent/tt-inference-server/issues/340 (A100)",
                [(1024, 70 * MS), (2048, 81 * MS), (4096, 75 * MS), (8192, 227 * MS)]),
    # Qwen3-Omni's audio encoder, batch 1, eager (as omniray's encoder pool runs it), 1x H100 BF16;
    # 300 / 3000 mel frames = 3 / 30 s of audio.
    "audio_encode": ("https://github.com/sgl-project/sglang-omni/pull/333", [(3, 13.54 * MS), (30, 14.82 * MS)]),
    # Qwen3-Omni technical report (arXiv 2509.17765) Table 2: the talker's MTP cost per token at 1 / 4 / 6
    # concurrent streams, and code2wav's cost per code (vLLM, CUDA graphs; the GPU is not named).
    "talker_step": ("arXiv 2509.17765 Table 2 (MTP cost per token)", [(1, 14 * MS), (4, 16 * MS), (6, 18 * MS)]),
    "vocoder_batch": ("arXiv 2509.17765 Table 2 (codec decoder cost per code)",
                      [(1, 3 * MS), (4, 5 * MS), (6, 5 * MS)]),
}  # fmt: skip
UNITS = {
    "decode_step": "running requests",
    "prefill": "prompt tokens",
    "audio_encode": "audio seconds",
    "talker_step": "streams",
    "vocoder_batch": "chunks",
}
GIB = 1 << 30
# Qwen3-30B-A3B's config: 48 layers, 4 KV heads of 128 dims, K and V in bf16. The pool: vLLM's 0.9 of
# 80 GiB less the thinker's ~30.5B bf16 weights (~57 GiB) and ~4 GiB of activations and CUDA graphs.
MEMORY = Memory(
    kv_cache_bytes=11 * GIB,
    kv_bytes_per_token=48 * 4 * 128 * 2 * 2,
    host_bandwidth_bps=25e9,  # PCIe Gen5 x16, about half its peak as pinned copies reach
    source="Qwen3-30B-A3B config.json (layers, KV heads, head dim); 0.9 x 80 GiB less bf16 weights",
)
NOT_PUBLISHED = "vision encoder per tile (SigLIP2-So400M), VAD, the gateway per event"


def profile() -> HardwareProfile:
    curves = {
        stage: Curve.fit(UNITS[stage], points, quadratic=stage == "prefill")
        for stage, (_, points) in SOURCES.items()
    }
    cited = "; ".join(f"{stage}: {src}" for stage, (src, _) in SOURCES.items())
    return HardwareProfile(
        name="h100-qwen3-omni-published",
        device="1x NVIDIA H100 80GB (H800 / A100 figures where none for an H100 was published)",
        model_profile="qwen3-omni",
        source=f"fitted to published figures: {cited}. Not published: {NOT_PUBLISHED}",
        stages=StageCosts(**curves),
        memory=MEMORY,
    )


def main() -> int:
    out = profile()
    path = HARDWARE_DIR / f"{out.name}.yaml"
    out.dump(path)
    print(f"[published] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
