"""Picking codes for a batch of talker streams, each with its own sampling settings and random state,
drawing exactly what transformers' `generate` draws for that stream alone.

- Scores: transformers' own logits processors (repetition penalty over the stream's codes so far,
  suppressed tokens, temperature, top-k, top-p), built once per distinct setting and applied to
  the rows that share it.
- Draws: `torch.multinomial(probs, 1)` is, in torch, the exponential race `argmax(probs / q)` with
  q ~ Exp(1) drawn over the row (its fast path for one sample); each row draws its q from its own
  generator (a seeded stream) or torch's (an unseeded one), so a seeded stream's codes depend on its
  seed and inputs only, whoever steps beside it (tests/unit/qwen3_omni/test_sampling.py pins the
  equality to torch.multinomial).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    max_frames: int = 4096  # codes drawn at most (transformers' talker_max_new_tokens)
    # and at most this many per token of the text once it is known, plus TAIL_FRAMES (0: no bound)
    max_frames_per_token: int = 0


# The code predictor's draws, as the model's generate asks for them (top-k 50, top-p 0.8).
PREDICTOR_TOP_K, PREDICTOR_TOP_P = 50, 0.8


@cache
def _talker_processors(s: Sampling, suppressed: tuple[int, ...], device: str):
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList()
    if s.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
    processors.append(SuppressTokensLogitsProcessor(list(suppressed), device=device))
    if s.do_sample:
        processors.extend(
            [TemperatureLogitsWarper(s.temperature), TopKLogitsWarper(s.top_k), TopPLogitsWarper(s.top_p)]
        )
    return processors


@cache
def _predictor_processors():
    from transformers.generation.logits_process import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

    return LogitsProcessorList([TopKLogitsWarper(PREDICTOR_TOP_K), TopPLogitsWarper(PREDICTOR_TOP_P)])


def talker_codes(logits, settings: list[Sampling], history, suppressed: tuple[int, ...], generators: list):
    """One code per row: `logits` [rows, vocab] (float32), `history` [rows, n] the codes each row has
    drawn (rows shorter than n padded with their own first code: a repeat changes no penalty)."""
    import torch

    scores = torch.empty_like(logits)
    groups: dict[Sampling, list[int]] = {}
    for row, s in enumerate(settings):
        groups.setdefault(s, []).append(row)
    for s, rows in groups.items():
        at = torch.tensor(rows, device=logits.device) if len(groups) > 1 else slice(None)
        processors = _talker_processors(s, suppressed, str(logits.device))
        scores[at] = processors(history[at], logits[at])
    sample = [s.do_sample for s in settings]
    return _draw(scores, sample, generators)


def predictor_codes(logits, sample: list[bool], generators: list):
    """One code per row of the code predictor's `logits` [rows, vocab] (float32)."""
    import torch

    if any(sample):
        rows = torch.tensor([i for i, s in enumerate(sample) if s], device=logits.device)
        scores = logits.clone()
        scores[rows] = _predictor_processors()(None, logits[rows])
        return _draw(scores, sample, generators)
    return logits.argmax(-1)


def _draw(scores, sample: list[bool], generators: list):
    """Greedy rows: argmax; sampled rows: torch.multinomial's draw from the row's own generator."""
    import torch

    codes = scores.argmax(-1)
    if any(sample):
        probs = torch.softmax(scores, dim=-1)
        race = torch.empty_like(probs)
        for row, (s, generator) in enumerate(zip(sample, generators, strict=True)):
            if s:
                race[row].exponential_(1, generator=generator)
        drawn = (probs / race).argmax(-1)
        mask = torch.tensor(sample, device=scores.device)
        codes = torch.where(mask, drawn, codes)
    return codes
