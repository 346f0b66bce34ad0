"""Tensor descriptors: how arrays cross stage boundaries.

Small arrays travel inline in the protobuf message; larger ones (> INLINE_LIMIT_BYTES) go into
Ray's object store and only a serialized reference travels, so control messages stay small on
Serve's gRPC transport. Serializing a reference out of band pins the object; the producer unpins it
after HOLD_SECONDS (longer than any request may live), so nothing leaks. kv_store replaces this
with NIXL transfers.
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import ray
from omni.v1 import common_pb2

# Per tensor. Small enough that a message with the most media items a request may carry stays far
# below the replica gRPC message limit that services.app sets.
INLINE_LIMIT_BYTES = 256 * 1024
HOLD_SECONDS = 300.0

_held: list[tuple[float, ray.ObjectRef]] = []
_held_lock = threading.Lock()
_sweeper: threading.Thread | None = None


def _release_expired() -> None:
    core_worker = ray._private.worker.global_worker.core_worker
    now = time.monotonic()
    with _held_lock:
        while _held and _held[0][0] <= now:
            core_worker.remove_object_ref_reference(_held.pop(0)[1])


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
        desc.object_ref = ray.cloudpickle.dumps(ref)
        _hold(ref)
    return desc


def describe_bytes(data: bytes, **kwargs) -> common_pb2.TensorDescriptor:
    """Raw media bytes as a UINT8 tensor, tagged with their content hash (cache keys use it)."""
    return describe(
        np.frombuffer(data, dtype=np.uint8), content_hash=hashlib.sha256(data).hexdigest(), **kwargs
    )


def materialize(desc: common_pb2.TensorDescriptor) -> np.ndarray:
    dtype = _FROM_PROTO.get(desc.dtype)
    if dtype is None:
        raise ValueError(f"unsupported tensor dtype {desc.dtype}")
    where = desc.WhichOneof("location")
    if where == "inline_data":
        return np.frombuffer(desc.inline_data, dtype=dtype).reshape(tuple(desc.shape))
    if where == "object_ref":
        return np.asarray(ray.get(ray.cloudpickle.loads(desc.object_ref)))
    raise ValueError(f"tensor location {where!r} is not available in this build")
