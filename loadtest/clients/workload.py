"""Seeded synthetic workloads (no dataset can be downloaded here).

Chat prompts: a word count drawn log-normal (median ~60 words, clipped to 10-400), words from a
fixed vocabulary, so every run and machine sends the same requests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

REPLY_TOKENS = (30, 300)  # replies' lengths are drawn log-uniform in this range (WORKLOADS.md)

_WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "you",
    "that",
    "for",
    "on",
    "with",
    "as",
    "this",
    "be",
    "at",
    "by",
    "from",
    "or",
    "have",
    "an",
    "not",
    "are",
    "but",
    "can",
    "voice",
    "image",
    "model",
    "audio",
    "serve",
    "stream",
    "token",
    "speech",
    "answer",
    "question",
    "time",
    "long",
    "short",
    "fast",
    "slow",
    "city",
    "river",
    "music",
    "paper",
    "light",
    "house",
    "story",
    "green",
    "blue",
    "window",
    "table",
    "night",
    "morning",
    "train",
    "mountain",
]


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    max_tokens: int


def chat_prompts(
    n: int, *, seed: int = 0, max_tokens: int = 64, median_words: float = 60.0
) -> list[ChatPrompt]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median_words), 0.6, n), 10, 400).astype(int)
    return [ChatPrompt(" ".join(rng.choice(_WORDS, k)), max_tokens) for k in lengths]


def reply_length(rng: random.Random, low: int, high: int) -> int:
    """A reply's length in tokens, log-uniform in [low, high] (short replies as likely per octave
    as long ones)."""
    return min(high, max(low, round(math.exp(rng.uniform(math.log(low), math.log(high))))))
