"""How the load test's voice sessions interrupt replies (loadtest/clients/voice_turns.py)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from loadtest.clients import voice_turns
from loadtest.clients.voice_turns import SPEECH_MARGIN_MS, decide, plan


def test_plan_follows_the_barge_in_probability():
    rng = random.Random(0)
    plans = [plan(rng, 0.5) for _ in range(6000)]
    interrupted = [p for p in plans if p]
    assert 0.47 < len(interrupted) / len(plans) < 0.53
    assert 0.63 < interrupted.count("speech") / len(interrupted) < 0.70
    assert all(plan(rng, 0.0) is None for _ in range(100))
    assert all(plan(rng, 1.0) for _ in range(100))


def test_speech_needs_unplayed_audio_to_cut():
    assert decide("speech", SPEECH_MARGIN_MS + 1, done=True) == "speech"
    assert decide("speech", SPEECH_MARGIN_MS - 1, done=True) is None  # it would all be heard first
    assert decide("speech", 100, done=False) == "cancel"  # still generating: cancel it instead
    assert decide("cancel", 100, done=True) == "cancel"
    assert decide("cancel", 0, done=True) is None  # heard in full


@given(
    planned=st.sampled_from([None, "speech", "cancel"]),
    unplayed=st.floats(0, 10_000),
    done=st.booleans(),
)
def test_decide_never_escalates(planned, unplayed, done):
    how = decide(planned, unplayed, done)
    assert how in (None, planned, "cancel")
    if planned is None:
        assert how is None
    if how == "speech":
        assert unplayed >= voice_turns.SPEECH_MARGIN_MS
    if done and unplayed <= 0:
        assert how is None
