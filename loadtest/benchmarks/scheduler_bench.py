"""Decision overhead of the interaction-aware scheduler per scheduling round: the whole urgency hook
(`UrgencyOrder.before` of services/extensions/vllm/scheduler.py: running and waiting queues ordered,
preemption checked) on a simulated decode loop of N live voice sessions, with the changes a real
loop brings, on a simulated clock:

- one decode step every `--step-ms`: every running request not held generates a token;
- a response ends after a random length (mean `--mean-tokens`); the session's next turn arrives
  when the client has played what it has and the user has spoken (`--user-turn-s`, uniform up to
  twice the mean), or right after a barge-in's user turn: requests arrive and leave most rounds;
- the client plays in real time; the talker's audio reaches it in chunks (`--chunk-tokens` tokens of
  `--ms-per-token` each: the policy's `piece_tokens`), so a generating session's view changes when a
  chunk lands; what it has played counts from its response's start, as the gateway's playback
  monitor counts it (a paced request's lead over playback is then what its client has buffered);
- a fraction of sessions barge in now and then (the view changes, the response ends);
- the board is read every `--poll-ms` through the real decoder (views whose course did not change
  keep their object, as BoardReader does).

The same simulation runs twice: the incremental plan (`refresh_s` as served) and, as the baseline,
a full classification and sort every round (what the scheduler did before: `refresh_s` = 0).
LiveServe reports 0.093 ms average / 0.222 ms P90 at 256 sessions.

    python -m loadtest.benchmarks.scheduler_bench --sessions 64 256 1024 --rounds 3000
"""

from __future__ import annotations

import argparse
import collections
import heapq
import itertools
import json
import random
import statistics
import time
from dataclasses import asdict
from types import SimpleNamespace

from kv_store.metrics import Recorder
from loadtest import results
from services.extensions.vllm import engine_metrics
from services.extensions.vllm.scheduler import SESSION_ARG, UrgencyOrder
from services.playback.board import BoardView, decode
from services.policies import urgency


class _Session:
    def __init__(self, sid: str, rng: random.Random, now: float):
        self.sid, self.rng = sid, rng
        self.buffered, self.played, self.pending, self.responses, self.barge_ins = 0.0, 0.0, 0, 1, 0
        self.first_audio, self.at = False, now

    def view(self, now: float, ms_per_token: float) -> BoardView:
        # playback in real time since the last look
        elapsed = (now - self.at) * 1000
        self.played += min(self.buffered, elapsed)
        self.buffered = max(0.0, self.buffered - elapsed)
        self.at = now
        return BoardView(session_id=self.sid, played_ms=self.played, age_s=0.0, ms_per_token=ms_per_token,
                         buffered_ms=self.buffered, playing=self.buffered > 0, speaking=False, responding=True,
                         first_audio=self.first_audio, barge_ins=self.barge_ins, responses=self.responses,
                         reply_gap_ms=None, at=now)  # fmt: skip


class _Request:
    """What the hook reads of a vLLM request; hashed and compared by identity, as vLLM's are."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class _Loop:
    """The engine's queues and the sessions' clients, on a simulated clock."""

    def __init__(self, n: int, args, seed: int = 0):
        self.rng, self.args, self.now = random.Random(seed), args, 1_000_000.0
        self.sessions = [_Session(f"t/s{i}", self.rng, self.now) for i in range(n)]
        self.sched = SimpleNamespace(running=[], waiting=collections.deque(), kv_cache_manager=SimpleNamespace(usage=0.6),
                                     max_num_active_reqs=n, num_waiting_for_streaming_input=0)  # fmt: skip
        for s in self.sessions:
            # mid-response: some tokens generated, their audio sent, some of it played
            generated = self.rng.randint(0, 150)
            sent = generated * args.ms_per_token
            s.buffered, s.first_audio = self.rng.uniform(0, min(8000, sent)), generated > 0
            s.played = sent - s.buffered
            self.sched.running.append(self._request(s, generated))
        self.turns: list = []  # (time, seq, session): next turns due
        self.seq = itertools.count()
        self.raw: dict[str, str] = {}
        self.views: dict[str, BoardView] = {}
        self.next_poll = self.now

    def _request(self, session: _Session, generated: int = 0):
        return _Request(session=session, arrival_time=self.now, num_computed_tokens=self.rng.randint(200, 4000),
                               num_output_tokens=generated, length=int(self.rng.expovariate(1 / self.args.mean_tokens)) + 1,
                               sampling_params=SimpleNamespace(extra_args={SESSION_ARG: session.sid}))  # fmt: skip

    def step(self, held: list) -> None:
        """One decode step: tokens, audio chunks, finished responses and next turns, board polls."""
        self.now += self.args.step_ms / 1000
        a, skip = self.args, set(map(id, held))
        running = self.sched.running
        done = []
        for r in running:
            if id(r) in skip:
                continue
            r.num_output_tokens += 1
            r.num_computed_tokens += 1
            s = r.session
            s.pending += 1
            if s.pending >= a.chunk_tokens:  # a talker chunk reaches the client
                s.view(self.now, a.ms_per_token)
                s.buffered += s.pending * a.ms_per_token
                s.pending, s.first_audio = 0, True
            barged = self.rng.random() < a.barge_in_rate
            if r.num_output_tokens >= r.length or barged:
                done.append(r)
                s.barge_ins += barged
                s.responses += 1
                s.first_audio, s.pending = False, 0
                if barged:
                    s.view(self.now, a.ms_per_token)
                    s.buffered = 0.0
        if done:
            gone = set(map(id, done))
            self.sched.running = [r for r in running if id(r) not in gone]
            for r in done:  # the next turn: after the client played what it has, and the user spoke
                s = r.session
                user_s = self.rng.uniform(0, 2 * a.user_turn_s)
                heapq.heappush(self.turns, (self.now + s.buffered / 1000 + user_s, next(self.seq), s))
        while self.turns and self.turns[0][0] <= self.now:
            s = heapq.heappop(self.turns)[2]
            s.view(self.now, a.ms_per_token)
            s.played = 0.0  # a new response: the monitor counts its playback from its start
            self.sched.running.append(self._request(s))  # admitted
        if self.now >= self.next_poll:
            self.next_poll += a.poll_ms / 1000
            self.raw = {
                s.sid: json.dumps({**asdict(s.view(self.now, a.ms_per_token))}) for s in self.sessions
            }
            self.views = decode(self.raw, self.views, self.now)


def measure(n: int, args, policy: str, refresh_s: float) -> tuple[list[float], float]:
    loop = _Loop(n, args)
    # the audio of a chunk's tokens comes when its last one is generated: the pipeline's piece
    urgency_policy = urgency.create(policy, piece_tokens=args.chunk_tokens)
    order = UrgencyOrder(urgency_policy, lambda: loop.views, Recorder(engine_metrics.ENGINE_SPEC),
                         refresh_s=refresh_s, clock=lambda: loop.now)  # fmt: skip
    times, classified, running = [], 0, 0
    for i in range(args.warmup + args.rounds):
        t = time.perf_counter()
        held = order.before(loop.sched)
        times.append(time.perf_counter() - t)
        if i >= args.warmup:
            classified += order.running.classified
            running += len(loop.sched.running) + len(held)
        loop.sched.running.extend(held)
        loop.step(held)
    return times[args.warmup :], classified / args.rounds, running / args.rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=25.0, help="decode step period")
    ap.add_argument("--poll-ms", type=float, default=50.0, help="board poll period (BoardReader)")
    ap.add_argument("--mean-tokens", type=float, default=200.0, help="mean response length")
    ap.add_argument("--chunk-tokens", type=int, default=8, help="tokens per audio chunk reaching the client")
    ap.add_argument("--ms-per-token", type=float, default=150.0)
    ap.add_argument("--barge-in-rate", type=float, default=0.001, help="per generated token")
    ap.add_argument("--user-turn-s", type=float, default=3.0, help="mean user turn after playback ends")
    args = ap.parse_args()
    print(f"step {args.step_ms} ms, board poll {args.poll_ms} ms, mean response {args.mean_tokens} tokens, "
          f"audio chunk {args.chunk_tokens} tokens x {args.ms_per_token} ms, user turn {args.user_turn_s} s")  # fmt: skip
    rows = []
    header = ("sessions", "policy", "plan", "avg ms", "p50 ms", "p90 ms", "classified/round", "running")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (8, 9, 12, 8, 8, 8, 17, 8), strict=True)))
    for n in args.sessions:
        for policy in ("fcfs", "liveserve"):
            avg = {}
            for plan, refresh_s in (("full/round", 0.0), ("incremental", 5.0)):
                times, classified, running = measure(n, args, policy, refresh_s)
                ms = sorted(t * 1000 for t in times)
                avg[plan] = statistics.mean(ms)
                p90 = ms[int(0.9 * (len(ms) - 1))]
                print(f"{n:>8} {policy:>9} {plan:>12} {avg[plan]:8.3f} {statistics.median(ms):8.3f} {p90:8.3f} "
                      f"{classified:17.1f} {running:8.0f}")  # fmt: skip
                rows.append({"sessions": n, "policy": policy, "plan": plan, "avg_ms": avg[plan],
                             "p50_ms": statistics.median(ms), "p90_ms": p90, "classified_per_round": classified})  # fmt: skip
            print(f"{'':>8} {'':>9} {'speed-up':>12} {avg['full/round'] / avg['incremental']:7.1f}x")
    print(f"[scheduler] wrote {results.write('scheduler', None, {'settings': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()
