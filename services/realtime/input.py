"""A realtime session's input: the audio buffer (pcm16 at 24 kHz, decoded from the session's input
format), server VAD over it (Silero + the turn segmenter), the current turn's audio as clips — the
same clip objects whether the turn is complete or still being spoken, so each chunk is resampled
and encoded once — and what speculative prefill has done of the turn being spoken."""

from __future__ import annotations

import asyncio

from services.models.profile import Profile
from services.pipeline.turn import AudioClip
from services.realtime import events as ev
from services.realtime.codecs import PCM_RATE, InputAudio
from services.realtime.vad import SileroStream, TurnSegmenter

MIN_TURN_BYTES = PCM_RATE * 2 // 10  # 100 ms: less is no turn (OpenAI's commit rule)


class InputBuffer:
    def __init__(self, profile: Profile, input_format: str):
        self.profile = profile
        self.audio = InputAudio(input_format)
        self.buffer = bytearray()
        self.start = 0  # position of buffer[0] in the session's input audio, in samples
        self.vad: SileroStream | None = None
        self.turns: TurnSegmenter | None = None
        self.speech_start_ms: float | None = None
        ahead = profile.realtime.speculative_prefill
        self.chunk_bytes = ahead.chunk_ms * PCM_RATE // 1000 * 2 if ahead.enabled else 0
        self.ahead: asyncio.Task | None = None  # the speculative prefill in flight
        self.ahead_chunks = 0  # chunks of the current turn prefilled (or being prefilled) so far
        self.ahead_paid_s = 0.0  # audio of the current turn debited by speculative prefill
        # The current turn's audio chunks made into clips so far (speculative prefill): chunk k of
        # the turn, reused by the committed turn, so each chunk is resampled and encoded once.
        self.turn_clips: dict[int, tuple[bytes, AudioClip]] = {}

    def start_vad(self, turn_detection) -> None:
        """(Re)start server VAD at the current input position with the session's settings."""
        self.vad = SileroStream(PCM_RATE) if turn_detection else None
        self.turns = TurnSegmenter(turn_detection, origin_ms=self.input_ms) if turn_detection else None
        self.speech_started_at(None)

    def speech_started_at(self, audio_start_ms: float | None) -> None:
        self.speech_start_ms = audio_start_ms
        self.ahead_chunks = 0
        if audio_start_ms is not None:  # a new turn: its audio is not paid for yet, nor encoded
            self.ahead_paid_s = 0.0
            self.turn_clips = {}

    def offset(self, ms: float) -> int:
        """Where input position `ms` is in the buffer, in bytes (within the buffer)."""
        samples = int(ms * PCM_RATE // 1000) - self.start
        return min(max(samples, 0) * 2, len(self.buffer))

    def speech_offset(self) -> int:
        """Where the turn being spoken starts in the buffer, in bytes."""
        return self.offset(self.speech_start_ms)

    @property
    def input_ms(self) -> float:
        return (self.start + len(self.buffer) // 2) / PCM_RATE * 1000

    def drop(self, upto: int | None = None) -> bytes:
        """Take the buffer's first `upto` bytes (all by default) out of it."""
        upto = len(self.buffer) if upto is None else upto
        taken = bytes(self.buffer[:upto])
        del self.buffer[:upto]
        self.start += upto // 2
        return taken

    def clear(self) -> None:
        """input_audio_buffer.clear, or a turn its tenant cannot pay for: no turn in the buffer."""
        self.drop()
        self.speech_started_at(None)
        self.turn_clips = {}

    def append(self, pcm16: bytes, event_id: str | None) -> None:
        limit = int(self.profile.limits.max_audio_seconds * PCM_RATE * 2)
        if len(self.buffer) + len(pcm16) > limit:
            raise ev.RealtimeEventError(
                f"input audio buffer would exceed {self.profile.limits.max_audio_seconds} s",
                code="input_audio_buffer_full",
                event_id=event_id,
            )
        self.buffer += pcm16

    async def detect(self, chunk: bytes) -> list:
        """Server VAD over `chunk`: the speech starts and stops it finds (TurnSegmenter's)."""
        probs = await asyncio.to_thread(self.vad.feed, chunk)
        return list(self.turns.push(probs))

    def forget_silence(self) -> None:
        """Audio before the earliest place a coming speech start can reach back to (its window less
        the prefix padding) can never be part of a turn: an open microphone in a quiet room keeps
        only the padding's worth, however long it stays open."""
        if not self.turns.speaking:
            self.drop(self.offset(self.turns.earliest_start_ms))

    def clips(self, pcm: bytes | bytearray) -> list[AudioClip]:
        """A turn's audio (from its start) as clips: chunks of the streaming encoder's size when
        speculative prefill is on — its first chunks are then the same clips (the same objects, so
        encoded once) whether the turn is complete or still being spoken — else one clip."""
        step = self.chunk_bytes or len(pcm)
        clips = []
        for k, at in enumerate(range(0, len(pcm), step)):
            chunk = bytes(pcm[at : at + step])
            seen, clip = self.turn_clips.get(k, (b"", None))
            if clip is None or seen != chunk:
                clip = AudioClip.from_pcm16(chunk, PCM_RATE, keep=True)
                if len(chunk) == step:  # only whole chunks recur
                    self.turn_clips[k] = (chunk, clip)
            clips.append(clip)
        return clips

    def take_turn(self, upto: int) -> list[AudioClip]:
        """The buffer's first `upto` bytes, as the committed turn's clips."""
        clips = self.clips(self.drop(upto))
        self.turn_clips = {}
        self.ahead_paid_s = 0.0
        self.speech_started_at(None)
        return clips

    def ahead_due(self) -> list[AudioClip] | None:
        """The turn being spoken, up to the chunks the VAD has heard as speech (the silence after
        the speech is not the turn's), when more of it is complete than was prefilled and no
        prefill is in flight; else None."""
        if not self.chunk_bytes or self.speech_start_ms is None:
            return None
        if self.ahead is not None and not self.ahead.done():
            return None
        start, end = self.speech_offset(), self.offset(self.turns.speech_end_ms)
        chunks = (end - start) // self.chunk_bytes
        if chunks <= self.ahead_chunks:
            return None
        self.ahead_chunks = chunks
        return self.clips(self.buffer[start : start + chunks * self.chunk_bytes])
