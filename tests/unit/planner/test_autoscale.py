"""Stages scaled in the simulator by real autoscaling policies (planner/sim/autoscale.py): Serve's
default after its upscale delay and a replica's start; the SLA policy from the offered load, ahead of
Serve's on the same step (planner/autoscale_bench.py, shortened)."""

from __future__ import annotations

import argparse

import simpy
from ray.serve.autoscaling_policy import default_autoscaling_policy
from ray.serve.config import AutoscalingConfig

from planner import autoscale_bench
from planner.sim.autoscale import StageScaler


def test_serves_default_grows_after_its_delay_and_the_replicas_start():
    env = simpy.Environment()
    replicas = [object()]
    config = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=2, upscale_delay_s=5)
    scaler = StageScaler(env, "Stage", default_autoscaling_policy, config, replicas, object, lambda: 6.0, 3.0)
    env.run(until=7.9)
    assert len(replicas) == 1  # the delay (5 s) then the start (3 s)
    env.run(until=8.5)
    assert len(replicas) == 3 and scaler.target == 3  # 6 ongoing / 2 a replica


def test_violations_are_the_bins_over_the_slo():
    samples = [(10.1, 0.2), (10.5, 0.9), (11.2, 0.1), (12.0, 2.0), (30.0, 5.0)]
    assert autoscale_bench.violations(samples, 0.5, 0, 20) == [10, 12]


def test_the_sla_policy_grows_the_encoder_before_serves_default_on_an_image_step():
    args = argparse.Namespace(duration_s=120.0, step_s=20.0, start_s=10.0, image_rps=30.0, tiles_per_encoder=60.0,
                              encoder_slo_s=0.5)  # fmt: skip
    serve, sla = (autoscale_bench.image_step(args, p) for p in ("serve", "sla"))
    assert sla["first_growth_s"] is not None and sla["first_growth_s"] < 20
    assert serve["first_growth_s"] is None or serve["first_growth_s"] > sla["first_growth_s"] + 10
    assert sla["violation_s"] < serve["violation_s"]
