"""The bounded session KV in a real vLLM engine (tiny thinker through ThinkerEngine): greedy decoding
with sinks + window equals the same model run with full KV and the same mask (transformers, one
teacher-forced forward over the engine's own tokens), and the request's resident blocks, read from
the engine's pool occupancy, stay within the sink + window bound as the sequence grows past it."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.sink_attention import allowed_keys
from services.extensions.vllm import engine_metrics, sink_window, stat_logger
from tests.integration.bounded_engine import bounded_engine

SINKS, WINDOW, BLOCK, POOL = 32, 64, 32, 64
PROMPT = [(i * 37) % 2000 + 5 for i in range(100)]
NEW_TOKENS = 300
TIE = 1e-3  # top-2 log-probability gap under which either token is a correct greedy choice
LOGPROB_ATOL = 1e-3  # fp32; vLLM with full attention matches transformers to < 1e-5


@pytest.fixture(scope="module")
def engine(redis_url):
    e = bounded_engine(redis_url, sinks=SINKS, window=WINDOW, block=BLOCK, pool=POOL)
    yield e
    e.shutdown()


async def _generate(engine) -> tuple[list[int], list[float], int]:
    """Greedy tokens, their logprobs, and the most blocks the pool held while generating."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=1)
    most = 0.0
    async for out in engine.engine.generate({"prompt_token_ids": PROMPT}, params, request_id="sw"):
        most = max(most, engine_metrics.TOTALS.values.get(stat_logger.occupancy_key(), 0.0))
        final = out
    c = final.outputs[0]
    logprobs = [step[t].logprob for t, step in zip(c.token_ids, c.logprobs, strict=True)]
    return list(c.token_ids), logprobs, round(most * (POOL - 1))  # vLLM's pool keeps one null block


def _reference(model_path, tokens: list[int], sinks: int, window: int) -> torch.Tensor:
    """Log-probabilities at every position, full KV, mask [0, S) ∪ [t−W, t]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    n = len(tokens)
    allowed = allowed_keys(torch.arange(n), n, sinks, window)
    mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        logits = model(torch.tensor([tokens]), attention_mask=mask).logits[0]
    return torch.log_softmax(logits.double(), -1)


async def test_window_output_equals_the_masked_reference_and_blocks_stay_bounded(engine):
    tokens, logprobs, most_blocks = await _generate(engine)
    seq = PROMPT + tokens
    picked = torch.tensor(tokens)[:, None]
    got = torch.tensor(logprobs, dtype=torch.float64)
    rows = _reference(engine.model_path, seq, SINKS, WINDOW)[
        len(PROMPT) - 1 : -1
    ]  # each token's distribution
    top2 = rows.topk(2, dim=-1).values
    for k, tok in enumerate(tokens):
        if top2[k, 0] - top2[k, 1] > TIE:  # a closer call may go either way between implementations
            assert tok == int(rows[k].argmax()), f"step {k}: engine {tok}, reference {int(rows[k].argmax())}"
    masked_gap = float((rows.gather(1, picked)[:, 0] - got).abs().max())
    assert masked_gap < LOGPROB_ATOL, masked_gap

    # What the engine computed is the mask, not full attention over the same tokens.
    causal = _reference(engine.model_path, seq, 0, len(seq))[len(PROMPT) - 1 : -1]
    causal_gap = float((causal.gather(1, picked)[:, 0] - got).abs().max())
    assert causal_gap > 5 * masked_gap, (causal_gap, masked_gap)

    bound = sink_window.max_resident_blocks(BLOCK, SINKS, WINDOW)
    assert 0 < most_blocks <= bound
    assert bound < math.ceil(len(seq) / BLOCK)  # full KV would have held more
