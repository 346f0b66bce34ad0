"""`make simulate`: omniray's policies at fleet scale on a hardware profile (planner/sim). The same
voice workload runs against the baseline (FCFS scheduling, LRU eviction, no preload) and the
interaction-aware set (LiveServe urgency, next-use eviction, speech-triggered preload) at each
session count and barge-in probability; `--ablation` adds the interaction-aware set's parts switched
on one at a time. Printed per cell: P50/P90 audio TTFP after end of speech, continuity, wasted
tokens (their share of what was generated), useful RPS (replies heard whole with no stall over
100 ms, per second), and the ratios interaction-aware / baseline.

    python -m planner.simulate --hardware h100-qwen3-omni-published --profile qwen3-omni \
        --sessions 8 32 128 256 --barge-p 0 0.5 --ablation
"""

from __future__ import annotations

import argparse
import json
import time

from loadtest import results
from planner.sim import report
from planner.sim.cluster import BASELINE, INTERACTION, Cluster, Deployment, Policies
from planner.sim.workload import VoiceSpec, Workload

ABLATION = {
    "baseline": BASELINE,
    "+scheduling": Policies(scheduler="liveserve"),
    "+eviction": Policies(eviction="next_use"),
    "+preload": Policies(preload=True),
    "interaction": INTERACTION,
}


def cell(args, policies: Policies, sessions: int, barge_p: float) -> dict:
    deployment = Deployment(hardware=args.hardware, profile=args.profile, decode_replicas=args.decode_replicas,
                            talker_replicas=args.talker_replicas, host_tokens=args.host_tokens,
                            admission=args.admission, policies=policies)  # fmt: skip
    workload = Workload(voice=VoiceSpec(sessions=sessions, barge_p=barge_p, ramp_s=args.ramp_s),
                        duration_s=args.duration_s, warmup_s=args.warmup_s, seed=args.seed)  # fmt: skip
    started = time.perf_counter()
    cluster = Cluster(deployment, workload)
    cluster.run()
    return {**report.voice(cluster), **report.engines(cluster), "wall_s": time.perf_counter() - started}


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


COLUMNS = ("ttfp_p50_s", "ttfp_p90_s", "continuity", "wasted_tokens", "wasted_share", "useful_rps",
           "turns", "barge_ins", "prefix_hit_share", "preempted", "wall_s")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h100-qwen3-omni-published")
    ap.add_argument("--profile", default="qwen3-omni")
    ap.add_argument("--sessions", type=int, nargs="+", default=[8, 32, 128, 256])
    ap.add_argument("--barge-p", type=float, nargs="+", default=[0.0, 0.5])
    ap.add_argument("--duration-s", type=float, default=300.0)
    ap.add_argument("--warmup-s", type=float, default=30.0)
    ap.add_argument("--ramp-s", type=float, default=10.0)
    ap.add_argument("--decode-replicas", type=int, default=1)
    ap.add_argument("--talker-replicas", type=int, default=2)
    ap.add_argument(
        "--host-tokens", type=int, default=2_000_000, help="host KV tier below each replica's pool"
    )
    ap.add_argument("--admission", action="store_true", help="AIMD admission on (the profile's parameters)")
    ap.add_argument("--ablation", action="store_true", help="also each interaction-aware part on its own")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sets = ABLATION if args.ablation else {"baseline": BASELINE, "interaction": INTERACTION}
    print(f"hardware {args.hardware}, profile {args.profile}, {args.decode_replicas} decode / "
          f"{args.talker_replicas} talker replicas, {args.duration_s:g} s simulated ({args.warmup_s:g} s warm-up)")  # fmt: skip
    print(f"{'sessions':>8} {'p':>4} {'set':>12} " + " ".join(f"{c:>16}" for c in COLUMNS))
    rows = []
    for n in args.sessions:
        for p in args.barge_p:
            out = {}
            for name, policies in sets.items():
                out[name] = cell(args, policies, n, p)
                print(
                    f"{n:>8} {p:>4} {name:>12} " + " ".join(f"{_fmt(out[name][c]):>16}" for c in COLUMNS),
                    flush=True,
                )
                rows.append({"sessions": n, "barge_p": p, "set": name, **out[name]})
            b, i = out["baseline"], out["interaction"]
            ratio = (b["ttfp_p90_s"] or 0) / max(i["ttfp_p90_s"] or 1e-9, 1e-9)
            cut = 1 - i["wasted_tokens"] / b["wasted_tokens"] if b["wasted_tokens"] else None
            print(f"{'':>8} {'':>4} {'ratio':>12} P90 TTFP baseline/interaction {ratio:.2f}x"
                  + (f", wasted tokens {cut:.0%} lower" if cut is not None else ""))  # fmt: skip
    path = results.write("simulate", None, {"settings": vars(args), "rows": rows})
    print(f"[simulate] wrote {path}")
    print(json.dumps({"cells": len(rows)}))


if __name__ == "__main__":
    main()
