"""Audio continuity at the gateway: stalls are what an unbuffered real-time player would wait."""

from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.playback import Playback

chunks = st.lists(
    st.tuples(st.floats(0, 5, allow_nan=False), st.floats(0.001, 2, allow_nan=False)), min_size=1, max_size=50
)


def test_a_late_chunk_stalls_for_its_gap():
    p = Playback()
    assert p.receive(10.0, 0.5) == 0  # plays 10.0 -> 10.5
    assert p.receive(10.2, 0.5) == 0  # buffered: plays 10.5 -> 11.0
    assert abs(p.receive(11.3, 0.5) - 0.3) < 1e-9  # 0.3 s of silence, plays 11.3 -> 11.8
    assert abs(p.receive(11.8, 0.5)) < 1e-9
    assert abs(p.stall_s - 0.3) < 1e-9 and p.audio_s == 2.0


@settings(deadline=None)  # timing-free logic; a loaded machine must not fail it
@given(chunks)
def test_stalls_account_for_all_wall_time_not_covered_by_audio(items):
    p = Playback()
    now = 0.0
    for delay, seconds in items:
        now += delay
        assert p.receive(now, seconds) >= 0
    # Playback ends when the last audio is played: start + audio + stalls, never before the last
    # chunk arrived; stalls never exceed the wall time between first and last chunk.
    assert p.start + p.audio_s + p.stall_s >= now - 1e-9
    assert p.stall_s <= now - p.start + 1e-9


@settings(deadline=None)
@given(st.lists(st.floats(0.001, 2, allow_nan=False), min_size=1, max_size=50))
def test_audio_faster_than_real_time_never_stalls(durations):
    p = Playback()
    now = 0.0
    for seconds in durations:
        assert p.receive(now, seconds) == 0
        now += seconds * 0.9  # the next chunk arrives before this one is played
    assert p.stall_s == 0
