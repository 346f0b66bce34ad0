"""One typed turn: what every transport (REST, gRPC, the realtime session) builds once and the
pipeline takes. No wire format gets past a transport: media are typed clips and images whose
headers were checked when the transport built them and which decode (at most once) after the quota
admitted the request; a realtime session keeps its items, so their decoded samples, content hashes
and encoder outputs are computed once however many responses they appear in.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from math import gcd
from typing import Literal

import numpy as np
from omni.v1 import stages_pb2
from scipy.signal import resample_poly

from services.models.base import ENCODER_RATE
from services.pipeline.tools import ToolCall, Tools

Role = Literal["system", "user", "assistant", "tool"]


class _Once:
    """What a media item computes lazily, once (items are shared by the requests of a session)."""

    def __init__(self, keep: bool = False):
        self._lock = threading.Lock()
        # encoder version -> what the encoder made of this item
        self.encoded: dict[str, stages_pb2.EncodedItem] = {}
        # `keep`: the item outlives its request (a realtime session's turn): its encoder outputs are
        # held in objects this process owns, alive as long as the item (`keepalive`).
        self.keep = keep
        self.keepalive: list = []


class AudioClip(_Once):
    """Mono audio. Built from samples (realtime: decoded PCM) or from an encoded payload whose header
    was checked (`services.pipeline.media.audio_clip`): `frames` and `rate` are known either way, the
    samples only once `samples()` decoded them."""

    def __init__(
        self,
        *,
        rate: int,
        frames: int,
        samples: np.ndarray | None = None,
        decode=None,
        content_hash: str = "",
        decoded_bytes: int = 0,
        keep: bool = False,
    ):
        super().__init__(keep)
        self.rate, self.frames = rate, frames
        self._samples, self._decode, self._hash = samples, decode, content_hash
        self._at_encoder_rate: np.ndarray | None = None
        self.decoded_bytes = decoded_bytes or frames * 4

    @classmethod
    def from_pcm16(cls, pcm: bytes, rate: int, *, keep: bool = False) -> AudioClip:
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        return cls(rate=rate, frames=len(samples), samples=samples, keep=keep)

    @classmethod
    def joined(cls, clips: list[AudioClip]) -> AudioClip:
        """Consecutive pieces of one stream at one rate (a realtime turn's chunks) as one clip,
        resampled once for the encoder (chunks resampled one by one have edges at every cut)."""
        samples = np.concatenate([c.samples() for c in clips])
        return cls(rate=clips[0].rate, frames=len(samples), samples=samples)

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    @property
    def decoded(self) -> bool:
        return self._samples is not None

    def samples(self) -> np.ndarray:
        """float32 mono at `rate` (decoded on first use)."""
        with self._lock:
            if self._samples is None:
                self._samples, self._decode = self._decode(), None
            return self._samples

    def for_encoder(self) -> np.ndarray:
        """float32 mono at ENCODER_RATE (resampled once)."""
        samples = self.samples()
        with self._lock:
            if self._at_encoder_rate is None:
                if self.rate == ENCODER_RATE:
                    out = samples
                else:
                    g = gcd(self.rate, ENCODER_RATE)
                    out = resample_poly(samples, ENCODER_RATE // g, self.rate // g)
                self._at_encoder_rate = np.ascontiguousarray(out, dtype=np.float32)
            return self._at_encoder_rate

    @property
    def content_hash(self) -> str:
        """Names the audio for the feature cache (of what the encoder is given)."""
        if not self._hash:
            self._hash = hashlib.sha256(self.for_encoder().tobytes()).hexdigest()
        return self._hash


class ImageInput(_Once):
    """An image whose header was checked (format, size, frames); its pixels are decoded on use."""

    def __init__(self, *, width: int, height: int, detail: str, content_hash: str, decode):
        super().__init__()
        self.width, self.height, self.detail, self.content_hash = width, height, detail, content_hash
        self._decode = decode
        self._pixels: np.ndarray | None = None

    @property
    def decoded_bytes(self) -> int:
        return self.width * self.height * 3  # RGB

    def pixels(self) -> np.ndarray:
        """uint8 RGB [height, width, 3]."""
        with self._lock:
            if self._pixels is None:
                self._pixels, self._decode = self._decode(), None
            return self._pixels


class VideoInput(_Once):
    """A video clip whose container was checked from its headers (services/pipeline/video_input.py):
    size, length and frame count are known; its key frames come from the video pre-stage after
    admission (`frames`, `timestamps`, set once). With its audio track asked for, `track` is the
    track as an audio clip, its samples filled in by the same pre-stage call."""

    def __init__(
        self, *, data: bytes, width: int, height: int, seconds: float, frames: int, track_seconds: float = 0.0
    ):
        super().__init__()
        self.data, self.width, self.height, self.seconds, self.frames = data, width, height, seconds, frames
        self.content_hash = hashlib.sha256(data).hexdigest()
        self.key_frames: np.ndarray | None = None  # uint8 [n, h, w, 3]
        self.timestamps: list[float] = []
        self.sampled = 0  # frames sampled before near-duplicates were dropped
        self._track: np.ndarray | None = None
        self.track = (
            AudioClip(rate=ENCODER_RATE, frames=int(track_seconds * ENCODER_RATE), decode=self._track_samples)
            if track_seconds > 0
            else None
        )

    def sampled_by(self, frames: np.ndarray, timestamps: list[float], sampled: int, track: np.ndarray | None):
        """The pre-stage's answer for this clip."""
        with self._lock:
            self.key_frames, self.timestamps, self.sampled = frames, timestamps, sampled
            self._track = track if track is not None else np.zeros(0, np.float32)

    @property
    def sampled_yet(self) -> bool:
        return self.key_frames is not None

    def _track_samples(self) -> np.ndarray:
        if self._track is None:
            raise RuntimeError("the clip's audio track is read after the video pre-stage ran")
        return self._track


@dataclass(frozen=True)
class DocumentInput:
    """A PDF as its pages: images that render on first use (services/pipeline/documents.py)."""

    pages: tuple[ImageInput, ...]


Part = str | AudioClip | ImageInput | VideoInput | DocumentInput
Media = AudioClip | ImageInput | VideoInput


def media_of(part: Part) -> list[Media]:
    """What the encoders see of a part, in prompt order: a document's pages, a clip then its audio
    track (where asked for)."""
    if isinstance(part, str):
        return []
    if isinstance(part, DocumentInput):
        return list(part.pages)
    if isinstance(part, VideoInput) and part.track is not None:
        return [part, part.track]
    return [part]


@dataclass(frozen=True)
class Message:
    role: Role
    parts: tuple[Part, ...]
    tool_calls: tuple[ToolCall, ...] = ()  # assistant: the calls it made
    tool_call_id: str = ""  # tool: the call this is the result of

    def media(self) -> list[Media]:
        return [m for p in self.parts for m in media_of(p)]


SEED_BOUND = 2**63  # seeds are int64: -SEED_BOUND <= seed < SEED_BOUND


@dataclass(frozen=True)
class Sampling:
    """Sampling as every API asks for it (ranges checked by the pipeline for all of them)."""

    max_tokens: int | None = None  # None: the profile's default
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Structured output (OpenAI's response_format): answers follow this JSON schema (as JSON text),
    # or are any JSON object.
    json_schema: str | None = None
    json_object: bool = False


# A chat answer's audio formats: streamed answers are always pcm16 deltas (as OpenAI's); a whole
# answer is one file in the format asked for.
SPEECH_FORMATS = ("pcm16", "wav", "mp3", "opus", "flac", "aac")


@dataclass(frozen=True)
class SpeechOut:
    voice: str | None = None  # None: the profile's default voice
    format: str = "pcm16"


@dataclass(frozen=True)
class Turn:
    """A request for one response: the conversation so far and how to answer."""

    model: str
    messages: tuple[Message, ...]
    sampling: Sampling = Sampling()
    speech: SpeechOut | None = None  # audio out (talker + vocoder) when set
    session: str = ""  # the client's session name ("" for none), scoped by tenant in the pipeline
    realtime: bool = False  # a realtime session's turn: decoded on the realtime pool, where there is one
    slo_class: str = ""
    service_tier: str = ""
    tools: Tools | None = None  # function calling (services/pipeline/tools.py)
    media: list[Media] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "media", [m for msg in self.messages for m in msg.media()])

    @property
    def document_pages(self) -> int:
        """Pages of the PDFs the messages carry."""
        return sum(len(p.pages) for m in self.messages for p in m.parts if isinstance(p, DocumentInput))

    @property
    def text_chars(self) -> int:
        """Characters of the messages' text parts."""
        return sum(len(part) for m in self.messages for part in m.parts if isinstance(part, str))


@dataclass(frozen=True)
class SpeechTurn:
    """Text to speech (the audio speech endpoints): the talker and vocoder alone, no thinker."""

    model: str
    input: str
    voice: str | None = None  # None: the profile's default voice
    instructions: str = ""


@dataclass(frozen=True)
class TranscriptionTurn:
    """Speech to text (the audio transcription endpoints) by the profile's transcriber."""

    model: str
    audio: AudioClip
    language: str = ""
    prompt: str = ""
    temperature: float = 0.0  # 0: greedy, with the model's own fallback temperatures


SPEECH_MODALITIES = ("text", "audio")


def speech_out(modalities: list[str], voice: str | None, audio_format: str | None) -> SpeechOut | None:
    """OpenAI's `modalities` (and `audio`) of a request: SpeechOut for ["text", "audio"], None for
    ["text"] (or none given); anything else is a client error."""
    from services.common.errors import bad_request

    if len(modalities) > len(SPEECH_MODALITIES):
        raise bad_request("modalities lists each modality once", param="modalities")
    asked = set(modalities or ["text"])
    if not asked <= set(SPEECH_MODALITIES) or "text" not in asked:
        raise bad_request(
            f"unsupported modalities {sorted(asked)}; use ['text'] or ['text', 'audio']",
            code="unsupported_modality",
            param="modalities",
        )
    return SpeechOut(voice or None, audio_format or "pcm16") if "audio" in asked else None
