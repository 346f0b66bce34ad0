"""Frame sampling, key-frame detection and sizing (services/policies/frames/): invariants."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from services.policies.frames.keyframes import KeyFrames, thumbnail
from services.policies.frames.sampling import sample_times
from services.policies.frames.sizing import frame_size


@given(st.floats(0.01, 3600), st.floats(0.1, 30), st.integers(1, 512))
def test_sampled_instants_are_bounded_ordered_and_inside_the_clip(duration, fps, max_frames):
    times = sample_times(duration, fps, max_frames)
    assert 1 <= len(times) <= max_frames
    assert len(times) <= max(1, int(np.ceil(duration * fps)))
    assert all(0 <= t < duration for t in times)
    assert times == sorted(times)


def test_a_long_clip_is_spread_over_not_cut_off():
    times = sample_times(600.0, 2.0, 8)
    assert len(times) == 8 and times[0] < 60 and times[-1] > 540


frames = st.integers(0, 2**31).map(
    lambda seed: np.random.default_rng(seed).integers(0, 256, (24, 40, 3), dtype=np.uint8)
)


@given(st.lists(frames, min_size=1, max_size=8), st.floats(0, 1))
def test_first_frame_kept_and_counts_add_up(seq, threshold):
    k = KeyFrames(threshold)
    kept = [k.offer(f) for f in seq]
    assert kept[0] and k.kept == sum(kept) and k.offered == len(seq)


@given(frames, st.integers(1, 10))
def test_a_static_camera_is_one_key_frame(frame, repeats):
    k = KeyFrames(0.02)
    assert [k.offer(frame) for _ in range(repeats)] == [True] + [False] * (repeats - 1)


@given(st.lists(frames, min_size=1, max_size=6))
def test_threshold_zero_keeps_every_frame(seq):
    k = KeyFrames(0.0)
    assert all(k.offer(f) for f in seq + seq)


def test_a_scene_change_is_kept_and_noise_is_not():
    dark = np.full((64, 64, 3), 20, np.uint8)
    noisy = np.clip(dark.astype(int) + np.random.default_rng(0).integers(-3, 4, dark.shape), 0, 255)
    bright = np.full((64, 64, 3), 220, np.uint8)
    k = KeyFrames(0.02)
    assert [k.offer(dark), k.offer(noisy.astype(np.uint8)), k.offer(bright)] == [True, False, True]


def test_thumbnail_of_any_size_is_32_square_in_unit_range():
    for h, w in [(1, 1), (7, 300), (480, 640)]:
        t = thumbnail(np.full((h, w, 3), 255, np.uint8))
        assert t.shape == (32, 32) and np.allclose(t, 1.0)


@given(
    st.integers(1, 8000), st.integers(1, 8000), st.integers(16, 1024), st.sampled_from([1, 14, 16, 28, 32])
)
def test_frame_size_is_on_the_grid_and_within_bounds(w, h, frame_px, multiple):
    fw, fh = frame_size(w, h, frame_px, multiple)
    assert fw % multiple == 0 and fh % multiple == 0 and fw >= multiple and fh >= multiple
    assert max(fw, fh) <= max(frame_px + multiple, multiple)
