"""The thinker's hidden states at the media placeholders, out of vLLM for the talker (Qwen3-Omni).

Qwen3-Omni's talker reads, at the image/audio placeholders of the user turns, the thinker's residual
stream after `accept_hidden_layer` layers. vLLM has no per-request output for it, so:

- the model (services/extensions/vllm/qwen3_omni_thinker.py) keeps that layer's rows of each forward
  (vLLM's aux-hidden-state hook, the one EAGLE-3 uses) and the step's media mask;
- this worker extension (`worker_extension_cls`) wraps the model runner's `execute_model`: after a
  forward it cuts the rows by request (the batch's token order) and position, and once a media item's
  rows are all computed, writes them to Redis under the item's key;
- a key names the item by everything its rows depend on — the tenant salt, the model, and the prompt
  up to the item's end (`media_row_keys`, the KV store's chain hashing) — so an item served from a
  prefix cache or the KV store next time (not recomputed) finds the rows its first computation wrote;
- the decode stage reads a response's rows and hands them to the talker with its tokens
  (services/dataplane/token_stream.py).

Rows expire after ROWS_TTL_S (refreshed when read): a media item cached longer than that cannot be
spoken about until it is recomputed (a clear error, not wrong speech).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np

from services.common.redis_config import sync_client

log = logging.getLogger(__name__)

EXTRA_ARG = "omniray_media_rows"  # SamplingParams.extra_args: [[start, rows, key], ...]
PREFIX = "omniray:media-rows:"
ROWS_TTL_S = 3600


def media_row_keys(segments: list, salt: str, llm_version: str) -> list[tuple[int, int, str]]:
    """(first position, rows, key) of each media span of `segments` (token-id lists and media spans
    {"media": digest, "tokens": n}, as the engine names the prompt for the KV store)."""
    chain = hashlib.sha256(f"{llm_version}\x00{salt}".encode())
    out, at = [], 0
    for seg in segments:
        if isinstance(seg, dict):
            chain.update(b"M" + seg["media"].encode() + int(seg["tokens"]).to_bytes(4, "little"))
            out.append((at, int(seg["tokens"]), PREFIX + chain.copy().hexdigest()))
            at += int(seg["tokens"])
        else:
            chain.update(b"T" + np.asarray(seg, dtype="<i4").tobytes())
            at += len(seg)
    return out


def read_rows(redis, keys: list[str]) -> list[np.ndarray | None]:
    """The rows written under `keys` ([rows, hidden] float32 each), None where missing."""
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.getex(key, ex=ROWS_TTL_S)
    return [_decode(raw) for raw in pipe.execute()]


async def read_rows_async(redis, keys: list[str]) -> list[np.ndarray | None]:
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.getex(key, ex=ROWS_TTL_S)
        return [_decode(raw) for raw in await pipe.execute()]


def _encode(rows: np.ndarray) -> bytes:
    rows = np.ascontiguousarray(rows, dtype="<f4")
    return int(rows.shape[1]).to_bytes(4, "little") + rows.tobytes()


def _decode(raw: bytes | None) -> np.ndarray | None:
    if raw is None:
        return None
    width = int.from_bytes(raw[:4], "little")
    return np.frombuffer(raw[4:], dtype="<f4").reshape(-1, width)


class _Pending:
    """One request's media spans whose rows are being computed (chunked prefill: over steps)."""

    def __init__(self, spans: list):
        self.spans = [(int(s), int(n), str(k)) for s, n, k in spans]
        self.rows: dict[int, np.ndarray] = {}  # position -> row
        self.done: set[str] = set()


class MediaRowsWorker:
    """vLLM worker extension (`worker_extension_cls`): `omniray_capture_media_rows` (through
    `collective_rpc`) starts writing media rows after every forward."""

    def omniray_capture_media_rows(self) -> bool:
        runner = self.model_runner
        model = runner.get_model()
        if not hasattr(model, "take_media_rows") or getattr(runner, "_omniray_media_rows", False):
            return False
        runner._omniray_media_rows = True
        redis = sync_client()
        pending: dict[str, _Pending] = {}
        execute = runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            out = execute(scheduler_output, *args, **kwargs)
            try:
                _after_forward(runner, model, scheduler_output, pending, redis)
            except Exception as e:  # the talker of this response fails clearly; the text goes on
                log.warning("media rows not written: %s", e)
            return out

        runner.execute_model = execute_model
        return True


def _after_forward(runner, model, scheduler_output, pending: dict[str, _Pending], redis) -> None:
    for req_id in list(pending):
        if req_id in scheduler_output.finished_req_ids:
            del pending[req_id]
    taken = model.take_media_rows()
    if taken is None:
        return
    rows, mask = taken  # [tokens, hidden] this step's rows at the talker's layer; [tokens] bool
    computed: dict[str, int] = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    offset, writes = 0, {}
    for req_id in runner.input_batch.req_ids:
        n = scheduler_output.num_scheduled_tokens.get(req_id, 0)
        step_mask = mask[offset : offset + n]
        if n and step_mask.any():
            p = pending.get(req_id)
            if p is None:
                spans = _spans(runner.requests.get(req_id))
                p = pending[req_id] = _Pending(spans) if spans else None
            if p is not None:
                at = np.nonzero(step_mask)[0]
                for pos, row in zip(
                    (computed[req_id] + at).tolist(), rows[offset : offset + n][at], strict=True
                ):
                    p.rows[pos] = row
                for start, count, key in p.spans:
                    if key not in p.done and all(pos in p.rows for pos in range(start, start + count)):
                        writes[key] = _encode(
                            np.stack([p.rows.pop(pos) for pos in range(start, start + count)])
                        )
                        p.done.add(key)
        offset += n
    if writes:
        pipe = redis.pipeline(transaction=False)
        for key, value in writes.items():
            pipe.set(key, value, ex=ROWS_TTL_S)
        pipe.execute()


def _spans(state: Any) -> list:
    params = getattr(state, "sampling_params", None)
    extra = (params.extra_args or {}) if params is not None else {}
    return extra.get(EXTRA_ARG) or []
