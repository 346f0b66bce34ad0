"""AIMD admission of realtime sessions (Metronome): admit sessions up to a limit discovered from
the engine's measured frame time, and refuse the surplus cleanly instead of letting every session
stutter.

A frame is one engine step while it is busy: one more token for each running request. A session
observes the decode engine's frame time (measured in the engine core, carried with each decoded
chunk) over the audio one of its tokens yields: above 1, the engine generates speech slower than
real time and every session's buffer drains, however the scheduler orders them. Every `window`
observations the controller looks at their p95: above `late_ratio` the limit shrinks
multiplicatively, otherwise it grows additively.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdmissionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    initial: float = Field(default=16, ge=1)
    min: float = Field(default=1, ge=1)
    max: float = Field(default=256, ge=1)
    increase: float = Field(default=1.0, gt=0)
    decrease: float = Field(default=0.7, gt=0, lt=1)
    window: int = Field(default=50, ge=1)
    late_ratio: float = Field(default=1.0, gt=0)


class AimdAdmission:
    def __init__(self, params: AdmissionParams):
        self.params = params
        self.limit = min(max(params.initial, params.min), params.max)
        self.active = 0
        self._ratios: list[float] = []

    def try_admit(self) -> bool:
        if self.active + 1 > int(self.limit):
            return False
        self.active += 1
        return True

    def release(self) -> None:
        self.active = max(0, self.active - 1)

    def observe(self, ratio: float) -> None:
        """One frame's lateness ratio; every `window` frames the limit moves."""
        self._ratios.append(ratio)
        if len(self._ratios) < self.params.window:
            return
        ordered = sorted(self._ratios)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        self._ratios.clear()
        p = self.params
        if p95 > p.late_ratio:
            self.limit = max(p.min, self.limit * p.decrease)
        else:
            self.limit = min(p.max, self.limit + p.increase)
