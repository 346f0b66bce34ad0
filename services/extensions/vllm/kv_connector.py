"""`OmniKvConnector`: vLLM v1 KV connector backed by the tiered store.

Pages are vLLM blocks: a page holds one block's KV for every layer (`kernels.kv_pages` converts
between the two layouts) and is named by its chained hash (`kv_store.hashing`), so any engine finds
any other's pages by hashing its own prompt.

Scheduler side (per request): hash the prompt (token ids, or the segments the engine passes for
prompts with media embeddings), ask Redis how much of it live providers hold, and report those
tokens as externally computed; loads are asynchronous, so a prompt held entirely (P/D: prefill's
pages) is reported whole. As tokens are computed, every newly completed page is saved; a request
marked `do_remote_decode` (prefill for a decode engine) also saves its prompt's partial last page.

Worker side: loads run on the store agent's loop (pull from a peer's L2 over NIXL, or promote from
L3) and are scattered into the request's blocks; a page that cannot be had (its provider died, the
transfer failed) is reported as a load error and vLLM recomputes from there
(`kv_load_failure_policy="recompute"`) — correctness never depends on the store. Saves gather the
completed blocks straight into reserved L2 slots and publish them before the step returns, so a
decode engine asked right after prefill finds them.

Request parameters (`kv_transfer_params["omniray"]`): `segments` (the prompt as token-id lists and
media spans), `salt` (the tenant: pages are never shared across salts), `trace` (W3C trace context:
the `kv_store.load` span joins the request's trace), `session` (appends saved pages to the session's chain), `bypass` (neither load nor
save: a recompute baseline), `kind` (pd / session / prefix, for metrics).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kernels import kv_pages
from kv_store import metrics as store_metrics
from kv_store.agent import AgentConfig, StoreAgent
from kv_store.hashing import ChainHasher, MediaSpan, elements, token_elements
from kv_store.layout import PageLayout
from kv_store.metadata import MetadataUnavailable
from services.extensions.vllm import engine_metrics

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


# Spans are exported when the engine process has an OpenTelemetry SDK provider (vLLM sets one up
# with --otlp-traces-endpoint); otherwise they cost nothing.
_TRACER = trace.get_tracer("omniray.kv_store")


@dataclass
class LoadJob:
    req_id: str
    pages: list[str]
    block_ids: list[int]
    tokens: int  # tokens these pages stand for (the last page may be partial)
    kind: str = "prefix"
    trace: dict[str, str] = field(default_factory=dict)
    session: str | None = None


@dataclass
class SaveJob:
    pages: list[str]
    block_ids: list[int]
    session: str | None
    hand_off: bool = False  # a decode engine reads these pages next


@dataclass
class OmniKvMetadata(KVConnectorMetadata):
    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)
    # (kind, tokens found in the store, tokens to compute) per newly admitted request
    lookups: list[tuple[str, int, int]] = field(default_factory=list)


def segments_from_params(raw: list) -> list:
    """The `segments` request parameter: lists of token ids, and media spans as
    {"media": hash of the span's features, "encoder": version, "tokens": n}."""
    return [
        MediaSpan(s["media"], s["encoder"], int(s["tokens"])) if isinstance(s, dict) else list(s) for s in raw
    ]


@dataclass
class _Tracked:
    """Scheduler-side state of one request."""

    request: Request
    hasher: ChainHasher
    prompt_pages: list[str]
    prompt_tail: str | None
    kind: str
    session: str | None
    trace: dict[str, str]
    hand_off: bool  # prefill for a remote decode: save the prompt's partial last page too
    block_ids: list[int] = field(default_factory=list)
    saved: int | None = None  # pages saved (or already held) so far; None until first scheduled
    fed_output: int = 0
    matched: tuple[int, int, list[str]] | None = None  # (first page, tokens, pages) of the last lookup
    tail_saved: bool = False
    loaded: bool = False  # one load per request: after a failed one, vLLM recomputes


class OmniKvStats(KVConnectorStats):
    """The store agent's recorded metrics, carried from the engine core to the front end."""

    def reset(self):
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        return OmniKvStats(data=store_metrics.merge(self.data, other.data))

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, float] = {}
        for method, per in self.data.items():
            if store_metrics.SPEC[method][0] == "counter":
                for labels, values in per:
                    out[f"{method}[{','.join(labels)}]"] = values[0]
        return out

    def is_empty(self) -> bool:
        return not self.data


class OmniKvPromMetrics(KVConnectorPromMetrics):
    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        engine_metrics.publish(transfer_stats_data)


class OmniKvConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.HOST  # loads land from the L2 host pool

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # saves complete within the step; a dropped save is a future miss

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config, role, kv_cache_config)
        self.config = AgentConfig.from_extra(dict(self._kv_transfer_config.kv_connector_extra_config))
        self.agent = StoreAgent.get(self.config)
        self.block_size = vllm_config.cache_config.block_size
        # scheduler side
        self._tracked: dict[str, _Tracked] = {}
        self._loads: list[LoadJob] = []
        self._lookups: list[tuple[str, int, int]] = []
        # worker side
        self._layers: list[torch.Tensor] = []
        self._layout: PageLayout | None = None
        self._loading: dict[str, tuple[LoadJob, Any]] = {}  # req id -> (job, future of failed block ids)
        self._load_errors: set[int] = set()

    # ---- scheduler side ------------------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        params = (request.kv_transfer_params or {}).get("omniray", {})
        if params.get("bypass"):
            return
        if "segments" in params:
            items = elements(segments_from_params(params["segments"]))
        elif request.prompt_token_ids is not None:
            items = token_elements(request.prompt_token_ids)
        else:
            return  # prompt embeddings without segments: nothing to name the pages by
        hasher = ChainHasher(self.block_size, self.config.llm_version, params.get("salt", ""))
        hasher.feed(items)
        if hasher.tokens != request.num_prompt_tokens:  # a caller's bug: skip the store, never fail
            log.warning(
                "request %s: segments cover %d tokens, the prompt has %d; not using the KV store",
                request.request_id,
                hasher.tokens,
                request.num_prompt_tokens,
            )
            self.agent.recorder.error("naming")
            return
        self._tracked[request.request_id] = _Tracked(
            request=request,
            hasher=hasher,
            prompt_pages=list(hasher.pages),
            prompt_tail=hasher.tail(),
            kind=params.get("kind", "session" if params.get("session") else "prefix"),
            session=params.get("session"),
            trace=params.get("trace", {}),
            hand_off=bool((request.kv_transfer_params or {}).get("do_remote_decode")),
        )

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tracked = self._tracked.get(request.request_id)
        if tracked is None or tracked.loaded:
            return 0, False
        first = num_computed_tokens // self.block_size
        chain = tracked.prompt_pages[first:] + ([tracked.prompt_tail] if tracked.prompt_tail else [])
        if not chain:
            return 0, False
        held = self.agent.lookup(chain)  # 0 when the store is down or slow: computed, never failed
        pages = chain[:held]
        if held == len(chain):
            tokens = request.num_prompt_tokens - num_computed_tokens
        else:
            tokens = held * self.block_size
        tracked.matched = (first, tokens, pages)
        return tokens, tokens > 0

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int):
        tracked = self._tracked.get(request.request_id)
        if tracked is None or tracked.matched is None:
            return
        first, tokens, pages = tracked.matched
        tracked.matched = None
        self._lookups.append(
            (tracked.kind, num_external_tokens, request.num_prompt_tokens - num_external_tokens)
        )
        if num_external_tokens <= 0:
            return
        block_ids = blocks.get_block_ids()[0]
        tracked.loaded = True
        blocks_for_pages = list(block_ids[first : first + len(pages)])
        self._loads.append(
            LoadJob(
                request.request_id,
                pages,
                blocks_for_pages,
                num_external_tokens,
                tracked.kind,
                tracked.trace,
                tracked.session,
            )
        )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = OmniKvMetadata(loads=self._loads, lookups=self._lookups)
        self._loads, self._lookups = [], []
        steps: list[tuple[str, int]] = []
        for new in scheduler_output.scheduled_new_reqs:
            if (tracked := self._tracked.get(new.req_id)) is not None:
                tracked.block_ids = list(new.block_ids[0])
                steps.append((new.req_id, new.num_computed_tokens))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if (tracked := self._tracked.get(req_id)) is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_blocks[0]) if new_blocks else []
            elif new_blocks:
                tracked.block_ids.extend(new_blocks[0])
            steps.append((req_id, cached.num_computed_tokens[i]))
        for req_id, computed in steps:
            if (job := self._save_job(self._tracked[req_id], computed, scheduler_output)) is not None:
                meta.saves.append(job)
        return meta

    def _save_job(self, t: _Tracked, computed: int, out: SchedulerOutput) -> SaveJob | None:
        after = computed + out.num_scheduled_tokens.get(t.request.request_id, 0)
        if t.saved is None:  # what was computed before (local or loaded) is in the store already
            t.saved = computed // self.block_size
        outputs = t.request.output_token_ids
        want = min(after - t.hasher.tokens, len(outputs) - t.fed_output)
        if want > 0:
            t.hasher.feed(token_elements(outputs[t.fed_output : t.fed_output + want]))
            t.fed_output += want
        full = min(len(t.hasher.pages), after // self.block_size, len(t.block_ids))
        pages = t.hasher.pages[t.saved : full]
        blocks = t.block_ids[t.saved : full]
        t.saved = max(t.saved, full)
        n_prompt_pages = len(t.prompt_pages)
        if (
            t.hand_off
            and t.prompt_tail
            and not t.tail_saved
            and after >= t.request.num_prompt_tokens
            and n_prompt_pages < len(t.block_ids)
        ):
            pages.append(t.prompt_tail)
            blocks.append(t.block_ids[n_prompt_pages])
            t.tail_saved = True
        return SaveJob(pages, blocks, t.session, t.hand_off) if pages else None

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._tracked.pop(request.request_id, None)
        return False, None

    # ---- worker side ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        model = self._vllm_config.model_config
        heads = model.get_num_kv_heads(self._vllm_config.parallel_config)
        head_dim = model.get_head_size()
        self._layers = [kv_pages.block_view(t, self.block_size, heads, head_dim) for t in kv_caches.values()]
        dtype = str(next(iter(kv_caches.values())).dtype).removeprefix("torch.")
        self._layout = PageLayout(len(self._layers), heads, head_dim, self.block_size, dtype=dtype)
        self.agent.attach(self._layout)

    def _slot(self, raw: np.ndarray) -> torch.Tensor:
        """A pool slot (uint8) as [layers, 2, block, heads, head_dim] of the KV dtype (no copy)."""
        layout = self._layout
        shape = (layout.num_layers, layout.kv_parts, layout.page_tokens, layout.num_kv_heads, layout.head_dim)
        return torch.from_numpy(raw).view(self._layers[0].dtype).view(shape)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, OmniKvMetadata)
        for kind, hit, miss in meta.lookups:
            self.agent.recorder.request(kind, "hit", hit)
            self.agent.recorder.request(kind, "miss", miss)
        for job in meta.loads:
            self._loading[job.req_id] = (job, self.agent.submit(self._load(job)))

    async def _load(self, job: LoadJob) -> set[int]:
        """Fetch the job's pages and scatter the leading ones that arrived; the block ids from the
        first missing page on are returned as failed (vLLM recomputes them)."""
        store = self.agent.store
        parent = TraceContextTextMapPropagator().extract(job.trace)
        started = time.perf_counter()
        with _TRACER.start_as_current_span("kv_store.load", context=parent) as span:
            span.set_attribute("omniray.request_id", job.req_id)
            span.set_attribute("omniray.kv.kind", job.kind)
            span.set_attribute("omniray.kv.pages", len(job.pages))
            fetched = await store.fetch(job.pages)
            if job.session:
                self.agent.saw(job.session, job.pages)
            try:
                ok = 0
                while ok < len(job.pages) and fetched[job.pages[ok]] is not None:
                    ok += 1
                if ok:
                    pages = torch.stack([self._slot(fetched[p]) for p in job.pages[:ok]])
                    kv_pages.scatter(self._layers, torch.tensor(job.block_ids[:ok]), pages)
            finally:
                store.release([p for p, v in fetched.items() if v is not None])
            self.agent.recorder.reload(job.kind, time.perf_counter() - started)
            span.set_attribute("omniray.kv.loaded_pages", ok)
            if ok < len(job.pages):
                self.agent.recorder.fallback("load_failed")
                span.set_attribute("omniray.kv.fallback", True)
        return set(job.block_ids[ok:])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads finish before the request is scheduled (asynchronous loading)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return  # whole completed blocks are saved after the forward (wait_for_save)

    def wait_for_save(self):
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, OmniKvMetadata)
        if not meta.saves:
            return
        store = self.agent.store
        pages = [p for job in meta.saves for p in job.pages]
        blocks = [b for job in meta.saves for b in job.block_ids]
        slots: dict = {}
        try:
            slots = self.agent.run(store.reserve(pages))  # pages already held are left out
            todo = {p: b for p, b in zip(pages, blocks, strict=True) if p in slots}
            if todo:
                gathered = kv_pages.gather(self._layers, torch.tensor(list(todo.values())))
                for page, data in zip(todo, gathered, strict=True):
                    self._slot(slots[page]).copy_(data)
                self.agent.recorder.moved("L1->L2", len(todo) * self._layout.page_bytes)

            async def publish() -> None:
                if any(job.hand_off for job in meta.saves):  # the decode engine's read is next
                    store.pool.expect_readers(self.agent.config.hand_off_read_s)
                await store.commit(list(todo))
                for job in meta.saves:
                    if job.session:
                        await store.meta.append_chain(job.session, job.pages)
                        self.agent.saw(job.session, job.pages)

            self.agent.run(publish())
        except Exception as e:  # a save that fails is a future miss, never a failed request
            if not isinstance(e, MetadataUnavailable):  # an outage is logged once, by the metadata
                log.warning("saving %d KV pages failed: %s", len(pages), e)
            self.agent.recorder.error("save")
            if slots:
                self.agent.run(store.abandon(list(slots)))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done = set()
        for req_id, (job, future) in list(self._loading.items()):
            if future.done():
                del self._loading[req_id]
                try:
                    self._load_errors |= future.result()
                except Exception:  # the whole load failed: recompute every block of it
                    self.agent.recorder.fallback("load_error")
                    self._load_errors |= set(job.block_ids)
                done.add(req_id)
        return None, done or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        data = self.agent.recorder.drain()
        return OmniKvStats(data=data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return OmniKvStats(data=data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return OmniKvPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
