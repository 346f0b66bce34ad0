"""Ray object references that travel inside protobuf messages (services/dataplane/tensors.py).

Serializing a reference out of band (ray.cloudpickle) makes Ray pin the object for good: Ray cannot
see who holds the bytes. Ray 2.60 has no public call to drop that pin; its core worker's
`remove_object_ref_reference` is what Ray itself uses. Written for Ray 2.60; the out-of-band round
trip and the release are driven against a real Ray in tests/contracts/test_ray_object_refs.py.
"""

from __future__ import annotations

import ray

WRITTEN_FOR = "2.60"

if ".".join(ray.__version__.split(".")[:2]) != WRITTEN_FOR:
    raise RuntimeError(
        f"{__name__} was written for Ray {WRITTEN_FOR}.x, this is Ray {ray.__version__}: run "
        "tests/contracts against it and update WRITTEN_FOR"
    )


def dumps(ref: ray.ObjectRef) -> bytes:
    """The reference as bytes for a message; the object stays pinned until `release(ref)`."""
    return ray.cloudpickle.dumps(ref)


def loads(data: bytes) -> ray.ObjectRef:
    return ray.cloudpickle.loads(data)


def release(ref: ray.ObjectRef) -> None:
    """Drop the pin that `dumps` added (in the process that called it)."""
    if not ray.is_initialized():  # disconnected (a driver after ray.shutdown): its pins went with it
        return
    ray._private.worker.global_worker.core_worker.remove_object_ref_reference(ref)
