"""Tiny thinker: a random-weight Llama and a BPE tokenizer trained here, offline, in seconds.

Built deterministically (fixed seeds, fixed corpus) so tests and benchmarks see the same model on
every machine. It answers nonsense, fast: it exists to exercise the real vLLM serving path.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from services.models import options as o

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image|>", "<|audio|>", "<|pad|>"]
VOCAB_SIZE = 2048

# ChatML; media parts are rendered as their placeholder token and replaced by encoder output.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus() -> list[str]:
    """English-ish training text that ships with Python itself: stdlib docstrings."""
    import asyncio
    import collections
    import functools
    import itertools
    import json as json_mod
    import os
    import pathlib
    import re
    import string
    import textwrap

    texts: list[str] = []
    for mod in (asyncio, collections, functools, itertools, json_mod, os, pathlib, re, string, textwrap):
        texts.append(inspect.getdoc(mod) or "")
        for name in sorted(dir(mod)):
            doc = inspect.getdoc(getattr(mod, name, None))
            if doc:
                texts.append(doc)
    return texts


def prepare(dest: Path, options: o.TinyThinker) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dest.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)

    torch.manual_seed(options.seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=options.hidden_size,
        intermediate_size=options.intermediate_size,
        num_hidden_layers=options.num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=options.max_position_embeddings,
        bos_token_id=fast.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|pad|>"),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(dest, safe_serialization=True)
    (dest / "omniray_model.json").write_text(json.dumps({"role": "thinker", "family": "llama-tiny"}))
