"""A deployment on the simulated clock: the gateway (session monitor, board, AIMD admission, the
routers' scorer pipelines), decode replicas (planner/sim/engine.py) with their KV (planner/sim/kv.py),
encoder replicas batching tiles with the real `TileScheduler`,  talker replicas batching
streams in the speech stages' urgency order (planner/sim/speech.py). Every policy is omniray's own module, called
through its public interface; only the clock and the hardware are simulated.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from typing import Literal

import simpy
from pydantic import BaseModel, ConfigDict, Field
from ray.serve.autoscaling_policy import default_autoscaling_policy
from ray.serve.config import AutoscalingConfig

from kv_store.metrics import Recorder
from planner import costs
from planner.sim.autoscale import SimSla, StageScaler
from planner.sim.cores import SharedCores, work
from planner.sim.engine import EngineReplica, SimRequest
from planner.sim.kv import KvPool
from planner.sim.quota import SimQuota
from planner.sim.speech import TalkerReplica, TextTalkerReplica, frames_per_token
from planner.sim.voice import VoiceSession, VoiceStats
from planner.sim.workload import CLOSED_LOOP, RequestSpec, Workload
from services.extensions.vllm import engine_metrics
from services.extensions.vllm.scheduler import UrgencyOrder
from services.models.profile import Profile, load_profile
from services.playback.board import BoardView, BoardViews, advance, follow
from services.playback.monitor import PlaybackMonitor
from services.policies import urgency
from services.policies.admission import AimdAdmission
from services.policies.scorers import ScorerPipeline
from services.policies.scorers.base import Candidate, RoutedRequest
from services.quota.service import Cost
from services.stages.tile_scheduler import TileScheduler


class Policies(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scheduler: str = "fcfs"  # services/policies/urgency
    scheduler_params: dict = Field(default_factory=dict)
    eviction: str = "lru"  # kv_store/eviction
    preload: bool = False  # speech-triggered preload (kv_store/follower.py)


BASELINE = Policies()
INTERACTION = Policies(scheduler="liveserve", eviction="next_use", preload=True)


class Scaling(BaseModel):
    """A stage scaled during the run by a real autoscaling policy (planner/sim/autoscale.py)."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["serve", "sla"] = "serve"
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=4, ge=1)
    target_ongoing_requests: float = Field(default=2.0, gt=0)  # Serve's default policy
    upscale_delay_s: float = Field(default=30.0, ge=0)  # Serve's defaults
    downscale_delay_s: float = Field(default=600.0, ge=0)
    per_replica: dict[str, float] = Field(default_factory=dict)  # the SLA policy's capacities
    headroom: float = Field(default=1.2, ge=1)
    window_s: float = Field(default=10.0, gt=1)
    start_s: float = Field(default=10.0, ge=0)  # a new replica serves this long after it is asked for


class Deployment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hardware: str  # configs/hardware/<name>.yaml
    profile: str  # the model profile: engine seats and budget, urgency and admission parameters
    decode_replicas: int = Field(default=1, ge=1)
    encoder_replicas: int = Field(default=1, ge=0)
    talker_replicas: int = Field(default=2, ge=1)
    page_tokens: int = Field(default=256, ge=16)
    kv_tokens: int | None = Field(default=None, ge=1)  # the device pool (None: the hardware profile's)
    host_tokens: int = Field(default=0, ge=0)  # the host tier below it
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    admission: bool = True  # AIMD admission of voice sessions (the profile's parameters)
    policies: Policies = BASELINE
    board_poll_s: float = Field(default=0.05, gt=0)
    scaling: dict[Literal["encoder", "talker"], Scaling] = Field(default_factory=dict)


class Cluster:
    def __init__(self, deployment: Deployment, workload: Workload, env: simpy.Environment | None = None,
                 redis_url: str | None = None, hardware: costs.HardwareProfile | None = None):  # fmt: skip
        self.d, self.w = deployment, workload
        self.env = env or simpy.Environment()
        if workload.quota is not None and redis_url is None:
            raise ValueError("a workload with a quota needs a Redis for its token buckets (redis_url)")
        self.quota = SimQuota(self.env, redis_url, workload.quota) if workload.quota is not None else None
        self.hw = hardware or costs.load(deployment.hardware)  # given: a profile not on disk (calibration's)
        self.profile: Profile = load_profile(deployment.profile)
        self.rng = random.Random(workload.seed)
        self.counts: Counter = Counter()
        self.monitor = PlaybackMonitor(clock=lambda: self.env.now)
        self.views = BoardViews({})
        self._dirty: set[str] = set()
        self._dry: list[tuple[float, str]] = []  # (when a session's buffer may run dry, session)
        self.admission = AimdAdmission(self.profile.realtime.admission) if deployment.admission else _Open()
        serving = self.hw.serving
        self.cores = SharedCores(self.env, serving.cores) if serving is not None else None
        if self.cores is not None:
            self.cores.spin(serving.background_cores)  # Ray's processes and idle replicas, always
        self.replicas = [self._replica(i) for i in range(deployment.decode_replicas)]
        self.router = ScorerPipeline.from_config(
            [{"name": "session_affinity", "weight": 2.0}, {"name": "queue_length", "weight": 1.0}]
        )
        self.talkers = [self._talker() for _ in range(deployment.talker_replicas)]
        ahead = self.profile.realtime.speculative_prefill
        self.ahead_chunk_s = ahead.chunk_ms / 1000 if ahead.enabled else None  # prefill while users speak
        self.encoders = [self._encoder_replica() for _ in range(deployment.encoder_replicas)]
        self.encoder_router = ScorerPipeline.from_config([{"name": "least_pending_tiles"}])
        self.responding: set[str] = set()
        self._clients: list = []  # the closed loop's clients (start)
        self._voice: simpy.Process | None = None  # the voice sessions' blocks (start)
        self.voice = VoiceStats()
        self.requests: dict[str, list[dict]] = {name: [] for name in workload.requests}
        if workload.closed_loop is not None:
            self.requests[CLOSED_LOOP] = []
        self.load: Counter = Counter()  # what the gateways admitted, by kind (load_meter.py's counters)
        self.open_sessions = 0
        self.scalers = {stage: self._scaler(stage, spec) for stage, spec in deployment.scaling.items()}
        self.env.process(self._board())
        self.env.process(self._session_seconds())

    def _scaler(self, stage: str, spec: Scaling) -> StageScaler:
        config = AutoscalingConfig(min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                                   target_ongoing_requests=spec.target_ongoing_requests,
                                   upscale_delay_s=spec.upscale_delay_s, downscale_delay_s=spec.downscale_delay_s)  # fmt: skip
        policy = (
            SimSla(
                lambda: self.load,
                per_replica=spec.per_replica,
                headroom=spec.headroom,
                window_s=spec.window_s,
            )
            if spec.policy == "sla"
            else default_autoscaling_policy
        )
        # Serve's ongoing requests: an encoder's Encode calls, a talker's Talk calls (one per reply)
        if stage == "encoder":
            replicas, start = self.encoders, self._encoder_replica
            ongoing = lambda: sum(e.ongoing for e in self.encoders)  # noqa: E731
        else:
            replicas, start = self.talkers, self._talker
            ongoing = lambda: sum(len(t.streams) for t in self.talkers)  # noqa: E731
        return StageScaler(self.env, stage, policy, config, replicas, start, ongoing, spec.start_s)

    def _session_seconds(self):
        while True:
            yield self.env.timeout(1.0)
            self.load["session_seconds"] += self.open_sessions

    # ---- construction ------------------------------------------------------------------------------

    def _replica(self, i: int) -> EngineReplica:
        d, hw, p = self.d, self.hw, self.profile
        memory = hw.memory
        kv_tokens = d.kv_tokens or (memory.kv_cache_bytes / memory.kv_bytes_per_token if memory else None)
        if kv_tokens is None:
            raise ValueError(f"hardware profile {hw.name} has no memory section: give kv_tokens")
        page_bytes = d.page_tokens * (memory.kv_bytes_per_token if memory else 1.0)
        pol = d.policies
        follower = {"preload": pol.preload} if pol.preload or pol.eviction == "next_use" else None
        kv = KvPool(self.env, int(kv_tokens // d.page_tokens), d.page_tokens, page_bytes, policy=pol.eviction,
                    host_pages=d.host_tokens // d.page_tokens,
                    bandwidth_bps=memory.host_bandwidth_bps if memory else 25e9, follower=follower)  # fmt: skip
        order = UrgencyOrder(self._urgency(), lambda: self.views, Recorder(engine_metrics.ENGINE_SPEC),
                             clock=lambda: self.env.now)  # fmt: skip
        return EngineReplica(self.env, f"decode-{i}", hw.stages, kv, max_num_seqs=p.engine.max_num_seqs,
                             max_num_batched_tokens=d.max_num_batched_tokens, order=order,
                             on_step=self._frame, cores=self.cores, serving=hw.serving)  # fmt: skip

    def _encoder_replica(self) -> EncoderReplica:
        self.counts["encoders"] += 1
        return EncoderReplica(self, f"encoder-{self.counts['encoders']}")

    def _talker(self) -> TalkerReplica | TextTalkerReplica:
        """A new talker replica of the profile's talker: a text talker voices the reply's text pieces
        (where the hardware profile has its cost), a token talker batches codec frames."""
        self.counts["talkers"] += 1
        i = self.counts["talkers"]
        talker, name, voice = self.profile.models.talker, f"talker-{i}", self.w.voice
        if talker is not None and not self.profile.token_talker() and self.hw.stages.talker_units is not None:
            pipe = self.profile.pipeline
            chunking = (pipe.chunk_min_tokens, pipe.chunk_max_tokens) if pipe.async_chunk else (10**9, 10**9)
            units = getattr(talker.options, "units_per_char", 1) * voice.chars_per_token
            speech_s = self.hw.serving.speech_token_cpu_s if self.hw.serving is not None else 0.0
            return TextTalkerReplica(self.env, name, self.hw.stages, self.cores, chunking, voice.clause_p, units,
                                     getattr(talker.options, "chunk_units", 10**9), random.Random(self.w.seed + i),
                                     self.profile.engine.stream_interval, speech_s)  # fmt: skip
        max_streams = getattr(talker.options, "max_streams", 1) if talker is not None else 1
        return TalkerReplica(self.env, name, self.hw.stages, self._urgency(), lambda: self.views, max_streams,
                             frames_per_token(voice.ms_per_token))  # fmt: skip

    def _urgency(self) -> urgency.UrgencyPolicy:
        pol = self.d.policies
        return urgency.create(
            pol.scheduler, pol.scheduler_params, piece_tokens=self.profile.audio_piece_tokens()
        )

    # ---- the gateway -------------------------------------------------------------------------------

    def published(self, sid: str) -> None:
        """The monitor's view of `sid` changed: the next board poll carries it."""
        self._dirty.add(sid)

    def playing_until(self, sid: str, t: float) -> None:
        """The session's buffer runs dry at `t` unless more audio comes (its view changes then)."""
        heapq.heappush(self._dry, (t, sid))

    def _board(self):
        """The board's publish and poll: what changed since the last poll, as decode() keeps it."""
        while True:
            yield self.env.timeout(self.d.board_poll_s)
            now = self.env.now
            while self._dry and self._dry[0][0] <= now:
                self._dirty.add(heapq.heappop(self._dry)[1])
            if not self._dirty:
                continue
            views, changed, refilled = dict(self.views), set(), set()
            for sid in self._dirty:
                v = self.monitor.view(sid)
                if v is None:
                    if views.pop(sid, None) is not None:
                        changed.add(sid)
                    continue
                views[sid], is_changed, is_refilled = follow(
                    self.views.get(sid), BoardView(**vars(v), at=now)
                )
                if is_changed:
                    changed.add(sid)
                    if is_refilled:
                        refilled.add(sid)
            self._dirty.clear()
            self.views = advance(self.views, views, changed, refilled)
            for r in self.replicas:
                r.kv.follow(self.views)

    def _frame(self, step_s: float, decoding: int) -> None:
        """A decode step: the frame time AIMD admission watches (over the audio a token yields)."""
        if decoding:
            self.admission.observe(step_s * 1000 / self.w.voice.ms_per_token)

    def route(self, sid: str, current: EngineReplica | None) -> EngineReplica:
        request = RoutedRequest(request_id=f"{sid}/{self.counts['routed']}", session_id=sid)
        self.counts["routed"] += 1
        best = self.router.rank(request, [Candidate(r.name, r.load) for r in self.replicas])[0]
        for _, scorer in self.router.stages:
            scorer.on_routed(request, best)
        return next(r for r in self.replicas if r.name == best)

    # ---- the speech stages ---------------------------------------------------------------------------

    def audio_encoded(self, speech_s: float) -> simpy.Event:
        """A committed turn through the gateway (the serving path's work per request, where the
        cores are shared) and its audio encoded."""
        curve, serving = self.hw.stages.audio_encode, self.hw.serving
        cpu_s = (curve.at(speech_s) if curve is not None else 0.0) + (
            serving.request_cpu_s if serving else 0.0
        )
        return work(self.env, self.cores, cpu_s)

    def session(self, delta: int) -> None:
        """A realtime session opened (+1) or closed (-1): while open it keeps part of a core busy
        (Serving.session_cores), where the cores are shared."""
        self.open_sessions += delta
        if self.cores is not None and self.hw.serving.session_cores:
            self.cores.spin(delta * self.hw.serving.session_cores)

    def talker(self) -> TalkerReplica | TextTalkerReplica:
        """A new reply's talker: the one with the fewest streams."""
        return min(self.talkers, key=lambda t: len(t.streams))

    # ---- the users -----------------------------------------------------------------------------------

    def start(self) -> None:
        v, env = self.w.voice, self.env
        if v.sessions:
            self._voice = env.process(self._voice_blocks())
        for name, spec in self.w.requests.items():
            if spec.rate > 0:
                env.process(self._requests(name, spec))
        if self.w.closed_loop is not None:
            todo = iter(enumerate(self.w.closed_loop.requests))
            self._clients = [
                env.process(self._closed_loop_client(todo)) for _ in range(self.w.closed_loop.concurrency)
            ]

    def _voice_blocks(self):
        """The voice sessions, opening over the ramp; with a number of turns, block after block of
        fresh ones (each once the last block's have all ended)."""
        v, env = self.w.voice, self.env
        yield env.timeout(v.start_s)
        for block in range(v.blocks):
            runs = []
            for i in range(v.sessions):
                n = block * v.sessions + i
                sid = f"t{n % self.w.tenants}/s{n}"
                session = VoiceSession(self, sid, v, random.Random(f"{self.w.seed}/{sid}"), self.voice)
                runs.append(env.process(_after(env, v.ramp_s * i / max(1, v.sessions), session.run())))
            yield env.all_of(runs)

    def _closed_loop_client(self, todo):
        """One of `make bench`'s clients: the next request as soon as its last one ended."""
        for n, (prompt, output) in todo:
            record = {"arrival": self.env.now, "tiles": 0}
            self.requests[CLOSED_LOOP].append(record)
            yield self.env.process(
                self._serve(f"{CLOSED_LOOP}-{n}", f"t{n % self.w.tenants}", record, prompt, output)
            )

    def _requests(self, name: str, spec: RequestSpec):
        rng = random.Random(f"{self.w.seed}/{name}")
        yield self.env.timeout(spec.start_s)
        for n, gap in enumerate(spec.arrivals.gaps(spec.rate, rng)):
            yield self.env.timeout(gap)
            if spec.stop_s is not None and self.env.now >= spec.stop_s:
                return
            self.env.process(self._request(name, n, spec, rng))

    def _request(self, name: str, n: int, spec: RequestSpec, rng: random.Random):
        rid, tenant = f"{name}-{n}", f"t{n % self.w.tenants}"
        record = {"arrival": self.env.now, "tiles": rng.randint(*spec.tiles)}
        self.requests[name].append(record)
        prompt, output = spec.prompt(rng), spec.output(rng)
        if self.quota is not None:
            cost = Cost(text_tokens=prompt + output, image_tiles=record["tiles"])
            if not (yield self.env.process(self.quota.admit(tenant, rid, cost, spec.slo_class == "batch"))):
                record["refused"] = True
                return
            record["admitted"], record["charged"] = self.env.now, cost
        yield self.env.process(self._serve(rid, tenant, record, prompt, output, spec.tokens_per_tile))
        if self.quota is not None:
            self.quota.release(tenant, rid)

    def _serve(self, rid: str, tenant: str, record: dict, prompt: int, output: int, tokens_per_tile: int = 0):
        """An admitted request through the pipeline: the serving path's work per request, its tiles
        encoded, then the thinker (whose tokens reach it through the serving path's work per step)."""
        env, serving = self.env, self.hw.serving
        self.load.update(requests=1, text_tokens=prompt + output, image_tiles=record["tiles"])
        if serving is not None:
            yield work(env, self.cores, serving.request_cpu_s)
        if record["tiles"]:
            encoder = self._encoder(rid, record["tiles"])
            yield encoder.encode(rid, record["tiles"])
            prompt += record["tiles"] * tokens_per_tile
            record["encoded"] = env.now
        done = env.event()

        def owner(request: SimRequest, what: str) -> None:
            if what == "token" and "ttft" not in record:
                record["ttft"] = env.now - record["arrival"]
            elif what == "finished":
                done.succeed()

        request = SimRequest(rid, None, prompt, output, env.now, owner)
        self.route(rid, None).add(request)
        yield done
        record["e2e"], record["end"] = env.now - record["arrival"], env.now

    def _encoder(self, rid: str, tiles: int) -> EncoderReplica:
        request = RoutedRequest(request_id=rid, tiles=tiles)
        best = self.encoder_router.rank(
            request, [Candidate(e.name, None, {"pending_tiles": e.scheduler.pending}) for e in self.encoders]
        )[0]
        for _, scorer in self.encoder_router.stages:
            scorer.on_routed(request, best)
        return next(e for e in self.encoders if e.name == best)

    def run(self) -> None:
        self.start()
        until = self.env.timeout(self.w.duration_s)
        if self._clients:  # a closed loop ends with its last request
            until = self.env.any_of([until, self.env.all_of(self._clients)])
        elif self.w.voice.turns is not None and self._voice is not None:  # sessions of a number of turns
            until = self.env.any_of([until, self._voice])
        try:
            self.env.run(until=until)
        finally:
            if self.quota is not None:
                self.quota.close()


class EncoderReplica:
    """Tiles batched by the encoder stage's own scheduler; a batch costs the encoder curve."""

    def __init__(self, cluster: Cluster, name: str):
        self.cluster, self.env, self.name = cluster, cluster.env, name
        pool = cluster.profile.encoder_pool
        self.scheduler = TileScheduler(
            pool.batch_size, pool.policy, pool.aging_tiles_per_s, clock=lambda: self.env.now
        )
        self.curve = cluster.hw.stages.encoder_batch
        self.prep = cluster.hw.stages.encoder_prep  # None: tiles reach the scheduler as they arrive
        self._left: dict[str, tuple[int, simpy.Event]] = {}
        self._preparing = 0
        self._wake = self.env.event()
        self.env.process(self._loop())

    @property
    def ongoing(self) -> int:
        """Requests with tiles still to cut or encode here."""
        return len(self._left) + self._preparing

    def encode(self, rid: str, tiles: int) -> simpy.Event:
        if self.curve is None:
            raise ValueError(f"hardware profile {self.cluster.hw.name} has no encoder_batch curve")
        done = self.env.event()
        if self.prep is None:
            self._submit(rid, tiles, done)
        else:
            self.env.process(self._prepared(rid, tiles, done))
        return done

    def _prepared(self, rid: str, tiles: int, done: simpy.Event):
        """A request's tiles are cut on a thread of their own (the stage's pool), then batched."""
        self._preparing += 1
        yield work(self.env, self.cluster.cores, self.prep.at(tiles))
        self._preparing -= 1
        self._submit(rid, tiles, done)

    def _submit(self, rid: str, tiles: int, done: simpy.Event) -> None:
        self._left[rid] = (tiles, done)
        self.scheduler.submit(rid, list(range(tiles)))
        if not self._wake.triggered:
            self._wake.succeed()

    def _loop(self):
        while True:
            batch = self.scheduler.next_batch()
            if not batch:
                self._wake = self.env.event()
                yield self._wake
                continue
            yield work(self.env, self.cluster.cores, self.curve.at(len(batch)))
            for rid, _ in batch:
                left, done = self._left[rid]
                self._left[rid] = (left - 1, done)
                if left == 1:
                    del self._left[rid]
                    for _, scorer in self.cluster.encoder_router.stages:
                        scorer.on_completed(rid, self.name)
                    done.succeed()


class _Open:
    """Admission off: every session is admitted."""

    def try_admit(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def observe(self, ratio: float) -> None:
        pass


def _after(env: simpy.Environment, delay: float, process):
    yield env.timeout(delay)
    yield env.process(process)
