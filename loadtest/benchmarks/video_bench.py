"""`make bench-video`: video in the encoder pool, measured in one run on this machine.

1. Key frames: the video pre-stage's sampler (services/stages/video.py, the real one) on a static,
   a moving and a cutting clip: frames sampled, kept as key frames, the share saved, its time.
2. LiveServe's mixed workload on one encoder replica (the real Encoder stage class and the
   profile's real models, in process): a video question (a moving clip's key frames) arrives, and
   while it is encoded single-image chat requests and voice turns (1 s of audio through the audio
   encoder) arrive every `--interval-ms`. Two ways, same workload: the clip's frames as tiles in the
   tile scheduler (fewest pending first, the profile's batch size), and the clip whole (one batch of
   all its frames, arrival order: what an encoder that takes a clip as one input does). Reported:
   chat and voice p50/p90, the clip's time; the ratios.

3. Features streamed over NIXL (`--stream-profile`, qwen3-omni-tiny: a thinker that places media
   itself): a real deployment, started twice on the same profile — once with `encoder_pool.
   stream_mib` (each image's features written to the encoder's NIXL feature pool as it is encoded,
   the prompt sent at placement, read by the thinker's EC connector) and once without (features
   whole, once all are encoded). The same `--stream-requests` chat requests of 10 fresh images each
   (2x1 tiles each: 20 tiles, more than one encoder batch), one at a time, `max_tokens` 1:
   first-token time p50/p90 each way, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import platform
import statistics
import time

import numpy as np
from omni.v1 import stages_pb2

from loadtest import results
from loadtest.benchmarks.encoder_hol import _image, _item, timed_encode
from loadtest.clients.clips import video_clip
from services.dataplane import tensors
from services.models.profile import load_profile
from services.stages.tile_scheduler import TileScheduler
from services.stages.video import sample_clip

SCENES = ("static", "moving", "cuts")


def _request(args) -> stages_pb2.VideoRequest:
    return stages_pb2.VideoRequest(
        fps=args.fps, max_frames=args.max_frames, keyframe_threshold=args.threshold,
        frame_px=args.frame_px, frame_multiple=32, seconds=args.seconds,
    )  # fmt: skip


def key_frames(args) -> dict:
    out = {}
    for scene in SCENES:
        clip = video_clip(seconds=args.seconds, fps=15, size=(640, 360), motion=scene)
        t0 = time.perf_counter()
        frames, _, sampled, _ = sample_clip(clip, _request(args))
        seconds = time.perf_counter() - t0
        out[scene] = {
            "sampled": sampled,
            "kept": len(frames),
            "saved": 1 - len(frames) / sampled,
            "ms": seconds * 1000,
        }
        print(f"  {scene:7s} sampled {sampled:3d}  kept {len(frames):3d}  saved {out[scene]['saved']:5.0%}"
              f"  pre-stage {seconds * 1000:6.0f} ms ({args.seconds:g} s clip, 640x360 at 15 fps)", flush=True)  # fmt: skip
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]


async def _mixed(encoder, clip_item, chats, voices, interval_s: float, whole: bool) -> dict:
    pool = encoder.profile.encoder_pool
    frames = clip_item.data.shape[0]
    encoder.scheduler = (
        TileScheduler(max(frames, pool.batch_size), "fifo", 0.0)
        if whole
        else TileScheduler(pool.batch_size, pool.policy, pool.aging_tiles_per_s)
    )
    encoder.cache.clear()

    video = asyncio.create_task(timed_encode(encoder, "video", [clip_item]))
    chat_tasks, voice_tasks = [], []
    for i, (chat, voice) in enumerate(zip(chats, voices, strict=True)):
        await asyncio.sleep(interval_s)
        chat_tasks.append(asyncio.create_task(timed_encode(encoder, f"chat{i}", [chat])))
        voice_tasks.append(asyncio.create_task(timed_encode(encoder, f"voice{i}", [voice])))
    video_s = await video
    chat_s, voice_s = await asyncio.gather(*chat_tasks), await asyncio.gather(*voice_tasks)
    return {
        "video_s": video_s,
        "chat_p50_s": statistics.median(chat_s), "chat_p90_s": _pct(chat_s, 0.9),
        "voice_p50_s": statistics.median(voice_s), "voice_p90_s": _pct(voice_s, 0.9),
    }  # fmt: skip


def _voice(i: int) -> stages_pb2.MediaItem:
    t = np.arange(16_000) / 16_000
    wave = (0.3 * np.sin(2 * np.pi * (180 + 20 * i) * t)).astype(np.float32)
    digest = hashlib.sha256(wave.tobytes()).hexdigest()
    return stages_pb2.MediaItem(
        modality="audio", data=tensors.describe(wave, content_hash=digest), audio_seconds=1.0
    )


async def mixed(args) -> dict:
    from services.stages.encoder import Encoder

    profile = load_profile(args.profile)
    encoder = Encoder.func_or_class(profile.model_dump())
    clip = video_clip(seconds=args.seconds, fps=15, size=(640, 360), motion="moving")
    frames, stamps, _, _ = sample_clip(clip, _request(args))
    clip_item = stages_pb2.MediaItem(
        modality="video",
        data=tensors.describe(frames, content_hash=hashlib.sha256(clip).hexdigest()),
        timestamps=stamps,
    )
    tile = profile.tiling.tile_px
    chats = [_item(_image(2000 + i, (tile, tile)), (tile, tile), profile) for i in range(args.requests)]
    voices = [_voice(i) for i in range(args.requests)]
    await _mixed(encoder, clip_item, chats[:2], voices[:2], 0.0, whole=False)  # warm-up
    out = {"frames": len(frames)}
    for name, whole in (("clip_whole", True), ("frames_as_tiles", False)):
        r = out[name] = await _mixed(encoder, clip_item, chats, voices, args.interval_ms / 1000, whole)
        print(f"  {name:16s} chat p50 {r['chat_p50_s'] * 1000:7.1f} ms  p90 {r['chat_p90_s'] * 1000:7.1f} ms"
              f"  voice p50 {r['voice_p50_s'] * 1000:7.1f} ms  p90 {r['voice_p90_s'] * 1000:7.1f} ms"
              f"  video {r['video_s'] * 1000:7.0f} ms", flush=True)  # fmt: skip
    w, t = out["clip_whole"], out["frames_as_tiles"]
    out["chat_p90_cut"] = w["chat_p90_s"] / t["chat_p90_s"]
    out["voice_p90_cut"] = w["voice_p90_s"] / t["voice_p90_s"]
    out["video_time_ratio"] = t["video_s"] / w["video_s"]
    print(f"[bench-video] chat p90 clip-whole / frames-as-tiles = {out['chat_p90_cut']:.1f}x; voice p90 "
          f"{out['voice_p90_cut']:.2f}x; the clip's time frames-as-tiles / whole = {out['video_time_ratio']:.2f}")  # fmt: skip
    return out


def _ten_images(seed: int, px: tuple[int, int]) -> list[dict]:
    import base64
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(10):
        buf = io.BytesIO()
        Image.fromarray((rng.random((px[1], px[0], 3)) * 255).astype(np.uint8)).save(buf, "PNG")
        url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        parts.append({"type": "image_url", "image_url": {"url": url, "detail": "high"}})
    return parts


def _first_token_s(url: str, model: str, parts: list[dict]) -> float:
    import httpx

    from loadtest.clients.client import LOCAL_API_KEY

    body = {"model": model, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Compare them."}, *parts]}]}  # fmt: skip
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300,
                   headers={"Authorization": f"Bearer {LOCAL_API_KEY}"})  # fmt: skip
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
    return time.perf_counter() - t0


def streamed(args) -> dict:
    """Part 3: one deployment each way, the same requests."""
    import tempfile
    from pathlib import Path

    import yaml

    from services import runtime

    base = load_profile(args.stream_profile)
    on_mib = base.encoder_pool.stream_mib or 64
    size = tuple(int(x) for x in args.stream_size.split("x"))
    requests = [_ten_images(3000 + i, size) for i in range(args.stream_requests + 2)]
    out: dict = {"profile": base.name, "images": 10, "size": args.stream_size}
    with tempfile.TemporaryDirectory(prefix="bench-video-") as tmp:
        for name, mib in (("whole", 0), ("streamed", on_mib)):
            data = base.model_dump(mode="json")
            data["encoder_pool"]["stream_mib"] = mib
            path = Path(tmp, f"{base.name}-{name}.yaml")
            path.write_text(yaml.safe_dump(data))
            run_dir = Path(tmp, f"run-{name}")
            cluster = runtime.start(str(path), http_port=runtime.free_port(), grpc_port=runtime.free_port(),
                                    run_dir=run_dir)  # fmt: skip
            try:
                for parts in requests[:2]:  # warm-up: first requests pay for lazy setup
                    _first_token_s(cluster.http_url, base.served_model_name, parts)
                times = sorted(
                    _first_token_s(cluster.http_url, base.served_model_name, p) for p in requests[2:]
                )
            finally:
                runtime.stop(run_dir)
            out[name] = {
                "ttft_p50_s": statistics.median(times),
                "ttft_p90_s": _pct(times, 0.9),
                "n": len(times),
            }
            print(f"  {name:8s} first token p50 {out[name]['ttft_p50_s'] * 1000:7.1f} ms"
                  f"  p90 {out[name]['ttft_p90_s'] * 1000:7.1f} ms  (n={len(times)})", flush=True)  # fmt: skip
    out["ttft_p50_whole_over_streamed"] = out["whole"]["ttft_p50_s"] / out["streamed"]["ttft_p50_s"]
    print(f"[bench-video] first token of a 10-image request, whole / streamed over NIXL = "
          f"{out['ttft_p50_whole_over_streamed']:.2f}x (p50)")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="small")
    ap.add_argument("--seconds", type=float, default=30.0, help="clip length")
    ap.add_argument("--fps", type=float, default=2.0, help="frames sampled a second")
    ap.add_argument("--max-frames", type=int, default=64)
    ap.add_argument("--threshold", type=float, default=0.02, help="key-frame threshold")
    ap.add_argument("--frame-px", type=int, default=448)
    ap.add_argument("--requests", type=int, default=30, help="chat requests and voice turns each")
    ap.add_argument("--interval-ms", type=float, default=20.0)
    ap.add_argument("--parts", default="1,2,3", help="which parts to run (comma-separated)")
    ap.add_argument("--stream-profile", default="qwen3-omni-tiny", help="part 3's profile")
    ap.add_argument("--stream-requests", type=int, default=10)
    ap.add_argument("--stream-size", default="896x448", help="the images' size (2x1 tiles of 448 px: 20 tiles, "
                    "more than an encoder batch of 16)")  # fmt: skip
    args = ap.parse_args(argv)
    out = {
        "profile": args.profile, "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "args": vars(args),
    }  # fmt: skip
    parts = set(args.parts.split(","))
    if "1" in parts:
        print("[bench-video] key frames (the pre-stage's sampler):", flush=True)
        out["key_frames"] = key_frames(args)
    if "2" in parts:
        print(
            f"[bench-video] encoder pool, {args.profile}: a video question beside chat and voice:", flush=True
        )
        out["mixed"] = asyncio.run(mixed(args))
    if "3" in parts:
        print(
            f"[bench-video] a 10-image request on {args.stream_profile}, features streamed vs whole:",
            flush=True,
        )
        out["streamed"] = streamed(args)
    print(f"[bench-video] wrote {results.write('bench-video', args.profile, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
