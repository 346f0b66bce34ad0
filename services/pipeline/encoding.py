"""The encoder pool as a response uses it: each media item's features at this deployment's model
versions, encoded once (kept on the item for a realtime session's later turns), re-encoded once when
an encoder replica answers with other versions (a rollout). Video clips go through the video
pre-stage first (key frames, and the audio track where asked), once per clip."""

from __future__ import annotations

import asyncio

import numpy as np
from omni.v1 import common_pb2, stages_pb2

from services.common.errors import OmniError, bad_request
from services.dataplane import tensors
from services.extensions.ray.metrics import metric
from services.models.profile import Profile
from services.models.versions import FeatureVersionMismatch, FeatureVersions
from services.pipeline.stage_calls import StageHandles, stage_calls
from services.pipeline.stage_deadlines import StageDeadlines
from services.pipeline.turn import AudioClip, Media, VideoInput
from services.router.encoder_load import EncoderLoad
from services.router.tiles import TILE_POLICY_VERSION, TileGrid


class MediaEncoding:
    def __init__(self, profile: Profile, handles: StageHandles, deadlines: StageDeadlines):
        self.h, self.deadlines = handles, deadlines
        self.video, self.limits = profile.video, profile.limits
        self.load = EncoderLoad(profile.tiling.overload_wait_s, profile.tiling.overload_max_tiles)
        self.stream = profile.encoder_pool.stream_mib > 0
        self.queue_wait = metric("omniray_router_encoder_queue_wait_seconds")
        self.feature_versions = {
            m: FeatureVersions.for_profile(profile, m).encode() for m in ("image", "audio")
        }
        self.version_mismatches = metric(
            "omniray_encoder_feature_version_mismatch_total", modality=tuple(self.feature_versions)
        )

    def _version(self, item: Media) -> str:
        return self.feature_versions["audio" if isinstance(item, AudioClip) else "image"]

    @staticmethod
    def _media_item(item: Media, grid: TileGrid | None) -> stages_pb2.MediaItem:
        """The stage contract's item: decoded samples (at the encoders' rate), pixels, or a clip's
        key frames."""
        if isinstance(item, AudioClip):
            return stages_pb2.MediaItem(
                modality="audio",
                data=tensors.describe(item.for_encoder(), content_hash=item.content_hash),
                audio_seconds=item.seconds,
            )
        if isinstance(item, VideoInput):
            return stages_pb2.MediaItem(
                modality="video",
                data=tensors.describe(item.key_frames, content_hash=item.content_hash),
                timestamps=item.timestamps,
            )
        return stages_pb2.MediaItem(
            modality="image",
            detail=item.detail,
            tiles=stages_pb2.TileGrid(
                cols=grid.cols, rows=grid.rows, tile_px=grid.tile_px, policy_version=TILE_POLICY_VERSION
            ),
            data=tensors.describe(item.pixels(), content_hash=item.content_hash),
        )

    async def encode(
        self,
        ctx: common_pb2.RequestContext,
        items: list[Media],
        grids: list[TileGrid | None],
        progress=None,
        stream_to=None,
    ) -> list[stages_pb2.EncodedItem]:
        """Each item's encoder output at this deployment's versions: kept on the item from an earlier
        request, or encoded now (new items only; their outputs are then kept on them). A mismatch (an
        encoder replica still on the previous version during a rollout) is counted and re-encoded
        once. With `progress`, the encoder streams progress events to it while it works.

        With `stream_to`, on a profile that streams features (encoder_pool.stream_mib), images are
        returned as soon as the encoder has placed them — their features go to the thinker over
        NIXL as each is encoded — and the rest of the encoding is handed to `stream_to` as a task
        (never for items kept on a realtime session: their features must outlive the pool's)."""
        new = [i for i, item in enumerate(items) if self._version(item) not in item.encoded]
        clips = [items[i] for i in new if isinstance(items[i], VideoInput) and not items[i].sampled_yet]
        if clips:
            await asyncio.gather(*(self._sample(ctx, clip) for clip in clips))
        if new:
            request = await asyncio.to_thread(
                lambda: stages_pb2.EncodeRequest(
                    ctx=ctx, items=[self._media_item(items[i], grids[i]) for i in new]
                )
            )
            request.stream = (
                stream_to is not None
                and self.stream
                and any(item.modality == "image" for item in request.items)
                and not any(items[i].keep for i in new)
            )
            rest: list[asyncio.Task] = []
            encoded = await self._encode_items(request, progress, rest.append)
            stale = self._stale(request.items, encoded)
            if stale:
                for task in rest:
                    task.cancel()
                rest.clear()
                for modality in stale:
                    self.version_mismatches.inc(tags={"modality": modality})
                request.bypass_cache, request.stream = True, False
                request.require_versions.update({m: self.feature_versions[m] for m in stale})
                try:
                    encoded = await self._encode_items(request)
                except Exception as e:  # the replica cannot serve the version (raised in another process)
                    if FeatureVersionMismatch.CODE not in str(e):
                        raise
                    encoded = None
                if encoded is None or self._stale(request.items, encoded):
                    raise OmniError(
                        503,
                        "encoder replicas serve other model versions than this gateway; retry shortly",
                        code=FeatureVersionMismatch.CODE,
                    )
            if rest:
                stream_to(rest[0])
            for i, out in zip(new, encoded, strict=True):
                if items[i].keep:
                    out = await _owned(out, items[i])
                items[i].encoded[out.encoder_version] = out
        return [item.encoded[self._version(item)] for item in items]

    async def _sample(self, ctx: common_pb2.RequestContext, clip: VideoInput) -> None:
        """The video pre-stage's key frames (and audio track) for one clip, kept on the clip."""
        v = self.video
        request = stages_pb2.VideoRequest(
            ctx=ctx,
            clip=tensors.describe(np.frombuffer(clip.data, np.uint8), content_hash=clip.content_hash),
            fps=v.fps,
            max_frames=v.max_frames,
            keyframe_threshold=v.keyframe_threshold,
            frame_px=v.frame_px,
            frame_multiple=v.frame_multiple,
            with_audio=clip.track is not None,
            seconds=clip.seconds,
            max_frame_pixels=clip.width * clip.height,
        )
        with stage_calls():
            reply = await self.deadlines.reply("video", self.h.video.Sample.remote(request))
        if reply.refusal_code:
            raise bad_request(reply.refusal, code=reply.refusal_code, param="messages")
        frames = await tensors.materialized(reply.frames)
        track = await tensors.materialized(reply.audio) if reply.HasField("audio") else None
        clip.sampled_by(frames, list(reply.timestamps), reply.sampled, track)

    async def _encode_items(self, request: stages_pb2.EncodeRequest, progress=None, rest=None) -> list:
        """The encoder's outputs; for a stream request, its placed items, the rest of the stream
        handed to `rest` as a task."""
        with stage_calls():
            if progress is None and not request.stream:
                reply = await self.deadlines.reply("encoder", self.h.encoder.Encode.remote(request))
            else:
                reply = stages_pb2.EncodeResponse()  # a stream that ends without its result: no items
                events = self.h.encoder.options(stream=True).EncodeStream.remote(request)
                stream = self.deadlines.stream("encoder", events)
                async for event in stream:
                    if event.HasField("progress"):
                        if progress is not None:
                            await progress(event.progress)
                    elif event.HasField("placed"):
                        rest(asyncio.create_task(self._rest(stream, progress)))
                        return list(event.placed.items)
                    else:
                        reply = event.result
        self._observe(reply)
        return list(reply.items)

    async def _rest(self, stream, progress) -> None:
        """A stream request's events after its items were placed: progress, then the result (every
        image written to the feature pool). Fails when the encoding does."""
        with stage_calls():
            async for event in stream:
                if event.HasField("progress") and progress is not None:
                    await progress(event.progress)
                elif event.HasField("result"):
                    self._observe(event.result)

    def _observe(self, reply: stages_pb2.EncodeResponse) -> None:
        self.load.observe(reply.queue_wait_s)
        self.queue_wait.set(self.load.wait_s)

    def _stale(self, items, encoded: list[stages_pb2.EncodedItem]) -> list[str]:
        """The modalities (of the feature versions: a clip's frames are images) answered stale."""
        modalities = ("audio" if item.modality == "audio" else "image" for item in items)
        return [
            modality
            for modality, out in zip(modalities, encoded, strict=True)
            if out.encoder_version != self.feature_versions[modality]
        ]


async def _owned(out: stages_pb2.EncodedItem, item: Media) -> stages_pb2.EncodedItem:
    """An encoder output this process can keep using: features left in the object store by the
    encoder replica (pinned there only for a while) are taken into an object this process owns,
    pinned for as long as the item that holds them lives (a realtime session's turn)."""
    if out.WhichOneof("output") != "embeddings" or out.embeddings.WhichOneof("location") != "object_ref":
        return out
    kept = tensors.Kept(await tensors.materialized(out.embeddings), out.embeddings)
    item.keepalive.append(kept)
    owned = stages_pb2.EncodedItem()
    owned.CopyFrom(out)
    owned.embeddings.CopyFrom(kept.descriptor)
    return owned
