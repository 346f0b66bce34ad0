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


def nearest(times: list[float], frame_times: list[float]) -> list[int]:
    """For each decoded frame's time (ascending), whether it is the frame closest to a sampled
    instant: the indices of `frame_times` chosen, one per instant at most, ascending."""
    chosen: list[int] = []
    j = 0
    for t in times:
        while j + 1 < len(frame_times) and abs(frame_times[j + 1] - t) <= abs(frame_times[j] - t):
            j += 1
        if frame_times and (not chosen or chosen[-1] != j):
            chosen.append(j)
    return chosen
