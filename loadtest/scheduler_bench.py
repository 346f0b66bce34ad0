"""Decision overhead of the interaction-aware scheduler per scheduling round: the scheduler's own
ranking step (`UrgencyOrder._rank` of services/extensions/vllm/scheduler.py: read the board copy, build
candidates, rank, reorder)
over N running requests of N live sessions with mixed states. LiveServe reports 0.093 ms average /
0.222 ms P90 at 256 sessions.

    python -m loadtest.scheduler_bench --sessions 256 --rounds 2000
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from types import SimpleNamespace

from kv_store.metrics import Recorder
from services.extensions.vllm import engine_metrics
from services.extensions.vllm.scheduler import SESSION_ARG, UrgencyOrder
from services.playback.board import BoardView
from services.policies import urgency


def _fixture(n: int, policy: str, seed: int = 0):
    rng = random.Random(seed)
    now = time.time()
    views, running = {}, []
    for i in range(n):
        sid = f"t/s{i}"
        views[sid] = BoardView(session_id="s", played_ms=0.0, age_s=0.0, ms_per_token=None, buffered_ms=rng.choice([0, rng.uniform(0, 12_000)]), playing=True,
                               speaking=rng.random() < 0.1, responding=True, first_audio=rng.random() < 0.8,
                               barge_ins=rng.randint(0, 3), responses=rng.randint(1, 6), reply_gap_ms=None,
                               at=now)  # fmt: skip
        extra = {SESSION_ARG: sid} if rng.random() < 0.95 else {}
        running.append(SimpleNamespace(arrival_time=now - rng.uniform(0, 60), num_computed_tokens=rng.randint(100, 8000), num_output_tokens=rng.randint(0, 300),
                                       sampling_params=SimpleNamespace(extra_args=extra)))  # fmt: skip
    order = UrgencyOrder(urgency.create(policy), lambda: views, Recorder(engine_metrics.ENGINE_SPEC))
    return order, SimpleNamespace(running=running, kv_cache_manager=SimpleNamespace(usage=0.6))


def measure(n: int, rounds: int, policy: str) -> list[float]:
    order, sched = _fixture(n, policy)
    original = list(sched.running)
    times = []
    for _ in range(rounds):
        sched.running = list(original)
        t = time.perf_counter()
        held = order._rank(sched, order.views())
        times.append(time.perf_counter() - t)
        sched.running.extend(held)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args()
    print(f"{'sessions':>8} {'policy':>9} {'avg ms':>8} {'p50 ms':>8} {'p90 ms':>8}")
    for n in args.sessions:
        for policy in ("fcfs", "liveserve"):
            ms = sorted(t * 1000 for t in measure(n, args.rounds, policy))
            p90 = ms[int(0.9 * (len(ms) - 1))]
            print(f"{n:>8} {policy:>9} {statistics.mean(ms):8.3f} {statistics.median(ms):8.3f} {p90:8.3f}")


if __name__ == "__main__":
    main()
