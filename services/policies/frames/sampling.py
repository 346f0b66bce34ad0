"""Which instants of a clip are sampled: `fps` frames a second, at most `max_frames`, spread evenly
over the whole clip when it is longer (a long clip is summarised, not cut off). Each instant is the
middle of its interval, so a clip of one interval yields its middle frame, not its first."""

from __future__ import annotations

import math


def sample_times(duration_s: float, fps: float, max_frames: int) -> list[float]:
    """Instants (seconds from the clip's start), ascending, within [0, duration_s)."""
    if duration_s <= 0 or fps <= 0 or max_frames < 1:
        return [0.0]
    n = max(1, min(max_frames, math.ceil(duration_s * fps)))
    step = duration_s / n
    return [step * (i + 0.5) for i in range(n)]
