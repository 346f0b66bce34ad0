"""`make simulate-planner`: the SLA autoscaling policy against Serve's default on load steps, side by
side, in the simulator (planner/sim/autoscale.py runs both real policy functions on the simulated
clock; `make bench-planner`, loadtest/benchmarks/planner_bench.py, runs the real deployment).

- Image step (`cpu-2core-small` / `small`: its measured vision-encoder curve): a trickle of chat,
  then from `--step-s` image requests of 4 tiles at `--image-rps`. The encoder scales.
- Voice step (`h100-qwen3-omni-published` / `qwen3-omni`): from `--step-s`, `--sessions` voice
  sessions open over 10 s. The talker scales.

Printed per policy: when the stage first grew after the step, its most replicas, the SLO-violation
seconds (one-second bins whose P90 — the encoder's queue wait, or audio TTFP — is over the SLO), and
the P90 over the step.

    python -m planner.autoscale_bench
"""

from __future__ import annotations

import argparse
import statistics

from loadtest import results
from planner.sim import report
from planner.sim.cluster import Cluster, Deployment, Scaling
from planner.sim.workload import RequestSpec, VoiceSpec, Workload

# Serve's default policy decides on a noisy signal (ongoing requests) and relies on the controller's
# delays (30 s up, 600 s down, its defaults); the SLA policy smooths the offered load over its own
# window and holds a lower target itself, so its stages set a short upscale delay (as the profiles do).
SLA_DELAYS = {"upscale_delay_s": 2.0}


def violations(samples: list[tuple[float, float]], slo_s: float, start: float, end: float) -> list[int]:
    """The one-second bins in [start, end) whose P90 of `samples` (finish time, value) is over the
    SLO, in order: their count is the SLO-violation seconds."""
    bins: dict[int, list[float]] = {}
    for t, v in samples:
        if start <= t < end:
            bins.setdefault(int(t), []).append(v)
    return sorted(b for b, values in bins.items() if report.quantile(values, 0.9) > slo_s)


def _summary(cluster: Cluster, stage: str, samples, slo_s: float, args) -> dict:
    scaler = cluster.scalers[stage]
    grew = next((t for t, n in scaler.history if t >= args.step_s and n > scaler.history[0][1]), None)
    during = [v for t, v in samples if t >= args.step_s]
    return {
        "first_growth_s": None if grew is None else grew - args.step_s,
        "most_replicas": max(n for _, n in scaler.history),
        "violation_s": len(violations(samples, slo_s, args.step_s, args.duration_s)),
        "p90_s": report.quantile(during, 0.9),
        "median_s": statistics.median(during) if during else None,
    }


def image_step(args, policy: str) -> dict:
    scaling = Scaling(policy=policy, min_replicas=1, max_replicas=4, target_ongoing_requests=2,
                      per_replica={"image_tiles": args.tiles_per_encoder}, start_s=args.start_s,
                      **SLA_DELAYS if policy == "sla" else {})  # fmt: skip
    cluster = Cluster(
        Deployment(hardware="cpu-2core-small", profile="small", kv_tokens=1 << 22, admission=False,
                   scaling={"encoder": scaling}),
        Workload(requests={
            "chat": RequestSpec(rate=0.5, prompt_tokens=(20, 60), output_tokens=(1, 4)),
            "image": RequestSpec(rate=args.image_rps, tiles=(4, 4), prompt_tokens=(20, 40), output_tokens=(1, 2),
                                 tokens_per_tile=16, start_s=args.step_s),
        }, duration_s=args.duration_s, warmup_s=0),
    )  # fmt: skip
    cluster.run()
    samples = [
        (r["encoded"], r["encoded"] - r["arrival"]) for r in cluster.requests["image"] if "encoded" in r
    ]
    return _summary(cluster, "encoder", samples, args.encoder_slo_s, args)


def voice_step(args, policy: str) -> dict:
    scaling = Scaling(policy=policy, min_replicas=2, max_replicas=12, target_ongoing_requests=24,
                      per_replica={"session_seconds": args.sessions_per_talker}, start_s=args.start_s,
                      **SLA_DELAYS if policy == "sla" else {})  # fmt: skip
    cluster = Cluster(
        Deployment(hardware="h100-qwen3-omni-published", profile="qwen3-omni", admission=False,
                   talker_replicas=2, host_tokens=2_000_000, scaling={"talker": scaling}),
        Workload(voice=VoiceSpec(sessions=args.sessions, ramp_s=10, start_s=args.step_s),
                 duration_s=args.duration_s, warmup_s=0),
    )  # fmt: skip
    cluster.run()
    samples = [(t.start + t.ttfp_s, t.ttfp_s) for t in cluster.voice.turns if t.ttfp_s is not None]
    return _summary(cluster, "talker", samples, args.ttfp_slo_s, args)


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=300.0)
    ap.add_argument("--step-s", type=float, default=60.0)
    ap.add_argument(
        "--start-s", type=float, default=15.0, help="a new replica serves this long after it is asked"
    )
    ap.add_argument("--image-rps", type=float, default=30.0)
    ap.add_argument("--tiles-per-encoder", type=float, default=60.0, help="the SLA policy's capacity")
    ap.add_argument("--encoder-slo-s", type=float, default=0.5)
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--sessions-per-talker", type=float, default=32.0)
    ap.add_argument("--ttfp-slo-s", type=float, default=1.0)
    args = ap.parse_args()
    rows = []
    for name, run in (("image step, encoder", image_step), ("voice step, talker", voice_step)):
        out = {policy: run(args, policy) for policy in ("serve", "sla")}
        for policy, r in out.items():
            print(f"{name:>20} {policy:>6}: first growth {_s(r['first_growth_s'])} after the step, most replicas "
                  f"{r['most_replicas']}, SLO-violation seconds {r['violation_s']}, P90 {r['p90_s']:.3f} s, "
                  f"median {r['median_s']:.3f} s", flush=True)  # fmt: skip
            rows.append({"scenario": name, "policy": policy, **r})
    print(
        f"[simulate-planner] wrote {results.write('simulate-planner', None, {'settings': vars(args), 'rows': rows})}"
    )


if __name__ == "__main__":
    main()
