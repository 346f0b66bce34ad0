"""Prefill and decode stages: the thinker's two halves, each its own Serve deployment and engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import numpy as np
from omni.v1 import common_pb2, stages_pb2
from ray import serve

from services.common.redis_config import UNAVAILABLE, async_client
from services.common.streams import coalesce
from services.dataplane import token_stream
from services.dataplane.token_stream import TokenStreamWriter
from services.engine.thinker import DecodeDelta, ThinkerEngine
from services.extensions.ray.metrics import metric
from services.extensions.ray.pool_replica import hold_registration
from services.extensions.vllm.media_rows import read_rows_async
from services.router.session_seats import SessionSeats
from services.stages._stage import Stage, StageMetrics

log = logging.getLogger("ray.serve")


class _Thinker(Stage):
    """What both halves share: an engine of this stage's role, and its counters for tests and ops."""

    def __init__(self, profile: dict):
        super().__init__(profile)
        self.engine = ThinkerEngine(self.profile, self.name)

    async def prompt_token_sources(self) -> dict[str, float]:
        """vLLM's count of prompt tokens by source; `external_kv_transfer` is KV loaded from the store."""
        return self.engine.prompt_token_sources()

    async def unfinished_requests(self) -> int:
        return self.engine.unfinished_requests()

    async def kv_store_totals(self) -> dict[str, float]:
        """The KV store's metrics as this replica has replayed them (also exported through Ray)."""
        return self.engine.kv_store_totals()

    def __del__(self):
        self.engine.shutdown()


@serve.deployment
class Prefill(_Thinker):
    name = "prefill"

    async def Prefill(self, request: stages_pb2.PrefillRequest) -> stages_pb2.PrefillResponse:
        with self.operation("prefill", request.ctx):
            n_tokens, kv_params = await self.engine.prefill(
                f"{request.ctx.request_id}-prefill", request.prompt, request.sampling, request.ctx
            )
            return stages_pb2.PrefillResponse(prompt_tokens=n_tokens, kv_transfer_params=kv_params)


@serve.deployment
class Decode(_Thinker):
    """Decode; deployed twice where the profile has a realtime decode pool (`pool`: its stage key),
    whose replicas register for the sessions pinned to them (services/router/session_seats.py)."""

    name = "decode"

    def __init__(self, profile: dict, pool: str = ""):
        super().__init__(profile)
        self.redis = async_client()  # token streams to token talkers
        # kept while a lost decode may still be resumed on it, and a while after
        self.token_stream_ttl_s = token_stream.TTL_S + self.profile.pipeline.thinker_gap_s()
        self.takeovers = metric("omniray_decode_stream_takeovers_total", outcome=token_stream.TAKEOVERS)
        if pool:  # seats for sessions while this replica runs; its latency apart from Decode's
            self.metrics = StageMetrics(pool)
            spec = self.profile.stages[pool].sessions
            seats = SessionSeats(self.redis, pool, spec.cap, spec.seat_ttl_s)
            self._registration = asyncio.get_running_loop().create_task(
                hold_registration(seats, spec.register_s)
            )

    async def Decode(self, request: stages_pb2.DecodeRequest) -> AsyncIterator[stages_pb2.DecodeChunk]:
        with self.operation("decode", request.ctx):
            deltas = self.engine.decode(
                f"{request.ctx.request_id}-decode",
                request.prompt,
                request.sampling,
                request.kv_transfer_params,
                request.ctx,
            )
            talker = (
                TokenStreamWriter(request.token_stream, self.redis, self.token_stream_ttl_s, request.attempt)
                if request.token_stream
                else None
            )
            # a resumed decode (the stream holds a lost one's part): the talker has the media rows
            resumed = talker is not None and await talker.take_over(_answered(request))
            if talker is not None and talker.takeover:
                self.takeovers.inc(tags={"outcome": talker.takeover})
                if talker.overlap:  # spoken as the lost decode wrote them; the text has this decode's
                    log.info(
                        "token stream %s: %d tokens held past the answer sent", talker.stream, talker.overlap
                    )
            # What the talker reads when this call ends: the end (the response answered), an
            # error, or nothing — an answer the engine gave up on (no finish), or a call its
            # reader cancelled (a stall the pipeline resumes on this stream; a response that ended
            # otherwise cancels its talk itself).
            last = "end"
            try:
                finished = False
                # Tokens that piled up while the previous chunk was in flight go out as one chunk.
                async for delta in coalesce(deltas, DecodeDelta.merge):
                    if talker is not None and delta.media_rows and not resumed:
                        await self._hand_media_rows(talker, delta.media_rows)
                    if talker is not None and delta.token_ids:
                        await talker.add(delta.token_ids)
                    finished = finished or bool(delta.finish_reason)
                    yield self._chunk(delta, self.engine.frame_s())
                if not finished:
                    last = None
            except (asyncio.CancelledError, GeneratorExit):  # Serve cancels with CancelledError
                last = "end" if finished else None  # cancelled after the answer's last chunk: whole
                raise
            except Exception:
                last = "error"
                raise
            finally:
                if talker is not None and last == "end":
                    await asyncio.shield(talker.end())
                elif talker is not None and last == "error":
                    await asyncio.shield(talker.fail("the thinker failed; ask again"))
                if talker is not None and talker.fenced:  # at take-over or at a later write
                    self.takeovers.inc(tags={"outcome": "fenced"})

    async def _hand_media_rows(self, talker: TokenStreamWriter, keys: tuple[str, ...]) -> None:
        """The thinker's rows at the prompt's media, in prompt order, ahead of the tokens (written
        by whichever engine computed them: this one, the prefill engine, or an earlier request's)."""
        try:
            found = await read_rows_async(self.redis, list(keys))
        except UNAVAILABLE:  # speech fails alone; the text answer goes on
            await talker.fail("the thinker's hidden states could not be read (store unavailable); ask again")
            return
        if any(rows is None for rows in found):
            missing = sum(rows is None for rows in found)
            await talker.fail(f"the thinker's hidden states for {missing} media item(s) are gone; ask again")
            return
        await talker.add_media_rows(np.concatenate(found))

    @staticmethod
    def _chunk(delta: DecodeDelta, frame_s: float) -> stages_pb2.DecodeChunk:
        return stages_pb2.DecodeChunk(
            token_ids=delta.token_ids,
            text=delta.text,
            finish_reason=delta.finish_reason or "",
            frame_ms=frame_s * 1000,
            usage=common_pb2.Usage(
                prompt_tokens=delta.prompt_tokens,
                completion_tokens=delta.completion_tokens,
                total_tokens=delta.prompt_tokens + delta.completion_tokens,
                cached_prompt_tokens=delta.cached_tokens,
            ),
        )


def _answered(request: stages_pb2.DecodeRequest) -> list[int]:
    """The answer's tokens the gateway has, which a resumed decode's prompt ends with."""
    n = request.answered_tokens
    return list(request.prompt.segments[-1].tokens.ids[-n:]) if n else []
