"""The playback monitor: what each live voice session is doing, from the signals the realtime endpoint
sees — audio sent, audio the client reports played, speech starting and stopping, responses starting
and ending. The interaction-aware scheduler and the KV store's next-use policy read `snapshot()`.

Pure bookkeeping (no I/O, injectable clock), so the policies that read it can be tested exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class PlaybackState:
    session_id: str
    sent_ms: float = 0.0  # audio of the current response sent to the client
    played_ms: float = 0.0  # of that, played at `played_at` (a client report, or first audio)
    played_at: float | None = None  # None: nothing is playing yet
    speaking: bool = False  # the user is speaking now
    responding: bool = False  # a response is being generated
    barge_ins: int = 0  # speech that started while a response was playing or being generated
    responses: int = 0  # responses started
    reply_gap_ms: float | None = None  # moving average: end of user speech -> first audio out
    ms_per_token: float | None = None  # moving average: audio per generated token (responses so far)
    first_audio: bool = False  # the current response has sent audio
    speech_stopped_at: float | None = None
    updated_at: float = field(default=0.0)

    def played_now(self, now: float) -> float:
        """Playback runs at real time from the last anchor (the client's report, or the first audio
        delta for clients that send no `omniray.playback.progress`), never past what was sent."""
        if self.played_at is None:
            return self.played_ms
        return min(self.sent_ms, self.played_ms + (now - self.played_at) * 1000)

    def buffered_ms(self, now: float) -> float:
        """Audio the client holds and has not played: how long playback lasts without new audio."""
        return max(0.0, self.sent_ms - self.played_now(now))


@dataclass(frozen=True)
class PlaybackView:
    """What the policies read: immutable, so a scheduling round sees one consistent picture."""

    session_id: str
    buffered_ms: float
    played_ms: float
    playing: bool
    speaking: bool
    responding: bool
    first_audio: bool
    barge_ins: int
    responses: int
    reply_gap_ms: float | None
    ms_per_token: float | None
    age_s: float  # since the last signal


class PlaybackMonitor:
    def __init__(self, clock: Callable[[], float] = time.monotonic, gap_alpha: float = 0.3):
        self.clock, self.gap_alpha = clock, gap_alpha
        self._sessions: dict[str, PlaybackState] = {}
        self._ms_per_token: float | None = None  # over every session's responses (one model's voice)

    def _state(self, session_id: str) -> PlaybackState:
        state = self._sessions.get(session_id)
        if state is None:
            state = self._sessions[session_id] = PlaybackState(session_id)
        state.updated_at = self.clock()
        return state

    def open(self, session_id: str) -> None:
        self._state(session_id)

    def __len__(self) -> int:
        return len(self._sessions)

    def response_started(self, session_id: str) -> None:
        s = self._state(session_id)
        s.responding, s.first_audio, s.sent_ms, s.played_ms, s.played_at = True, False, 0.0, 0.0, None
        s.responses += 1

    def audio_sent(self, session_id: str, ms: float) -> None:
        s = self._state(session_id)
        if not s.first_audio and s.speech_stopped_at is not None:
            gap = (s.updated_at - s.speech_stopped_at) * 1000
            s.reply_gap_ms = (
                gap
                if s.reply_gap_ms is None
                else (1 - self.gap_alpha) * s.reply_gap_ms + self.gap_alpha * gap
            )
        if s.played_at is None:
            s.played_at = s.updated_at
        s.first_audio = True
        s.sent_ms += ms

    def played(self, session_id: str, played_ms: float) -> None:
        """The client's playback position in the current response's audio, never past what was sent.
        A report is the new anchor even behind the estimate: a player that started late or fell
        behind real time (a WebRTC track whose gateway was starved of CPU goes on from where it
        was, docs/webrtc.md) is where it says, and a barge-in cuts there, not where the clock says."""
        s = self._state(session_id)
        s.played_ms = min(played_ms, s.sent_ms)
        s.played_at = s.updated_at if s.played_at is not None or s.played_ms > 0 else None

    def response_finished(self, session_id: str, tokens: int = 0, audio_ms: float = 0.0) -> None:
        """A response ended; `tokens` generated for `audio_ms` of audio (the rate the scheduler
        converts generated tokens into audio ahead of playback with)."""
        s = self._state(session_id)
        s.responding = False
        if tokens > 0 and audio_ms > 0:
            s.ms_per_token = self._averaged(s.ms_per_token, audio_ms / tokens)
            self._ms_per_token = self._averaged(self._ms_per_token, audio_ms / tokens)

    def _averaged(self, average: float | None, rate: float) -> float:
        return rate if average is None else (1 - self.gap_alpha) * average + self.gap_alpha * rate

    def ms_per_token(self, session_id: str) -> float | None:
        """Audio per generated token: the session's own, else this replica's sessions' so far."""
        s = self._sessions.get(session_id)
        return s.ms_per_token if s is not None and s.ms_per_token is not None else self._ms_per_token

    def speech_started(self, session_id: str) -> bool:
        """Returns True when this is a barge-in (the user talks over a response)."""
        s = self._state(session_id)
        barge = s.responding or s.buffered_ms(s.updated_at) > 0
        s.speaking = True
        if barge:
            s.barge_ins += 1
        return barge

    def speech_stopped(self, session_id: str) -> None:
        s = self._state(session_id)
        s.speaking, s.speech_stopped_at = False, s.updated_at

    def truncated(self, session_id: str, audio_end_ms: float) -> None:
        """The client dropped what it had not played: nothing is buffered any more."""
        s = self._state(session_id)
        s.sent_ms = s.played_ms = min(audio_end_ms, s.sent_ms)
        s.played_at = None

    def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def snapshot(self) -> dict[str, PlaybackView]:
        now = self.clock()
        return {sid: self._view(sid, s, now) for sid, s in self._sessions.items()}

    def view(self, session_id: str) -> PlaybackView | None:
        """One session's view now (None: not open)."""
        s = self._sessions.get(session_id)
        return None if s is None else self._view(session_id, s, self.clock())

    @staticmethod
    def _view(sid: str, s: PlaybackState, now: float) -> PlaybackView:
        buffered = s.buffered_ms(now)
        return PlaybackView(
            session_id=sid,
            buffered_ms=buffered,
            played_ms=s.played_now(now),
            playing=buffered > 0,
            speaking=s.speaking,
            responding=s.responding,
            first_audio=s.first_audio,
            barge_ins=s.barge_ins,
            responses=s.responses,
            reply_gap_ms=s.reply_gap_ms,
            ms_per_token=s.ms_per_token,
            age_s=now - s.updated_at,
        )
