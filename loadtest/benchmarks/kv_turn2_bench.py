"""Turn-2 time to first token with the KV store vs recomputing the history.

Two engines of the profile (as the prefill and decode deployments run them, each in its own
processes, on its own core). Engine A answers turn 1 of a session with a `--history`-token prompt and
saves its pages. Engine B then takes turn 2 (history + A's reply + `--new` tokens): once loading the
history from the store (pulled from A over NIXL), once with the store bypassed (recompute), each on
its own fresh history so neither run finds the other's KV in B's own prefix cache. Pairs alternate
their order; medians and the ratio are printed and written to loadtest/results/.

    python -m loadtest.benchmarks.kv_turn2_bench --profile small --history 2048 --pairs 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from loadtest import results


def _prompt(ids: list[int]):
    from omni.v1 import stages_pb2

    return stages_pb2.Prompt(segments=[stages_pb2.PromptSegment(tokens=stages_pb2.TokenSpan(ids=ids))])


async def _ttft(engine, rid: str, ids: list[int], kv: dict | None) -> float:
    from omni.v1 import common_pb2

    params = engine.sampling_params(
        common_pb2.SamplingParams(max_tokens=1, temperature=0), kv_transfer_params=kv, max_tokens=1
    )
    started = time.perf_counter()
    async for _ in engine.engine.generate({"prompt_token_ids": ids}, params, request_id=rid):
        return time.perf_counter() - started
    raise RuntimeError("no output")


async def run(profile_name: str, history: int, new: int, pairs: int, reply: int) -> dict:
    from omni.v1 import common_pb2

    from services.engine.thinker import ThinkerEngine
    from services.models.profile import load_profile

    profile = load_profile(profile_name)
    profile.engine.max_model_len = max(profile.engine.max_model_len, history + reply + new + 8)
    first, second = ThinkerEngine(profile, "prefill"), ThinkerEngine(profile, "decode")
    rng = random.Random(0)
    vocab = 1000

    async def session(tag: str) -> list[int]:
        """Turn 1 on the first engine; returns turn 2's prompt."""
        ids = [rng.randrange(10, vocab) for _ in range(history)]
        ctx = common_pb2.RequestContext(request_id=tag, tenant="bench", session_id=f"bench/{tag}")
        out = []
        sampling = common_pb2.SamplingParams(max_tokens=reply, temperature=0)
        async for d in first.decode(f"{tag}-1", _prompt(ids), sampling, "", ctx):
            out.extend(d.token_ids)
        return ids + out + [rng.randrange(10, vocab) for _ in range(new)]

    rows = []
    try:
        # Warm both engines (first-request costs are not what is measured).
        warm = await session("warm")
        await _ttft(second, "warm-2", warm, {"omniray": {"bypass": True}})
        for i in range(pairs):
            stored, recomputed = await session(f"s{i}"), await session(f"r{i}")
            before = second.prompt_token_sources()
            order = ["store", "recompute"] if i % 2 == 0 else ["recompute", "store"]
            row = {}
            for mode in order:
                if mode == "store":
                    kv = {"omniray": {"kind": "session", "salt": "bench", "session": f"bench/s{i}"}}
                    row["store_s"] = await _ttft(second, f"s{i}-2", stored, kv)
                else:
                    row["recompute_s"] = await _ttft(
                        second, f"r{i}-2", recomputed, {"omniray": {"bypass": True}}
                    )
            after = second.prompt_token_sources()
            row["loaded_tokens"] = after.get("external_kv_transfer", 0) - before.get(
                "external_kv_transfer", 0
            )
            row["prompt_tokens"] = len(stored)
            rows.append(row)
            print(
                f"pair {i}: store {row['store_s'] * 1000:.0f} ms ({row['loaded_tokens']:.0f} of "
                f"{len(stored)} tokens loaded), recompute {row['recompute_s'] * 1000:.0f} ms",
                flush=True,
            )
    finally:
        first.shutdown()
        second.shutdown()
    store = statistics.median(r["store_s"] for r in rows)
    recompute = statistics.median(r["recompute_s"] for r in rows)
    return {
        "profile": profile_name,
        "history_tokens": history,
        "new_tokens": new,
        "pairs": rows,
        "store_ttft_median_s": store,
        "recompute_ttft_median_s": recompute,
        "ratio_recompute_over_store": recompute / store,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="small")
    ap.add_argument("--history", type=int, default=2048)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--reply", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    from services import runtime

    port = runtime.free_port()
    redis = runtime.start_redis(port, Path(tempfile.mkdtemp(prefix="kv-turn2-")))
    os.environ["OMNIRAY_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    try:
        data = asyncio.run(run(args.profile, args.history, args.new, args.pairs, args.reply))
    finally:
        redis.terminate()
    print(
        f"turn-2 TTFT at {args.history}-token history ({args.profile}): store "
        f"{data['store_ttft_median_s'] * 1000:.0f} ms, recompute {data['recompute_ttft_median_s'] * 1000:.0f} ms "
        f"-> recompute/store = {data['ratio_recompute_over_store']:.1f}x (median of {args.pairs} pairs)"
    )
    print(f"results: {results.write('kv_turn2', args.profile, data)}")


if __name__ == "__main__":
    main()
