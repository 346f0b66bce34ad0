"""What a response streams to its API: text (content and tool calls), audio, progress, the end."""

from __future__ import annotations

from dataclasses import dataclass

from omni.v1 import common_pb2

from services.pipeline.tools import CallDelta


@dataclass
class Event:
    text: str = ""
    tokens: int = 0  # generated tokens behind `text` (their text may be empty)
    pcm16: bytes = b""
    sample_rate: int = 0
    transcript: str | None = None
    finish_reason: str | None = None
    usage: common_pb2.Usage | None = None
    progress: common_pb2.Progress | None = None
    calls: tuple[CallDelta, ...] = ()  # tool calls as they are written (`text` is the content)
    frame_ms: float = 0.0  # the decode engine's frame time as of this text (0: not measured)

    @property
    def is_text(self) -> bool:
        """Only generated text (what piles up and merges under load)."""
        return bool(self.tokens or self.text) and not (
            self.pcm16 or self.finish_reason is not None or self.progress is not None or self.calls
        )


def merged_text(batch: list[Event | None]) -> list[Event | None]:
    """Consecutive text events that piled up become one (fewer chunks on the wire under load)."""
    merged: list[Event | None] = []
    for ev in batch:
        prev = merged[-1] if merged else None
        if ev is not None and prev is not None and ev.is_text and prev.is_text:
            merged[-1] = Event(text=prev.text + ev.text, tokens=prev.tokens + ev.tokens, frame_ms=ev.frame_ms)
        else:
            merged.append(ev)
    return merged
