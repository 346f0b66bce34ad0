"""How a load-test voice session ends a reply it hears: listens to the end, talks over it (server VAD
barge-in) or cancels and truncates it (client barge-in). Pure, so it is unit-tested."""

from __future__ import annotations

import random
from typing import Literal

Interruption = Literal["speech", "cancel"]
# Talking over a reply cuts it only if audio is still unplayed when the VAD hears the speech (a few
# hundred ms after its onset; playback runs on meanwhile): below this much left, speech may land
# after the reply was heard in full, and nothing would be cut.
SPEECH_MARGIN_MS = 1500.0


def plan(rng: random.Random, barge_p: float) -> Interruption | None:
    """With probability barge_p the reply is interrupted: two in three by speech, one by cancel."""
    if rng.random() >= barge_p:
        return None
    return "speech" if rng.random() < 2 / 3 else "cancel"


def decide(planned: Interruption | None, unplayed_ms: float, done: bool) -> Interruption | None:
    """The interruption that can still happen once playback reached the planned point: `unplayed_ms`
    received but not played, `done` whether the reply has ended on the server."""
    if planned is None or (done and unplayed_ms <= 0):
        return None  # nothing left to interrupt
    if planned == "speech" and unplayed_ms < SPEECH_MARGIN_MS:
        return None if done else "cancel"
    return planned
