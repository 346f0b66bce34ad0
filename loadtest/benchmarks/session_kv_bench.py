"""An hour of one realtime conversation on the bounded decode engine, turn by turn, on an accelerated
clock (the user speaks every `--turn-s` of simulated time; nothing waits for it): session KV
(`engine.session_kv`: each turn appended to the session's one long-lived request) vs per-turn
requests on the same sinks + window engine (each turn's request prefills the conversation, its
oldest tokens dropped to fit `max_model_len`, as the realtime conversation window does). Per turn:
the engine's resident KV (the most blocks the pool held during the turn), the prompt
tokens computed, the time to the reply's first token. Both arms through ThinkerEngine.decode (the
decode stage's entry) on one tiny-thinker engine, one after the other; the conversation (user
tokens, greedy replies) is the same text in both.

    python -m loadtest.benchmarks.session_kv_bench              # one simulated hour: 360 turns of 10 s
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from loadtest import results
from services.extensions.vllm import engine_metrics, sink_window, stat_logger
from services.extensions.vllm.specs import SinkWindowParams
from services.models.profile import SessionKvSpec, load_profile

BLOCK, POOL = 32, 256
# prompt tokens computed, streaming-input chunks included (vLLM's own counter takes first prefills only)
COMPUTED = "omniray_scheduler_prompt_tokens_computed_total{}"


def _engine(args):
    from services.engine.thinker import ThinkerEngine

    tiny = load_profile("tiny")
    spec = tiny.engine.model_copy(
        update={
            "kv_transfer": "none",
            "block_size": BLOCK,
            "max_model_len": args.max_model_len,
            "sink_window": SinkWindowParams(sink_tokens=args.sinks, window_tokens=args.window),
            "session_kv": SessionKvSpec(max_sessions=2, idle_s=3600),
            "extra": {"num_gpu_blocks_override": POOL, "max_num_batched_tokens": 1024},
        }
    )
    return ThinkerEngine(tiny.model_copy(update={"engine": spec}), "decode")


def _occupancy() -> float:
    return engine_metrics.TOTALS.values.get(stat_logger.occupancy_key(), 0.0) * (POOL - 1)


async def _turn(engine, session: str, ids: list[int], n: int, max_tokens: int) -> dict:
    from omni.v1 import common_pb2, stages_pb2

    ctx = common_pb2.RequestContext(request_id=f"{session or 'one'}-t{n}", session_id=session, tenant="b")
    prompt = stages_pb2.Prompt(segments=[stages_pb2.PromptSegment(tokens=stages_pb2.TokenSpan(ids=ids))])
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0)
    computed = engine_metrics.TOTALS.values.get(COMPUTED, 0.0)
    t0, first, reply, most = time.perf_counter(), None, [], 0.0
    async for d in engine.decode(ctx.request_id, prompt, sampling, "", ctx):
        first = first or time.perf_counter()
        reply += d.token_ids
        most = max(most, _occupancy())
    return {
        "reply": reply,
        "ttft_s": (first or time.perf_counter()) - t0,
        "computed": engine_metrics.TOTALS.values.get(COMPUTED, 0.0) - computed,
        "blocks_during": round(most),
        "prompt": len(ids),
    }


async def _arm(engine, args, session: str) -> list[dict]:
    """One conversation of `turns` turns; per-turn requests (no session) keep the newest tokens."""
    rng = random.Random(0)
    ids = [rng.randrange(5, 2000) for _ in range(args.system_tokens)]
    keep = args.max_model_len - args.reply_tokens - 8
    out = []
    for n in range(args.turns):
        ids = ids + [rng.randrange(5, 2000) for _ in range(args.user_tokens)]
        sent = (
            ids
            if session or len(ids) <= keep
            else ids[: args.system_tokens] + ids[-(keep - args.system_tokens) :]
        )
        turn = await _turn(engine, session, sent, n, args.reply_tokens)
        ids = ids + turn.pop("reply")
        out.append(turn)
    return out


def _summary(turns: list[dict], turn_s: float) -> dict:
    tenth = max(1, len(turns) // 6)  # the first and the last ten minutes of an hour
    return {
        "computed_tokens": sum(t["computed"] for t in turns),
        "blocks_during_max": max(t["blocks_during"] for t in turns),
        "blocks_during_first_10min": sorted({t["blocks_during"] for t in turns[:tenth]}),
        "blocks_during_last_10min": sorted({t["blocks_during"] for t in turns[-tenth:]}),
        "ttft_first_10min_ms": 1000 * statistics.median(t["ttft_s"] for t in turns[:tenth]),
        "ttft_last_10min_ms": 1000 * statistics.median(t["ttft_s"] for t in turns[-tenth:]),
        "simulated_min": len(turns) * turn_s / 60,
    }


async def main_async(args) -> dict:
    engine = _engine(args)
    try:
        await _turn(engine, "", [7] * 64, -1, 4)  # warm-up
        session = _summary(await _arm(engine, args, "hour"), args.turn_s)
        outcomes = dict(engine.session_kv.outcomes)
        await engine.session_kv.close_all()
        per_turn = _summary(await _arm(engine, args, ""), args.turn_s)
    finally:
        engine.shutdown()
    return {"session_kv": session, "per_turn": per_turn, "session_outcomes": outcomes,
            "bound_blocks": sink_window.max_resident_blocks(BLOCK, args.sinks, args.window)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=360)
    ap.add_argument("--turn-s", type=float, default=10.0, help="simulated time per turn")
    ap.add_argument("--system-tokens", type=int, default=48)
    ap.add_argument("--user-tokens", type=int, default=24)
    ap.add_argument("--reply-tokens", type=int, default=16)
    ap.add_argument("--sinks", type=int, default=64)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--max-model-len", type=int, default=4096)
    args = ap.parse_args()
    report = asyncio.run(main_async(args))
    print(f"{args.turns} turns x {args.turn_s:.0f} s simulated; sinks {args.sinks} + window {args.window}, "
          f"block {BLOCK}: bound {report['bound_blocks']} blocks; session outcomes {report['session_outcomes']}")  # fmt: skip
    header = ("arm", "computed tok", "blocks max", "blocks: first / last 10 min", "TTFT first/last 10 min")
    print(" | ".join(header))
    for arm in ("session_kv", "per_turn"):
        s = report[arm]
        print(f"{arm} | {s['computed_tokens']:.0f} | {s['blocks_during_max']} | {s['blocks_during_first_10min']} / "
              f"{s['blocks_during_last_10min']} | {s['ttft_first_10min_ms']:.1f}/{s['ttft_last_10min_ms']:.1f} ms")  # fmt: skip
    ratio = report["per_turn"]["computed_tokens"] / max(report["session_kv"]["computed_tokens"], 1)
    print(f"prompt tokens computed: per-turn / session KV = {ratio:.1f}x")
    print("raw:", results.write("session-kv", "tiny", {**results.header("tiny", **vars(args)), **report}))


if __name__ == "__main__":
    main()
