import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from services.dataplane import tensors

DTYPES = st.sampled_from([np.float32, np.float16, np.int16, np.int32, np.int64, np.uint8])


@given(hnp.arrays(DTYPES, hnp.array_shapes(min_dims=1, max_dims=3, max_side=16)))
def test_inline_roundtrip(array):
    desc = tensors.describe(array)
    assert desc.WhichOneof("location") == "inline_data"
    out = tensors.materialize(desc)
    assert out.dtype == array.dtype and out.shape == array.shape
    assert np.array_equal(out, array, equal_nan=array.dtype.kind == "f")


def test_large_tensor_goes_by_reference_through_the_object_store():
    import ray

    # Reuse the session's cluster connection when another test already made one.
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        big = np.arange(1 << 19, dtype=np.float32)  # 2 MiB, over the inline limit
        desc = tensors.describe(big)
        assert desc.WhichOneof("location") == "object_ref"
        assert len(desc.SerializeToString()) < 4096
        assert np.array_equal(tensors.materialize(desc), big)
    finally:
        if started:
            ray.shutdown()
