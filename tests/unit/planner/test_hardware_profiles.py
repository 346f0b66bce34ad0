"""The shipped hardware profiles (configs/hardware/): each loads, names where its figures came from,
fits its own points (a measured curve within 30%: one CPU run's noise; the published GPU prefill
within 35%: A100 figures that are not monotone in prompt length), and the published one is what planner/published.py makes."""

from __future__ import annotations

import pytest

from planner import published
from planner.costs import HARDWARE_DIR, load

SHIPPED = sorted(HARDWARE_DIR.glob("*.yaml"))


def test_profiles_ship():
    names = {p.stem for p in SHIPPED}
    assert "h100-qwen3-omni-published" in names and any(n.startswith("cpu-2core-") for n in names)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_profile_loads_and_fits_its_points(path):
    profile = load(str(path))
    assert profile.name == path.stem and profile.source.split(":")[0] in (
        "measured",
        "fitted to published figures",
    )
    for stage, curve in profile.stages:
        if curve is None:
            continue
        bound = 0.35 if profile.source.startswith("fitted") and stage == "prefill" else 0.3
        assert curve.points and curve.worst_error <= bound, (stage, curve.worst_error)
        assert curve.at(curve.points[-1][0]) >= curve.at(curve.points[0][0])


def test_the_published_profile_is_what_its_sources_make():
    # to the fit's last bits: the least-squares solve rounds by the BLAS it runs on
    shipped, made = load("h100-qwen3-omni-published").model_dump(), published.profile().model_dump()
    assert _close(shipped, made)


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == pytest.approx(b, rel=1e-9) if isinstance(a, float) else a == b
