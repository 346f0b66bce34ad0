"""omniray's encoder-cache (EC) connector: the thinker consumes encoder outputs that the encoder pool
streams over NIXL (kv_store/features.py), item by item, by multimodal uuid — vLLM's EC transfer API
(`vllm.distributed.ec_transfer`), the one its own encoder/prefill disaggregation uses.

The gateway sends a prompt as soon as the encoder pool has placed its images (their token counts),
while they are still being encoded; each streamed image is named `PREFIX + <its feature key>` in the
request's `multi_modal_uuids` and carries only its grid (the consumer config sets vLLM's
`allow_missing_mm_embeddings`). Then, in the engine core:

- scheduler side: an item counts as available once its features have *arrived* in this process — an
  encoder replica indexed them in Redis, a reader thread looked them up and READ them over NIXL
  (Redis and the network never on the scheduler's loop). A request computes up to the first of its streamed items not yet arrived
  (`computable_tokens`, applied by services/extensions/vllm/scheduler.py: the prompt's text and
  first images are prefilled while later images encode) and waits there, keeping its seat; one that
  waits past `wait_s` fails (`take_unavailable_requests`: vLLM's error, the gateway's 503);
- worker side: the arrived features travel to the worker in the step's connector metadata and are
  put in vLLM's encoder cache, cast to the model's dtype. A worker never reads the network, so a
  lost encoder replica can fail a request but never an engine step.

Items with inline embeddings (audio, video, a realtime session's kept images) do not use the
connector: their uuid has no PREFIX, so `has_cache_item` is False and vLLM reads them as before.
Known limit: an item vLLM already holds in its encoder cache is read again when another request
needs it before its KV is cached (the connector does not see vLLM's encoder cache).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
)

from kv_store.features import INDEX, FeatureReader, FeatureUnavailable
from services.common.redis_config import UNAVAILABLE, sync_client
from services.extensions.vllm.specs import EC_ITEM_PREFIX as PREFIX

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

RETRY_S = 0.5  # after a failed read, the item is looked for again this much later
LOOK_S = 0.01  # items not indexed yet are looked for in Redis (one round trip for all) this often


@dataclass
class EcLoads(ECConnectorMetadata):
    """A step's arrived features for the worker to put in vLLM's encoder cache."""

    features: dict[str, np.ndarray] = field(default_factory=dict)


class _Arrived:
    """Features read over NIXL, waiting to be scheduled (bounded in bytes, oldest dropped first: a
    dropped item is read again if still needed)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._items: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    def __contains__(self, ident: str) -> bool:
        return ident in self._items

    def get(self, ident: str) -> np.ndarray:
        self._items.move_to_end(ident)
        return self._items[ident]

    def add(self, ident: str, features: np.ndarray) -> None:
        self._items[ident] = features
        self.bytes += features.nbytes
        while self.bytes > self.max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.nbytes


class OmniEcConnector(ECConnectorBase):
    def __init__(self, vllm_config: VllmConfig, role: ECConnectorRole):
        super().__init__(vllm_config=vllm_config, role=role)
        extra = vllm_config.ec_transfer_config.ec_connector_extra_config
        self.redis_url = extra["redis_url"]
        self.wait_s = float(extra.get("wait_s", 60.0))
        self.landing_bytes = int(extra.get("landing_bytes", 64 << 20))
        self.dtype = vllm_config.model_config.dtype
        self._arrived = _Arrived(int(extra.get("arrived_bytes", 1 << 30)))
        self._reads: dict[str, concurrent.futures.Future] = {}
        self._failed_at: dict[str, float] = {}
        self._wanted: set[str] = set()  # items asked for, not indexed at the last look
        self._looked = -LOOK_S
        self._looking: concurrent.futures.Future | None = None
        self._waiting_since: dict[str, float] = {}
        self._unavailable: set[str] = set()
        self.waits: list[
            tuple[str, float]
        ] = []  # (outcome, seconds) of ended waits, for the scheduler's metrics
        self._loads: dict[str, np.ndarray] = {}
        self._redis = None
        self._reader: FeatureReader | None = None
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None

    # ---- scheduler side ------------------------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        """Whether a streamed item's features are here to be scheduled (starting their read when
        the encoder pool has indexed them)."""
        if not identifier.startswith(PREFIX):
            return False
        if identifier in self._arrived:
            return True
        read = self._reads.get(identifier)
        if read is None:
            if time.monotonic() - self._failed_at.get(identifier, -RETRY_S) >= RETRY_S:
                self._wanted.add(identifier)
                self._look()
            return False
        if not read.done():
            return False
        del self._reads[identifier]
        try:
            self._arrived.add(identifier, read.result())
        except (FeatureUnavailable, *UNAVAILABLE) as e:
            self._failed_at[identifier] = time.monotonic()
            log.warning("features of %s not read (%s); looked for again", identifier, e)
            return False
        self._failed_at.pop(identifier, None)
        return True

    def _look(self) -> None:
        """At most every LOOK_S, on the reader thread (a stalled Redis never stalls the scheduler's
        loop): which wanted items the encoder pool has indexed, in one pipelined round trip. The
        reads of those found by the last look start."""
        if self._looking is not None:
            if not self._looking.done():
                return
            look, self._looking = self._looking, None
            try:
                found = look.result()
            except UNAVAILABLE:
                found = []
            for identifier in found:
                if identifier in self._wanted:
                    self._wanted.discard(identifier)
                    self._reads[identifier] = self._pool().submit(self._read, identifier)
        now = time.monotonic()
        if now - self._looked < LOOK_S or not self._wanted:
            return
        self._looked = now
        self._looking = self._pool().submit(self._indexed, sorted(self._wanted))

    def _indexed(self, wanted: list[str]) -> list[str]:
        """On the reader thread: those of `wanted` the encoder pool has indexed."""
        pipe = self._client().pipeline(transaction=False)
        for identifier in wanted:
            pipe.exists(INDEX + identifier[len(PREFIX) :])
        return [i for i, indexed in zip(wanted, pipe.execute(), strict=True) if indexed]

    def computable_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        """How many tokens from `num_computed_tokens` the request may compute now: up to its first
        streamed item whose features have not arrived (None: no bound). Every later item already
        indexed starts its read too, so reads run ahead of the prefill."""
        bound = None
        for feature in request.mm_features or ():
            pos = feature.mm_position
            if pos.offset + pos.length <= num_computed_tokens or not feature.identifier.startswith(PREFIX):
                continue
            if not self.has_cache_item(feature.identifier) and bound is None:
                bound = max(0, pos.offset - num_computed_tokens)
        return bound

    def ensure_cache_available(self, request: Request, num_computed_tokens: int) -> bool:
        now = time.monotonic()
        if self.computable_tokens(request, num_computed_tokens) != 0:
            if (since := self._waiting_since.pop(request.request_id, None)) is not None:
                self.waits.append(("arrived", now - since))
            return True
        since = self._waiting_since.setdefault(request.request_id, now)
        if now - since > self.wait_s:
            log.warning(
                "request %s waited %.0f s for streamed features; failed", request.request_id, self.wait_s
            )
            self._unavailable.add(request.request_id)
            self._waiting_since.pop(request.request_id, None)
            self.waits.append(("timed_out", now - since))
        return False

    @property
    def waiting(self) -> bool:
        """Requests are waiting for streamed features (the scheduler idles briefly, not spins)."""
        return bool(self._waiting_since)

    def take_unavailable_requests(self) -> set[str]:
        out, self._unavailable = self._unavailable, set()
        return out

    def update_state_after_alloc(self, request: Request, index: int) -> None:
        identifier = request.mm_features[index].identifier
        if identifier in self._arrived:
            self._loads[identifier] = self._arrived.get(identifier)

    def build_connector_meta(self, scheduler_output: Any) -> EcLoads:
        meta, self._loads = EcLoads(self._loads), {}
        return meta

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        self._waiting_since.pop(request.request_id, None)
        for feature in request.mm_features or ():
            self._wanted.discard(feature.identifier)
            self._failed_at.pop(feature.identifier, None)
        return False, None

    def _read(self, identifier: str) -> np.ndarray:
        """On the reader thread: one item over NIXL."""
        if self._reader is None:
            name = f"ec-reader-{self._vllm_config.ec_transfer_config.engine_id}"
            self._reader = FeatureReader(name, sync_client(self.redis_url), self.landing_bytes)
        return self._reader.read(identifier[len(PREFIX) :])

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._threads is None:
            self._threads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="omniray-ec-read")
        return self._threads

    def _client(self):
        if self._redis is None:
            self._redis = sync_client(self.redis_url)
        return self._redis

    def shutdown(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    # ---- worker side ---------------------------------------------------------------------------

    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs) -> None:
        from vllm.platforms import current_platform

        meta = self._get_connector_metadata()
        assert isinstance(meta, EcLoads)
        device = current_platform.device_type
        if current_platform.is_cuda_alike():
            device = f"{device}:{current_platform.current_device()}"
        for identifier, features in meta.features.items():
            if identifier not in encoder_cache:
                encoder_cache[identifier] = torch.from_numpy(features).to(device=device, dtype=self.dtype)

    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs) -> None:
        """Nothing: the producer is omniray's encoder pool, not a vLLM engine."""
