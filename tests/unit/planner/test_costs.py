"""Stage cost curves (planner/costs.py): a fit recovers the curve it was sampled from, never has a
negative term (a step never gets cheaper with more work), and a profile round-trips through YAML."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.costs import Curve, HardwareProfile, StageCosts, load


def test_a_fit_recovers_a_linear_and_a_quadratic_curve():
    line = Curve.fit("requests", [(x, 0.02 + 0.003 * x) for x in (1, 2, 4, 8, 16)])
    assert abs(line.intercept_s - 0.02) < 1e-9 and abs(line.slope_s - 0.003) < 1e-9 and line.quad_s == 0
    curve = Curve.fit("tokens", [(x, 0.01 + 1e-4 * x + 1e-8 * x * x) for x in (64, 256, 1024, 4096)], True)
    assert curve.worst_error < 1e-6 and curve.at(2048) > curve.at(1024)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 4096), st.floats(1e-5, 10.0, allow_nan=False)), min_size=1, max_size=12
    ),
    st.booleans(),
)
def test_no_term_of_a_fit_is_negative(points, quadratic):
    curve = Curve.fit("units", points, quadratic)
    assert min(curve.intercept_s, curve.slope_s, curve.quad_s) >= 0
    xs = sorted({x for x, _ in points})
    assert all(curve.at(a) <= curve.at(b) + 1e-12 for a, b in zip(xs, xs[1:], strict=False))


def test_a_profile_round_trips(tmp_path):
    profile = HardwareProfile(
        name="t", device="a test", model_profile="tiny", source="measured: test",
        stages=StageCosts(prefill=Curve.fit("tokens", [(16, 0.01), (64, 0.02)]),
                          decode_step=Curve.fit("requests", [(1, 0.005), (8, 0.006)])),
    )  # fmt: skip
    path = tmp_path / "t.yaml"
    profile.dump(path)
    assert load(str(path)) == profile
