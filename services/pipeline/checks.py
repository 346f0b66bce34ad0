"""What a request asks that this deployment cannot do, found before anything runs: a 400 (or 413)
that names the field, from the request and its media's headers alone (nothing is decoded,
tokenized or encoded yet)."""

from __future__ import annotations

import math

from omni.v1 import common_pb2

from services.common.errors import OmniError, bad_request, too_large
from services.models.profile import Profile
from services.pipeline.prompt import PromptBuilder
from services.pipeline.structured_output import checked_json_schema
from services.pipeline.tool_parser import ToolCallParser
from services.pipeline.tools import Tools
from services.pipeline.turn import (
    SEED_BOUND,
    SPEECH_FORMATS,
    AudioClip,
    ImageInput,
    SpeechTurn,
    TranscriptionTurn,
    Turn,
    VideoInput,
)
from services.policies.frames.sampling import sample_times
from services.policies.frames.sizing import frame_size
from services.router.tiles import TileGrid, tile_grid

# name: (low, high) — OpenAI's ranges.
SAMPLING_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
MAX_STOP, MAX_STOP_CHARS = 4, 256
MAX_SESSION_CHARS = 128
# OpenAI's limits for the audio endpoints' text
MAX_SPEECH_CHARS = 4096
MAX_TRANSCRIPTION_PROMPT_CHARS = 4096


class TurnChecks:
    def __init__(self, profile: Profile, prompts: PromptBuilder, tool_parser: ToolCallParser | None):
        self.profile, self.prompts, self.tool_parser = profile, prompts, tool_parser

    def turn(self, turn: Turn) -> tuple[common_pb2.SamplingParams, str, str]:
        limits, pipe = self.profile.limits, self.profile.pipeline
        self.model(turn.model)
        if not turn.messages:
            raise bad_request("messages must not be empty", param="messages")
        if len(turn.messages) > limits.max_messages:
            raise bad_request(f"at most {limits.max_messages} messages", param="messages")
        if len(turn.session) > MAX_SESSION_CHARS:
            raise bad_request(
                f"session id must be at most {MAX_SESSION_CHARS} characters", param="x-omniray-session-id"
            )
        voice, audio_format = "", "pcm16"
        if turn.speech is not None:
            if why := self.profile.speech_out_unavailable():
                raise bad_request(
                    f"{why}; use modalities ['text']", code="unsupported_modality", param="modalities"
                )
            voice = self.voice_named(turn.speech.voice, "audio.voice")
            audio_format = turn.speech.format
            if audio_format not in SPEECH_FORMATS:
                raise bad_request(f"audio.format must be one of {SPEECH_FORMATS}", param="audio.format")
        s = turn.sampling
        max_tokens = pipe.default_max_tokens if s.max_tokens is None else s.max_tokens
        if max_tokens < 1:
            raise bad_request("max_tokens must be positive", param="max_tokens")
        if max_tokens > limits.max_tokens_cap:
            raise bad_request(f"max_tokens must be at most {limits.max_tokens_cap}", param="max_tokens")
        self._text_fits(turn, max_tokens)
        for name, (low, high) in SAMPLING_RANGES.items():
            value = getattr(s, name)
            if not (math.isfinite(value) and low <= value <= high):
                raise bad_request(f"{name} must be a number in [{low:g}, {high:g}]", param=name)
        if len(s.stop) > MAX_STOP or not all(0 < len(x) <= MAX_STOP_CHARS for x in s.stop):
            raise bad_request(
                f"stop takes at most {MAX_STOP} non-empty sequences of at most {MAX_STOP_CHARS} characters",
                param="stop",
            )
        if s.seed is not None and not -SEED_BOUND <= s.seed < SEED_BOUND:
            raise bad_request("seed must be a 64-bit integer", param="seed")
        json_schema = s.json_schema or ""
        if (tools := turn.tools) is not None:
            json_schema = self.tool_schema(tools, s.json_schema is not None or s.json_object)
        sampling = common_pb2.SamplingParams(
            max_tokens=max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed or 0,
            stop=list(s.stop),
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            json_schema=json_schema,
            json_object=s.json_object,
        )
        return sampling, voice, audio_format

    def _text_fits(self, turn: Turn, max_tokens: int) -> None:
        """Text that cannot fit the context even at the most characters a token holds is a 400 before
        anything is tokenized; the exact check, in tokens, follows the layout (_build_prompt)."""
        context = self.profile.engine.max_model_len
        if turn.text_chars > (context - max_tokens) * self.prompts.max_token_chars:
            raise bad_request(
                f"the messages' text ({turn.text_chars} characters) plus max_tokens ({max_tokens}) "
                f"cannot fit the context length ({context} tokens)",
                code="context_length_exceeded",
                param="messages",
            )

    def tool_schema(self, tools: Tools, structured: bool = False) -> str:
        """The schema a forced call is generated under ("" when the model answers freely); what
        this deployment cannot do with `tools` is a 400."""
        tools.check()
        if self.content_or_calls(tools):
            if structured:
                raise bad_request(
                    f"response_format cannot be combined with tool_choice 'auto' on profile "
                    f"{self.profile.name!r}: its model has no tool-call format, so 'auto' is itself "
                    "answered as structured output (docs/api.md, Tools)",
                    param="response_format",
                )
            return tools.content_or_calls_schema()
        if not tools.forced:
            return ""
        if structured:
            raise bad_request(
                "response_format cannot be combined with a required tool call", param="response_format"
            )
        return tools.schema()

    @staticmethod
    async def schema(turn: Turn, sampling: common_pb2.SamplingParams) -> None:
        """The schema the answer is generated under compiles (a required call's, or
        response_format's): a 400 with the reason otherwise."""
        if sampling.json_schema:
            forced = turn.tools is not None and turn.tools.forced
            where = {"param": "tools", "what": "tools"} if forced else {}
            await checked_json_schema(sampling.json_schema, **where)

    def media(self, turn: Turn, max_tiles: int | None = None) -> list[TileGrid | None]:
        """What the media cost and whether this deployment takes them, from their headers alone:
        what the plan and the quota need, before anything is decoded. Returns each image's tile
        grid (None for audio and video), with at most `max_tiles` (default: the profile's)."""
        limits = self.profile.limits
        if len(turn.media) > limits.max_media_items:
            raise bad_request(
                f"at most {limits.max_media_items} images, pages, audio and video clips per request",
                code="too_many_media_items",
                param="messages",
            )
        grids: list[TileGrid | None] = []
        decoded = 0
        for item in turn.media:
            kind = (
                "audio"
                if isinstance(item, AudioClip)
                else ("video" if isinstance(item, VideoInput) else "image")
            )
            if getattr(self.profile.models, "audio" if kind == "audio" else "vision") is None:
                raise bad_request(
                    f"profile {self.profile.name!r} does not accept {kind} input",
                    code="unsupported_modality",
                    param="messages",
                )
            grid = None
            if isinstance(item, ImageInput):
                t = self.profile.tiling
                grid = tile_grid(item.width, item.height, item.detail, t.tile_px, max_tiles or t.max_tiles)
            decoded += self.video_decoded_bytes(item) if isinstance(item, VideoInput) else item.decoded_bytes
            if decoded > limits.max_media_decoded_bytes:
                raise too_large(
                    f"the request's media decode to more than {limits.max_media_decoded_bytes} bytes",
                    code="media_too_large",
                    param="messages",
                )
            grids.append(grid)
        return grids

    def video_frames(self, clip: VideoInput) -> int:
        """The key frames a clip may yield (each one encoder tile): what its quota is debited."""
        v = self.profile.video
        return len(sample_times(clip.seconds, v.fps, v.max_frames))

    def video_decoded_bytes(self, clip: VideoInput) -> int:
        """The clip's bytes (sent to the pre-stage) and its key frames at the encoder's size."""
        v = self.profile.video
        width, height = frame_size(clip.width, clip.height, v.frame_px, v.frame_multiple)
        return len(clip.data) + self.video_frames(clip) * width * height * 3

    def content_or_calls(self, tools: Tools | None) -> bool:
        """ "auto" on a model with no call format of its own (no tool parser): the answer is
        generated as `{"content": ...}` or `{"tool_calls": [...]}`."""
        return tools is not None and tools.choice == "auto" and self.tool_parser is None

    def voice_named(self, name: str | None, param: str) -> str:
        """The profile's voice for `name` (an own name or an alias; None: the default), or a 400."""
        voice = self.profile.voice(name or self.profile.pipeline.default_voice)
        if voice is None:
            raise bad_request(
                f"unknown voice {(name or '')[:64]!r}; available: {self.profile.voice_names()}", param=param
            )
        return voice

    def model(self, model: str) -> None:
        if not self.profile.serves(model):
            raise OmniError(
                400,
                f"model {model[:64]!r} does not exist; this server serves {self.profile.served_model_name!r}",
                code="model_not_found",
                param="model",
            )

    def transcription(self, turn: TranscriptionTurn) -> None:
        """What this deployment's transcriber cannot do, as a 400 (before any audio is decoded)."""
        self.model(turn.model)
        spec = self.profile.models.transcriber_spec()
        if spec is None:
            raise bad_request(
                f"profile {self.profile.name!r} has no transcription model",
                code="unsupported_modality",
                param="model",
            )
        languages = spec.options.languages
        if turn.language and turn.language not in languages:
            raise bad_request(
                f"language {turn.language[:16]!r} is not transcribed here; one of {languages}",
                code="unsupported_language",
                param="language",
            )
        if len(turn.prompt) > MAX_TRANSCRIPTION_PROMPT_CHARS:
            raise bad_request(
                f"prompt must be at most {MAX_TRANSCRIPTION_PROMPT_CHARS} characters", param="prompt"
            )

    def speech(self, turn: SpeechTurn) -> str:
        """Text to speech: what the talker cannot say, as a 400; the voice it will say it in."""
        self.model(turn.model)
        if why := self.profile.speech_out_unavailable():
            raise bad_request(why, code="unsupported_modality", param="model")
        if not turn.input.strip():
            raise bad_request("input must not be empty", param="input")
        if len(turn.input) > MAX_SPEECH_CHARS:
            raise bad_request(f"input must be at most {MAX_SPEECH_CHARS} characters", param="input")
        if turn.instructions:
            raise bad_request(
                f"profile {self.profile.name!r}'s talker takes no speaking instructions",
                code="unsupported_parameter",
                param="instructions",
            )
        return self.voice_named(turn.voice, "voice")
