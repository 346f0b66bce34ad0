"""The bounded-KV integration tests' engine (test_sink_window_engine.py, test_session_kv_engine.py)."""

from __future__ import annotations


def bounded_engine(redis_url: str, *, sinks: int, window: int, block: int, pool: int, **engine):
    """A decode ThinkerEngine of the tiny thinker with sinks + window KV in a pool of `pool` blocks
    (and any other engine spec fields): the bounded-KV integration tests' engine."""
    import os

    from services.engine.thinker import ThinkerEngine
    from services.extensions.vllm.specs import SinkWindowParams
    from services.models.profile import load_profile

    os.environ["OMNIRAY_REDIS_URL"] = redis_url
    tiny = load_profile("tiny")
    spec = tiny.engine.model_copy(
        update={
            "kv_transfer": "none",
            "block_size": block,
            "max_model_len": 1024,
            "sink_window": SinkWindowParams(sink_tokens=sinks, window_tokens=window),
            "extra": {"num_gpu_blocks_override": pool, "max_num_batched_tokens": 512},
            **engine,
        }
    )
    return ThinkerEngine(tiny.model_copy(update={"engine": spec}), "decode")
