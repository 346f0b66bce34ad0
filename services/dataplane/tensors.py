"""Tensor descriptors: how arrays cross stage boundaries.

Small arrays travel inline in the protobuf message; larger ones (> INLINE_LIMIT_BYTES) go into
Ray's object store and only a serialized reference travels, so control messages stay small on
Serve's gRPC transport. Serializing a reference out of band pins the object; the producer unpins it
after HOLD_SECONDS (longer than any request may live), so nothing leaks. kv_store replaces this
with NIXL transfers.
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import ray
from omni.v1 import common_pb2

from services.common.deadline import Overdue, within
from services.extensions.ray import object_refs

# Per tensor. Small enough that a message with the most media items a request may carry stays far
# below the replica gRPC message limit that services.app sets.
INLINE_LIMIT_BYTES = 256 * 1024
HOLD_SECONDS = 300.0

_held: list[tuple[float, ray.ObjectRef]] = []
_held_lock = threading.Lock()
_sweeper: threading.Thread | None = None


def _release_expired() -> None:
    now = time.monotonic()
    with _held_lock:
        while _held and _held[0][0] <= now:
            object_refs.release(_held.pop(0)[1])


def _sweep_forever() -> None:
    while True:
        time.sleep(HOLD_SECONDS / 10)
        _release_expired()


def _hold(ref: ray.ObjectRef) -> None:
    """Keep the producer's pin for HOLD_SECONDS; a daemon thread undoes expired pins."""
    global _sweeper
    with _held_lock:
        _held.append((time.monotonic() + HOLD_SECONDS, ref))
        if _sweeper is None:
            _sweeper = threading.Thread(target=_sweep_forever, name="omniray-tensor-unpin", daemon=True)
            _sweeper.start()


_TO_PROTO = {
    np.dtype(np.float32): common_pb2.DTYPE_FLOAT32,
    np.dtype(np.float16): common_pb2.DTYPE_FLOAT16,
    np.dtype(np.int16): common_pb2.DTYPE_INT16,
    np.dtype(np.int32): common_pb2.DTYPE_INT32,
    np.dtype(np.int64): common_pb2.DTYPE_INT64,
    np.dtype(np.uint8): common_pb2.DTYPE_UINT8,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}


def describe(
    array: np.ndarray,
    *,
    content_hash: str = "",
    producer_version: str = "",
    inline_limit: int = INLINE_LIMIT_BYTES,
) -> common_pb2.TensorDescriptor:
    array = np.ascontiguousarray(array)
    if array.dtype not in _TO_PROTO:
        raise TypeError(f"dtype {array.dtype} cannot cross a stage boundary")
    desc = common_pb2.TensorDescriptor(
        shape=list(array.shape),
        dtype=_TO_PROTO[array.dtype],
        content_hash=content_hash,
        producer_version=producer_version,
    )
    if array.nbytes <= inline_limit:
        desc.inline_data = array.tobytes()
    else:
        ref = ray.put(array)
        desc.object_ref = object_refs.dumps(ref)
        _hold(ref)
    return desc


class Kept:
    """A tensor in the object store that stays there for as long as this handle lives (not just
    HOLD_SECONDS): for outputs a long-lived holder reuses in many requests (a realtime session's
    encoded turns). Its `descriptor` carries the reference."""

    def __init__(self, array: np.ndarray, like: common_pb2.TensorDescriptor):
        self.ref = ray.put(np.ascontiguousarray(array))
        self.descriptor = common_pb2.TensorDescriptor(
            shape=list(like.shape),
            dtype=like.dtype,
            content_hash=like.content_hash,
            producer_version=like.producer_version,
            object_ref=object_refs.dumps(self.ref),
        )
        weakref.finalize(self, object_refs.release, self.ref)


# The longest an object-store fetch may take (ray.exceptions.GetTimeoutError after it): a tensor of
# the largest media items moves between nodes well within it.
FETCH_TIMEOUT_S = 30.0


def materialize(desc: common_pb2.TensorDescriptor) -> np.ndarray:
    dtype = _FROM_PROTO.get(desc.dtype)
    if dtype is None:
        raise ValueError(f"unsupported tensor dtype {desc.dtype}")
    where = desc.WhichOneof("location")
    if where == "inline_data":
        return np.frombuffer(desc.inline_data, dtype=dtype).reshape(tuple(desc.shape))
    if where == "object_ref":  # bounded: an object on a node that stopped answering is no hang
        return np.asarray(ray.get(object_refs.loads(desc.object_ref), timeout=FETCH_TIMEOUT_S))
    raise ValueError(f"tensor location {where!r} is not available in this build")


async def materialized(desc: common_pb2.TensorDescriptor) -> np.ndarray:
    """`materialize` for a caller on an event loop (the gateway): an object-store fetch is awaited,
    so the loop serves its other requests meanwhile; bounded alike."""
    if desc.WhichOneof("location") != "object_ref" or desc.dtype not in _FROM_PROTO:
        return materialize(desc)
    try:
        return np.asarray(await within(FETCH_TIMEOUT_S, object_refs.loads(desc.object_ref)))
    except Overdue:
        raise ray.exceptions.GetTimeoutError(f"object not fetched within {FETCH_TIMEOUT_S:g} s") from None
