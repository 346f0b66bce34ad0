"""A committed turn's input transcription (`audio.input.transcription`), beside its response."""

from __future__ import annotations

from typing import Protocol

from services.common.errors import OmniError, internal_error
from services.models.profile import Profile
from services.pipeline.turn import AudioClip
from services.quota.tenants import TenantSpec
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.items import Item
from services.realtime.settings import transcription_turn


class SessionSide(Protocol):
    profile: Profile
    tenant: TenantSpec

    async def send(self, event: se.ServerEvent) -> None: ...


async def transcribe_turn(session: SessionSide, pipeline, item: Item, asked: ev.InputTranscription) -> None:
    """A committed turn's transcript, beside its response (off its critical path): deltas as the
    transcriber writes segments, then `.completed` (kept on the item), or `.failed`. The turn's
    audio was paid for when it was committed."""
    clip = item.clips[0] if len(item.clips) == 1 else AudioClip.joined(item.clips)
    texts: list[str] = []
    try:
        t = await pipeline.transcription.prepare(
            transcription_turn(session.profile, asked, clip), session.tenant, "realtime", paid=True
        )
        async for segment in pipeline.transcription.transcribe(t):
            delta = (" " if texts else "") + segment.text
            texts.append(segment.text)
            await session.send(se.InputAudioTranscriptionDelta(item_id=item.id, delta=delta))
    except Exception as e:
        err = e if isinstance(e, OmniError) else internal_error(e, "input transcription failed")
        detail = se.ErrorDetail(type="server_error" if err.status >= 500 else "invalid_request_error",
                                code=err.code or "transcription_failed", message=err.message)  # fmt: skip
        await session.send(se.InputAudioTranscriptionFailed(item_id=item.id, error=detail))
        return
    item.transcript = " ".join(texts)
    usage = se.TranscriptionUsage(seconds=round(clip.seconds, 3))
    await session.send(
        se.InputAudioTranscriptionCompleted(item_id=item.id, transcript=item.transcript, usage=usage)
    )
