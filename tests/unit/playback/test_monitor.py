"""Session monitor bookkeeping with a fake clock: buffered audio, playback, barge-ins, reply gaps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.playback.monitor import PlaybackMonitor


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_playback_buffer_barge_in_and_reply_gap():
    clock = Clock()
    m = PlaybackMonitor(clock, gap_alpha=0.5)
    m.open("s")
    m.speech_started("s")
    clock.t += 1.0
    m.speech_stopped("s")
    m.response_started("s")
    clock.t += 0.4  # first audio 400 ms after the user stopped
    m.audio_sent("s", 500)
    m.audio_sent("s", 500)
    m.played("s", 300)
    view = m.snapshot()["s"]
    assert view.buffered_ms == 700 and view.playing and view.first_audio and view.responding
    assert view.reply_gap_ms == pytest.approx(400)
    assert m.speech_started("s")  # talking over a playing response: a barge-in
    m.truncated("s", 300)
    assert m.snapshot()["s"].buffered_ms == 0 and m.snapshot()["s"].barge_ins == 1
    m.response_finished("s")
    m.speech_stopped("s")
    m.response_started("s")
    clock.t += 0.8
    m.audio_sent("s", 100)
    assert m.snapshot()["s"].reply_gap_ms == pytest.approx(600)  # EMA of 400 and 800
    clock.t += 2
    assert m.snapshot()["s"].age_s == pytest.approx(2)
    m.response_finished("s")
    assert m.snapshot()["s"].buffered_ms == 0  # played out at real time
    assert not m.speech_started("s")  # no response, nothing playing: not a barge-in
    m.close("s")
    assert len(m) == 0


def test_playback_without_reports_runs_at_real_time_from_the_first_audio():
    clock = Clock()
    m = PlaybackMonitor(clock)
    m.open("s")
    m.response_started("s")
    clock.t += 5  # generating: nothing plays before the first audio
    m.audio_sent("s", 1000)
    clock.t += 0.25
    assert m.snapshot()["s"].played_ms == pytest.approx(250)
    m.played("s", 100)  # a report behind the estimate is the new anchor: the player is behind
    assert m.snapshot()["s"].played_ms == pytest.approx(100)
    clock.t += 0.1
    assert m.snapshot()["s"].played_ms == pytest.approx(200)
    m.played("s", 600)  # ahead of it too
    clock.t += 0.1
    assert m.snapshot()["s"].played_ms == pytest.approx(700)
    assert m.snapshot()["s"].buffered_ms == pytest.approx(300)
    clock.t += 10
    assert m.snapshot()["s"].played_ms == 1000 and not m.snapshot()["s"].playing
    assert m.snapshot()["s"].buffered_ms == 0 and "unknown" not in m.snapshot()


def test_a_transport_behind_real_time_is_where_its_reports_say():
    """A WebRTC track reports each 20 ms frame as it goes out; starved of CPU it goes out at a third
    of real time. Its position is what went out, not the clock since the first audio (a barge-in
    cuts there: tests/e2e/test_webrtc.py)."""
    clock = Clock()
    m = PlaybackMonitor(clock)
    m.open("s")
    m.response_started("s")
    m.audio_sent("s", 10_000)
    for frame in range(1, 51):
        clock.t += 0.06
        m.played("s", 20 * frame)
    view = m.snapshot()["s"]
    assert view.played_ms == pytest.approx(1000) and view.buffered_ms == pytest.approx(9000)


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("sent"), st.floats(0, 2000)),
        st.tuples(st.just("played"), st.floats(0, 5000)),
        st.tuples(st.just("truncated"), st.floats(0, 5000)),
        st.tuples(st.just("start"), st.just(0)),
        st.tuples(st.just("response"), st.just(0)),
    ),
    max_size=50,
)


@given(EVENTS)
def test_played_never_passes_sent_and_nothing_is_negative(events):
    m = PlaybackMonitor(Clock())
    m.open("s")
    calls = {
        "sent": lambda v: m.audio_sent("s", v),
        "played": lambda v: m.played("s", v),
        "truncated": lambda v: m.truncated("s", v),
        "start": lambda v: m.speech_started("s"),
        "response": lambda v: m.response_started("s"),
    }
    for kind, value in events:
        calls[kind](value)
        state = m._sessions["s"]
        assert 0 <= state.played_ms <= state.sent_ms + 1e-9
        assert m.snapshot()["s"].buffered_ms >= 0
        if kind == "played":  # a report is where playback is, whatever the estimate said
            assert state.played_ms == min(value, state.sent_ms)


def test_audio_per_token_is_the_sessions_own_else_the_replicas():
    m = PlaybackMonitor(Clock(), gap_alpha=0.5)
    assert m.ms_per_token("a") is None  # nothing measured yet
    m.open("a")
    m.response_finished("a", tokens=10, audio_ms=1000)
    m.open("b")
    assert m.ms_per_token("a") == 100 and m.ms_per_token("b") == 100  # b: the replica's so far
    m.response_finished("b", tokens=10, audio_ms=3000)
    assert m.ms_per_token("b") == 300 and m.ms_per_token("a") == 100
    assert m.ms_per_token("new") == 200  # averaged over both sessions' responses
