"""`make plan`'s Helm overlay renders: each planned deployment's autoscaling bounds reach the Serve
config, and each pool's worker group is sized for its devices (planner/plan.py, a short plan)."""

from __future__ import annotations

import yaml
from hypothesis import given
from hypothesis import strategies as st

from planner import plan
from services import deploy


@given(lo=st.integers(1, 50), span=st.integers(0, 500), edge=st.integers(1, 600))
def test_bisect_finds_the_last_true_within_its_step(lo, span, edge):
    hi = lo + span
    found = plan._bisect(lambda n: n <= edge, lo, hi)
    if edge < lo:
        assert found == 0
    else:
        assert found <= min(edge, hi) and min(edge, hi) - found <= max(1, found // 16)


def test_a_plans_overlay_renders_with_its_bounds(tmp_path):
    out = tmp_path / "plan.yaml"
    result = plan.main(["--users", "400", "--seconds", "20", "--out", str(out)])
    values = yaml.safe_load(out.read_text())
    assert result.replicas["decode"] >= 1 and result.predicted["ttfp_p90_s"] is not None
    docs = deploy.render(values)
    (service,) = [d for d in docs if d["kind"] == "RayService"]
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    bounds = {
        d["name"]: (d["autoscaling_config"]["min_replicas"], d["autoscaling_config"]["max_replicas"])
        for app in serve["applications"]
        for d in app["deployments"]
    }
    for name, b in values["replicaBounds"].items():
        assert bounds[name] == (b["min"], b["max"])
    groups = {g["groupName"]: g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    for pool, size in values["ray"]["workerGroups"].items():
        assert (groups[pool]["minReplicas"], groups[pool]["maxReplicas"]) == (
            size["minReplicas"],
            size["maxReplicas"],
        )


def test_bounds_reach_a_deployment_the_profile_runs_at_a_fixed_count():
    """tiny runs Decode and Prefill at one replica each, without autoscaling: bounds that meet set
    the count; bounds that do not make it autoscale between them (Serve's default policy)."""
    docs = deploy.render({"profile": "tiny", "replicaBounds": {"Decode": {"min": 2, "max": 2},
                                                               "Prefill": {"min": 1, "max": 3}}})  # fmt: skip
    (service,) = [d for d in docs if d["kind"] == "RayService"]
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    by_name = {d["name"]: d for d in app["deployments"]}
    assert by_name["Decode"]["num_replicas"] == 2 and "autoscaling_config" not in by_name["Decode"]
    assert "num_replicas" not in by_name["Prefill"]
    assert by_name["Prefill"]["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3}
