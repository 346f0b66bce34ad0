"""`make bench-eviction`: eviction decision time with 10k resident pages, per policy.

One decision = pick the victim, evict it, insert the page that needed the room; between decisions
one page's predicted next use changes (a session's playback moved). The scan baseline answers the
same question as the next-use policy by looking at every page. Reported: mean and p99 microseconds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from kv_store.eviction import PageInfo, create
from loadtest import results


class ScanNextUse:
    """The same choice as `next_use`, by a full scan per decision (the baseline the heap replaces)."""

    def __init__(self, predict):
        self.predict, self.info = predict, {}

    def insert(self, page, info):
        self.info[page] = info

    def update(self, page):
        pass

    def remove(self, page, evicted=False):
        self.info.pop(page, None)

    def victim(self):
        return max(self.info, key=lambda p: (self.predict(p), self.info[p].position), default=None)


def run(name: str, pages: int, decisions: int, seed: int) -> dict:
    rng = random.Random(seed)
    next_use: dict[int, float] = {}
    predict = next_use.__getitem__
    if name == "next_use":
        policy = create("next_use", predict=predict)
    elif name == "next_use_scan":
        policy = ScanNextUse(predict)
    else:
        policy = create(name)

    def info() -> PageInfo:
        return PageInfo(size=rng.choice([1, 4]), cost=rng.choice([1.0, 8.0]), position=rng.randrange(64))

    for page in range(pages):
        next_use[page] = rng.expovariate(1 / 30)
        policy.insert(page, info())
    times = []
    new = pages
    for _ in range(decisions):
        moved = rng.randrange(new - pages, new)  # a resident page's prediction changes
        if moved in next_use:
            next_use[moved] = rng.expovariate(1 / 30)
        next_use[new] = rng.expovariate(1 / 30)
        t0 = time.perf_counter()
        if hasattr(policy, "update"):
            policy.update(moved)
        victim = policy.victim()
        policy.remove(victim, evicted=True)
        policy.insert(new, info())
        times.append(time.perf_counter() - t0)
        del next_use[victim]
        new += 1
    times.sort()
    return {
        "mean_us": statistics.fmean(times) * 1e6,
        "p99_us": times[int(0.99 * (len(times) - 1))] * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=10_000)
    ap.add_argument("--decisions", type=int, default=5_000)
    args = ap.parse_args(argv)
    out = {"pages": args.pages, "decisions": args.decisions}
    for name in ("lru", "tinylfu", "greedy_dual_size", "next_use", "next_use_scan"):
        decisions = args.decisions if name != "next_use_scan" else max(200, args.decisions // 25)
        r = out[name] = run(name, args.pages, decisions, seed=7)
        print(f"  {name:17s} mean {r['mean_us']:9.1f} us  p99 {r['p99_us']:9.1f} us", flush=True)
    ratio = out["next_use_scan"]["mean_us"] / out["next_use"]["mean_us"]
    print(
        f"[eviction] next_use (indexed heap) mean {out['next_use']['mean_us'] / 1000:.4f} ms "
        f"(target < 0.2 ms); the scan is {ratio:.0f}x slower"
    )
    print(f"[eviction] wrote {results.write('eviction', None, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
