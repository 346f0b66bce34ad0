"""`make bench-fairness`: one tenant bursting far over its quota must not hurt another tenant.

Same cluster, same run: tenant B sends chat requests at a steady open-loop rate, first alone, then
while tenant A sends at `--burst` times its quota. A's excess is refused with 429 at the gateway
(interactive class) before it costs any stage work. Reported: B's p50/p99 latency alone and
alongside A, the ratio (target: p99 rises by at most 20%), and A's outcome counts.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import platform
import statistics
import time
import uuid

import httpx
import redis.asyncio as aioredis

from loadtest import results
from loadtest.clients.client import stream_chat
from loadtest.clients.workload import chat_prompts
from services import runtime
from services.models.profile import load_profile
from services.quota.tenants import Limits, TenantSpec, put_tenant


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


async def _open_loop(url: str, key: str, bodies: list[dict], rate: float, duration: float) -> list:
    """Send at `rate` req/s for `duration` s regardless of responses; returns (ok, status, e2e)."""
    out: list = []
    async with httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {key}"}) as client:

        async def one(body):
            r = await stream_chat(client, url, body)
            status = 200 if r.ok else int(r.error.split()[1].rstrip(":")) if r.error.startswith("HTTP") else 0
            out.append((r.ok, status, r.e2e))

        tasks, t0, i = [], time.perf_counter(), 0
        while (now := time.perf_counter() - t0) < duration:
            tasks.append(asyncio.create_task(one(bodies[i % len(bodies)])))
            i += 1
            await asyncio.sleep(max(0.0, i / rate - now))
        await asyncio.gather(*tasks)
    return out


async def _tenants(redis_url: str, a_tokens_per_min: float) -> tuple[str, str]:
    keys = (f"sk-a-{uuid.uuid4().hex}", f"sk-b-{uuid.uuid4().hex}")
    client = aioredis.Redis.from_url(redis_url)
    try:
        await put_tenant(
            client, TenantSpec(id="tenant-a", per_minute=Limits(text_tokens=a_tokens_per_min)), [keys[0]]
        )
        await put_tenant(client, TenantSpec(id="tenant-b"), [keys[1]])
    finally:
        await client.aclose()
    return keys


async def run(url: str, redis_url: str, args) -> dict:
    model = load_profile(args.profile).served_model_name
    bodies = [
        {
            "model": model,
            "messages": [{"role": "user", "content": p.text}],
            "max_tokens": p.max_tokens,
            "temperature": 0,
        }
        for p in chat_prompts(64, seed=3, max_tokens=args.max_tokens, median_words=30)
    ]
    # A request costs about its text tokens + max_tokens; A's quota covers a twentieth of B's rate,
    # so what A is entitled to barely loads the machine and any harm to B would come from its excess.
    per_request = args.max_tokens + 45
    a_quota_rate = args.b_rate / 20
    key_a, key_b = await _tenants(redis_url, a_quota_rate * 60 * per_request)
    await _open_loop(url, key_b, bodies, args.b_rate, 5)  # warm-up
    # Alternate the two conditions so drift on a shared machine hits both alike.
    alone, with_a, a = [], [], []
    for _ in range(args.rounds):
        alone.append(await _open_loop(url, key_b, bodies, args.b_rate, args.duration))
        b_part, a_part = await asyncio.gather(
            _open_loop(url, key_b, bodies, args.b_rate, args.duration),
            _open_loop(url, key_a, bodies, a_quota_rate * args.burst, args.duration),
        )
        with_a.append(b_part)
        a += a_part

    def summary(rounds: list[list]) -> dict:
        lat = [e for rs in rounds for ok, _, e in rs if ok]
        p99s = [_p([e for ok, _, e in rs if ok], 0.99) for rs in rounds]
        return {
            "n": sum(len(rs) for rs in rounds),
            "errors": sum(not ok for rs in rounds for ok, _, _ in rs),
            "p50_s": _p(lat, 0.5),
            "p99_s": _p(lat, 0.99),
            "p99_per_round_s": p99s,
            "p99_median_of_rounds_s": statistics.median(p99s),
        }

    out = {
        "b_alone": summary(alone),
        "b_with_a": summary(with_a),
        "a": {
            "sent": len(a),
            "ok": sum(ok for ok, _, _ in a),
            "rejected_429": sum(s == 429 for _, s, _ in a),
        },
        "a_quota_req_per_s": a_quota_rate,
        "a_sent_req_per_s": a_quota_rate * args.burst,
        "b_req_per_s": args.b_rate,
        "rounds": args.rounds,
    }
    out["b_p99_ratio"] = out["b_with_a"]["p99_s"] / out["b_alone"]["p99_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--b-rate", type=float, default=4.0, help="tenant B's requests per second")
    ap.add_argument("--burst", type=float, default=10.0, help="tenant A sends this many times its quota")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per round and condition")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    with runtime.temporary(args.profile, prefix="omniray-fairness-") as cluster:
        out = asyncio.run(run(f"{cluster.http_url}/v1/chat/completions", cluster.redis_url, args))
    out.update(
        profile=args.profile, machine=f"{platform.node()} {platform.processor() or platform.machine()}"
    )
    b, w, a = out["b_alone"], out["b_with_a"], out["a"]
    print(
        f"  B alone      p50 {b['p50_s'] * 1000:6.0f} ms  p99 {b['p99_s'] * 1000:6.0f} ms  errors {b['errors']}"
    )
    print(
        f"  B with A     p50 {w['p50_s'] * 1000:6.0f} ms  p99 {w['p99_s'] * 1000:6.0f} ms  errors {w['errors']}"
    )
    print(
        f"  A sent {a['sent']} ({out['a_sent_req_per_s']:.1f}/s, {args.burst:g}x its quota): {a['ok']} ok, {a['rejected_429']} x 429"
    )
    print(
        f"[fairness] B p99 with A / alone = {out['b_p99_ratio']:.2f} (target <= 1.20); per round "
        f"alone {[round(x * 1000) for x in b['p99_per_round_s']]} ms, with A {[round(x * 1000) for x in w['p99_per_round_s']]} ms"
    )
    print(f"[fairness] wrote {results.write('fairness', args.profile, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
