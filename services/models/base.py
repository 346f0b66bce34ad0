"""Model adapter interfaces: what each stage needs from a model, whatever the profile.

A profile names an adapter per role (thinker, vision, audio, talker, vocoder); the stage code only
speaks these interfaces, so a new profile is a YAML plus adapters, never new plumbing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

# The rate audio reaches the encoders at (every audio adapter's input rate; the stage contracts'
# "FLOAT32 mono at 16 kHz").
ENCODER_RATE = 16_000


@dataclass(frozen=True)
class Placement:
    """Embeddings that are the thinker's own multimodal input (Qwen3-Omni): the engine puts
    `prefix`, one `placeholder` token per row and `suffix` in the prompt, and its model lays out the
    rows' positions from the image's patch grid or the audio's mel frames (M-RoPE)."""

    modality: str  # "image" | "audio" | "video"
    placeholder: int
    prefix: list[int]
    suffix: list[int]
    grid_thw: tuple[int, int, int] | None = None  # image, video: temporal, height, width in patches
    feature_frames: int = 0  # audio: mel frames
    seconds_per_grid: float = 0.0  # video: seconds one temporal patch spans


@dataclass(frozen=True)
class EncoderOutput:
    """What the thinker receives for one media item: embeddings (native path) or text (cascade).
    Embeddings without a placement are prompt embeddings in the thinker's hidden size."""

    embeddings: np.ndarray | None = None  # [n_tokens, dim] float32
    text: str | None = None
    tiles: int = 0
    audio_seconds: float = 0.0
    placement: Placement | None = None


class VisionEncoder(Protocol):
    """Tile-level: the encoder pool cuts images into tiles (the router's grid), batches tiles of
    many requests through `encode_tiles`, and reassembles each image with `assemble`."""

    version: str

    def preprocess(self, tile) -> Any:
        """One RGB PIL tile (or the whole image for a 1x1 grid) -> the model's input for it."""

    def encode_tiles(self, tiles: list) -> list:
        """Preprocessed tiles from any requests -> one feature object per tile."""

    def assemble(self, features: list, cols: int, rows: int) -> EncoderOutput:
        """One image's tile features, in row-major order of its cols x rows grid -> what the
        thinker sees."""

    # A thinker that places media itself (Qwen3-Omni) may take an image's features streamed, its
    # prompt sent before they are encoded: such an encoder also has
    #   placement(tiles, cols, rows) -> (Placement, (tokens, dim))
    # from the image's preprocessed tiles (services/extensions/vllm/ec_connector.py).

    # Video: a clip's key frames are tiles too, `frames_per_tile` consecutive frames each (1: a
    # frame is an image; Qwen3-Omni: its temporal patch).
    frames_per_tile: int

    def video_tile(self, frames: np.ndarray) -> Any:
        """`frames_per_tile` key frames, uint8 RGB [n, h, w, 3] -> the model's input for them."""

    def assemble_video(self, features: list, timestamps: list[float]) -> EncoderOutput:
        """One clip's tile features in time order, and its key frames' times (seconds) -> what
        the thinker sees."""


def frame_image(frames: np.ndarray):
    """A one-frame tile's frame as a PIL image (what an image model's `preprocess` takes)."""
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(frames[0]))


class AudioEncoder(Protocol):
    version: str
    sample_rate: int

    def encode(self, waves: list[np.ndarray]) -> list[EncoderOutput]:
        """Mono float32 waves at `sample_rate` -> one output per wave."""


@dataclass(frozen=True)
class Segment:
    """One stretch of transcribed speech; times in seconds from the start of the audio."""

    start: float
    end: float
    text: str
    language: str
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    compression_ratio: float = 0.0
    temperature: float = 0.0


class Transcriber(Protocol):
    """Speech to text with timestamps (the audio endpoints, realtime input transcription)."""

    version: str
    sample_rate: int

    def transcribe(
        self, wave: np.ndarray, language: str = "", prompt: str = "", temperature: float = 0.0
    ) -> Iterator[Segment]:
        """Mono float32 at `sample_rate` -> its segments as they are written (lazily). Temperature
        0: greedy, falling back to sampling where the model's own checks fail."""


class Talker(Protocol):
    """A text talker. One that batches the pieces its replica speaks also has `loop` (a
    services/models/stream_loop.StreamLoop) and `stream(text, voice)`, a loop stream whose frames are
    the unit chunks `stream_units` yields; the stage reads those."""

    version: str

    def stream_units(self, text: str, voice: str) -> Iterator[np.ndarray]:
        """Text -> speech units (int32 [n]) or latent frames (float32 [n, d]), chunk by chunk."""


@dataclass
class ThinkerPrompt:
    """What a token talker reads from the thinker's prompt (its generated tokens come as they are
    written: TokenTalkerStream.feed)."""

    token_ids: list[int]  # each media item's placeholders expanded to its rows
    # [placeholders, thinker hidden]: the thinker's hidden states at the talker's layer at the media
    # placeholders, in order (None for a prompt without media)
    media_hidden: np.ndarray | None = None
    image_grid_thw: list[tuple[int, int, int]] = field(default_factory=list)
    video_grid_thw: list[tuple[int, int, int]] = field(default_factory=list)
    video_seconds_per_grid: list[float] = field(default_factory=list)
    audio_feature_lengths: list[int] = field(default_factory=list)


class TokenTalkerStream(Protocol):
    ended_by: str  # why frames() ended: codec_eos | text_budget | max_frames

    def feed(self, token_ids: list[int]) -> None: ...

    @property
    def text_ended(self) -> bool:
        """A token that ends the text (the thinker's eos, a stop token) has been fed."""

    def set_media_hidden(self, rows: np.ndarray) -> None:
        """The thinker's hidden states at the prompt's media placeholders (before its first token)."""

    def finish(self, error: BaseException | None = None) -> None:
        """The thinker ended (or failed: `frames` raises `error`)."""

    def frames(self, timeout: float | None = None) -> Iterator[np.ndarray]:
        """[1, codebooks] codes per frame as they are drawn; `timeout` bounds each wait for text."""


class TokenTalker(Protocol):
    """A talker that reads the thinker's prompt and tokens (Qwen3-Omni), one stream per response."""

    version: str
    chunk_frames: list[int]  # frames per unit chunk sent on: the first, then the rest

    def stream(
        self, prompt: ThinkerPrompt, voice: str, seed: int | None = None, stop_token_ids: Iterable[int] = ()
    ) -> TokenTalkerStream:
        """One response's talker; with a `seed`, its draws depend on the seed and its input only.
        A token of `stop_token_ids` ends the text to speak as the thinker's end does (a tool call's
        marker: the talker says what came before it)."""


@dataclass(frozen=True)
class VocodeInput:
    """One chunk to decode: `units`, with `left`/`right` context that is decoded but not emitted."""

    units: np.ndarray
    left: np.ndarray | None = None
    right: np.ndarray | None = None
    voice: str = ""

    def shape(self) -> tuple[int, int, int]:
        """(left, units, right) lengths: chunks alike in it decode in one forward, exactly as alone."""
        return (
            0 if self.left is None else len(self.left),
            len(self.units),
            0 if self.right is None else len(self.right),
        )


def alike(chunks: list[VocodeInput]) -> list[list[int]]:
    """Indices of `chunks` grouped by shape, in order: each group is one batched forward."""
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, chunk in enumerate(chunks):
        groups.setdefault(chunk.shape(), []).append(i)
    return list(groups.values())


class Vocoder(Protocol):
    version: str
    sample_rate: int

    def decode(
        self, units: np.ndarray, left: np.ndarray | None, right: np.ndarray | None, voice: str
    ) -> np.ndarray:
        """Units -> float32 mono PCM in [-1, 1] for `units` only; `left`/`right` are context that is
        decoded but not emitted (how much a chunk needs is the profile's VocoderSpec)."""

    def decode_batch(self, chunks: list[VocodeInput]) -> list[np.ndarray]:
        """`decode` of many chunks (of many streams), each equal to it alone: one forward per group
        of chunks `alike`."""
