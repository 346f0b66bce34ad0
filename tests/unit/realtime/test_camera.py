"""A realtime session's camera (services/realtime/camera.py): the frame rate, near-duplicates and
the window bound what a turn carries; a commit takes the window and starts it over."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from services.models.profile import CameraSpec, load_profile
from services.realtime.camera import Camera

TINY = load_profile("tiny")


def _camera(clock, **spec) -> Camera:
    profile = TINY.model_copy(deep=True)
    profile.realtime.camera = CameraSpec(**spec)
    return Camera(profile, clock)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _frame(value: int) -> np.ndarray:
    return np.full((24, 32, 3), value, np.uint8)


def _show(cam: Camera, clock: Clock, at: float, value: int) -> bool:
    clock.now = at
    return cam.due() and cam.offer(_frame(value))


def test_frames_over_the_rate_are_dropped_before_decoding():
    clock = Clock()
    cam = _camera(clock, max_fps=2, window_frames=8)
    shown = [_show(cam, clock, t, int(t * 40) % 256) for t in (0.0, 0.1, 0.3, 0.5, 0.6, 1.0)]
    assert shown == [True, False, False, True, False, True]


def test_a_static_scene_holds_one_frame_and_a_commit_starts_over():
    clock = Clock()
    cam = _camera(clock, max_fps=10, window_frames=8)
    assert [_show(cam, clock, t, 100) for t in (0, 1, 2, 3)] == [True, False, False, False]
    taken = cam.take()
    assert len(taken) == 1 and taken[0].pixels().shape == (24, 32, 3)
    assert cam.take() == []
    assert _show(cam, clock, 4, 100)  # the next turn's first frame, whatever it looks like


@given(st.lists(st.integers(0, 255), min_size=1, max_size=40), st.integers(1, 8))
def test_the_window_holds_the_most_recent_key_frames(values, window):
    clock = Clock()
    cam = _camera(clock, max_fps=30, window_frames=window, keyframe_threshold=0)
    for i, v in enumerate(values):
        _show(cam, clock, float(i), v)
    held = cam.take()
    assert len(held) == min(window, len(values))
    assert [int(h.pixels()[0, 0, 0]) for h in held] == values[-len(held) :]
