"""Encoder pool stage: images, video key frames and audio -> what the thinker sees (embeddings or text).

Images are cut into tiles by the grid the router chose; the tile is the scheduling unit. Tiles of
all requests on this replica go through one TileScheduler (fewest pending tiles first, with aging)
and share batches up to `encoder_pool.batch_size`; each image is reassembled from its tiles. A
feature cache skips the encoder for an image it has already encoded for the same tenant, encoder
version and tile grid. A clip's key frames (from the video pre-stage) are tiles too, grouped as the
model reads frames (services/models/base.py VisionEncoder.frames_per_tile), cached tile by tile.
Every feature tensor carries the encoder/projector/LLM versions.

Streamed features (profile `encoder_pool.stream_mib`, a thinker that places media itself): a stream
request's images are placed (token counts, grids) before they are encoded, the caller sends its
prompt at once, and each image's features go into this replica's NIXL feature pool
(kv_store/features.py) as soon as it is encoded, where the thinker's EC connector reads them
(services/extensions/vllm/ec_connector.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator

import numpy as np
from omni.v1 import common_pb2, stages_pb2
from PIL import Image
from ray import serve

from kv_store.features import FeaturePool
from services.common.redis_config import sync_client
from services.dataplane import tensors
from services.extensions.ray.metrics import metric
from services.models.base import EncoderOutput, Placement
from services.models.versions import FeatureVersionMismatch, FeatureVersions
from services.stages._stage import Stage
from services.stages.feature_cache import FRAME, FeatureCache, cache_key
from services.stages.feature_stream import FeatureStream
from services.stages.tile_scheduler import TileJob, TileScheduler


def cut_tiles(image: Image.Image, grid: stages_pb2.TileGrid) -> list[Image.Image]:
    """The tiles of `image` in row-major order. A 1x1 grid is the whole image, left to the
    model's own preprocessing (resize, crop) rather than squashed to a square here."""
    if grid.cols * grid.rows <= 1:
        return [image]
    t = grid.tile_px
    resized = image.resize((grid.cols * t, grid.rows * t), Image.Resampling.BICUBIC)
    return [
        resized.crop((c * t, r * t, (c + 1) * t, (r + 1) * t))
        for r in range(grid.rows)
        for c in range(grid.cols)
    ]


@serve.deployment
class Encoder(Stage):
    name = "encoder"

    def __init__(self, profile: dict):
        super().__init__(profile)
        self.vision = self.load_model(self.profile.models.vision)
        self.audio = self.load_model(self.profile.models.audio)
        self._transcriber = None  # loaded on first use (services/models/base.py Transcriber)
        self._transcriber_lock = asyncio.Lock()
        pool = self.profile.encoder_pool
        self.scheduler = TileScheduler(pool.batch_size, pool.policy, pool.aging_tiles_per_s)
        self.cache = FeatureCache(pool.cache_mib * 1024 * 1024)
        self.versions = {m: FeatureVersions.for_profile(self.profile, m).encode() for m in ("image", "audio")}
        self._pending: dict[tuple[str, int], TileJob] = {}
        self._work = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self._reload_lock = asyncio.Lock()
        self._waits: dict[str, list[float]] = {}  # request id -> its tiles' longest queue wait
        self.pool_metrics = _PoolMetrics()
        # Images' features streamed to the thinker over NIXL (services/extensions/vllm/ec_connector.py).
        self.features: FeaturePool | None = None
        if pool.stream_mib and hasattr(self.vision, "placement"):
            self.features = FeaturePool(
                f"ec-encoder-{uuid.uuid4().hex[:12]}", pool.stream_mib << 20, sync_client(),
                hold_s=pool.stream_hold_s, ttl_s=2 * pool.stream_hold_s,
            )  # fmt: skip
        self._feature_server: asyncio.Task | None = None

    # ---- tile batching --------------------------------------------------------------------

    async def _run(self) -> None:
        """Forever: take the best batch of tiles, encode it, hand each feature to its request."""
        while True:
            if not self.scheduler.pending:
                self._work.clear()
                await self._work.wait()
            batch = self.scheduler.next_batch()
            self.pool_metrics.batch(len(batch), self.scheduler.pending)
            try:
                feats = await asyncio.to_thread(self.vision.encode_tiles, [t for _, (_, t) in batch])
            except Exception as e:  # fail the requests in this batch, keep serving the rest
                for key, _ in batch:
                    self.scheduler.cancel(key)
                    if (p := self._pending.pop(key, None)) is not None and not p.done.done():
                        p.done.set_exception(e)
                continue
            touched = {}
            for (key, (image, _)), feat in zip(batch, feats, strict=True):
                if (p := self._pending.get(key)) is not None:  # else cancelled
                    p.add(image, feat)
                    touched[key] = p
            for p in touched.values():
                if p.waited is None:
                    p.waited = time.monotonic() - p.submitted
                p.report()

    def _cache_key(self, item: stages_pb2.MediaItem, tenant: str) -> str:
        if item.modality == "audio":
            shape = "audio"
        else:
            shape = f"{item.tiles.cols}x{item.tiles.rows}@{item.tiles.tile_px}/{item.tiles.policy_version}"
        return cache_key(tenant, item.data.content_hash, self.versions[item.modality], shape)

    def _tiles(self, item: stages_pb2.MediaItem) -> list:
        """The image's pixels (uint8 RGB [height, width, 3], decoded by the gateway) in tiles."""
        image = Image.fromarray(tensors.materialize(item.data))
        return [self.vision.preprocess(t) for t in cut_tiles(image, item.tiles)]

    async def _tiled(
        self, request: stages_pb2.EncodeRequest, tiles: dict[int, list], items: int, progress=None, on_image=None
    ) -> dict[int, list]:
        """Each item's tiles -> their features, as one scheduler job (its priority: its pending
        tiles, so a long clip or a document does not hold a chat image back). `items`: the
        request's items of this kind, the cached ones included (for progress)."""
        tiles = {i: t for i, t in tiles.items() if t}
        if not tiles:
            return {}
        key = (request.ctx.request_id, uuid.uuid4().hex)
        pending = self._pending[key] = TileJob({i: len(t) for i, t in tiles.items()}, items, progress, on_image)
        self.scheduler.submit(key, [(i, t) for i, ts in tiles.items() for t in ts])
        self._work.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run())
        try:
            features = await pending.done
        finally:
            self.scheduler.cancel(key)
            self._pending.pop(key, None)
        waits = self._waits.setdefault(request.ctx.request_id, [0.0])
        waits[0] = max(waits[0], pending.waited or 0.0)
        for t in tiles.values():
            self.pool_metrics.tiles(len(t))
        return features

    async def _encode_images(
        self, request: stages_pb2.EncodeRequest, indices: list[int], progress=None, stream: FeatureStream | None = None
    ) -> dict[int, EncoderOutput]:
        """Images of one request -> outputs: cache hits directly, the rest as one scheduler job.
        With `stream`, each image is placed before it is encoded and written to the feature pool as
        soon as it is (a hit at once)."""
        out: dict[int, EncoderOutput] = {}
        misses = []
        for i in indices:
            item = request.items[i]
            hit = None if request.bypass_cache else self.cache.get(self._cache_key(item, request.ctx.tenant))
            self.pool_metrics.cache("image", "miss" if hit is None else "hit")
            if hit is None:
                misses.append(i)
            else:
                out[i] = hit
        tiles = await asyncio.to_thread(lambda: {i: self._tiles(request.items[i]) for i in misses})
        if stream is not None:
            placed = {i: (out[i].placement, out[i].embeddings.shape) for i in out}
            for i in misses:
                grid = request.items[i].tiles
                placed[i] = self.vision.placement(tiles[i], grid.cols, grid.rows)
            stream.place(placed, {i: self._cache_key(request.items[i], request.ctx.tenant) for i in indices})
            for i in out:
                await stream.write(i, out[i].embeddings)
        if not misses:
            return out
        written: list[asyncio.Task] = []

        async def finished(i: int, features: list) -> None:
            grid = request.items[i].tiles
            out[i] = await asyncio.to_thread(self.vision.assemble, features, grid.cols, grid.rows)
            self.cache.put(self._cache_key(request.items[i], request.ctx.tenant), out[i])
            if stream is not None:
                await stream.write(i, out[i].embeddings)

        def on_image(i: int, features: list) -> None:
            written.append(asyncio.create_task(finished(i, features)))

        try:
            await self._tiled(request, tiles, len(indices), progress, on_image)
            await asyncio.gather(*written)
        finally:
            for task in written:
                task.cancel()
        return out

    async def _encode_videos(
        self, request: stages_pb2.EncodeRequest, indices: list[int], progress=None
    ) -> dict[int, EncoderOutput]:
        """Clips of one request -> outputs. Key frames are grouped into the model's video tiles
        (`frames_per_tile`: 1, or Qwen3-Omni's temporal patch of 2); each tile is looked up in the
        cache by its frames' pixels, and the tiles not found go through the tile scheduler beside
        the images of every request."""
        groups = await asyncio.to_thread(lambda: {i: self._frame_groups(request.items[i]) for i in indices})
        tenant, version = request.ctx.tenant, self.versions["image"]
        keys = {i: [cache_key(tenant, digest, version, FRAME) for digest, _ in g] for i, g in groups.items()}
        cached: dict[int, dict[int, object]] = {i: {} for i in indices}
        if not request.bypass_cache:
            for i in indices:
                for n, key in enumerate(keys[i]):
                    if (hit := self.cache.get(key)) is not None:
                        cached[i][n] = hit
                self.pool_metrics.cache("video", "hit", len(cached[i]))
                self.pool_metrics.cache("video", "miss", len(keys[i]) - len(cached[i]))
        tiles = await asyncio.to_thread(
            lambda: {
                i: [self.vision.video_tile(frames) for n, (_, frames) in enumerate(g) if n not in cached[i]]
                for i, g in groups.items()
            }
        )
        features = await self._tiled(request, tiles, len(indices), progress)
        out: dict[int, EncoderOutput] = {}
        for i in indices:
            fresh = iter(features.get(i, []))
            merged = []
            for n, key in enumerate(keys[i]):
                if n in cached[i]:
                    merged.append(cached[i][n])
                else:
                    merged.append(feature := next(fresh))
                    self.cache.put(key, feature, _nbytes(feature))
            stamps = list(request.items[i].timestamps)
            out[i] = await asyncio.to_thread(self.vision.assemble_video, merged, stamps)
        return out

    def _frame_groups(self, item: stages_pb2.MediaItem) -> list[tuple[str, np.ndarray]]:
        """The clip's key frames in the model's tiles (the last padded with its last frame, as
        video processors pad a clip to whole temporal patches), each named by its pixels."""
        frames = tensors.materialize(item.data)
        per = self.vision.frames_per_tile
        if len(frames) % per:
            frames = np.concatenate([frames, np.repeat(frames[-1:], per - len(frames) % per, axis=0)])
        return [
            (hashlib.sha256(frames[at : at + per].tobytes()).hexdigest(), frames[at : at + per])
            for at in range(0, len(frames), per)
        ]

    async def _encode_audio(
        self, request: stages_pb2.EncodeRequest, item: stages_pb2.MediaItem
    ) -> EncoderOutput:
        """Audio clips are cached like images: a realtime session's earlier turns, and the chunks of
        a turn already encoded while it was spoken (speculative prefill), are not encoded again."""
        key = self._cache_key(item, request.ctx.tenant)
        out = None if request.bypass_cache else self.cache.get(key)
        self.pool_metrics.cache("audio", "miss" if out is None else "hit")
        if out is None:
            wave = tensors.materialize(item.data).view("float32")
            (out,) = await asyncio.to_thread(self.audio.encode, [wave])
            self.cache.put(key, out)
        return out

    def record_routing_stats(self) -> dict:
        """Read by the least_pending_tiles scorer in every caller's request router."""
        return {"pending_tiles": self.scheduler.pending}

    # ---- the stage call ---------------------------------------------------------------------

    async def Encode(self, request: stages_pb2.EncodeRequest) -> stages_pb2.EncodeResponse:
        with self.operation("encode", request.ctx, items=len(request.items)):
            return await self._encode(request, None)

    async def EncodeStream(self, request: stages_pb2.EncodeRequest) -> AsyncIterator[stages_pb2.EncodeEvent]:
        """Progress (at most one event per encoder batch) while the request's tiles are encoded;
        for a stream request, its items placed first (EncodeEvent.placed)."""
        with self.operation("encode_stream", request.ctx, items=len(request.items)):
            updates: asyncio.Queue = asyncio.Queue()
            task = asyncio.create_task(self._encode(request, updates.put_nowait, updates.put_nowait))
            try:
                while not task.done():
                    getter = asyncio.create_task(updates.get())
                    await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        continue
                    pending = [getter.result()]
                    while not updates.empty():
                        pending.append(updates.get_nowait())
                    for update in pending:
                        if isinstance(update, stages_pb2.EncodeResponse):
                            yield stages_pb2.EncodeEvent(placed=update)
                    progress = [u for u in pending if isinstance(u, common_pb2.Progress)]
                    if progress:  # only the newest of what piled up
                        yield stages_pb2.EncodeEvent(progress=progress[-1])
                yield stages_pb2.EncodeEvent(result=task.result())
            finally:
                task.cancel()

    async def Transcribe(
        self, request: stages_pb2.TranscribeRequest
    ) -> AsyncIterator[stages_pb2.TranscribedSegment]:
        """The profile's transcriber on one clip, each segment sent as soon as it is written. Where
        the transcriber is the audio encoder (a cascade's ASR) and has just encoded this clip (a
        realtime turn), its text is the transcript: one segment, not a second pass."""
        with self.operation("transcribe", request.ctx):
            model = await self._transcriber_model()
            item = request.audio
            seconds = float(item.audio_seconds)
            if model is self.audio and not request.prompt and not request.temperature:
                hit = self.cache.get(self._cache_key(item, request.ctx.tenant))
                if hit is not None and hit.text is not None:
                    language = request.language or model.languages[0]
                    if hit.text:
                        yield stages_pb2.TranscribedSegment(
                            start=0.0, end=seconds, text=hit.text, language=language
                        )
                    return
            wave = tensors.materialize(item.data).view("float32")
            segments = model.transcribe(wave, request.language, request.prompt, request.temperature)
            while (seg := await asyncio.to_thread(next, segments, None)) is not None:
                yield stages_pb2.TranscribedSegment(
                    start=seg.start,
                    end=seg.end,
                    text=seg.text,
                    avg_logprob=seg.avg_logprob,
                    no_speech_prob=seg.no_speech_prob,
                    compression_ratio=seg.compression_ratio,
                    temperature=seg.temperature,
                    language=seg.language,
                )

    async def _transcriber_model(self):
        spec = self.profile.models.transcriber_spec()
        if spec is None:
            raise ValueError(f"profile {self.profile.name!r} has no transcriber")
        if spec is self.profile.models.audio:
            return self.audio
        async with self._transcriber_lock:
            if self._transcriber is None:
                self._transcriber = await asyncio.to_thread(self.load_model, spec)
        return self._transcriber

    async def _follow_versions(self, required: dict[str, str]) -> None:
        """Reload a model the caller needs at another version, if that version is what is on disk
        now (the model was updated under this replica); otherwise fail clearly."""
        async with self._reload_lock:
            for modality, version in required.items():
                if self.versions.get(modality) == version:
                    continue
                on_disk = FeatureVersions.for_profile(self.profile, modality).encode()
                if on_disk != version:
                    raise FeatureVersionMismatch(on_disk, version)
                spec = self.profile.models.vision if modality == "image" else self.profile.models.audio
                model = await asyncio.to_thread(self.load_model, spec)
                if modality == "image":
                    self.vision = model
                else:
                    self.audio = model
                self.versions[modality] = on_disk

    async def _encode(
        self, request: stages_pb2.EncodeRequest, progress, placed=None
    ) -> stages_pb2.EncodeResponse:
        """The request's outputs. With `placed` (a stream request, on a replica with a feature
        pool), its items go to `placed` as soon as its images are placed — before they are encoded
        — and each image's features to the feature pool as soon as it is encoded."""
        if request.require_versions:
            await self._follow_versions(dict(request.require_versions))
        images, videos, audio = [], [], []
        for i, item in enumerate(request.items):
            if item.modality == "image" and self.vision is not None:
                images.append(i)
            elif item.modality == "video" and self.vision is not None:
                videos.append(i)
            elif item.modality == "audio" and self.audio is not None:
                audio.append(i)
            else:
                raise ValueError(f"this profile has no encoder for {item.modality!r}")
        stream = None
        if placed is not None and request.stream and images and self.features is not None:
            stream = FeatureStream(self.features, self.pool_metrics)
            self._serve_features()
        image_task = asyncio.ensure_future(self._encode_images(request, images, progress, stream))
        others = asyncio.ensure_future(
            asyncio.gather(
                self._encode_videos(request, videos, progress),
                *(self._encode_audio(request, request.items[i]) for i in audio),
            )
        )
        try:
            if stream is not None:
                ready = asyncio.ensure_future(stream.ready.wait())
                try:
                    await asyncio.wait({image_task, ready}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    ready.cancel()
                video_out, *audio_out = await others
                if stream.on:
                    rest = {**video_out, **dict(zip(audio, audio_out, strict=True))}
                    placed(self._response(request, rest, 0.0, stream))
            image_out = await image_task
            video_out, *audio_out = await others
        finally:
            image_task.cancel()
            others.cancel()
            (waited,) = self._waits.pop(request.ctx.request_id, [0.0])
        outputs = {**image_out, **video_out, **dict(zip(audio, audio_out, strict=True))}
        return self._response(request, outputs, waited, stream)

    def _response(
        self, request: stages_pb2.EncodeRequest, outputs: dict[int, EncoderOutput], waited: float, stream: FeatureStream | None
    ) -> stages_pb2.EncodeResponse:
        """The items' outputs; streamed images as their feature pool keys."""
        response = stages_pb2.EncodeResponse(queue_wait_s=waited)
        for i, item in enumerate(request.items):
            version = self.versions["image" if item.modality == "video" else item.modality]
            if stream is not None and stream.on and i in stream.keys:
                placement, shape = stream.placed[i]
                encoded = response.items.add(encoder_version=version, tiles=max(1, item.tiles.cols * item.tiles.rows))
                encoded.embeddings.CopyFrom(
                    common_pb2.TensorDescriptor(
                        shape=list(shape),
                        dtype=common_pb2.DTYPE_FLOAT32,
                        content_hash=item.data.content_hash,
                        producer_version=version,
                        feature_key=stream.keys[i],
                    )
                )
                encoded.placement.CopyFrom(_placement(placement))
                continue
            out = outputs[i]
            encoded = response.items.add(encoder_version=version, tiles=out.tiles, audio_seconds=out.audio_seconds)
            if out.embeddings is not None:
                encoded.embeddings.CopyFrom(
                    tensors.describe(
                        out.embeddings, content_hash=item.data.content_hash, producer_version=version
                    )
                )
                if out.placement is not None:
                    encoded.placement.CopyFrom(_placement(out.placement))
            else:
                encoded.text = out.text or ""
        return response

    def _serve_features(self) -> None:
        """Progress the feature pool for the thinkers reading it (from the first stream request)."""
        if self._feature_server is None or self._feature_server.done():
            self._feature_server = asyncio.create_task(self.features.serve())


def _placement(pl: Placement) -> stages_pb2.MediaPlacement:
    return stages_pb2.MediaPlacement(
        modality=pl.modality,
        placeholder_id=pl.placeholder,
        prefix_ids=pl.prefix,
        suffix_ids=pl.suffix,
        grid_thw=pl.grid_thw or (),
        feature_frames=pl.feature_frames,
        seconds_per_grid=pl.seconds_per_grid,
    )


def _nbytes(feature) -> int:
    """A tile feature's size for the cache: an array, or an adapter's object holding arrays."""
    if isinstance(feature, np.ndarray):
        return feature.nbytes
    return sum(v.nbytes for v in vars(feature).values() if isinstance(v, np.ndarray))


class _PoolMetrics:
    def __init__(self):
        self._tiles = metric("omniray_encoder_tiles_total")
        self._batch = metric("omniray_encoder_batch_tiles")
        self._pending = metric("omniray_encoder_pending_tiles")
        self._cache = metric("omniray_encoder_cache_requests_total")
        self._streamed = metric("omniray_encoder_streamed_items_total", outcome=("written", "refused"))
        self._pool_bytes = metric("omniray_encoder_feature_pool_bytes")
        self._pool_bytes.set(0)  # the series exists where nothing streams

    def batch(self, size: int, pending: int) -> None:
        self._batch.observe(size)
        self._pending.set(pending)

    def tiles(self, n: int) -> None:
        self._tiles.inc(n)

    def streamed(self, outcome: str, n: int, pool_bytes: int | None = None) -> None:
        self._streamed.inc(n, tags={"outcome": outcome})
        if pool_bytes is not None:
            self._pool_bytes.set(pool_bytes)

    def cache(self, modality: str, result: str, n: int = 1) -> None:
        if n:
            self._cache.inc(n, tags={"modality": modality, "result": result})
