"""What a simulated run measured, as `make bench-voice` and `make bench` report it (WORKLOADS.md):
P50/P90 audio TTFP after end of speech, playback continuity, wasted tokens, useful RPS; TTFT and
end-to-end latency of the other request classes."""

from __future__ import annotations

import statistics


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def voice(cluster) -> dict:
    """Turns that started after the warm-up and ended (heard, or cut by a barge-in) in the run."""
    w = cluster.w
    turns = [t for t in cluster.voice.turns if t.start >= w.warmup_s and (t.heard_whole or t.barged)]
    ttfp = [t.ttfp_s for t in turns if t.ttfp_s is not None]
    heard = [t for t in turns if t.heard_whole]
    continuous = [t for t in heard if t.longest_stall_s <= 0.1]
    played = sum(t.audio_s for t in turns)
    stalled = sum(t.stalled_s for t in turns)
    generated = sum(t.generated for t in turns)
    wasted = sum(t.wasted for t in turns)
    span = max(1e-9, w.duration_s - w.warmup_s)
    return {
        "turns": len(turns),
        "barge_ins": sum(t.barged for t in turns),
        "ttfp_p50_s": quantile(ttfp, 0.5),
        "ttfp_p90_s": quantile(ttfp, 0.9),
        # the first token's share of it (make bench-voice records the first transcript text's)
        "ttft_p50_s": quantile([t.ttft_s for t in turns if t.ttft_s is not None], 0.5),
        "continuity": 1 - stalled / max(played + stalled, 1e-9),
        "continuous_share": len(continuous) / max(1, len(heard)),
        "generated_tokens": generated,
        "wasted_tokens": wasted,
        "wasted_share": wasted / max(1, generated),
        "useful_rps": len(continuous) / span,
        "refused_sessions": cluster.voice.refused,
    }


def requests(cluster) -> dict:
    out = {}
    for name, records in cluster.requests.items():
        counted = [r for r in records if r["arrival"] >= cluster.w.warmup_s]
        done = [r for r in counted if "e2e" in r]
        ttft = [r["ttft"] for r in done]
        encode = [r["encoded"] - r["arrival"] for r in done if "encoded" in r]
        out[name] = {
            "requests": len(done),
            "refused": sum(1 for r in counted if r.get("refused")),
            "quota_wait_p99_s": quantile(
                [r["admitted"] - r["arrival"] for r in done if "admitted" in r], 0.99
            ),
            "encode_p99_s": quantile(encode, 0.99),
            "ttft_p50_s": quantile(ttft, 0.5),
            "ttft_p99_s": quantile(ttft, 0.99),
            "e2e_p50_s": quantile([r["e2e"] for r in done], 0.5),
            "rps": len(done) / max(1e-9, cluster.w.duration_s - cluster.w.warmup_s),
        }
    return out


def engines(cluster) -> dict:
    reps = cluster.replicas
    kv = [r.kv.stats for r in reps]
    prompt_pages = sum(s["prompt_pages"] for s in kv)
    return {
        "decode_busy": statistics.mean(r.busy_s / max(cluster.env.now, 1e-9) for r in reps),
        "steps": sum(r.steps for r in reps),
        "preempted": sum(r.preempted for r in reps),
        "prefix_hit_share": sum(s["hit_pages"] for s in kv) / max(1, prompt_pages),
        "evicted_pages": sum(s["evicted"] for s in kv),
        "preloaded_pages": sum(s["preload_pages"] for s in kv),
    }
