"""Deploy profiles (configs/<name>.yaml): models, pipeline behaviour, limits and per-stage scaling.

One file is the single source of truth for the local run, the tests and the Helm chart.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, SerializeAsAny, field_validator, model_validator

from services.common.paths import REPO_ROOT, data_dir
from services.extensions.vllm.specs import SinkWindowParams
from services.models.media_specs import EncoderPoolSpec, TilingSpec, VideoSpec
from services.models.media_specs import Strict as _Strict
from services.models.options import Options, TinyEncoder
from services.models.registry import TRANSCRIBERS
from services.policies.admission import AdmissionParams
from services.policies.scorers import ScorerSpec

CONFIG_DIR = REPO_ROOT / "configs"
STAGES = ("gateway", "video", "encoder", "prefill", "decode", "realtime_decode", "talker", "vocoder")


class ModelSpec(_Strict):
    adapter: str  # a name in services/models/registry.py ADAPTERS
    # Relative to $OMNIRAY_DATA/models, or absolute for weights the deployment mounts.
    path: str
    # The adapter's options: a mapping in the profile, validated into its class in
    # services/models/options.py (a bad key or value fails here, with its field path).
    options: SerializeAsAny[Options]
    # Programs the adapter runs that `make setup` installs only where it can (e.g. espeak-ng,
    # GPL-3.0, kept an optional system package). Missing ones switch this model off, not the app.
    requires: list[str] = Field(default_factory=list)

    def missing(self) -> list[str]:
        return [prog for prog in self.requires if shutil.which(prog) is None]

    @field_validator("adapter")
    @classmethod
    def _known_adapter(cls, name: str) -> str:
        from services.models.registry import ADAPTERS

        return ADAPTERS.check(name)

    @model_validator(mode="before")
    @classmethod
    def _typed_options(cls, data: Any) -> Any:
        from services.models.registry import ADAPTERS

        if not isinstance(data, dict) or data.get("adapter") not in ADAPTERS.modules:
            return data  # the adapter's own check says what is wrong
        options = data.get("options") or {}
        if not isinstance(options, Options):
            options = ADAPTERS.params(data["adapter"], options)
        return {**data, "options": options}


class VocoderSpec(ModelSpec):
    # Units before / after a chunk that it must be decoded with to equal a whole-utterance decode
    # (the vocoder's receptive field, measured for trained weights). The gateway keeps them.
    context_frames: int = Field(default=0, ge=0)
    lookahead_frames: int = Field(default=0, ge=0)
    # Chunks of many streams a replica decodes in one forward at most (1: one at a time), and how long
    # a batch that is not full waits after its first chunk for the rest of a talker step's
    # (services/stages/urgency_batcher.py).
    max_batch: int = Field(default=1, ge=1, le=64)
    batch_wait_ms: float = Field(default=5.0, ge=0, le=100)


class SessionKvSpec(_Strict):
    """A realtime session's turns as one long-lived streaming-input request on the decode engine
    (services/engine/session_kv.py)."""

    max_sessions: int = Field(default=32, ge=1)  # open requests per decode replica (LRU closed)
    idle_s: float = Field(default=120.0, gt=0)  # a request with no turn this long is closed


class EngineSpec(_Strict):
    """vLLM engine arguments for the thinker (prefill and decode deployments)."""

    dtype: str = "auto"
    max_model_len: int = 4096
    enforce_eager: bool = True
    kv_cache_space_gib: int = 1
    max_num_seqs: int = 64
    # vLLM's stream interval: after the first token, outputs go out every N tokens. Per-item costs
    # of the Serve hops dominate a small model's per-token time; N > 1 trades smoothness for them.
    stream_interval: int = 1
    # "store": engines save and load KV pages through the tiered KV store (kv_store/): prefill hands
    # its KV to decode (P/D), later turns and shared prefixes load instead of recomputing.
    # "none": no connector; decode computes every prompt itself.
    kv_transfer: Literal["store", "none"] = "store"
    # Tokens per KV block = per store page (vLLM's CPU attention wants a multiple of 32).
    block_size: int = Field(default=32, ge=16)
    # Conditional disaggregation: prompts shorter than this prefill on the decode engine (a
    # remote prefill costs a hop and a transfer that a short prompt does not pay back).
    disagg_min_prompt_tokens: int = 0
    # CPU only (VLLM_CPU_OMP_THREADS_BIND per engine role). One core per engine: OpenMP's spinning
    # barriers next to NIXL's progress threads on the same cores slow a step 40x.
    cpu_threads_bind: dict[Literal["prefill", "decode"], str] = Field(
        default_factory=lambda: {"prefill": "auto", "decode": "auto"}
    )
    extra: dict[str, Any] = Field(default_factory=dict)
    # Off (None) by default. The decode engine only; its blocks behind the window are freed, so it
    # cannot save whole prompts to the KV store: needs kv_transfer "none".
    sink_window: SinkWindowParams | None = None
    # Off (None) by default: needs sink_window (what bounds the long-lived request's KV).
    session_kv: SessionKvSpec | None = None

    @model_validator(mode="after")
    def _sink_window_alone(self):
        if self.sink_window is not None and self.kv_transfer != "none":
            raise ValueError("engine.sink_window needs engine.kv_transfer: none")
        if self.session_kv is not None and self.sink_window is None:
            raise ValueError("engine.session_kv needs engine.sink_window")
        return self


class KvStoreSpec(_Strict):
    """The tiered KV store each engine process runs (docs/kv-store.md)."""

    l2_mib: int = Field(default=256, ge=1)  # host DRAM pool, NIXL-registered
    l3_mib: int = Field(default=0, ge=0)  # disk tier; 0 = none
    l3_dir: str = "kv"  # relative paths are under the data directory (.data)
    policy: str = "lru"  # next_use: ranked by the live session signals below
    policy_params: dict[str, Any] = Field(default_factory=dict)
    transfer_timeout_s: float = Field(default=5.0, gt=0)
    # Live session signals from the session board (kv_store/follower.py): next-use predictions and
    # speech-triggered preload; `follower` sets FollowerParams (idle_s, deadline_s, max_pages, ...).
    session_signals: bool = True
    follower: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _policy_params(self):
        from kv_store import eviction

        eviction.POLICIES.params(self.policy, self.policy_params)  # unknown or out-of-range: fails here
        return self


class SchedulerSpec(_Strict):
    """The decode engine's urgency policy (services/policies/urgency/) and its session board."""

    policy: str = "liveserve"  # a name in services/policies/urgency POLICIES
    params: dict[str, Any] = Field(default_factory=dict)
    board_interval_s: float = Field(default=0.05, gt=0, le=5)  # gateway publish and engine poll period
    # Model steps a talker / vocoder replica runs at once; waiting steps go in by urgency.
    stage_slots: int = Field(default=2, ge=1, le=64)

    @model_validator(mode="after")
    def _policy_params(self):
        from services.policies import urgency

        urgency.POLICIES.params(self.policy, self.params)  # unknown or out-of-range parameters fail here
        return self


class SpeculativePrefillSpec(_Strict):
    """Prefill while the user still speaks (docs/realtime.md). Needs an audio encoder whose output
    for a chunk does not depend on the audio after it (a streaming encoder, embeddings out): user
    audio is then encoded `chunk_ms` at a time, so the features of what was said so far are a
    prefix of the whole turn's and their KV is reused at the end of the turn. A cascade's ASR
    (text out) is not such an encoder: leave it off there."""

    enabled: bool = False
    chunk_ms: int = Field(default=1000, ge=100, le=30_000)


class ContinuitySpec(_Strict):
    """Sessions that outlive their connection (services/realtime/continuity.py): the state is saved
    to Redis at every turn boundary and a client reconnecting with the session's id within
    `grace_s` of the last save resumes it."""

    enabled: bool = True
    grace_s: float = Field(default=300.0, ge=1, le=86_400)
    # How often a gateway replica looks whether Serve began draining it; its sessions then move at
    # their next turn boundary (services/extensions/ray/replica_drain.py).
    drain_check_s: float = Field(default=0.5, gt=0, le=60)


class CameraSpec(_Strict):
    """A realtime session's camera (services/realtime/camera.py): frames shown while the user speaks
    join the next turn."""

    max_fps: float = Field(default=2.0, gt=0, le=30)  # frames faster than this are dropped
    window_frames: int = Field(default=4, ge=1, le=64)  # recent key frames held for the next turn
    keyframe_threshold: float = Field(default=0.02, ge=0, le=1)  # as video.keyframe_threshold


class RealtimeSpec(_Strict):
    """Realtime voice sessions (docs/realtime.md)."""

    # A session with no client event for this long, and no response in flight, gets an `error`
    # event (`session_idle_timeout`) and is closed: an abandoned socket frees its admission slot.
    idle_timeout_s: float = Field(default=300.0, gt=0)
    # A WebRTC call whose peer has not connected (ICE + DTLS) this long after the answer ends, and
    # its session with it: a peer that never connects gives its session slot back. A TURN relay
    # far away may want more.
    webrtc_connect_timeout_s: float = Field(default=30.0, gt=0, le=600)

    admission: AdmissionParams = Field(default_factory=AdmissionParams)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    speculative_prefill: SpeculativePrefillSpec = Field(default_factory=SpeculativePrefillSpec)
    camera: CameraSpec = Field(default_factory=CameraSpec)
    continuity: ContinuitySpec = Field(default_factory=ContinuitySpec)
    # The conversation a response sends (services/realtime/history.py): at most this many turns,
    # and within `limits.max_media_items`, `limits.max_messages` and the context length; once over
    # one, the oldest turns go until the rest is within `history_retention_ratio` of each limit.
    max_history_turns: int = Field(default=32, ge=1, le=1024)
    history_retention_ratio: float = Field(default=0.75, gt=0, le=1)


class ModelsSpec(_Strict):
    thinker: ModelSpec
    vision: ModelSpec | None = None
    audio: ModelSpec | None = None
    talker: ModelSpec | None = None
    vocoder: VocoderSpec | None = None
    # Speech to text with timestamps (audio endpoints, realtime input transcription), loaded by the
    # encoder pool beside the encoders. None: the audio encoder, when it writes text (a cascade's
    # ASR); else the profile transcribes nothing.
    transcriber: ModelSpec | None = None

    def transcriber_spec(self) -> ModelSpec | None:
        if self.transcriber is not None:
            return self.transcriber
        if self.audio is not None and self.audio.adapter in TRANSCRIBERS:
            return self.audio
        return None

    @field_validator("transcriber")
    @classmethod
    def _transcribes(cls, spec: ModelSpec | None) -> ModelSpec | None:
        if spec is not None and spec.adapter not in TRANSCRIBERS:
            raise ValueError(f"transcriber adapter must be one of {sorted(TRANSCRIBERS)}")
        return spec

    @model_validator(mode="after")
    def _encoders_project_into_the_thinker(self) -> ModelsSpec:
        """Tiny encoders left without a width get the tiny thinker's (one number in the profile)."""
        width = getattr(self.thinker.options, "hidden_size", None)
        for spec in (self.vision, self.audio):
            if (
                spec is not None
                and isinstance(spec.options, TinyEncoder)
                and spec.options.thinker_hidden_size is None
                and width is not None
            ):
                spec.options = spec.options.model_copy(update={"thinker_hidden_size": width})
        return self


class DecodeResumeSpec(_Strict):
    """A response whose decode replica died goes on elsewhere from the tokens already sent
    (services/pipeline/pipeline.py: Pipeline._decode)."""

    enabled: bool = True
    # How long after the loss a live replica may take to answer. With one replica that is Serve
    # starting its replacement: up to ~3 min on two busy CI cores, as long as a GPU engine loading
    # a large checkpoint.
    wait_s: float = Field(default=240.0, gt=0)
    # Between tries while no replica answers.
    retry_s: float = Field(default=1.0, gt=0)


class StageDeadlinesSpec(_Strict):
    """How long a call to a stage replica may go unanswered (services/pipeline/stage_deadlines.py):
    then it is cancelled and the stage counts as gone (a 503, or a decode resumed elsewhere)."""

    # A reply, or a stream's first item: a request's wait for a seat in a busy engine and a long
    # prompt's prefill on CPU come within it.
    reply_s: float = Field(default=120.0, gt=0)
    # A stream's next item: a paced request held back (a few seconds of audio ahead) and a busy
    # engine's step come within it.
    between_s: float = Field(default=60.0, gt=0)


class PipelineSpec(_Strict):
    # Async chunk: the talker starts on the first text chunk instead of the whole answer.
    async_chunk: bool = True
    # A text chunk closes at a clause boundary once it has this many tokens, or at max regardless.
    chunk_min_tokens: int = 4
    chunk_max_tokens: int = 24
    default_max_tokens: int = 256
    default_voice: str = "default"
    voices: list[str] = Field(default_factory=lambda: ["default"])
    # vLLM's tool parser for the model's own call format (the name `--tool-call-parser` takes, e.g.
    # "hermes" for Qwen): tool_choice "auto" needs one (services/pipeline/tool_parser.py).
    tool_call_parser: str | None = None
    decode_resume: DecodeResumeSpec = Field(default_factory=DecodeResumeSpec)
    stage_deadlines: StageDeadlinesSpec = Field(default_factory=StageDeadlinesSpec)

    def thinker_gap_s(self) -> float:
        """The longest a response's thinker may go without a token and still go on: until its
        first (a prefill's reply, then decode's first item) or its next (`between_s`), and when
        that call is found stalled, a resume (tries `retry_s` apart for `decode_resume.wait_s`,
        the last one answering within `reply_s`). A token talker waits this long for the thinker."""
        d, r = self.stage_deadlines, self.decode_resume
        resume = r.retry_s + r.wait_s + d.reply_s if r.enabled else 0.0
        return max(2 * d.reply_s, d.between_s) + resume


class AliasSpec(_Strict):
    """Other names clients may use for this deployment's model and voices: OpenAI's defaults, so an
    SDK or a voice-agent framework left at its defaults works (docs/api.md). Own names always work."""

    models: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list)
    voices: dict[str, str] = Field(default_factory=dict)  # alias -> one of pipeline.voices


class LimitsSpec(_Strict):
    max_request_bytes: int = 48 * 1024 * 1024
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_side_px: int = 8000
    # Pixels of one image (width x height, from its header): 8000 x 8000 would decode to 192 MB.
    max_image_pixels: int = 40_000_000
    # Header-derived decoded size of all images and audio of one request together.
    max_media_decoded_bytes: int = 512 * 1024 * 1024
    max_audio_seconds: float = 120.0
    max_audio_bytes: int = 25 * 1024 * 1024
    # Video clips (video_url parts), from the container's headers before anything is decoded.
    max_video_bytes: int = 32 * 1024 * 1024
    max_video_seconds: float = 600.0
    max_video_side_px: int = 4096
    max_video_frames: int = 36_000  # frames the container holds (600 s at 60 fps)
    # Decoding work: frames x pixels per frame (the pre-stage decodes every frame of the track to
    # reach the sampled ones): 10 minutes of 720p at 30 fps.
    max_video_decode_pixels: int = 17_000_000_000
    # PDFs (file parts): checked before any page is rendered; pages larger than max_pdf_page_px
    # (long side, at 72 dpi) are rendered scaled down to it.
    max_pdf_bytes: int = 32 * 1024 * 1024
    max_pdf_pages: int = 100
    max_pdf_page_px: int = 2048
    max_messages: int = 256
    max_media_items: int = 64
    max_tokens_cap: int = 4096
    # A request body (REST) must arrive within this long once its headers did: a client that stalls
    # or sends less than it declared gets a 408 instead of holding a connection and a task.
    body_read_timeout_s: float = Field(default=30.0, gt=0)


class RequestRouterSpec(_Strict):
    """Replica selection for calls into this stage: a weighted pipeline of scorers
    (services/policies/scorers/), run by services/extensions/ray/request_router.py."""

    scorers: list[ScorerSpec] = Field(min_length=1)
    # How often replicas report their routing stats (e.g. the encoder's pending tiles).
    stats_period_s: float = Field(default=0.5, gt=0)


class SlaSpec(_Strict):
    """The SLA autoscaling policy for a stage (services/extensions/ray/sla_autoscaling.py): what one
    replica serves within the SLOs, per kind of offered load (from `make plan`)."""

    per_replica: dict[Literal["requests", "realtime_requests", "text_tokens", "image_tiles", "audio_seconds",
                              "session_seconds"], Annotated[float, Field(gt=0)]] = Field(min_length=1)  # fmt: skip
    headroom: float = Field(default=1.2, ge=1)
    window_s: float = Field(default=20.0, gt=1)
    downscale_after_s: float = Field(default=60.0, ge=0)


class SessionPoolSpec(_Strict):
    """Replicas that each hold at most `cap` live sessions, a session pinned to one for its life
    (services/router/session_seats.py): the realtime decode pool (docs/realtime-pool.md)."""

    cap: int = Field(ge=1)
    seat_ttl_s: float = Field(default=90.0, gt=0)  # a seat not renewed this long is given back
    renew_s: float = Field(default=30.0, gt=0)  # how often a gateway renews its sessions' seats
    register_s: float = Field(default=2.0, gt=0)  # a replica registers this often (lapses after 3)

    @model_validator(mode="after")
    def _renewed_in_time(self):
        if self.renew_s * 2 > self.seat_ttl_s:
            raise ValueError("sessions: renew_s must be at most seat_ttl_s / 2")
        return self


class StageSpec(_Strict):
    """Serve deployment options; passed through to the Serve config for this stage."""

    # A replica being stopped (scale-down, a new config, a rolling update) takes no new requests
    # and keeps serving those it has for up to this long, so responses in flight finish (Serve's
    # default, 20 s, cuts a long spoken reply).
    graceful_shutdown_timeout_s: float = Field(default=120.0, ge=0)

    num_replicas: int | None = None
    autoscaling_config: dict[str, Any] | None = None
    max_ongoing_requests: int = 64
    max_queued_requests: int = -1
    ray_actor_options: dict[str, Any] = Field(default_factory=lambda: {"num_cpus": 0.1})
    request_router: RequestRouterSpec | None = None
    # Replicas from the offered load and the capacity plan instead of Serve's queue-length policy
    # (needs autoscaling_config: its bounds stand).
    sla: SlaSpec | None = None
    sessions: SessionPoolSpec | None = None  # the realtime decode pool's seats (its own key only)

    @model_validator(mode="after")
    def _sla_needs_autoscaling(self):
        if self.sla is not None and self.autoscaling_config is None:
            raise ValueError("sla needs autoscaling_config (the replica bounds it works within)")
        return self


class Profile(_Strict):
    name: str
    served_model_name: str
    description: str = ""
    models: ModelsSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)
    aliases: AliasSpec = Field(default_factory=AliasSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    tiling: TilingSpec = Field(default_factory=TilingSpec)
    encoder_pool: EncoderPoolSpec = Field(default_factory=EncoderPoolSpec)
    video: VideoSpec = Field(default_factory=VideoSpec)
    kv_store: KvStoreSpec = Field(default_factory=KvStoreSpec)
    realtime: RealtimeSpec = Field(default_factory=RealtimeSpec)
    stages: dict[Literal[STAGES], StageSpec]

    @model_validator(mode="after")
    def _session_pool(self) -> Profile:
        """The realtime decode pool, and only it, has seats (`sessions`: its per-replica cap)."""
        if any((s.sessions is None) == (k == "realtime_decode") for k, s in self.stages.items()):
            raise ValueError("stages.realtime_decode, and no other stage, needs `sessions`")
        return self

    @model_validator(mode="after")
    def _vision_tiles(self) -> Profile:
        """A vision encoder that needs the tile size gets the router's (one number in the profile)."""
        vision = self.models.vision
        if (
            vision is not None
            and "tile_px" in type(vision.options).model_fields
            and vision.options.tile_px is None
        ):
            vision.options = vision.options.model_copy(update={"tile_px": self.tiling.tile_px})
        return self

    @model_validator(mode="after")
    def _aliases(self) -> Profile:
        voices = self.pipeline.voices
        if bad := {a: v for a, v in self.aliases.voices.items() if v not in voices or a in voices}:
            raise ValueError(f"aliases.voices must map other names to one of {voices}: {bad}")
        if self.served_model_name in self.aliases.models:
            raise ValueError("aliases.models must not repeat served_model_name")
        return self

    def serves(self, model: str) -> bool:
        """Whether `model` names this deployment's model (its own name or an alias)."""
        return model == self.served_model_name or model in self.aliases.models

    def voice(self, name: str) -> str | None:
        """The voice `name` stands for (its own name or an alias's), or None for an unknown one."""
        return name if name in self.pipeline.voices else self.aliases.voices.get(name)

    def voice_names(self) -> list[str]:
        """Every name `voice` takes: the voices, then their aliases."""
        return [*self.pipeline.voices, *self.aliases.voices]

    def model_path(self, spec: ModelSpec) -> Path:
        return data_dir() / "models" / spec.path

    def token_talker(self) -> bool:
        """Whether the talker reads the thinker's tokens (Qwen3-Omni) rather than text pieces."""
        talker = self.models.talker
        return talker is not None and getattr(talker.options, "reads_thinker_tokens", False)

    def audio_piece_tokens(self) -> int:
        """Tokens a reply may generate before the audio of the first of them can come: the engine
        streams tokens every `stream_interval`, and a talker of text pieces (not one that reads the
        thinker's tokens) waits for a piece's end, at most `chunk_max_tokens` (closed at a streamed
        batch's end). Realtime pacing lets a reply run this much further ahead of playback
        (services/policies/urgency/liveserve.py)."""
        interval = self.engine.stream_interval
        return interval if self.token_talker() else self.pipeline.chunk_max_tokens + interval - 1

    def speech_out_unavailable(self) -> str | None:
        """Why this profile cannot speak here, or None when it can."""
        talker, vocoder = self.models.talker, self.models.vocoder
        if not (talker and vocoder):
            return f"profile {self.name!r} has no speech output"
        if missing := talker.missing() + vocoder.missing():
            return f"speech output needs {', '.join(missing)} on this host (optional system package)"
        return None


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (configs/<name>.yaml) or by path to a YAML file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no deploy profile {name_or_path!r} (known: {known})")
    return Profile.model_validate(yaml.safe_load(path.read_text()))
