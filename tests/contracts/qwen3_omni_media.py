"""vLLM's greedy thinker tokens for one image + audio prompt two ways, in a process of its own (the
engine binds threads and holds the model): the thinker encoding the raw media itself, and the
encoder pool's adapters encoding them with their outputs placed by the engine's own prompt code
(services/engine/thinker.py vllm_prompt). Also a 2x1-tile image through the placed path. Prints
one JSON line per run: `RUN {"name", "tokens", "prompt_tokens", "counted"}`; and, for the placed
run, how far the rows the workers wrote for the talker (media_rows.py, in the Redis at
$OMNIRAY_REDIS_URL) are from transformers' thinker hidden states at the same layer and positions:
`ROWS {"items", "rows", "max_abs", "scale"}`."""

import json

import numpy as np
from omni.v1 import stages_pb2
from PIL import Image
from vllm import LLM, SamplingParams

from services.common.redis_config import sync_client
from services.dataplane import tensors
from services.engine.thinker import vllm_prompt
from services.extensions.vllm.media_rows import EXTRA_ARG, media_row_keys, read_rows
from services.extensions.vllm.plugin import QWEN3_OMNI_THINKER
from services.models.profile import load_profile
from services.models.registry import adapter_module
from services.models.versions import FeatureVersions
from services.stages.encoder import cut_tiles


def main() -> None:
    profile = load_profile("qwen3-omni-tiny")
    path = profile.model_path(profile.models.thinker)
    vision = adapter_module("qwen3_omni_vision").load(path, profile.models.vision.options)
    audio = adapter_module("qwen3_omni_audio").load(path, profile.models.audio.options)
    rng = np.random.default_rng(0)
    image = Image.fromarray((rng.random((320, 416, 3)) * 255).astype(np.uint8))  # 1x1 grid, 32-multiple sides
    wide = Image.fromarray((rng.random((448, 896, 3)) * 255).astype(np.uint8))  # a 2x1 grid
    t = np.arange(int(16000 * 1.37)) / 16000
    wave = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    head = tok.encode("<|im_start|>user\n", add_special_tokens=False)
    mid = tok.encode("\nWhat is in the picture and the sound?", add_special_tokens=False)
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    llm = LLM(model=str(path), dtype="float32", max_model_len=2048, enforce_eager=True, max_num_seqs=1,
              kv_cache_memory_bytes=256 << 20, **profile.engine.extra)  # fmt: skip
    assert profile.engine.extra["hf_overrides"]["architectures"] == [QWEN3_OMNI_THINKER]
    greedy = SamplingParams(max_tokens=16, temperature=0)

    def run(name: str, request: dict, counted: int, **extra) -> None:
        params = SamplingParams(max_tokens=16, temperature=0, **extra) if extra else greedy
        (out,) = llm.generate([request], params)
        line = {"name": name, "tokens": list(out.outputs[0].token_ids), "prompt_tokens": len(out.prompt_token_ids),
                "counted": counted}  # fmt: skip
        print("RUN", json.dumps(line), flush=True)

    def encode_image(img: Image.Image, cols: int, rows: int):
        grid = stages_pb2.TileGrid(cols=cols, rows=rows, tile_px=profile.tiling.tile_px)
        return vision.assemble(
            vision.encode_tiles([vision.preprocess(t) for t in cut_tiles(img, grid)]), cols, rows
        )

    def placed(out, modality: str) -> stages_pb2.PromptSegment:
        pl = out.placement
        version = FeatureVersions.for_profile(profile, modality).encode()
        seg = stages_pb2.PromptSegment(embeddings=tensors.describe(out.embeddings, producer_version=version))
        seg.placement.CopyFrom(stages_pb2.MediaPlacement(
            modality=pl.modality, placeholder_id=pl.placeholder, prefix_ids=pl.prefix, suffix_ids=pl.suffix,
            grid_thw=pl.grid_thw or (), feature_frames=pl.feature_frames))  # fmt: skip
        return seg

    def prompt(image_out, audio_out) -> stages_pb2.Prompt:
        p = stages_pb2.Prompt()
        p.segments.add(tokens=stages_pb2.TokenSpan(ids=head))
        p.segments.append(placed(image_out, "image"))
        p.segments.add(tokens=stages_pb2.TokenSpan(ids=mid))
        p.segments.append(placed(audio_out, "audio"))
        p.segments.add(tokens=stages_pb2.TokenSpan(ids=tail))
        return p

    (audio_out,) = audio.encode([wave])
    image_out = encode_image(image, 1, 1)
    request, counted, segments = vllm_prompt(prompt(image_out, audio_out), FeatureVersions.parse(
        FeatureVersions.for_profile(profile, "image").encode()).llm, lambda: None)  # fmt: skip
    assert sum(len(s) if isinstance(s, list) else s["tokens"] for s in segments) == counted
    raw_ids = (head + [image_out.placement.prefix[0], image_out.placement.placeholder, image_out.placement.suffix[0]]
               + mid + [audio_out.placement.prefix[0], audio_out.placement.placeholder, audio_out.placement.suffix[0]]
               + tail)  # fmt: skip
    run(
        "raw",
        {"prompt_token_ids": raw_ids, "multi_modal_data": {"image": image, "audio": (wave, 16000)}},
        counted,
    )
    llm.collective_rpc("omniray_capture_media_rows")
    llm_version = FeatureVersions.parse(FeatureVersions.for_profile(profile, "image").encode()).llm
    keys = media_row_keys(segments, "", llm_version)
    run("encoder_pool", request, counted, extra_args={EXTRA_ARG: [list(k) for k in keys]})
    rows = read_rows(sync_client(), [k for _, _, k in keys])
    assert all(r is not None for r in rows), "the workers wrote no rows"
    expected = _transformers_rows(path, tok.decode(raw_ids), image, wave, [(s, n) for s, n, _ in keys])
    got = np.concatenate(rows)
    print("ROWS", json.dumps({"items": len(rows), "rows": len(got), "max_abs": float(np.abs(got - expected).max()),
                              "scale": float(np.abs(expected).max())}), flush=True)  # fmt: skip
    request, counted, _ = vllm_prompt(prompt(encode_image(wide, 2, 1), audio_out), FeatureVersions.parse(
        FeatureVersions.for_profile(profile, "image").encode()).llm, lambda: None)  # fmt: skip
    run("two_tiles", request, counted)


def _transformers_rows(path, text: str, image, wave, spans: list[tuple[int, int]]) -> np.ndarray:
    """transformers' thinker hidden states after `accept_hidden_layer` layers at the spans."""
    import torch
    from transformers import AutoConfig, AutoProcessor, Qwen3OmniMoeForConditionalGeneration

    layer = AutoConfig.from_pretrained(path).talker_config.accept_hidden_layer
    processor = AutoProcessor.from_pretrained(path)
    inputs = processor(text=[text], images=[image], audio=[wave], return_tensors="pt")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model.thinker(**inputs, output_hidden_states=True).hidden_states[layer][0]
    return np.concatenate([hidden[s : s + n].numpy() for s, n in spans])


if __name__ == "__main__":
    main()
