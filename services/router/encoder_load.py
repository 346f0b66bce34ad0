"""How loaded the encoder pool is, as this gateway sees it: the time its recent requests' tiles
waited in an encoder replica's queue before their first batch (each encode reply says), smoothed
and decaying while nothing is observed (a drained pool reads as drained without a request to say
so). Over `bound_s` the pool is overloaded until the smoothed wait falls below half of it (hysteresis:
the tile policy does not flap at the bound). While it is, requests below the realtime SLO class get
the overload tile policy: at most `overload_max_tiles` per image."""

from __future__ import annotations

import time


class EncoderLoad:
    def __init__(
        self, bound_s: float | None, overload_max_tiles: int = 4, smoothing: float = 0.3, clock=time.monotonic
    ):
        self.bound_s, self.smoothing, self.clock = bound_s, smoothing, clock
        self.overload_max_tiles = overload_max_tiles
        self.wait_s = 0.0
        self._at = clock()
        self._over = False

    def _decayed(self) -> float:
        """The smoothed wait now: halved every `bound_s` without a new observation."""
        if not self.bound_s:
            return self.wait_s
        return self.wait_s * 0.5 ** ((self.clock() - self._at) / self.bound_s)

    def observe(self, wait_s: float) -> None:
        now_wait = self._decayed()
        self.wait_s = now_wait + self.smoothing * (max(0.0, wait_s) - now_wait)
        self._at = self.clock()

    @property
    def overloaded(self) -> bool:
        if self.bound_s is None:
            return False
        wait = self._decayed()
        self._over = wait > self.bound_s / 2 if self._over else wait > self.bound_s
        return self._over

    def max_tiles(self, slo_class: str) -> int | None:
        """The tiles an image of a request of `slo_class` may have now: the overload policy's, or
        None (the profile's own)."""
        if slo_class == "realtime" or not self.overloaded:
            return None
        return self.overload_max_tiles
