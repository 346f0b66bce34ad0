"""The bare-engine baseline: the thinker's vLLM AsyncLLM driven directly, same model, same engine
arguments, same prompt token ids, same concurrency — what serving overhead is measured against."""

from __future__ import annotations

import asyncio
import time

from services.models.profile import Profile


async def run(
    engine, prompts: list[list[int]], max_tokens: int, concurrency: int
) -> tuple[list[float], float]:
    """Returns (TTFT per request, wall seconds)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    queue: asyncio.Queue = asyncio.Queue()
    for i, ids in enumerate(prompts):
        queue.put_nowait((i, ids))
    ttfts: list[float] = []

    async def worker():
        while not queue.empty():
            i, ids = queue.get_nowait()
            t0 = time.perf_counter()
            first = None
            async for _ in engine.generate(
                {"prompt_token_ids": ids}, params, request_id=f"bare-{concurrency}-{i}-{time.time_ns()}"
            ):
                first = first or time.perf_counter() - t0
            ttfts.append(first)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ttfts, time.perf_counter() - t0


def make_engine(profile: Profile):
    import os

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    # The decode engine's settings: the baseline is that engine without Serve, HTTP or P/D around it.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(profile.engine.kv_cache_space_gib))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = profile.engine.cpu_threads_bind.get("decode", "auto")
    e = profile.engine
    return AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(profile.model_path(profile.models.thinker)),
            dtype=e.dtype,
            max_model_len=e.max_model_len,
            enforce_eager=e.enforce_eager,
            max_num_seqs=e.max_num_seqs,
            stream_interval=e.stream_interval,
            enable_prompt_embeds=True,
            **e.extra,
        )
    )
