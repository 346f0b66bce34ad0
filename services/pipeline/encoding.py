"""The encoder pool as a response uses it: each media item's features at this deployment's model
versions, encoded once (kept on the item for a realtime session's later turns), re-encoded once when
an encoder replica answers with other versions (a rollout)."""

from __future__ import annotations

import asyncio

from omni.v1 import common_pb2, stages_pb2

from services.common.errors import OmniError
from services.dataplane import tensors
from services.extensions.ray.metrics import metric
from services.models.profile import Profile
from services.models.versions import FeatureVersionMismatch, FeatureVersions
from services.pipeline.stage_calls import StageHandles, stage_calls
from services.pipeline.stage_deadlines import StageDeadlines
from services.pipeline.turn import AudioClip, ImageInput
from services.router.tiles import TILE_POLICY_VERSION, TileGrid


class MediaEncoding:
    def __init__(self, profile: Profile, handles: StageHandles, deadlines: StageDeadlines):
        self.h, self.deadlines = handles, deadlines
        self.feature_versions = {
            m: FeatureVersions.for_profile(profile, m).encode() for m in ("image", "audio")
        }
        self.version_mismatches = metric(
            "omniray_encoder_feature_version_mismatch_total", modality=tuple(self.feature_versions)
        )

    def _version(self, item: AudioClip | ImageInput) -> str:
        return self.feature_versions["image" if isinstance(item, ImageInput) else "audio"]

    @staticmethod
    def _media_item(item: AudioClip | ImageInput, grid: TileGrid | None) -> stages_pb2.MediaItem:
        """The stage contract's item: decoded samples (at the encoders' rate) or pixels."""
        if isinstance(item, AudioClip):
            return stages_pb2.MediaItem(
                modality="audio",
                data=tensors.describe(item.for_encoder(), content_hash=item.content_hash),
                audio_seconds=item.seconds,
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
        items: list[AudioClip | ImageInput],
        grids: list[TileGrid | None],
        progress=None,
    ) -> list[stages_pb2.EncodedItem]:
        """Each item's encoder output at this deployment's versions: kept on the item from an earlier
        request, or encoded now (new items only; their outputs are then kept on them). A mismatch (an
        encoder replica still on the previous version during a rollout) is counted and re-encoded
        once. With `progress`, the encoder streams progress events to it while it works."""
        new = [i for i, item in enumerate(items) if self._version(item) not in item.encoded]
        if new:
            request = await asyncio.to_thread(
                lambda: stages_pb2.EncodeRequest(
                    ctx=ctx, items=[self._media_item(items[i], grids[i]) for i in new]
                )
            )
            encoded = await self._encode_items(request, progress)
            stale = self._stale(request.items, encoded)
            if stale:
                for modality in stale:
                    self.version_mismatches.inc(tags={"modality": modality})
                request.bypass_cache = True
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
            for i, out in zip(new, encoded, strict=True):
                if items[i].keep:
                    out = await _owned(out, items[i])
                items[i].encoded[out.encoder_version] = out
        return [item.encoded[self._version(item)] for item in items]

    async def _encode_items(self, request: stages_pb2.EncodeRequest, progress=None) -> list:
        with stage_calls():
            if progress is None:
                reply = await self.deadlines.reply("encoder", self.h.encoder.Encode.remote(request))
                return list(reply.items)
            encoded: list = []
            events = self.h.encoder.options(stream=True).EncodeStream.remote(request)
            async for event in self.deadlines.stream("encoder", events):
                if event.HasField("progress"):
                    await progress(event.progress)
                else:
                    encoded = list(event.result.items)
            return encoded

    def _stale(self, items, encoded: list[stages_pb2.EncodedItem]) -> list[str]:
        return [
            item.modality
            for item, out in zip(items, encoded, strict=True)
            if out.encoder_version != self.feature_versions[item.modality]
        ]


async def _owned(out: stages_pb2.EncodedItem, item: AudioClip | ImageInput) -> stages_pb2.EncodedItem:
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
