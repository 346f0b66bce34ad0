"""What a realtime session's settings ask that this deployment cannot serve (its voices, its model,
its token cap, what it does with tools, its transcriber), found before they apply — a session's
`session.update`, or settings sent ahead of one (a client secret's: services/gateway/realtime/auth.py)."""

from __future__ import annotations

from services.common.errors import OmniError
from services.models.profile import Profile
from services.pipeline.structured_output import checked_json_schema
from services.pipeline.turn import AudioClip, TranscriptionTurn
from services.realtime import events as ev
from services.realtime.conversation import offered


def unserved(config: ev.SessionConfig, profile: Profile) -> list[tuple[tuple, str]]:
    """Settings this deployment does not serve (its voices, its model, its token cap), as (field,
    why); checked without a session too (settings sent ahead of one: services/gateway/realtime/auth.py)."""
    refused = []
    voice = config.audio.output.voice
    if voice is not None and profile.voice(voice) is None:
        why = f"unknown voice {voice[:64]!r}; available: {profile.voice_names()}"
        refused.append((("audio", "output", "voice"), why))
    if config.model is not None and not profile.serves(config.model):
        why = f"model {config.model[:64]!r} is not served here; this deployment serves {profile.served_model_name!r}"
        refused.append((("model",), why))
    cap = profile.limits.max_tokens_cap
    if isinstance(config.max_output_tokens, int) and config.max_output_tokens > cap:
        refused.append((("max_output_tokens",), f"must be at most {cap}"))
    return refused


async def refusals(
    config: ev.SessionConfig, given: dict, profile: Profile, pipeline
) -> list[tuple[tuple, str]]:
    """What only this deployment knows (its voices, its token cap, what it does with tools), as
    (field, why) refused; a refusal names a field of `given` (what the update changed)."""
    refused = unserved(config, profile)
    if (tools := offered(config.tools, config.tool_choice)) is not None:
        try:
            if schema := pipeline.checks.tool_schema(tools):
                await checked_json_schema(schema, param="tools", what="tools")
        except OmniError as e:
            field = e.param if e.param in given else ("tools" if "tools" in given else "tool_choice")
            refused.append(((field,), e.message))
    if (asked := config.audio.input.transcription) is not None:
        try:
            pipeline.transcription.check(transcription_turn(profile, asked, None))
        except OmniError as e:
            refused.append((("audio", "input", "transcription"), e.message))
    return refused


def transcription_turn(
    profile: Profile, asked: ev.InputTranscription, clip: AudioClip | None
) -> TranscriptionTurn:
    # the deployment's transcriber, whatever model the client names (served names only otherwise)
    return TranscriptionTurn(profile.served_model_name, clip, asked.language or "", asked.prompt or "")
