"""Stage cost profiles: what one step of each omniray stage costs on one machine, as curves fitted to
measured points (`make profile-stages`, planner/profile_stages.py) or to published figures. The
simulator and the capacity planner read them; a GPU node replaces the shipped one with one command.

A curve is `intercept + slope·x + quad·x²` seconds for x units (tokens of a prefill chunk, requests in
a decode step, tiles in an encoder batch, ...), fitted by least squares over its points with every
coefficient ≥ 0 (a step never gets cheaper with more work) — and it keeps the points it was fitted
to, so a reader can see how well it fits (`Curve.worst_error`).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

HARDWARE_DIR = Path(__file__).resolve().parents[1] / "configs" / "hardware"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Curve(_Strict):
    unit: str  # what x counts
    intercept_s: float = Field(ge=0)
    slope_s: float = Field(ge=0)
    quad_s: float = Field(default=0.0, ge=0)
    points: list[tuple[float, float]] = Field(default_factory=list)  # (x, seconds) it was fitted to

    def at(self, x: float) -> float:
        """Seconds for `x` units."""
        return self.intercept_s + self.slope_s * x + self.quad_s * x * x

    @property
    def worst_error(self) -> float:
        """The largest relative error of the curve at its own points (0 without points)."""
        return max((abs(self.at(x) - s) / s for x, s in self.points if s > 0), default=0.0)

    @classmethod
    def fit(cls, unit: str, points: list[tuple[float, float]], quadratic: bool = False) -> Curve:
        """Non-negative least squares over {1, x[, x²]}: every subset of the terms is solved and
        the best fit whose coefficients are all ≥ 0 is kept (three terms: an exact NNLS)."""
        if not points:
            raise ValueError(f"no points to fit a {unit} curve to")
        x = np.array([p[0] for p in points], float)
        y = np.array([p[1] for p in points], float)
        terms = [np.ones_like(x), x] + ([x * x] if quadratic else [])
        best: tuple[float, np.ndarray] | None = None
        for k in range(1, len(terms) + 1):
            for chosen in itertools.combinations(range(len(terms)), k):
                a = np.stack([terms[i] for i in chosen], axis=1)
                coef, *_ = np.linalg.lstsq(a, y, rcond=None)
                if (coef < 0).any():
                    continue
                full = np.zeros(3)
                full[list(chosen)] = coef
                residual = float(np.sum((a @ coef - y) ** 2))
                if best is None or residual < best[0] - 1e-18:
                    best = (residual, full)
        assert best is not None  # the intercept alone is the mean of y >= 0
        i, s, q = (float(v) for v in best[1])
        return cls(
            unit=unit, intercept_s=i, slope_s=s, quad_s=q, points=[(float(a), float(b)) for a, b in points]
        )


class StageCosts(_Strict):
    """One step of each stage (None: not measured on this machine)."""

    prefill: Curve  # one prefill of x prompt tokens (batch 1)
    decode_step: Curve  # one decode step of x running requests
    encoder_batch: Curve | None = None  # one vision-encoder batch of x tiles
    # cutting and preprocessing one request's x tiles (the encoder stage's thread, before they reach
    # its batch scheduler: a document's tiles queue behind what arrived while they were cut)
    encoder_prep: Curve | None = None
    audio_encode: Curve | None = None  # encoding x seconds of audio
    vad: Curve | None = None  # x 32 ms windows of one session's speech detection
    talker_step: Curve | None = None  # one step of a batching talker with x streams
    talker_units: Curve | None = None  # x speech units of one stream (a talker that does not batch)
    vocoder_batch: Curve | None = None  # one vocoder batch of x chunks


class Memory(_Strict):
    """What bounds a thinker replica's KV: the device memory left for it and a token's size."""

    kv_cache_bytes: float = Field(gt=0)  # the engine's KV pool
    kv_bytes_per_token: float = Field(gt=0)  # K and V of every layer
    host_bandwidth_bps: float = Field(gt=0)  # device <-> host KV copies
    source: str = ""


class Serving(_Strict):
    """Where cores are few (a CPU machine), the engines' steps share them with the serving path: the
    gateway, Serve's replicas and proxy, Ray, and a benchmark's client on the same machine. What that
    path spends outside the engines per request, per engine step and per streamed token, measured
    from the processes' CPU time (`make calibrate`, planner/calibrate.py); the simulator shares the
    cores by processor sharing (planner/sim/cores.py)."""

    cores: int = Field(ge=1)
    request_cpu_s: float = Field(ge=0)  # per request: ingress, routing, the response's start and end
    step_cpu_s: float = Field(default=0.0, ge=0)  # per engine step that made tokens: its outputs' handling
    token_cpu_s: float = Field(ge=0)  # per streamed token
    background_cores: float = Field(default=0.0, ge=0)  # what Ray and idle replicas keep busy meanwhile
    # The deployed engine's work per step beyond the bare step curve (make profile-stages runs vLLM
    # without omniray's scheduler hook and KV connector, and its step's hand-off to the replica):
    # fitted to two closed loops' rates (calibrate.fit_engine)
    engine_step_s: float = Field(default=0.0, ge=0)
    engine_request_s: float = Field(default=0.0, ge=0)  # and per running request of the step
    # per voiced token, what the speech path spends beyond the talker's and vocoder's model steps (the
    # stage curves): their replicas' handling of each piece and the gateway's audio back to the client;
    # measured from a spoken chat run's CPU time (calibrate.SPEECH_RUN)
    speech_token_cpu_s: float = Field(default=0.0, ge=0)
    # per open realtime session, the cores it keeps busy whatever it says or hears beyond the above:
    # its audio streamed in (the server's VAD), its playback reports, its events out and the client's
    # own work; measured from a voice run's CPU time (calibrate.session_cores)
    session_cores: float = Field(default=0.0, ge=0)
    source: str = ""


class HardwareProfile(_Strict):
    name: str
    device: str  # the machine, in words
    model_profile: str  # the deployment profile whose models were measured
    source: str  # "measured: <command>" or "fitted to published figures: <which>"
    measured_at: str = ""
    stages: StageCosts
    memory: Memory | None = None  # None: the simulator needs it given
    serving: Serving | None = None  # None: the serving path costs nothing (cores to spare, a GPU node)

    def dump(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=110))


def load(name_or_path: str) -> HardwareProfile:
    """A hardware profile by name (configs/hardware/<name>.yaml) or path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = HARDWARE_DIR / f"{name_or_path}.yaml"
    return HardwareProfile.model_validate(yaml.safe_load(path.read_text()))
