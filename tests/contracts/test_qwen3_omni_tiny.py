"""`qwen3-omni-tiny` is the real Qwen3-Omni at a tiny size: transformers' classes built with the real
vocabulary, token ids, 16 code groups and 1920 samples per code, and vLLM's thinker for that
checkpoint gives transformers' greedy tokens (built by `make models PROFILE=qwen3-omni-tiny`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from services.common.paths import REPO_ROOT
from services.models.profile import load_profile
from services.models.qwen3_omni.random_checkpoint import ROLE_TOKENS, SPECIAL_TOKENS, VOCAB_SIZE


@pytest.fixture(scope="module")
def checkpoint():
    profile = load_profile("qwen3-omni-tiny")
    path = profile.model_path(profile.models.thinker)
    if not (path / "model.safetensors").is_file():
        pytest.fail(f"{path} not built: make models PROFILE=qwen3-omni-tiny")
    return path


def test_the_checkpoint_has_the_real_ids_and_shapes(checkpoint):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert config.architectures == ["Qwen3OmniMoeForConditionalGeneration"]
    thinker, talker, code2wav = config.thinker_config, config.talker_config, config.code2wav_config
    assert thinker.text_config.vocab_size == VOCAB_SIZE and len(tokenizer) == VOCAB_SIZE
    for i, token in {**SPECIAL_TOKENS, **ROLE_TOKENS}.items():
        assert tokenizer.convert_tokens_to_ids(token) == i, token
    assert (thinker.audio_token_id, thinker.image_token_id, talker.audio_start_token_id) == (
        151675,
        151655,
        151669,
    )
    assert (config.user_token_id, config.assistant_token_id, config.system_token_id) == (872, 77091, 8948)
    assert thinker.text_config.num_experts > 1 and thinker.vision_config.deepstack_visual_indexes
    assert thinker.text_config.rope_parameters["mrope_interleaved"]
    assert talker.num_code_groups == code2wav.num_quantizers == 16
    assert talker.accept_hidden_layer > max(thinker.vision_config.deepstack_visual_indexes)
    assert (
        math.prod(code2wav.upsample_rates) * math.prod(code2wav.upsampling_ratios) == 1920
    )  # 24 kHz / 12.5 Hz


def test_vllm_greedy_thinker_tokens_equal_transformers(checkpoint):
    import torch
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is in Paris?"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[:2] == [151644, 8948] and ids[-3:] == [151644, 77091, tokenizer.convert_tokens_to_ids("Ċ")]
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.thinker.generate(input_ids=torch.tensor([ids]), max_new_tokens=16, do_sample=False)
    expected = out[0, len(ids) :].tolist()

    job = json.dumps({"model": str(checkpoint), "prompt_token_ids": ids, "max_tokens": 16})
    run = subprocess.run([sys.executable, "-m", "tests.contracts.qwen3_omni_greedy"], input=job, capture_output=True,
                         text=True, cwd=REPO_ROOT, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("TOKENS ")]
    assert json.loads(line.removeprefix("TOKENS ")) == expected
