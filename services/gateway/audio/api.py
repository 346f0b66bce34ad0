"""OpenAI's audio endpoints: POST /v1/audio/speech and /v1/audio/transcriptions, and their gRPC
methods (omni.v1.Omni/Speech, /Transcribe), over the pipeline's text-to-speech and transcriber."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from omni.v1 import common_pb2, omni_pb2

from services.common import telemetry
from services.common.errors import internal_error
from services.gateway.audio import protocol
from services.gateway.audio.files import SpeechFile
from services.gateway.body import read_body, read_json
from services.gateway.observer import RequestObserver
from services.gateway.sse import reported
from services.models.profile import Profile
from services.pipeline.pipeline import Pipeline
from services.pipeline.prepared import Prepared
from services.pipeline.transcription import Transcription


class AudioAPI:
    def __init__(self, profile: Profile, pipeline: Pipeline, observer: RequestObserver):
        self.profile, self.pipeline, self.observer = profile, pipeline, observer

    # ---- speech ----------------------------------------------------------------------------

    async def speech(self, request: Request):
        arrival = time.perf_counter()
        async with self.observer.admitting("speech", "gateway.speech", request.headers) as (span, tenant):
            req, turn = protocol.speech_request(await read_json(request, self.profile.limits))
            prepared = await self.pipeline.speech.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)
        file = SpeechFile(req.response_format, req.speed)
        chunks = self._file_chunks("speech", prepared, file, arrival, span)
        headers = prepared.headers
        if req.stream_format == "sse":
            return StreamingResponse(_speech_sse(chunks), media_type="text/event-stream", headers=headers)
        # The status goes out with the first bytes: a failure before them is its own error (a 503
        # when a stage is gone), not a 200 with an empty file.
        first = await _first_bytes(chunks)
        return StreamingResponse(_file_bytes(first, chunks), media_type=file.content_type, headers=headers)

    async def grpc_speech(self, request, grpc_context) -> AsyncIterator[omni_pb2.SpeechChunk]:
        arrival = time.perf_counter()
        async with self.observer.grpc_admitting("grpc_speech", "gateway.speech", request, grpc_context) as (
            span,
            tenant,
            _,
        ):
            req, turn = protocol.grpc_speech_request(request)
            prepared = await self.pipeline.speech.prepare(turn, tenant)
            telemetry.inject(prepared.ctx)
        file = SpeechFile(req.response_format, req.speed)
        first = True
        async for data, usage in self._file_chunks("grpc_speech", prepared, file, arrival, span):
            yield omni_pb2.SpeechChunk(
                audio=data, content_type=file.content_type if first else "", usage=usage
            )
            first = False

    async def _file_chunks(self, api_name: str, p: Prepared, file: SpeechFile, arrival: float, span):
        """(bytes of the file, usage at the end) as the speech is made."""
        async for ev in self.observer.events(api_name, self.pipeline.speech.synthesize(p), arrival, span):
            if ev.pcm16 and (data := file.push(ev.pcm16)):
                yield data, None
            if ev.finish_reason:
                yield file.close(), ev.usage

    # ---- transcription ---------------------------------------------------------------------

    async def transcriptions(self, request: Request):
        arrival = time.perf_counter()
        limits = self.profile.limits
        async with self.observer.admitting("transcription", "gateway.transcription", request.headers) as (
            span,
            tenant,
        ):
            form, data = await protocol.read_form(await read_body(request, limits), request.headers, limits)
            turn = await asyncio.to_thread(protocol.transcription_turn, form, data, limits)
            t = await self.pipeline.transcription.prepare(turn, tenant, "transcription")
            telemetry.inject(t.ctx)
        segments = self._segments(t, arrival, span)
        if form.stream:
            lines = reported(_transcript_lines(segments, t), "transcription failed")
            return StreamingResponse(lines, media_type="text/event-stream", headers=t.lease.headers)
        collected = [s async for s in segments]
        body, media_type = protocol.transcript_body(form.response_format, collected, t.turn.audio.seconds)
        if isinstance(body, dict):
            return JSONResponse(body, headers=t.lease.headers)
        return Response(body, media_type=media_type, headers=t.lease.headers)

    async def grpc_transcribe(self, request, grpc_context) -> AsyncIterator[omni_pb2.TranscriptionChunk]:
        arrival = time.perf_counter()
        api_name = "grpc_transcription"
        async with self.observer.grpc_admitting(api_name, "gateway.transcription", request, grpc_context) as (
            span,
            tenant,
            _,
        ):
            turn = await asyncio.to_thread(protocol.grpc_transcription, request, self.profile.limits)
            t = await self.pipeline.transcription.prepare(turn, tenant, api_name)
            telemetry.inject(t.ctx)
        texts, language, duration = [], "", t.turn.audio.seconds
        async for segment in self._segments(t, arrival, span):
            texts.append(segment.text)
            language = segment.language
            yield omni_pb2.TranscriptionChunk(
                segment=omni_pb2.TranscriptSegment(
                    id=len(texts) - 1,
                    start=segment.start,
                    end=segment.end,
                    text=segment.text,
                    avg_logprob=segment.avg_logprob,
                    no_speech_prob=segment.no_speech_prob,
                    compression_ratio=segment.compression_ratio,
                    temperature=segment.temperature,
                ),
                language=language,
                duration=duration,
            )
        yield omni_pb2.TranscriptionChunk(
            text=" ".join(texts).strip(),
            language=language,
            duration=duration,
            usage=common_pb2.Usage(input_audio_seconds=duration),
        )

    def _segments(self, t: Transcription, arrival: float, span):
        """The transcriber's segments, measured; the request's span ends with them."""
        return self.observer.items(t.api, self.pipeline.transcription.transcribe(t), arrival, span)


async def _first_bytes(chunks) -> bytes:
    async for data, _ in chunks:
        if data:
            return data
    return b""


async def _file_bytes(first: bytes, chunks) -> AsyncIterator[bytes]:
    yield first
    try:
        async for data, _ in chunks:
            if data:
                yield data
    except Exception as e:
        # The status is gone: the body is cut off before its end (no last chunk), which the client
        # sees as a failed transfer, not a short file. Logged by id.
        internal_error(e, "speech failed")
        raise


async def _speech_sse(chunks) -> AsyncIterator[str]:
    async def lines() -> AsyncIterator[str]:
        async for data, usage in chunks:
            if data:
                yield protocol.speech_sse(data)
            if usage is not None:
                yield protocol.speech_sse(None, usage)

    async for line in reported(lines(), "speech failed"):
        yield line


async def _transcript_lines(segments, t: Transcription) -> AsyncIterator[str]:
    texts = []
    async for segment in segments:
        texts.append(segment.text)
        yield protocol.transcript_sse(segment)
    yield protocol.transcript_sse(None, " ".join(texts).strip(), t.turn.audio.seconds)
