"""`make bench-turn-cost`: what one realtime turn costs the gateway as a conversation grows.

One session on the profile with the conversation window opened to 32 turns, so that nothing is
dropped: `--turns` turns of `--seconds` of speech each (appended as 100 ms chunks, committed by hand),
a text reply of `--max-tokens` tokens. Per turn, the CPU time of the gateway replica (the process
that holds the session) and of the encoder replica from the first append to `response.done`, read
from /proc. A turn should cost the gateway what it adds (its audio, its reply), not the history: the
slope of gateway CPU over the turn number, and the last turns' cost over the first's, say whether it
does. Repeated `--repeat` times on the same cluster (fresh sessions); means per turn (/proc counts
CPU in 10 ms ticks: the mean over repeats resolves below a tick, a median would not).

    python -m loadtest.benchmarks.realtime_turn_cost --profile tiny --turns 10
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from loadtest import results
from loadtest.benchmarks.profiles import derive
from loadtest.clients.realtime_client import CHUNK_MS, RATE, RealtimeClient
from loadtest.clients.speech import SENTENCES, speech
from services import runtime
from services.realtime.server_events import WHOLE


def _replica(run_id: str, deployment: str) -> psutil.Process:
    for p in runtime.processes(run_id):
        try:
            if p.cmdline() and p.cmdline()[0] == f"ray::ServeReplica:omniray:{deployment}":
                return p
        except psutil.Error:
            continue
    raise RuntimeError(f"no {deployment} replica")


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _session(url: str, utterance: bytes, turns: int, max_tokens: int, procs: dict) -> list[dict]:
    client = RealtimeClient(url)
    try:
        client.wait("session.created")
        client.send({"type": "session.update", "session": {
            "type": "realtime", "output_modalities": ["text"], "max_output_tokens": max_tokens,
            "audio": {"input": {"turn_detection": None}}}})  # fmt: skip
        client.wait("session.updated")
        step = RATE * 2 * CHUNK_MS // 1000
        out = []
        for _ in range(turns):
            before = {name: _cpu_s(p) for name, p in procs.items()}
            mark, t0 = client.mark(), time.monotonic()
            for k in range(0, len(utterance), step):
                client.append(utterance[k : k + step])
            client.send({"type": "input_audio_buffer.commit"})
            client.send({"type": "response.create"})
            done = client.event(client.wait("response.done", mark))
            if done["response"]["status"] not in WHOLE:
                raise RuntimeError(f"turn failed: {client.errors()[-1:]}")
            out.append(
                {
                    "wall_s": time.monotonic() - t0,
                    **{f"{name}_cpu_s": _cpu_s(p) - before[name] for name, p in procs.items()},
                    "input_tokens": (done["response"].get("usage") or {}).get("input_tokens", 0),
                }
            )
        return out
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=3.0, help="speech per turn")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=8)
    args = ap.parse_args(argv)

    def edit(data: dict) -> None:
        data.setdefault("realtime", {})["max_history_turns"] = 32
        data.setdefault("limits", {})["max_media_items"] = 1024

    utterance = b"".join(speech(s) for s in SENTENCES)
    utterance = (utterance * 4)[: int(args.seconds * RATE) * 2]
    with tempfile.TemporaryDirectory(prefix="omniray-turns-") as tmp:
        path = derive(args.profile, Path(tmp), f"{args.profile}-turns", edit)
        with runtime.temporary(str(path), prefix="omniray-turns-") as cluster:
            url = f"{cluster.http_url.replace('http', 'ws', 1)}/v1/realtime"
            procs = {name: _replica(cluster.run_id, name.capitalize()) for name in ("gateway", "encoder")}
            _session(url, utterance, 2, args.max_tokens, procs)  # warm-up
            runs = [_session(url, utterance, args.turns, args.max_tokens, procs) for _ in range(args.repeat)]
    per_turn = [
        {key: statistics.fmean(run[t][key] for run in runs) for key in runs[0][0]} for t in range(args.turns)
    ]
    gateway_ms = [1000 * t["gateway_cpu_s"] for t in per_turn]
    slope = float(np.polyfit(np.arange(1, args.turns + 1), gateway_ms, 1)[0])
    first, last = statistics.mean(gateway_ms[:3]), statistics.mean(gateway_ms[-3:])
    print(f"{'turn':>4} {'input tok':>9} {'gateway ms':>10} {'encoder ms':>10} {'wall ms':>8}")
    for i, t in enumerate(per_turn, 1):
        print(
            f"{i:>4} {t['input_tokens']:>9.0f} {1000 * t['gateway_cpu_s']:>10.1f} "
            f"{1000 * t['encoder_cpu_s']:>10.1f} {1000 * t['wall_s']:>8.0f}"
        )
    print(f"gateway CPU per turn: slope {slope:+.2f} ms/turn; last 3 / first 3 = {last / first:.2f}")
    report = {"args": vars(args), "per_turn": per_turn, "runs": runs, "slope_ms_per_turn": slope,
              "last3_over_first3": last / first}  # fmt: skip
    print(f"saved {results.write('turn-cost', args.profile, report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
