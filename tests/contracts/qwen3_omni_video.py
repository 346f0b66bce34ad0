"""Greedy thinker tokens for one video prompt two ways, in a process of its own (the engine binds
threads and holds the model): transformers' Qwen3-Omni thinker reading the clip's frames itself
(`pixel_values_videos` in Qwen2-VL's video layout, its own vision tower and M-RoPE with the clip's
seconds per temporal patch), and vLLM's thinker taking the encoder pool's output for the same key
frames (services/models/qwen3_omni/vision.py video_tile + assemble_video), placed by the engine's
own prompt code (services/engine/thinker.py vllm_prompt). Prints `RUN {"name", "tokens",
"prompt_tokens"}` per run; a third run, the frames spread over 8x the time, shows the tokens depend
on the time axis."""

import json

import numpy as np
from omni.v1 import stages_pb2

from services.dataplane import tensors
from services.engine.thinker import vllm_prompt
from services.models.profile import load_profile
from services.models.registry import adapter_module
from services.models.versions import FeatureVersions

FRAMES, HEIGHT, WIDTH = 4, 64, 96  # key frames on the 32 px patch grid, as the video pre-stage sizes them
TIMES = [0.25, 0.75, 1.25, 1.75]


def main() -> None:
    profile = load_profile("qwen3-omni-tiny")
    path = profile.model_path(profile.models.thinker)
    vision = adapter_module("qwen3_omni_vision").load(path, profile.models.vision.options)
    frames = (np.random.default_rng(0).random((FRAMES, HEIGHT, WIDTH, 3)) * 255).astype(np.uint8)
    tiles = [vision.video_tile(frames[i : i + 2]) for i in range(0, FRAMES, 2)]
    out = vision.assemble_video(vision.encode_tiles(tiles), TIMES)
    pl = out.placement

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    head = tok.encode("<|im_start|>user\n", add_special_tokens=False)
    tail = tok.encode(
        "\nWhat happens in the video?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    version = FeatureVersions.for_profile(profile, "image").encode()
    prompt = stages_pb2.Prompt()
    prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=head))
    seg = prompt.segments.add(embeddings=tensors.describe(out.embeddings, producer_version=version))
    seg.placement.CopyFrom(stages_pb2.MediaPlacement(
        modality="video", placeholder_id=pl.placeholder, prefix_ids=pl.prefix, suffix_ids=pl.suffix,
        grid_thw=pl.grid_thw, seconds_per_grid=pl.seconds_per_grid))  # fmt: skip
    prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=tail))
    request, counted, _ = vllm_prompt(prompt, FeatureVersions.parse(version).llm, lambda: None)

    ids = head + [*pl.prefix, *[pl.placeholder] * len(out.embeddings), *pl.suffix] + tail
    pixels = np.concatenate([t.pixel_values for t in tiles])
    expected = _transformers(path, ids, pixels, pl.grid_thw, pl.seconds_per_grid)
    print(
        "RUN", json.dumps({"name": "transformers", "tokens": expected, "prompt_tokens": len(ids)}), flush=True
    )
    # The same frames spread over 8x the time: positions differ, so must the tokens (the check sees time).
    slower = _transformers(path, ids, pixels, pl.grid_thw, 8 * pl.seconds_per_grid)
    print(
        "RUN",
        json.dumps({"name": "transformers_slower", "tokens": slower, "prompt_tokens": len(ids)}),
        flush=True,
    )

    from vllm import LLM, SamplingParams

    llm = LLM(model=str(path), dtype="float32", max_model_len=2048, enforce_eager=True, max_num_seqs=1,
              kv_cache_memory_bytes=256 << 20, **profile.engine.extra)  # fmt: skip
    (got,) = llm.generate([request], SamplingParams(max_tokens=16, temperature=0))
    line = {"name": "encoder_pool", "tokens": list(got.outputs[0].token_ids), "prompt_tokens": len(got.prompt_token_ids),
            "counted": counted, "seconds_per_grid": pl.seconds_per_grid}  # fmt: skip
    print("RUN", json.dumps(line), flush=True)


def _transformers(path, ids: list[int], pixels: np.ndarray, grid, seconds_per_grid: float) -> list[int]:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.thinker.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            pixel_values_videos=torch.from_numpy(pixels),
            video_grid_thw=torch.tensor([list(grid)]),
            video_second_per_grid=torch.tensor([seconds_per_grid]),
            max_new_tokens=16,
            do_sample=False,
        )
    return out[0, len(ids) :].tolist()


if __name__ == "__main__":
    main()
