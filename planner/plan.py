"""`make plan USERS=5000 MIX=voice:0.4,chat:0.4,image:0.2 SLO=ttfp_p90:1.0,ttft_p99:2.0`: how many
replicas of each stage, and devices, serve that many concurrent users within the SLOs — and a Helm
values overlay with those bounds.

Dynamo's planner and llm-d's sizing start from one replica's capacity; so does this, but it finds
the capacity by simulating one replica under omniray's own policies (planner/sim) on the hardware
profile rather than from a benchmark table:
- voice: the most sessions one decode replica serves with P90 TTFP and playback continuity within
  the SLO (a bisection over session counts, the profile's interaction-aware policies, talkers never
  short); the talker work those sessions make, from the same runs, sizes the speech stages (talker
  and vocoder replicas in pairs, as the profiles deploy them);
- chat: the request rate one decode replica takes with TTFT p99 within the SLO;
- images: the rate one encoder replica takes with its encode p99 within the SLO (only where the
  hardware profile has an encoder curve).
Replicas add up linearly (a decode replica's time is split between voice and chat by their shares
of its capacity); one simulated replica at the planned share of the load checks the prediction.
Where the profile has a realtime decode pool, voice sessions are planned on it alone — one replica
holds the simulated capacity or its session cap, the lower — and chat and images on Decode.
Prefill runs inside the decode replicas in the simulator (P/D disaggregation is not simulated): the
plan keeps the profile's Prefill bounds.

    python -m planner.plan --users 5000 --mix voice:0.4,chat:0.4,image:0.2 --slo ttfp_p90:1.0,ttft_p99:2.0
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from planner import costs
from planner.sim import report
from planner.sim.cluster import INTERACTION, Cluster, Deployment
from planner.sim.workload import RequestSpec, VoiceSpec, Workload
from services.app import DEPLOYMENT_NAMES
from services.deploy import STAGE_POOLS
from services.models.profile import load_profile

CHAT = RequestSpec(prompt_tokens=(20, 2000), output_tokens=(30, 300))
IMAGE = RequestSpec(prompt_tokens=(20, 200), output_tokens=(30, 300), tiles=(1, 4), tokens_per_tile=256)


@dataclass(frozen=True)
class Slo:
    ttfp_p90_s: float = 1.0  # voice: audio TTFP after end of speech
    ttft_p99_s: float = 2.0  # chat and image: time to first token
    continuity: float = 0.9  # voice: replies heard whole with no stall over 100 ms


@dataclass(frozen=True)
class Plan:
    replicas: dict[str, int]
    devices: dict[str, float]
    capacity: dict[str, float | None]
    predicted: dict[str, float | None]
    sla: dict[str, dict[str, float]]  # stage -> the SLA policy's per_replica (profile `stages.<s>.sla`)


def _parse(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition(":")
        out[key.strip()] = float(value)
    return out


def _deployment(args, **kw) -> Deployment:
    return Deployment(hardware=args.hardware, profile=args.profile, policies=INTERACTION, admission=False,
                      host_tokens=args.host_tokens, **kw)  # fmt: skip


def _bisect(ok, lo: int, hi: int) -> int:
    """The largest n in [lo, hi] with ok(n) (ok is monotone: true up to a point); 0 if none."""
    if not ok(lo):
        return 0
    while hi - lo > max(1, lo // 16):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def voice_capacity(args, slo: Slo) -> tuple[int, float, float]:
    """(sessions one decode replica serves within the SLO, talker replicas' work per session, turns
    a session asks per second)."""
    talker = load_profile(args.profile).models.talker
    streams = getattr(talker.options, "max_streams", 1) if talker is not None else 1
    seen: dict[int, tuple[bool, float]] = {}

    def ok(n: int) -> bool:
        cluster = Cluster(
            _deployment(args, talker_replicas=max(1, math.ceil(n / streams))),
            Workload(
                voice=VoiceSpec(sessions=n, ramp_s=5), duration_s=args.seconds, warmup_s=args.seconds / 4
            ),
        )
        cluster.run()
        v = report.voice(cluster)
        good = (
            v["ttfp_p90_s"] is not None
            and v["ttfp_p90_s"] <= slo.ttfp_p90_s
            and v["continuous_share"] >= slo.continuity
        )
        span = cluster.env.now - cluster.w.warmup_s
        seen[n] = (good, sum(t.busy_s for t in cluster.talkers) / cluster.env.now / n, v["turns"] / span / n)
        return good

    n = _bisect(ok, 8, 2 * load_profile(args.profile).engine.max_num_seqs)
    _, work, turns = seen.get(n, (False, 0.0, 0.0))
    return n, work, turns


def rate_capacity(args, slo: Slo, spec: RequestSpec, measure: str) -> float:
    """Requests per second one replica takes with `measure` (a p99) within the SLO."""

    def ok(rate_x10: int) -> bool:
        cluster = Cluster(
            _deployment(args),
            Workload(requests={"r": spec.model_copy(update={"rate": rate_x10 / 10})}, duration_s=args.seconds,
                     warmup_s=args.seconds / 4),
        )  # fmt: skip
        cluster.run()
        p99 = report.requests(cluster)["r"][measure]
        return p99 is not None and p99 <= slo.ttft_p99_s

    return _bisect(ok, 1, 2000) / 10


def plan(args, slo: Slo, mix: dict[str, float]) -> Plan:
    hw, profile = costs.load(args.hardware), load_profile(args.profile)
    users = {k: args.users * v / sum(mix.values()) for k, v in mix.items()}
    sessions, talker_work, turn_rate = voice_capacity(args, slo) if users.get("voice") else (0, 0.0, 0.0)
    chat_rate = users.get("chat", 0) / args.chat_think_s
    image_rate = users.get("image", 0) / args.image_think_s
    chat_cap = rate_capacity(args, slo, CHAT, "ttft_p99_s") if chat_rate + image_rate else 0.0
    # None: the hardware profile has no encoder curve (the encoder keeps the profile's bounds)
    image_cap = (
        rate_capacity(args, slo, IMAGE, "encode_p99_s")
        if image_rate and hw.stages.encoder_batch is not None
        else None
    )
    pool = profile.stages.get("realtime_decode")
    per_pool_replica = min(sessions, pool.sessions.cap) if pool is not None else 0
    voice_load = users.get("voice", 0) / sessions if sessions else 0.0
    chat_load = (chat_rate + image_rate) / chat_cap if chat_cap else 0.0
    talkers = math.ceil(users.get("voice", 0) * talker_work / args.target_utilization)
    replicas = {name: stage.autoscaling_config["min_replicas"] for name, stage in profile.stages.items()}
    replicas.update(talker=max(1, talkers), vocoder=max(1, talkers))
    if pool is not None:
        replicas["realtime_decode"] = (
            max(1, math.ceil(users.get("voice", 0) / per_pool_replica)) if sessions else 1
        )
        replicas["decode"] = max(1, math.ceil(chat_load))
    else:
        replicas["decode"] = max(1, math.ceil(voice_load + chat_load))
    if image_cap:
        replicas["encoder"] = max(1, math.ceil(image_rate / image_cap))
    devices: dict[str, float] = {}
    for name, n in replicas.items():
        gpus = profile.stages[name].ray_actor_options.get("num_gpus", 0)
        pool = STAGE_POOLS[name]
        devices[pool] = devices.get(pool, 0.0) + n * gpus
    predicted = _check(args, replicas, users, chat_rate + image_rate, pooled=pool is not None)
    capacity = {"voice_sessions_per_decode": sessions, "chat_rps_per_decode": chat_cap,
                "image_rps_per_encoder": image_cap, "talker_replicas_per_session": talker_work}  # fmt: skip
    # What the SLA autoscaling policy reads (services/extensions/ray/sla_autoscaling.py): what one
    # replica serves of each kind of offered load alone, in the gateways' load counters' units (the
    # policy adds up the kinds' shares as decode_load does).
    sla: dict[str, dict[str, float]] = {"decode": {"requests": chat_cap}} if chat_cap else {}
    if pool is not None and sessions:
        sla["realtime_decode"] = {"session_seconds": per_pool_replica}
    elif sessions:
        sla.setdefault("decode", {})["realtime_requests"] = sessions * turn_rate
    if talker_work:
        sla["talker"] = sla["vocoder"] = {"session_seconds": 1 / talker_work}
    if image_cap:
        sla["encoder"] = {"image_tiles": image_cap * sum(IMAGE.tiles) / 2}
    return Plan(replicas, devices, capacity, predicted, sla)


def _check(
    args, replicas: dict[str, int], users: dict[str, float], rate: float, pooled: bool
) -> dict[str, float | None]:
    """One decode replica at its planned share of the load — with a realtime decode pool, one of the
    pool's at its share of the sessions and one of Decode's at its share of the rest: the SLO
    figures they predict."""
    runs = (
        [("realtime_decode", users.get("voice", 0), 0.0), ("decode", 0, rate)]
        if pooled
        else [("decode", users.get("voice", 0), rate)]
    )
    v = r = None
    for stage, voice, chat_rate in runs:
        n = replicas[stage]
        cluster = Cluster(
            _deployment(args, talker_replicas=max(1, round(replicas["talker"] / n))),
            Workload(voice=VoiceSpec(sessions=round(voice / n), ramp_s=5),
                     requests={"chat": CHAT.model_copy(update={"rate": chat_rate / n})} if chat_rate else {},
                     duration_s=args.seconds, warmup_s=args.seconds / 4),
        )  # fmt: skip
        cluster.run()
        v = report.voice(cluster) if voice else v
        r = report.requests(cluster)["chat"] if chat_rate else r
    return {"ttfp_p90_s": v and v["ttfp_p90_s"], "continuity": v and v["continuous_share"],
            "ttft_p99_s": r and r["ttft_p99_s"]}  # fmt: skip


def overlay(args, result: Plan) -> dict:
    """Helm values: each deployment's autoscaling bounds (min: `--min-share` of the plan; max: the
    plan with `--headroom`) and each worker group's pods for them."""
    bounds = {
        DEPLOYMENT_NAMES[name]: {"min": max(1, math.ceil(n * args.min_share)), "max": max(1, math.ceil(n * args.headroom))}
        for name, n in result.replicas.items()
    }  # fmt: skip
    groups = {}
    for pool, devices in result.devices.items():
        if pool == "head" or not devices:
            continue
        pods = math.ceil(devices / args.devices_per_pod)
        groups[pool] = {"replicas": pods, "minReplicas": max(1, math.ceil(pods * args.min_share)),
                        "maxReplicas": max(1, math.ceil(pods * args.headroom))}  # fmt: skip
    return {"profile": args.profile, "replicaBounds": bounds, "ray": {"workerGroups": groups}}


def main(argv: list[str] | None = None) -> Plan:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--mix", default="voice:0.4,chat:0.4,image:0.2", help="user shares per class")
    ap.add_argument("--slo", default="ttfp_p90:1.0,ttft_p99:2.0,continuity:0.9")
    ap.add_argument("--hardware", default="h100-qwen3-omni-published")
    ap.add_argument("--profile", default="qwen3-omni")
    ap.add_argument("--chat-think-s", type=float, default=30.0, help="a chat user's time between requests")
    ap.add_argument("--image-think-s", type=float, default=60.0, help="an image user's time between requests")
    ap.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per trial")
    ap.add_argument("--host-tokens", type=int, default=2_000_000)
    ap.add_argument("--target-utilization", type=float, default=0.8, help="of a talker replica")
    ap.add_argument("--min-share", type=float, default=0.25, help="min replicas as a share of the plan")
    ap.add_argument("--headroom", type=float, default=1.25, help="max replicas as a multiple of the plan")
    ap.add_argument("--devices-per-pod", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/plan-values.yaml"))
    args = ap.parse_args(argv)
    slo_values = _parse(args.slo)
    slo = Slo(**{f"{k}_s" if k.startswith("tt") else k: v for k, v in slo_values.items()})
    started = time.perf_counter()
    result = plan(args, slo, _parse(args.mix))
    print(f"{args.users} users ({args.mix}) on {args.hardware} / {args.profile}; SLO {slo}")
    print(f"{'stage':>15} {'replicas':>9} {'pool':>8}")
    for name, n in result.replicas.items():
        print(f"{name:>15} {n:>9} {STAGE_POOLS[name]:>8}")
    print("devices (GPUs) per pool: " + ", ".join(f"{p} {d:g}" for p, d in result.devices.items() if d))
    print("capacity of one replica: " + ", ".join(f"{k} {v:.3g}" if v is not None else f"{k} unknown (no curve)"
                                                  for k, v in result.capacity.items()))  # fmt: skip
    print("predicted at the plan: " + ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} -"
                                               for k, v in result.predicted.items()))  # fmt: skip
    print("SLA autoscaling, per replica (a profile's stages.<stage>.sla.per_replica): "
          + "; ".join(f"{stage} {', '.join(f'{k} {v:.3g}' for k, v in kinds.items())}" for stage, kinds in result.sla.items()))  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# make plan: python -m planner.plan --users {args.users} --mix {args.mix} --slo {args.slo} " \
             f"--hardware {args.hardware} --profile {args.profile}\n"  # fmt: skip
    args.out.write_text(header + yaml.safe_dump(overlay(args, result), sort_keys=False))
    print(f"[plan] wrote {args.out} in {time.perf_counter() - started:.1f} s")
    return result


if __name__ == "__main__":
    main()
