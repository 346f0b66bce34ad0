"""OpenAI's audio endpoints on the wire: POST /v1/audio/speech (JSON in; the file, or SSE) and
POST /v1/audio/transcriptions (multipart form in; json, text, verbose_json, srt, vtt, or SSE), parsed
into the pipeline's SpeechTurn / TranscriptionTurn; and the gRPC methods' messages."""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

from omni.v1 import omni_pb2, stages_pb2
from pydantic import Field
from starlette.datastructures import Headers, UploadFile

from services.common.errors import bad_request
from services.gateway.audio.files import SPEED_RANGE
from services.gateway.protocol import MAX_NAME_CHARS, Loose, Name, parse_form, validated
from services.models.profile import LimitsSpec
from services.pipeline import media
from services.pipeline.checks import MAX_SPEECH_CHARS, MAX_TRANSCRIPTION_PROMPT_CHARS
from services.pipeline.turn import SpeechTurn, TranscriptionTurn

TRANSCRIPT_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")


class SpeechBody(Loose):
    model: Name
    input: str = Field(max_length=MAX_SPEECH_CHARS)
    voice: Name = ""
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=SPEED_RANGE[0], le=SPEED_RANGE[1], allow_inf_nan=False)
    instructions: str = Field(default="", max_length=MAX_SPEECH_CHARS)
    stream_format: Literal["audio", "sse"] = "audio"


def speech_request(body: Any) -> tuple[SpeechBody, SpeechTurn]:
    req = validated(SpeechBody, body)
    return req, SpeechTurn(req.model, req.input, req.voice or None, req.instructions)


def grpc_speech_request(request: omni_pb2.SpeechRequest) -> tuple[SpeechBody, SpeechTurn]:
    body = {
        "model": request.model,
        "input": request.input,
        "voice": request.voice,
        "response_format": request.response_format or "mp3",
        "speed": request.speed or 1.0,
        "instructions": request.instructions,
    }
    return speech_request(body)


def speech_sse(delta: bytes | None, usage=None) -> str:
    """OpenAI's speech stream events: speech.audio.delta (base64 audio), speech.audio.done (usage)."""
    if delta is not None:
        event = {"type": "speech.audio.delta", "audio": base64.b64encode(delta).decode()}
    else:
        event = {
            "type": "speech.audio.done",
            "usage": {
                "input_tokens": usage.prompt_tokens,
                "output_tokens": 0,
                "total_tokens": usage.prompt_tokens,
            },
        }
    return f"data: {json.dumps(event)}\n\n"


# ---- transcriptions ---------------------------------------------------------------------------


class TranscriptionBody(Loose):
    model: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    response_format: Literal["json", "text", "srt", "verbose_json", "vtt"] = "json"
    stream: bool = False
    language: str = Field(default="", max_length=16)
    prompt: str = Field(default="", max_length=MAX_TRANSCRIPTION_PROMPT_CHARS)
    temperature: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    timestamp_granularities: list[Literal["segment", "word"]] = Field(default_factory=list, max_length=2)


async def read_form(body: bytes, headers: Headers, limits: LimitsSpec) -> tuple[TranscriptionBody, bytes]:
    """The transcription form: its audio and its fields."""
    if not headers.get("content-type", "").startswith("multipart/form-data"):
        raise bad_request(
            "send the audio as multipart/form-data with a 'file' field", code="invalid_content_type"
        )
    # fields: at most the UTF-8 of a whole prompt
    form = await parse_form(body, headers, max_files=1, max_part_size=4 * MAX_TRANSCRIPTION_PROMPT_CHARS)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise bad_request("the form has no audio 'file'", param="file")
    data = await upload.read()
    await form.close()
    fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
    body_fields: dict[str, Any] = {
        "model": fields.get("model", ""),
        "response_format": fields.get("response_format", "json"),
        "stream": fields.get("stream", "false"),
        "language": fields.get("language", ""),
        "prompt": fields.get("prompt", ""),
        "temperature": fields.get("temperature", "0"),
        "timestamp_granularities": [v for k, v in form.multi_items() if k == "timestamp_granularities[]"],
    }
    for unsupported in ("include[]", "chunking_strategy", "known_speaker_names[]"):
        if unsupported in fields and fields[unsupported] not in ("auto",):
            raise bad_request(
                f"{unsupported.rstrip('[]')} is not supported by this server",
                code="unsupported_parameter",
                param=unsupported.rstrip("[]"),
            )
    return validated(TranscriptionBody, body_fields), data


def transcription_turn(form: TranscriptionBody, data: bytes, limits: LimitsSpec) -> TranscriptionTurn:
    """Checks what the model cannot honour, then the audio (decoded here when compressed: call from
    a thread)."""
    if "word" in form.timestamp_granularities:
        raise bad_request(
            "word timestamps are not supported; use timestamp_granularities ['segment']",
            code="unsupported_parameter",
            param="timestamp_granularities",
        )
    if form.timestamp_granularities and form.response_format != "verbose_json":
        raise bad_request(
            "timestamp_granularities needs response_format 'verbose_json'", param="timestamp_granularities"
        )
    if form.stream and form.response_format not in ("json", "text"):
        raise bad_request(
            "stream=true returns text events: use response_format 'json' or 'text'", param="stream"
        )
    clip = media.audio_file(data, limits, param="file")
    return TranscriptionTurn(form.model, clip, form.language, form.prompt, form.temperature)


def grpc_transcription(request: omni_pb2.TranscriptionRequest, limits: LimitsSpec) -> TranscriptionTurn:
    form = validated(
        TranscriptionBody,
        {"model": request.model, "language": request.language, "prompt": request.prompt,
         "temperature": request.temperature},
    )  # fmt: skip
    return transcription_turn(form, request.file, limits)


def _clock(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def transcript_body(
    fmt: str, segments: list[stages_pb2.TranscribedSegment], duration: float
) -> tuple[str | dict, str]:
    """The whole transcript in `fmt` -> (body, media type)."""
    text = " ".join(s.text for s in segments).strip()
    usage = {"type": "duration", "seconds": round(duration, 3)}
    if fmt == "json":
        return {"text": text, "usage": usage}, "application/json"
    if fmt == "text":
        return text + "\n", "text/plain"
    if fmt == "verbose_json":
        return {
            "task": "transcribe",
            "language": segments[0].language if segments else "",
            "duration": round(duration, 3),
            "text": text,
            "segments": [
                {
                    "id": i,
                    "seek": 0,
                    "start": round(s.start, 3),
                    "end": round(s.end, 3),
                    "text": s.text,
                    "tokens": [],
                    "temperature": s.temperature,
                    "avg_logprob": s.avg_logprob,
                    "compression_ratio": s.compression_ratio,
                    "no_speech_prob": s.no_speech_prob,
                }
                for i, s in enumerate(segments)
            ],
            "usage": usage,
        }, "application/json"
    if fmt == "srt":
        cues = [
            f"{i + 1}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text}\n"
            for i, s in enumerate(segments)
        ]
        return "\n".join(cues), "application/x-subrip"
    cues = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(cues), "text/vtt"


def transcript_sse(
    segment: stages_pb2.TranscribedSegment | None, text: str = "", duration: float = 0.0
) -> str:
    """OpenAI's transcription stream events: transcript.text.delta per segment, then .done."""
    if segment is not None:
        event: dict = {
            "type": "transcript.text.delta",
            "delta": (" " if segment.start > 0 else "") + segment.text,
        }
    else:
        event = {
            "type": "transcript.text.done",
            "text": text,
            "usage": {"type": "duration", "seconds": round(duration, 3)},
        }
    return f"data: {json.dumps(event)}\n\n"
