"""`make bench-voice`: the same N concurrent voice sessions against two policy sets on the same
engine in one run — baseline (FCFS scheduler + LRU eviction, no preload) vs interaction-aware
(LiveServe urgency + next-use eviction and speech-triggered preload fed by the session board) — at
barge-in probability 0 and 0.5. `--sets` runs others beside the baseline: each part of the
interaction-aware set alone (`+scheduling`, `+eviction`, `+preload`: LiveServe's ablation).

Each session is a real-time WebSocket client: it speaks (espeak-ng speech at real-time pace, then
silence; server VAD ends the turn), plays the reply's audio at real time (reporting playback with
`omniray.playback.progress`) and, with probability p, talks over it (a barge-in) at a point drawn
as LiveServe does (WORKLOADS.md): first audio plus a sample of the output audio durations of whole
replies seen in the run before the cell (the p = 0 runs come first); a cut past the end of its
reply is no barge-in. Otherwise it waits until playback ends, then a reply gap (0.5–3 s, uniform).
Each reply's length is drawn per turn, log-uniform between `--min-tokens` and `--max-tokens`
(WORKLOADS.md: output 30–300 tokens; a random-weight thinker's logits are nearly flat, so it ends a
reply early only where it samples end-of-text — about 1 token in 2,000 on the tiny thinker — and
`max_output_tokens` is nearly always its length); lengths and gaps come from a per-session seed, the
same in every arm. A reply whose first token is end-of-text is empty and has no audio: counted as
`silent`, with what its `response.done` says (`silent_ends`: `completed`, one output token).

Both sets' deployments are up for the whole run (one sits idle while the other runs); each cell's
turns run in `--blocks` blocks of fresh sessions, alternating between the sets (A B B A …), so that a
drift of the machine's speed during the run lands on both sets alike rather than on whichever ran
second. Block b's sessions are seeded apart from the other blocks' and the same in every set.

Printed: P90 audio TTFP after end of speech (`speech_stopped` → first audio delta), wasted tokens
(cut by barge-ins), playback continuity (share of playback time not stalled on an empty buffer;
share of responses heard whole with no stall over 100 ms), responses heard whole per second; and the
ratios interaction-aware / baseline. With `--sweep`, each set runs the listed session counts at
p = 0 and reports its useful RPS: responses heard whole per second at the highest count with ≥ 90%
continuous responses and P90 TTFP ≤ `--slo-s`.

    python -m loadtest.benchmarks.voice_bench --profile tiny --sessions 4 --turns 3
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import os
import random
import statistics
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import websockets
from prometheus_client.parser import text_string_to_metric_families

from loadtest import results
from loadtest.benchmarks import process_cpu
from loadtest.benchmarks.profiles import derive, widen_thinker
from loadtest.clients.realtime_client import RATE, RealtimeClient
from loadtest.clients.speech import SENTENCES, speech
from loadtest.clients.workload import REPLY_TOKENS, reply_length
from services import runtime
from services.realtime.server_events import TRY_AGAIN_LATER, WHOLE

GAP_MS = 100  # a longer stall makes a response discontinuous (vLLM-Omni's benchmark default)
VAD_SILENCE_MS = 500  # the sessions' server VAD ends a turn after this much silence
# (scheduler: services/policies/urgency, KV eviction: kv_store/eviction, speech-triggered preload:
# kv_store/follower.py): the baseline, LiveServe's whole set, and each of its parts alone on the
# baseline (LiveServe's ablation; planner/simulate.py's sets of the same names)
POLICY_SETS = {
    "baseline": ("fcfs", "lru", False),
    "interaction": ("liveserve", "next_use", True),
    "+scheduling": ("liveserve", "lru", False),
    "+eviction": ("fcfs", "next_use", False),
    "+preload": ("fcfs", "lru", True),
}
DEFAULT_SETS = ["baseline", "interaction"]


@dataclass
class SessionStats:
    ttfp_s: list[float] = field(default_factory=list)
    ttfp_at: list[float] = field(default_factory=list)  # when each first audio came (time.monotonic())
    created_s: list[float] = field(default_factory=list)  # speech_stopped → response.created
    # speech_stopped → the reply's first transcript text (the thinker's first streamed tokens), per
    # TTFP: what of a slow first audio is the thinker's and what comes after it
    text_s: list[float | None] = field(default_factory=list)
    # (turn, prompt tokens) of each response (its response.done's usage): where a turn's prompt
    # crosses the profile's `disagg_min_prompt_tokens`, it is prefilled on the prefill stage
    prompt_tokens: list[tuple[int, int]] = field(default_factory=list)
    played_s: float = 0.0
    stalled_s: float = 0.0
    wasted: int = 0
    generated: int = 0
    barge_ins: int = 0
    heard: int = 0  # responses played to their end (no barge-in)
    continuous: int = 0  # of those, the ones with no stall over GAP_MS
    silent: int = 0  # responses that ended without any audio (no TTFP)
    # of those: (turn, status, why (status_details' reason or error code), output tokens)
    silent_ends: list[tuple[int, str, str, int]] = field(default_factory=list)
    # stalls over GAP_MS: (turn, where in the reply (s played), how long (s))
    stalls: list[tuple[int, float, float]] = field(default_factory=list)
    refused: bool = False  # the server refused the session (its close code 1013: try again later)
    errors: list[str] = field(default_factory=list)


class Client:
    """One voice session: the shared realtime client (loadtest/clients/realtime_client.py) collects server
    events; the main thread speaks, plays and barges in."""

    def __init__(self, url: str, utterances: list[bytes], barge_p: float, seed: int, tokens: tuple[int, int] = REPLY_TOKENS,
                 session: dict | None = None, durations: list[float] | None = None,
                 sample: tuple[float, ...] = ()):  # fmt: skip
        self.utterances, self.barge_p, self.rng = utterances, barge_p, random.Random(seed)
        # Reply lengths and gaps: their own stream, so they do not depend on the barge-in draws.
        self.workload, self.tokens = random.Random(seed + 1_000_003), tokens
        # Output audio durations (s) of whole responses: added to `durations` (the run's, shared by its
        # sessions); where a barge-in cuts is drawn from `sample` (LiveServe's barge-in model,
        # WORKLOADS.md), the run's durations as a cell starts: the same in every arm of the cell;
        # with none (a p = 0.5 cell alone), from `durations` as they come.
        self.durations = durations if durations is not None else []
        self.sample = sample
        self.stats = SessionStats()
        self.audio_ms = 0.0  # of the current response, received
        self.response_done = True
        self.item_id = ""
        self.turn = 0
        self.rt = RealtimeClient(url, on_event=self._seen)
        with contextlib.suppress(websockets.exceptions.ConnectionClosed):  # refused at once: `run` reports it
            self.rt.send({"type": "session.update", "session": {"type": "realtime",
                          "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": VAD_SILENCE_MS}}},
                          **(session or {})}})  # fmt: skip

    def _seen(self, event: dict) -> None:
        kind = event["type"]
        if kind == "response.created":
            self.audio_ms, self.response_done = 0.0, False
        elif kind == "response.output_audio.delta":
            self.audio_ms += len(base64.b64decode(event["delta"])) / 2 / RATE * 1000
            self.item_id = event["item_id"]
        elif kind == "response.done":
            self.response_done = True
            r = event["response"]
            if prompt := (r.get("usage") or {}).get("input_tokens"):
                self.stats.prompt_tokens.append((self.turn, prompt))
            if r["status"] in WHOLE:  # the whole reply was generated
                if self.audio_ms:  # its audio's length (an empty reply has none to cut)
                    self.durations.append(self.audio_ms / 1000)
                self.stats.generated += (r.get("usage") or {}).get("output_tokens", 0)
        elif kind == "conversation.item.truncated" and "omniray" in event:
            self.stats.wasted += event["omniray"]["wasted_tokens"]
            self.stats.generated += event["omniray"]["generated_tokens"]
        elif kind == "error":
            self.stats.errors.append(event["error"]["message"])

    def say(self, pcm: bytes) -> None:
        """An utterance at real-time pace, then 0.7 s of silence (server VAD ends the turn after
        VAD_SILENCE_MS)."""
        self.rt.say(pcm + bytes(RATE * 2 * 7 // 10))

    def wait(self, kind: str, after: int, timeout: float = 120) -> tuple[int, float]:
        """(index, arrival time) of the first `kind` event at `after` or later."""
        i = self.rt.wait(kind, after, timeout)
        return i, self.rt.at(i)

    def _play(self, barge_at_s: float | None) -> bool:
        """Play the current response at real time from its first delta; report progress; stop at
        `barge_at_s` of playback (the caller then talks: returns True) or when all audio is played.
        A response heard whole is continuous if no stall on an empty buffer exceeded `GAP_MS`."""
        played, last, gap, worst = 0.0, time.monotonic(), 0.0, 0.0
        while True:
            time.sleep(0.05)
            now = time.monotonic()
            with self.rt.cond:
                available, done = self.audio_ms, self.response_done
            step = (now - last) * 1000
            last = now
            if played + step <= available:
                if gap > GAP_MS:  # a stall ended: where in the reply, and how long
                    self.stats.stalls.append((self.turn, round(played / 1000, 2), round(gap / 1000, 3)))
                played += step
                gap = 0.0
            else:
                if not done:
                    stalled = played + step - available
                    self.stats.stalled_s += stalled / 1000
                    gap += stalled
                    worst = max(worst, gap)
                played = available
            self.rt.send({"type": "omniray.playback.progress", "item_id": self.item_id, "played_ms": played})
            if barge_at_s is not None and played >= barge_at_s * 1000:
                self.stats.played_s += played / 1000
                return True
            if done and played >= available:
                self.stats.played_s += played / 1000
                self.stats.heard += 1
                self.stats.continuous += worst <= GAP_MS
                return False

    def run(self, turns: int, start: int = 0) -> SessionStats:
        """Turns `start` … `start` + `turns` − 1 of this session's utterances (the last one is not
        cut by a barge-in: the session ends after it)."""
        last = start + turns - 1
        try:
            for turn in range(start, last + 1):
                self.turn = turn
                length = reply_length(self.workload, *self.tokens)
                gap_s = self.workload.uniform(0.5, 3.0)
                self.rt.send(
                    {"type": "session.update", "session": {"type": "realtime", "max_output_tokens": length}}
                )
                mark = self.rt.mark()
                self.say(self.utterances[turn % len(self.utterances)])
                stopped, t_stop = self.wait("input_audio_buffer.speech_stopped", mark)
                created, t_created = self.wait("response.created", stopped)
                rid = self.rt.event(created)["response"]["id"]
                # Drawn whatever the reply turns out to be (a silent one too), so that both arms'
                # sessions make the same draws turn by turn. Anchored at first audio, a sample of
                # the run's output durations: a cut past the end of this reply is no barge-in.
                barge_at = None
                if turn < last and self.rng.random() < self.barge_p:
                    # a cell with no durations before it (no p = 0 cell) draws from its own so far
                    seen = self.sample or self.durations
                    barge_at = self.rng.choice(seen) if seen else self.rng.uniform(0.3, 1.5)
                first = self.rt.wait(
                    lambda e, rid=rid: (
                        e.get("response_id", (e.get("response") or {}).get("id")) == rid
                        and e["type"] in ("response.output_audio.delta", "response.done")
                    ),
                    created,
                    120,
                )
                done = self.rt.event(first)
                if done["type"] == "response.done":  # it ended without audio
                    self.stats.silent += 1
                    self.stats.silent_ends.append(silent_end(turn, done["response"]))
                    time.sleep(gap_s)
                    continue
                t_audio = self.rt.at(first)
                self.stats.ttfp_s.append(t_audio - t_stop)
                text = self.rt.find(
                    lambda e, rid=rid: (
                        e["type"] == "response.output_audio_transcript.delta" and e["response_id"] == rid
                    ),
                    created,
                )
                self.stats.text_s.append(round(self.rt.at(text) - t_stop, 3) if text is not None else None)
                self.stats.ttfp_at.append(t_audio)
                self.stats.created_s.append(t_created - t_stop)
                if self._play(barge_at):
                    self.stats.barge_ins += 1  # the next utterance starts now, over the reply
                else:
                    self.wait("response.done", stopped)
                    time.sleep(gap_s)
        except Exception as e:  # a session that breaks is reported, not hidden
            self.stats.errors.append(repr(e))
        finally:
            self.rt.close()
        self.stats.refused = self.rt.close_code == TRY_AGAIN_LATER
        self.stats.errors += [f"malformed event {m}" for m in self.rt.malformed]
        return self.stats


def silent_end(turn: int, response: dict) -> tuple[int, str, str, int]:
    """What a response that ended without audio says of why (its `response.done`)."""
    details = response.get("status_details") or {}
    why = details.get("reason") or (details.get("error") or {}).get("code") or ""
    tokens = (response.get("usage") or {}).get("output_tokens") or 0
    return turn, str(response.get("status")), str(why), int(tokens)


def profile_file(args, name: str, tmp: Path) -> Path:
    scheduler, eviction, preload = POLICY_SETS[name]

    def edit(data: dict) -> None:
        data.setdefault("realtime", {}).setdefault("scheduler", {})["policy"] = scheduler
        data.setdefault("kv_store", {})["policy"] = eviction
        data["kv_store"].setdefault("follower", {})["preload"] = preload
        # measure the policies, not refusals: realtime admission's limit stays at 256 sessions
        data["realtime"]["admission"] = {"initial": 256, "min": 256, "max": 256}
        if args.hidden:
            widen_thinker(data, args.hidden, args.layers)
        if args.max_num_seqs:
            data["engine"]["max_num_seqs"] = args.max_num_seqs
        if args.chunk_max_tokens:
            data["pipeline"]["chunk_max_tokens"] = args.chunk_max_tokens

    return derive(args.profile, tmp, f"{args.profile}-{name.lstrip('+')}", edit)


# Where a turn's time goes, per cell (the deployment's own metrics, differenced): the speech stages'
# urgency-gate waits, the engines' step periods, the stage calls (a remote prefill among them), the
# KV store's reloads (a prefilled prompt's pages reaching decode: kind pd) and the loads it gave up.
WATCHED = ("omniray_stage_urgency_wait_seconds", "omniray_scheduler_frame_seconds", "omniray_stage_latency_seconds",
           "omniray_kv_reload_seconds", "omniray_kv_fallback_recompute_total")  # fmt: skip
LABELS = ("stage", "op", "kind", "reason")  # kept in a metric's key
FRAMES = "omniray_scheduler_frame_seconds_count{}"


def scrape(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        # Ray exports them as ray_omniray_*; a counter's family is named without its _total
        if family.name.removeprefix("ray_") not in {name.removesuffix("_total") for name in WATCHED}:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count", "_total")):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k in LABELS)
                key = f"{sample.name.removeprefix('ray_')}{{{labels}}}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def means_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean of each watched histogram over a cell (ms)."""
    out = {}
    for key, total in after.items():
        if "_sum{" in key:
            count_key = key.replace("_sum{", "_count{")
            n = after.get(count_key, 0.0) - before.get(count_key, 0.0)
            if n:
                out[key.replace("_sum{", "{")] = round(1000 * (total - before.get(key, 0.0)) / n, 2)
    return out


def run_block(url: str, utterances: list[bytes], args, sessions: int, barge_p: float, turns: tuple[int, int],
              sample: tuple[float, ...], durations: list[float]) -> tuple[list[SessionStats], float]:  # fmt: skip
    """`sessions` sessions in parallel, each through turns `turns` = (first, count) of its workload:
    (their stats, wall time)."""
    first, count = turns
    clients = [Client(url, utterances[i:] + utterances[:i], barge_p, seed=first * 1000 + i,
                      tokens=(args.min_tokens, args.max_tokens), durations=durations, sample=sample)
               for i in range(sessions)]  # fmt: skip
    out: list[SessionStats] = [SessionStats()] * len(clients)
    started = time.monotonic()
    threads = [threading.Thread(target=lambda k=k: out.__setitem__(k, clients[k].run(count, first)))
               for k in range(len(clients))]  # fmt: skip
    for t in threads:
        t.start()
        time.sleep(0.2)  # staggered starts
    for t in threads:
        t.join()
    return out, time.monotonic() - started


def blocks(turns: int, n: int) -> list[tuple[int, int]]:
    """The turns split into `n` blocks as even as can be: (first turn, turns) each."""
    n = max(1, min(n, turns))
    sizes = [turns // n + (b < turns % n) for b in range(n)]
    return [(sum(sizes[:b]), size) for b, size in enumerate(sizes)]


def summarize(out: list[SessionStats], wall: float) -> dict:
    """A cell's figures from its sessions' stats (every block's) and its wall time."""
    ttfp = sorted(x for s in out for x in s.ttfp_s)
    text = [x for s in out for x in s.text_s if x is not None]
    played = sum(s.played_s for s in out)

    def p90(values: list[float]) -> float | None:
        values = sorted(values)
        return values[int(0.9 * (len(values) - 1))] if values else None

    return {
        "ttfp_p50_s": statistics.median(ttfp) if ttfp else None,
        "ttfp_p90_s": p90(ttfp),
        "ttfp_max_s": max(ttfp, default=None),
        "text_p50_s": statistics.median(text) if text else None,
        # where a slow first audio comes from: before the response starts, or after
        "created_p90_s": p90([x for s in out for x in s.created_s]),
        "wall_s": wall,
        "ttfp_by_turn_s": [[round(x, 3) for x in s.ttfp_s] for s in out],  # per session, in turn order
        "prompt_tokens_by_turn": [s.prompt_tokens for s in out],  # per session: (turn, prompt tokens)
        "text_by_turn_s": [s.text_s for s in out],  # per session, beside ttfp_by_turn_s
        "wasted_tokens": sum(s.wasted for s in out),
        "generated_tokens": sum(s.generated for s in out),
        "continuity": 1 - sum(s.stalled_s for s in out) / max(played + sum(s.stalled_s for s in out), 1e-9),
        "continuous_share": sum(s.continuous for s in out) / max(sum(s.heard for s in out), 1),
        # Not responses completed: FCFS completes a reply the user then cuts, a paced one is cancelled.
        "heard_rps": sum(s.heard for s in out) / wall,
        "barge_ins": sum(s.barge_ins for s in out),
        "silent": sum(s.silent for s in out),
        "silent_ends": [end for s in out for end in s.silent_ends],
        "stalls": [stall for s in out for stall in s.stalls],
        "refused": sum(s.refused for s in out),
        "turns": len(ttfp),
        "errors": [e for s in out for e in s.errors],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=0, help="tiny: widen the thinker (0 = the profile's own)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--max-num-seqs", type=int, default=0,
                    help="the engines' seats (0 = the profile's): fewer seats than sessions make the engine the "
                         "scarce resource the scheduler arbitrates, as a GPU's KV memory does")  # fmt: skip
    ap.add_argument("--chunk-max-tokens", type=int, default=0,
                    help="the longest text piece the talker waits for (0 = the profile's): a random-weight "
                         "thinker writes no clause ends, so its pieces run to this cap where a real model's "
                         "close at its clause ends")  # fmt: skip
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--min-tokens", type=int, default=REPLY_TOKENS[0], help="shortest reply (tokens)")
    ap.add_argument("--max-tokens", type=int, default=REPLY_TOKENS[1], help="longest reply (tokens)")
    ap.add_argument("--barge", type=float, nargs="+", default=[0.0, 0.5])
    ap.add_argument("--sets", nargs="+", choices=list(POLICY_SETS), default=DEFAULT_SETS,
                    help="policy sets to run, each a deployment up for the whole run (ratios: each against "
                         "the baseline)")  # fmt: skip
    ap.add_argument("--sweep", type=int, nargs="+", default=[],
                    help="session counts for the useful-RPS sweep (p = 0) instead of --sessions/--barge")  # fmt: skip
    ap.add_argument("--slo-s", type=float, default=1.0, help="P90 TTFP objective of the sweep (s)")
    ap.add_argument("--blocks", type=int, default=4,
                    help="blocks of turns per cell, alternating between the sets (fresh sessions each)")  # fmt: skip
    args = ap.parse_args()
    report: dict = {"args": vars(args), "runs": {}}
    cells = [(c, 0.0) for c in args.sweep] or [(args.sessions, p) for p in args.barge]
    with tempfile.TemporaryDirectory(prefix="omniray-voice-") as tmp, contextlib.ExitStack() as stack:
        utterances = [speech(s) for s in SENTENCES]
        durations: list[float] = []  # whole replies' audio (s), from the p = 0 runs: where barge-ins cut
        # Every set's deployment is up for the whole run; the cells' blocks alternate between them
        # (A B B A …), so that a drift of this machine's speed lands on both sets alike.
        urls, metrics, runs, roots = {}, {}, {}, {os.getpid(): "client"}
        for name in args.sets:
            path = profile_file(args, name, Path(tmp))
            cluster = stack.enter_context(runtime.temporary(str(path), prefix=f"omniray-voice-{name}-"))
            urls[name] = f"{cluster.http_url.replace('http', 'ws', 1)}/v1/realtime"
            metrics[name] = cluster.metrics_url
            runs[cluster.run_id] = name
            roots[cluster.redis_pid] = f"{name}: redis"  # started by this process, not tagged with the run
        for sessions, p in cells:
            sample = tuple(durations)  # barge-ins of this cell cut at the same draws in every set
            stats: dict[str, list[SessionStats]] = {name: [] for name in args.sets}
            walls, deltas = dict.fromkeys(args.sets, 0.0), {name: {} for name in args.sets}
            cpu: dict[str, Counter[str]] = {name: Counter() for name in args.sets}
            for block, turns in enumerate(blocks(args.turns, args.blocks)):
                for name in args.sets if block % 2 == 0 else args.sets[::-1]:
                    before, cpu_before = scrape(metrics[name]), process_cpu.snapshot(roots, runs)
                    out, wall = run_block(urls[name], utterances, args, sessions, p, turns, sample, durations)
                    cpu[name].update(process_cpu.between(cpu_before, process_cpu.snapshot(roots, runs)))
                    after = scrape(metrics[name])
                    for key, value in after.items():
                        deltas[name][key] = deltas[name].get(key, 0.0) + value - before.get(key, 0.0)
                    stats[name] += out
                    walls[name] += wall
                    p90 = summarize(out, wall)["ttfp_p90_s"] or math.nan
                    print(f"  block {block + 1} {name}: turns {turns[0]}-{sum(turns) - 1}, {wall:.0f} s, "
                          f"TTFP P90 {p90:.3f} s, {means_ms(before, after)}", flush=True)  # fmt: skip
            for name in args.sets:
                cell = f"{name}@c={sessions},p={p}"
                report["runs"][cell] = r = summarize(stats[name], walls[name])
                r["stage_means_ms"] = means_ms({}, deltas[name])
                r["counts"] = {key: round(n) for key, n in sorted(deltas[name].items())
                               if key.split("{")[0].endswith(("_count", "_total")) and n}  # fmt: skip
                r["frames"] = deltas[name].get(FRAMES, 0.0)
                # CPU seconds of each process while this set's blocks ran: the set's own under their
                # role's name, the other sets' deployments (idle meanwhile) under theirs, this
                # process's sessions as the client, each set's Redis as its own
                r["cpu_s"] = {label: round(seconds, 2) for label, seconds in cpu[name].most_common()}
                per_turn = ("errors", "ttfp_by_turn_s", "prompt_tokens_by_turn", "text_by_turn_s")
                print(f"{cell}: {json.dumps({k: v for k, v in r.items() if k not in per_turn})}"
                      f" errors={len(r['errors'])} {sorted(set(r['errors']))[:3]}", flush=True)  # fmt: skip
    if args.sweep:
        report["ratios"] = useful_rps(report["runs"], args)
    elif "baseline" in args.sets and len(args.sets) > 1:
        report["ratios"] = ratios(report["runs"], cells, [name for name in args.sets if name != "baseline"])
    print(f"saved {results.write('voice', args.profile, report)}")


def ratios(runs: dict, cells: list, against: list[str]) -> dict:
    """Each set in `against` (the interaction-aware set, or one of its parts) against the baseline, per
    cell of the same sessions and p: {"<set> c=<n>,p=<p>": ratios}."""
    out = {}
    for name in against:
        for sessions, p in cells:
            b, i = runs[f"baseline@c={sessions},p={p}"], runs[f"{name}@c={sessions},p={p}"]
            if not (b["turns"] and i["turns"] and b["heard_rps"]):
                print(f"{name} p={p}: no ratios (a run answered no turn)")
                continue
            r = {
                f"ttfp_p90 baseline/{name}": b["ttfp_p90_s"] / i["ttfp_p90_s"],
                f"continuous {name}-baseline": i["continuous_share"] - b["continuous_share"],
                f"heard_rps {name}/baseline": i["heard_rps"] / b["heard_rps"],
            }
            if b["wasted_tokens"]:
                r["wasted reduction"] = 1 - i["wasted_tokens"] / b["wasted_tokens"]
            out[f"{name} c={sessions},p={p}"] = r
            print(f"{name} c={sessions} p={p}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    return out


def useful_rps(runs: dict, args) -> dict:
    """Per policy set, the highest session count served whole (none refused) whose responses are ≥ 90%
    continuous with P90 TTFP within the objective (WORKLOADS.md), and the responses heard whole per
    second there."""
    out = {}
    for name in args.sets:
        ok = [c for c in args.sweep if (r := runs[f"{name}@c={c},p=0.0"])["turns"] and not r["refused"]
              and r["continuous_share"] >= 0.9 and r["ttfp_p90_s"] <= args.slo_s]  # fmt: skip
        best = max(ok, default=None)
        out[name] = {
            "sessions": best,
            "useful_rps": runs[f"{name}@c={best},p=0.0"]["heard_rps"] if best else 0.0,
        }
        print(f"{name}: useful RPS {out[name]['useful_rps']:.3f} at {best} sessions "
              f"(P90 TTFP ≤ {args.slo_s} s, ≥ 90% continuous)")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
