"""`make profile-stages PROFILE=…`: each stage's step cost on this machine, through the profile's real
models, fitted into a hardware profile (planner/costs.py) written to configs/hardware/.

- thinker (vLLM, the profile's engine arguments, prefix caching off so nothing is reused): a prefill of
  T prompt tokens (batch 1: the time to a first token), and a decode step of B running requests (B
  requests generating N tokens, less the same requests generating one, over N - 1 steps);
- vision encoder: one batch of n tiles (`encode_tiles` on the profile's tile size);
- audio encoder: s seconds of audio;
- VAD: Silero over one session's speech, per 32 ms window;
- a text talker (tiny, small): one stream's speech units; the vocoder: a batch of alike chunks.

Each point is the median of at least `--repeats` runs after a warm-up. Not measured yet: a token
talker's step by streams (Qwen3-Omni), the gateway's cost per event.

    python -m planner.profile_stages --profile tiny --name cpu-2core-tiny
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np

from planner.costs import HARDWARE_DIR, Curve, HardwareProfile, StageCosts
from services.models.profile import Profile, load_profile
from services.models.registry import adapter_module


def _median_s(run: Callable[[], object], repeats: int, min_s: float = 0.5, max_runs: int = 50) -> float:
    """The median of at least `repeats` runs, more for a cheap step (until `min_s` is spent): one
    run that a scheduler hiccup slowed 8x does not move it."""
    run()  # warm-up: first calls pay for lazy setup
    times: list[float] = []
    while len(times) < repeats or (sum(times) < min_s and len(times) < max_runs):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def thinker(
    profile: Profile, prompt_tokens: list[int], batches: list[int], repeats: int
) -> tuple[Curve, Curve]:
    from vllm import LLM, SamplingParams

    from services.engine.thinker import _engine_env

    os.environ.update(_engine_env(profile, "prefill"))
    engine = profile.engine
    llm = LLM(model=str(profile.model_path(profile.models.thinker)), dtype=engine.dtype,
              max_model_len=engine.max_model_len, enforce_eager=engine.enforce_eager,
              max_num_seqs=max(batches), block_size=engine.block_size, enable_prefix_caching=False,
              **{k: v for k, v in engine.extra.items() if k != "worker_extension_cls"})  # fmt: skip
    vocab = llm.get_tokenizer().vocab_size
    rng = np.random.default_rng(0)

    def prompts(n: int, tokens: int) -> list[dict]:
        return [{"prompt_token_ids": rng.integers(10, vocab - 10, tokens).tolist()} for _ in range(n)]

    def generate(n: int, tokens: int, out: int) -> None:
        llm.generate(prompts(n, tokens), SamplingParams(max_tokens=out, ignore_eos=True), use_tqdm=False)

    fits = [t for t in prompt_tokens if t < engine.max_model_len] or [engine.max_model_len // 2]
    prefill = [(t, _median_s(lambda t=t: generate(1, t, 1), repeats)) for t in fits]
    steps, context = 64, 32
    decode = []
    for b in batches:
        first = _median_s(lambda b=b: generate(b, context, 1), repeats)
        whole = _median_s(lambda b=b: generate(b, context, steps + 1), repeats)
        decode.append((b, max(0.0, whole - first) / steps))
    return Curve.fit("prompt tokens", prefill, quadratic=True), Curve.fit("running requests", decode)


def vision(
    profile: Profile, batches: list[int], counts: list[int], repeats: int
) -> tuple[Curve | None, Curve | None]:
    """The vision encoder's batches of n tiles, and the stage's work on a request's images before
    their tiles are batched (pixels to an image, cut, each tile preprocessed: Encoder._tiles) for
    n one-tile images; one model load for both."""
    spec = profile.models.vision
    if spec is None:
        return None, None
    from omni.v1 import stages_pb2
    from PIL import Image

    from services.stages.encoder import cut_tiles

    model = adapter_module(spec.adapter).load(profile.model_path(spec), spec.options)
    px = profile.tiling.tile_px
    rng = np.random.default_rng(1)
    pixels = [rng.integers(0, 255, (px, px, 3), dtype=np.uint8) for _ in range(max(*batches, *counts))]
    tiles = [model.preprocess(Image.fromarray(p)) for p in pixels[: max(batches)]]
    points = [(n, _median_s(lambda n=n: model.encode_tiles(tiles[:n]), repeats)) for n in batches]
    # large batches leave the caches: superlinear on a CPU
    batch = Curve.fit("tiles", points, quadratic=True)
    grid = stages_pb2.TileGrid(cols=1, rows=1, tile_px=px)

    def prep(n: int) -> None:
        for p in pixels[:n]:
            [model.preprocess(t) for t in cut_tiles(Image.fromarray(p), grid)]

    return batch, Curve.fit("tiles", [(n, _median_s(lambda n=n: prep(n), repeats)) for n in counts])


def audio(profile: Profile, seconds: list[float], repeats: int) -> Curve | None:
    spec = profile.models.audio
    if spec is None:
        return None
    model = adapter_module(spec.adapter).load(profile.model_path(spec), spec.options)
    rng = np.random.default_rng(2)
    points = []
    for s in seconds:
        wave = (0.1 * rng.standard_normal(int(16_000 * s))).astype(np.float32)
        points.append((s, _median_s(lambda w=wave: model.encode([w]), repeats)))
    return Curve.fit("audio seconds", points)


def speech(profile: Profile, repeats: int) -> tuple[Curve | None, Curve | None]:
    """A text talker's units for one stream (by units), and the vocoder's batch of alike chunks (by
    chunks, up to its max_batch). Token talkers (Qwen3-Omni: they read the thinker's tokens) are
    not measured here."""
    talker_spec, vocoder_spec = profile.models.talker, profile.models.vocoder
    if talker_spec is None or vocoder_spec is None or profile.token_talker():
        return None, None
    from services.models.base import VocodeInput

    talker = adapter_module(talker_spec.adapter).load(profile.model_path(talker_spec), talker_spec.options)
    vocoder = adapter_module(vocoder_spec.adapter).load(
        profile.model_path(vocoder_spec), vocoder_spec.options
    )
    voice = profile.pipeline.default_voice
    texts = {n: " ".join(["The quick brown fox jumps over the lazy dog."] * n) for n in (1, 2, 4)}
    units_points = []
    units = None
    for text in texts.values():
        made = np.concatenate(list(talker.stream_units(text, voice)))
        units = made if units is None or len(made) > len(units) else units
        units_points.append(
            (len(made), _median_s(lambda t=text: list(talker.stream_units(t, voice)), repeats))
        )
    ctx, size = vocoder_spec.context_frames, max(8, len(units) // 8)
    chunk = VocodeInput(units[ctx : ctx + size], left=units[:ctx] if ctx else None, voice=voice)
    batches = [b for b in (1, 2, 4, 8, 16) if b <= vocoder_spec.max_batch] or [1]
    vocode = [(b, _median_s(lambda b=b: vocoder.decode_batch([chunk] * b), repeats)) for b in batches]
    return Curve.fit("speech units", units_points), Curve.fit(f"chunks of {size} units", vocode)


def vad(repeats: int) -> Curve:
    from services.realtime.vad import SileroStream

    rng = np.random.default_rng(3)
    points = []
    for seconds in (1.0, 2.0, 4.0):
        pcm = (rng.standard_normal(int(24_000 * seconds)) * 3000).astype(np.int16).tobytes()
        windows = int(seconds * 1000 / 32)
        points.append((windows, _median_s(lambda p=pcm: SileroStream().feed(p), repeats)))
    return Curve.fit("32 ms windows", points)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--name", help="the hardware profile's name (default: <machine>-<profile>)")
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[32, 128, 512, 1024, 2000])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    device = f"{platform.machine()}, {os.cpu_count()} cores, no GPU" if not _gpu() else _gpu()
    name = args.name or f"{platform.machine()}-{os.cpu_count()}core-{profile.name}"
    started = time.perf_counter()
    encoder_batches = [b for b in args.batches if b <= profile.encoder_pool.batch_size]
    talker_units, vocoder_batch = speech(profile, args.repeats)
    encoder_batch, encoder_prep = vision(profile, encoder_batches, [1, 8, 32, 64], args.repeats)
    stages = StageCosts(
        vad=vad(args.repeats),
        talker_units=talker_units,
        vocoder_batch=vocoder_batch,
        encoder_batch=encoder_batch,
        encoder_prep=encoder_prep,
        audio_encode=audio(profile, [1.0, 2.0, 4.0, 8.0], args.repeats),
        **dict(zip(("prefill", "decode_step"), thinker(profile, args.prompt_tokens, args.batches, args.repeats),
                   strict=True)),
    )  # fmt: skip
    out = HardwareProfile(
        name=name,
        device=device,
        model_profile=profile.name,
        source=f"measured: python -m planner.profile_stages --profile {profile.name} --name {name}",
        measured_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        stages=stages,
    )
    path = HARDWARE_DIR / f"{name}.yaml"
    out.dump(path)
    for stage, curve in stages:
        if curve is not None:
            print(f"  {stage:14s} {curve.intercept_s * 1e3:8.2f} ms + {curve.slope_s * 1e3:8.4f} ms/{curve.unit}"
                  f" + {curve.quad_s * 1e3:.2e} ms/{curve.unit}²  (worst fit error {curve.worst_error:.0%})")  # fmt: skip
    print(f"[profile-stages] wrote {path} in {time.perf_counter() - started:.0f} s")
    return 0


def _gpu() -> str:
    try:
        import torch

        return f"{torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    except Exception:  # no torch CUDA: a CPU machine
        return ""


if __name__ == "__main__":
    raise SystemExit(main())
