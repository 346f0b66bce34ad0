"""The thinker as a response uses it: prefill (when the prompt is long enough to pay for the
hand-off) then decode, streamed; a decode lost mid-response goes on from the tokens already sent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from omni.v1 import common_pb2, stages_pb2

from services.extensions.ray.metrics import metric
from services.extensions.ray.stage_handle import StageHandle
from services.models.profile import Profile
from services.pipeline.stage_calls import STAGE_GONE, DecodeDropped, StageHandles, stage_calls
from services.pipeline.stage_deadlines import StageDeadlines, StageStalled

log = logging.getLogger("ray.serve")

RESUME_CAUSES = ("replica_lost", "replica_stalled", "engine_dropped")


def _cause(lost: Exception) -> str:
    """Why a decode was lost (RESUME_CAUSES)."""
    if isinstance(lost, DecodeDropped):
        return "engine_dropped"
    return "replica_stalled" if isinstance(lost, StageStalled) else "replica_lost"


def _continued(request: stages_pb2.DecodeRequest, sent: list[int], attempt: int) -> stages_pb2.DecodeRequest:
    """The request again as its `attempt`-th resumed decode, its prompt followed by the tokens
    already sent, for what is left of max_tokens; decode computes the prompt itself (the prefill
    replica's hand-off was for the lost one)."""
    continued = stages_pb2.DecodeRequest()
    continued.CopyFrom(request)
    continued.kv_transfer_params = ""
    continued.attempt = attempt
    if sent:
        continued.prompt.segments.add(tokens=stages_pb2.TokenSpan(ids=sent))
        continued.sampling.max_tokens = request.sampling.max_tokens - len(sent)
        continued.answered_tokens = len(sent)
    return continued


class Thinking:
    def __init__(self, profile: Profile, handles: StageHandles, deadlines: StageDeadlines):
        self.profile, self.h, self.deadlines = profile, handles, deadlines
        self.decode_resumes = metric(
            "omniray_gateway_decode_resumes_total", outcome=("resumed", "failed"), cause=RESUME_CAUSES
        )
        self.resume_seconds = metric("omniray_gateway_decode_resume_seconds")

    async def think(
        self,
        ctx: common_pb2.RequestContext,
        prompt: stages_pb2.Prompt,
        tokens: int,
        sampling: common_pb2.SamplingParams,
        token_stream: str = "",
        *,
        realtime: bool = False,
    ) -> AsyncIterator[stages_pb2.DecodeChunk]:
        """The thinker: prefill (for prompts long enough to pay for the hand-off) then decode,
        streamed. Turns of one session go to the replicas that served it before (session_affinity);
        a realtime session's, where the profile has a realtime decode pool, decode on the pool's
        replica of the session's seat (pinned: services/router/session_seats.py).
        With `token_stream`, decode also writes the tokens there for a token talker."""
        kv_params = ""
        session = {"session_id": ctx.session_id} if ctx.session_id else {}
        with stage_calls():
            if (
                self.profile.engine.kv_transfer != "none"
                and tokens >= self.profile.engine.disagg_min_prompt_tokens
            ):
                pre = await self.deadlines.reply(
                    "prefill",
                    self.h.prefill.options(**session).Prefill.remote(
                        stages_pb2.PrefillRequest(ctx=ctx, prompt=prompt, sampling=sampling)
                    ),
                )
                kv_params = pre.kv_transfer_params
            request = stages_pb2.DecodeRequest(
                ctx=ctx,
                prompt=prompt,
                sampling=sampling,
                kv_transfer_params=kv_params,
                token_stream=token_stream,
            )
            pool = (
                self.h.realtime_decode if realtime and self.h.realtime_decode is not None else self.h.decode
            )
            async for chunk in self._decode(pool, request, session):
                yield chunk

    async def _decode(
        self, pool: StageHandle, request: stages_pb2.DecodeRequest, session: dict
    ) -> AsyncIterator[stages_pb2.DecodeChunk]:
        """Decode, streamed. When the replica serving it dies mid-response, stalls past its deadline
        (StageStalled), or its engine drops the request (DecodeDropped), the response goes on on
        another (or the replaced, or the same) replica from the tokens already sent: the prompt and
        those tokens are computed again (prefix caching and the KV store hold the prompt's pages)
        and generation continues for what is left of max_tokens — one visible hiccup, counted, and
        bounded by `pipeline.decode_resume.wait_s`. Not for answers under a grammar (structured
        output would restart its state mid-answer): those fail as before."""
        resume = self.profile.pipeline.decode_resume
        original, sent, resent = request, [], 0
        lost_at: float | None = None  # when the decode was lost (None: serving)
        cause = ""  # why: replica_lost, engine_dropped
        while True:
            try:
                finished = False
                chunks = pool.options(stream=True, **session).Decode.remote(request)
                async for chunk in self.deadlines.stream("decode", chunks):
                    if lost_at is not None and (chunk.token_ids or chunk.finish_reason):
                        self.decode_resumes.inc(tags={"outcome": "resumed", "cause": cause})
                        self.resume_seconds.observe(time.monotonic() - lost_at)
                        lost_at = None
                    sent.extend(chunk.token_ids)
                    if resent and chunk.usage.total_tokens:
                        # the engine counted the resent tokens as prompt: they were generated
                        chunk.usage.prompt_tokens -= resent
                        chunk.usage.completion_tokens += resent
                    finished = bool(chunk.finish_reason)
                    yield chunk
                if not finished:
                    raise DecodeDropped()
                return
            except (*STAGE_GONE, DecodeDropped) as e:
                if finished:  # lost after the answer's last chunk: nothing to resume
                    return
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    cause = _cause(e)
                left = original.sampling.max_tokens - len(sent)
                grammar = original.sampling.json_schema or original.sampling.json_object
                if not resume.enabled or grammar or left <= 0 or now - lost_at > resume.wait_s:
                    if resume.enabled and not grammar:
                        self.decode_resumes.inc(tags={"outcome": "failed", "cause": cause})
                    raise
                log.warning(
                    "decode lost mid-response (%s, %s): resuming after %d tokens",
                    original.ctx.request_id,
                    cause,
                    len(sent),
                )
                request, resent = _continued(original, sent, request.attempt + 1), len(sent)
                await asyncio.sleep(resume.retry_s)
