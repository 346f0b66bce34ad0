"""One realtime voice session on the simulated clock: the user, the client's player and what the
gateway tells its session monitor (the real `services.playback.monitor.PlaybackMonitor`, whose
views the engines' urgency hook and the KV follower read through the board).

A turn: the user speaks (`speech_s`); the server's VAD ends the turn — TTFP counts from there, as
`make bench-voice` counts from `speech_stopped`; the audio encoder runs; the thinker request (the
conversation so far plus the turn's audio tokens) goes to the session's decode replica. Each token
it generates is audio (`ms_per_token`) that reaches the client after the speech stages' delay; the
client plays it at real time, stalling when its buffer runs dry. With probability `barge_p` the
user talks over the reply at LiveServe's cut point (first audio plus a sample of whole replies'
audio durations); a cut past the reply's end is no barge-in. Otherwise the user waits for playback
to end, then a reply gap, and speaks again — for the run, or for the spec's `turns` (its last reply
heard whole, as `make bench-voice`'s sessions do).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import simpy

from loadtest.clients.workload import reply_length
from planner.sim.engine import SimRequest
from planner.sim.workload import VoiceSpec

GAP_MS = 100  # a longer stall makes a response discontinuous (WORKLOADS.md)


@dataclass
class Turn:
    """One reply, as measured at the client."""

    session: str
    start: float  # speech_stopped (simulated seconds)
    ttfp_s: float | None = None
    ttft_s: float | None = None  # the reply's first token (its first audio waits for its piece's)
    generated: int = 0
    wasted: int = 0
    barged: bool = False
    stalled_s: float = 0.0
    longest_stall_s: float = 0.0
    voiced: int = 0  # tokens whose audio reached the client
    audio_s: float = 0.0  # heard
    heard_whole: bool = False


@dataclass
class VoiceStats:
    turns: list[Turn] = field(default_factory=list)
    refused: int = 0  # admission said no (retried)


class VoiceSession:
    def __init__(self, cluster, sid: str, spec: VoiceSpec, rng: random.Random, stats: VoiceStats):
        self.cluster, self.sid, self.spec, self.rng, self.stats = cluster, sid, spec, rng, stats
        self.env: simpy.Environment = cluster.env
        self.monitor = cluster.monitor
        self.context = spec.system_tokens
        self.epoch = 0  # the conversation window moved this many times (a new KV chain each time)
        self.replica = self.talker = None
        # the current reply
        self.request: SimRequest | None = None
        self.turn: Turn | None = None
        self.play_end = 0.0  # when the client's buffer runs dry
        self.done: simpy.Event | None = None
        self.cut: simpy.Event | None = None
        self.final: int | None = None  # the reply's tokens, once the engine finished it
        self.turns: list[Turn] = []  # this session's
        self.encoded_s = 0.0  # of the turn's speech, what speculative prefill encoded

    @property
    def chain(self) -> str:
        return f"{self.sid}#{self.epoch}"

    def run(self):
        env, spec, c = self.env, self.spec, self.cluster
        while not c.admission.try_admit():
            self.stats.refused += 1
            yield env.timeout(5.0)
        self.monitor.open(self.sid)
        c.published(self.sid)
        c.session(+1)
        barged = False
        try:
            while spec.turns is None or len(self.turns) < spec.turns:
                speech = self.rng.uniform(*spec.speech_s)
                if not barged:  # a barge-in started this speech already
                    self.monitor.speech_started(self.sid)
                    c.published(self.sid)
                self.encoded_s = 0.0
                if c.ahead_chunk_s:  # in flight at the turn's end, it goes on beside the turn's request
                    env.process(self._prefill_ahead(speech))
                yield env.timeout(speech + spec.vad_silence_s)
                self.monitor.speech_stopped(self.sid)
                c.published(self.sid)
                barged = yield from self._reply(speech)
                if not barged:
                    yield env.timeout(max(0.0, self.play_end - env.now) + self.rng.uniform(*spec.gap_s))
        finally:
            c.admission.release()
            c.session(-1)

    def _prefill_ahead(self, speech_s: float):
        """The profile's speculative prefill (services/realtime/session.py): while the user speaks,
        the conversation up to each completed audio chunk is encoded and run through the session's
        replica for one token — one request at a time — so that the turn's own request finds all
        but its last chunk cached (and encodes only what was not: `encoded_s`)."""
        env, c = self.env, self.cluster
        said, chunk, chunks = env.now, c.ahead_chunk_s, 0
        context, chain = self.context, self.chain  # the conversation before this turn
        while (chunks + 1) * chunk <= speech_s:
            yield env.timeout(max(0.0, said + (chunks + 1) * chunk - env.now))
            if env.now >= said + speech_s + self.spec.vad_silence_s:
                return  # the turn was committed meanwhile: its own request runs the rest
            # every chunk completed by now (more than one when the last request outlasted a chunk)
            chunks = max(chunks + 1, int(min(env.now - said, speech_s) // chunk))
            seconds = chunks * chunk - self.encoded_s
            self.encoded_s += seconds
            yield c.audio_encoded(seconds)
            self.replica = c.route(self.sid, self.replica)
            self.replica.kv.session_chain.setdefault(self.sid, chain)  # the turn's own sets it after
            done = env.event()
            prompt = context + int(chunks * chunk * self.spec.audio_tokens_per_s)
            self.replica.add(SimRequest(f"{self.sid}/ahead-{len(self.turns)}-{chunks}", self.sid, prompt, 1, env.now,
                                        lambda _, what, done=done: what == "finished" and done.succeed(), chain=chain))  # fmt: skip
            yield done

    def _reply(self, speech_s: float):
        env, spec, c = self.env, self.spec, self.cluster
        turn = self.turn = Turn(self.sid, start=env.now)
        self.turns.append(turn)
        self.stats.turns.append(turn)
        yield c.audio_encoded(speech_s - self.encoded_s)  # what speculative prefill did not encode
        self.context += int(speech_s * spec.audio_tokens_per_s)
        if self.context > spec.context_tokens:  # the window drops its oldest turns: a new prefix
            self.context, self.epoch = spec.context_tokens // 2, self.epoch + 1
        length = reply_length(self.rng, *spec.reply_tokens)
        c.load["realtime_requests"] += 1
        self.replica, self.talker = c.route(self.sid, self.replica), c.talker()
        request = self.request = SimRequest(f"{self.sid}/{len(self.stats.turns)}", self.sid, self.context, length,
                                            env.now, self._on_request, chain=self.chain)  # fmt: skip
        self.replica.kv.session_chain[self.sid] = self.chain
        self.monitor.response_started(self.sid)
        c.published(self.sid)
        c.responding.add(self.sid)
        self.done, self.cut, self.final = env.event(), env.event(), None
        self.replica.add(request)
        yield self.done | self.cut
        c.responding.discard(self.sid)
        if self.cut.triggered:
            return True
        self.context += request.num_output_tokens
        return False

    # ---- the engine's tokens become audio at the client --------------------------------------------

    def _on_request(self, request: SimRequest, what: str) -> None:
        if request is not self.request:
            return  # a reply already cut
        if what == "token":
            self.turn.generated += 1
            if self.turn.ttft_s is None:
                self.turn.ttft_s = self.env.now - self.turn.start
            self.talker.token(self.sid, lambda: self._audio(request))
        elif what == "finished":
            self.final = request.num_output_tokens  # its audio ends the reply
            self.talker.end(self.sid)

    def _audio(self, request: SimRequest) -> None:
        if request is not self.request:
            return
        now, turn = self.env.now, self.turn
        if turn.ttfp_s is None:
            turn.ttfp_s = now - turn.start
            self.play_end = now
            last = len(self.turns) == self.spec.turns  # the session ends after it: heard whole
            if not last and self.rng.random() < self.spec.barge_p:
                heard = reply_length(self.rng, *self.spec.reply_tokens) * self.spec.ms_per_token / 1000
                self.env.process(self._barge(request, now + heard))
        elif now > self.play_end:
            stall = now - self.play_end
            turn.stalled_s += stall
            turn.longest_stall_s = max(turn.longest_stall_s, stall)
            self.play_end = now
        self.play_end += self.spec.ms_per_token / 1000
        self.monitor.audio_sent(self.sid, self.spec.ms_per_token)
        self.cluster.published(self.sid)
        self.cluster.playing_until(self.sid, self.play_end)
        turn.voiced += 1
        if turn.voiced == self.final:
            self.env.process(self._finish(request))

    def _finish(self, request: SimRequest):
        if request is not self.request:
            return
        turn = self.turn
        yield self.env.timeout(max(0.0, self.play_end - self.env.now))  # the client plays it out
        if request is not self.request:
            return
        turn.heard_whole = True
        turn.audio_s = turn.generated * self.spec.ms_per_token / 1000
        self.monitor.response_finished(self.sid, turn.generated, turn.generated * self.spec.ms_per_token)
        self.cluster.published(self.sid)
        self.request = None
        self.done.succeed()

    def _barge(self, request: SimRequest, at: float):
        yield self.env.timeout(max(0.0, at - self.env.now))
        if request is not self.request:
            return  # heard to its end first: no barge-in
        turn, now = self.turn, self.env.now
        played_s = max(0.0, min(now, self.play_end) - (turn.start + turn.ttfp_s) - turn.stalled_s)
        heard_tokens = min(turn.generated, round(played_s * 1000 / self.spec.ms_per_token))
        turn.barged, turn.audio_s = True, played_s
        turn.wasted = turn.generated - heard_tokens
        self.request = None
        self.replica.abort(request)
        self.talker.drop(self.sid)
        self.monitor.speech_started(self.sid)  # counted as a barge-in
        self.monitor.truncated(self.sid, played_s * 1000)
        self.cluster.published(self.sid)
        self.context += heard_tokens
        self.cut.succeed()
