"""Cut a stream of speech units into vocoder calls that reproduce a whole-utterance decode.

A vocoder with a finite receptive field decodes units [a, b) exactly when it also sees `context`
units before a and `lookahead` units after b. Units arrive from the talker in chunks of any size;
the window holds back the last `lookahead` units until more arrive (or the utterance ends) and
remembers the last `context` units already decoded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VocodeCall:
    units: np.ndarray  # decode these; their audio is emitted
    left: np.ndarray | None  # already-decoded units before them, context only
    right: np.ndarray | None  # not-yet-decoded units after them, lookahead only


class VocoderWindow:
    def __init__(self, context: int, lookahead: int):
        self.context, self.lookahead = context, lookahead
        self._left: np.ndarray | None = None
        self._pending: np.ndarray | None = None

    def push(self, units: np.ndarray) -> VocodeCall | None:
        """Add units; returns a call once more than `lookahead` units are waiting."""
        pending = units if self._pending is None else np.concatenate([self._pending, units])
        ready = len(pending) - self.lookahead
        if ready <= 0:
            self._pending = pending
            return None
        self._pending = pending[ready:]
        return self._call(pending[:ready], self._pending if self.lookahead else None)

    def flush(self) -> VocodeCall | None:
        """End of the utterance: whatever is held back is decoded without lookahead."""
        pending, self._pending = self._pending, None
        return None if pending is None or not len(pending) else self._call(pending, None)

    def _call(self, units: np.ndarray, right: np.ndarray | None) -> VocodeCall:
        call = VocodeCall(units, self._left, right)
        if self.context:
            joined = units if self._left is None else np.concatenate([self._left, units])
            self._left = joined[-self.context :]
        return call
