"""Qwen3-Omni's talker as omniray runs it (services/models/qwen3_omni/talker.py: the thinker's tokens
fed as they come, frames out as they are drawn) writes the codec frames transformers'
`Qwen3OmniMoeForConditionalGeneration.generate` writes, for the same thinker output and seed: a text
prompt greedy and sampled, and an image + audio prompt (the thinker's hidden states at the media
placeholders projected into the talker, M-RoPE over the image grid and the audio). A seeded stream
draws as transformers does after `torch.manual_seed(seed)`, whatever other streams draw beside it.
Runs on `qwen3-omni-tiny` (make models)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from services.models.base import ThinkerPrompt
from services.models.profile import load_profile
from services.models.qwen3_omni import talker as qt
from services.models.registry import adapter_module

MAX_CODES = 40


@pytest.fixture(scope="module")
def path():
    profile = load_profile("qwen3-omni-tiny")
    path = profile.model_path(profile.models.thinker)
    if not (path / "model.safetensors").is_file():
        pytest.fail(f"{path} not built: make models PROFILE=qwen3-omni-tiny")
    return path


@pytest.fixture(scope="module")
def reference(path):
    """transformers' whole model; its generate's codes are captured where it hands them to code2wav."""
    from transformers import AutoProcessor, Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    # transformers 5.19: the talker reads the audio config from its own config with audio in and out
    model.talker.config.audio_config = model.config.thinker_config.audio_config
    return model, AutoProcessor.from_pretrained(path)


@pytest.fixture(scope="module")
def talker(path):
    return adapter_module("qwen3_omni_talker").load(
        path, load_profile("qwen3-omni-tiny").models.talker.options
    )


def _transformers_codes(model, inputs: dict, sample: bool, seed: int = 0):
    captured = {}
    decode = model.code2wav.chunked_decode

    def capture(codes, *args, **kwargs):
        captured["codes"] = codes.clone()
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = capture
    try:
        torch.manual_seed(seed)
        sequences, _ = model.generate(**inputs, speaker="Ethan", thinker_max_new_tokens=24, thinker_do_sample=False,
                                      talker_do_sample=sample, talker_max_new_tokens=MAX_CODES)  # fmt: skip
    finally:
        model.code2wav.chunked_decode = decode
    return sequences[0].tolist(), captured["codes"][0].T.numpy()


def _omniray_codes(talker, prompt: ThinkerPrompt, generated: list[int], sample: bool, seed: int | None = 0):
    stream = talker.stream(
        prompt, "ethan", seed=seed, sampling=qt.Sampling(do_sample=sample, max_frames=MAX_CODES)
    )

    def thinker():  # the thinker's tokens arrive while the talker runs
        for token in generated:
            stream.feed([token])
            time.sleep(0.001)
        stream.finish()

    threading.Thread(target=thinker, daemon=True).start()
    return np.concatenate(list(stream.frames(timeout=30)))


def _text_inputs(processor):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is in Paris?"}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return dict(processor(text=[text], return_tensors="pt"))


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_text_prompt_frames_equal_transformers(reference, talker, sample):
    model, processor = reference
    inputs = _text_inputs(processor)
    prompt = inputs["input_ids"][0].tolist()
    sequence, expected = _transformers_codes(model, inputs, sample, seed=7)
    torch.manual_seed(1)  # the stream draws from its own seed's state, not from torch's
    got = _omniray_codes(talker, ThinkerPrompt(prompt), sequence[len(prompt) :], sample, seed=7)
    assert expected.shape[1] == 16 and len(expected) > 5
    np.testing.assert_array_equal(got, expected)


def test_a_seeded_stream_draws_the_same_frames_beside_other_streams(reference, talker):
    """Sampled streams stepping at once on several threads (as a talker replica speaks several
    responses): each seeded one writes what it writes alone; torch's own state is left as it was."""
    model, processor = reference
    inputs = _text_inputs(processor)
    prompt = inputs["input_ids"][0].tolist()
    generated, _ = _transformers_codes(model, inputs, sample=False)
    args = (talker, ThinkerPrompt(prompt), generated[len(prompt) :], True)
    alone = {seed: _omniray_codes(*args, seed=seed) for seed in (3, 4)}
    assert not np.array_equal(alone[3], alone[4])
    with ThreadPoolExecutor(4) as pool:  # None: an unseeded stream, drawing from torch's state
        together = list(pool.map(lambda seed: _omniray_codes(*args, seed=seed), [3, None, 4, 3]))
    for seed, got in zip([3, 4, 3], [together[0], together[2], together[3]], strict=True):
        np.testing.assert_array_equal(got, alone[seed])
    before = torch.get_rng_state()
    _omniray_codes(*args, seed=5)
    assert torch.equal(torch.get_rng_state(), before)


def test_image_and_audio_prompt_frames_equal_transformers(reference, talker):
    model, processor = reference
    rng = np.random.default_rng(3)
    image = Image.fromarray((rng.random((224, 288, 3)) * 255).astype(np.uint8))
    wave = (0.3 * np.sin(2 * np.pi * 220 * np.arange(20800) / 16000)).astype(np.float32)
    chat = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "Say it."}],
        }
    ]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = dict(processor(text=[text], images=[image], audio=[wave], return_tensors="pt"))
    prompt = inputs["input_ids"][0].tolist()
    sequence, expected = _transformers_codes(model, inputs, sample=False)

    # the thinker's hidden states at the talker's layer, at the image/audio placeholders
    with torch.no_grad():
        out = model.thinker(**inputs, output_hidden_states=True)
    layer = model.config.talker_config.accept_hidden_layer
    media = [i for i, t in enumerate(prompt) if t in talker.media_ids]
    lengths = inputs["feature_attention_mask"].sum(-1).tolist()
    thinker_prompt = ThinkerPrompt(
        prompt, media_hidden=out.hidden_states[layer][0, media].numpy(),
        image_grid_thw=[tuple(g) for g in inputs["image_grid_thw"].tolist()], audio_feature_lengths=lengths,
    )  # fmt: skip
    got = _omniray_codes(talker, thinker_prompt, sequence[len(prompt) :], sample=False)
    np.testing.assert_array_equal(got, expected)


def test_a_thinker_that_fails_or_stalls_stops_the_talker(talker, reference):
    _, processor = reference
    prompt = ThinkerPrompt(_text_inputs(processor)["input_ids"][0].tolist())
    stalled = talker.stream(prompt, "ethan")
    with pytest.raises(TimeoutError):
        next(stalled.frames(timeout=0.2))
    failed = talker.stream(prompt, "ethan")
    failed.feed([9, 10])
    failed.finish(ConnectionError("redis went away"))
    with pytest.raises(ConnectionError):
        list(failed.frames(timeout=5))
    with pytest.raises(ValueError, match="unknown voice"):
        talker.stream(prompt, "alloy")


def test_speech_is_bounded_by_the_texts_length(talker, reference):
    """A talker that does not end itself stops at its per-token share. (Random weights draw the
    codec's end now and then, unseeded: this seed's draws do not reach it.)"""
    _, processor = reference
    stream = talker.stream(ThinkerPrompt(_text_inputs(processor)["input_ids"][0].tolist()), "aiden", seed=1)
    stream.feed([100, 200, 300])
    stream.finish()
    # Resumed on whichever thread is free, as the stage does (asyncio.to_thread): each step keeps
    # its own inference mode.
    frames, generator = [], stream.frames(timeout=5)
    with ThreadPoolExecutor(1) as a, ThreadPoolExecutor(1) as b:
        while (frame := (a, b)[len(frames) % 2].submit(next, generator, None).result()) is not None:
            frames.append(frame)
    assert stream.ended_by == "text_budget"
    assert len(frames) == talker.sampling.max_frames_per_token * 3 + qt.TAIL_FRAMES - 1


def test_a_stop_token_ends_the_text_as_the_thinkers_end_does(talker, reference):
    """A tool call's marker (the stream's stop token) ends what the talker says, as the thinker's eos
    there would: the same frames, drawn without waiting for the thinker to finish (the call's
    tokens after the marker are never read, nor is a thinker that fails while writing them)."""
    _, processor = reference
    prompt = _text_inputs(processor)["input_ids"][0].tolist()
    marker = processor.tokenizer.convert_tokens_to_ids("<tool_call>")
    assert marker == 151657  # one token, at its id in Qwen's vocabulary

    def frames(stream) -> np.ndarray:
        return np.concatenate(list(stream.frames(timeout=5)))

    ended = talker.stream(ThinkerPrompt(prompt), "aiden", seed=1)
    ended.feed([100, 200, 300, talker.config.im_end_token_id])
    calling = talker.stream(ThinkerPrompt(prompt), "aiden", seed=1, stop_token_ids=[marker])
    calling.feed([100, 200, 300])
    calling.feed([marker, 400, 500])  # never finished: a thinker still writing its call
    failed = talker.stream(ThinkerPrompt(prompt), "aiden", seed=1, stop_token_ids=[marker])
    failed.feed([100, 200, 300, marker, 400])
    failed.finish(ConnectionError("redis went away while the call was written"))
    said = frames(ended)
    np.testing.assert_array_equal(frames(calling), said)
    np.testing.assert_array_equal(frames(failed), said)
    assert calling.ended_by == ended.ended_by == "text_budget"  # these draws: the text's share, 4 tokens
    assert len(said) == talker.sampling.max_frames_per_token * 4 + qt.TAIL_FRAMES - 1


def _chat_ids(processor, question: str) -> list[int]:
    chat = [{"role": "user", "content": question}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return processor(text=[text], return_tensors="pt")["input_ids"][0].tolist()


def _spoken(talker, prompt, tokens, seed, sample, start_after=0.0, gap=0.0) -> np.ndarray:
    """One stream's frames: the thinker's tokens fed `gap` s apart (joining when its first comes)."""
    stream = talker.stream(
        ThinkerPrompt(prompt),
        "ethan",
        seed=seed,
        sampling=qt.Sampling(do_sample=sample, max_frames=MAX_CODES),
    )

    def thinker():
        time.sleep(start_after)
        for token in tokens:
            stream.feed([token])
            time.sleep(gap)
        stream.finish()

    threading.Thread(target=thinker, daemon=True).start()
    return np.concatenate(list(stream.frames(timeout=30)))


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_streams_stepped_together_write_what_each_writes_alone(reference, talker, sample):
    """Five responses at once — prompts of different lengths, joining at different times, texts of
    different lengths so they leave at different steps, written at different speeds — each write the
    frames they write alone, and the talker did step them together (several streams per forward, at
    different positions)."""
    _, processor = reference
    questions = [
        "Hi.",
        "What is in Paris?",
        "Tell me about the weather in a long sentence, please.",
        "Why?",
        "Go.",
    ]
    cases = [
        (
            _chat_ids(processor, q),
            list(range(300 + 7 * i, 300 + 7 * i + 3 + 2 * i)),
            10 + i,
            0.01 * i,
            0.002 * (i % 3),
        )
        for i, q in enumerate(questions)
    ]
    alone = [_spoken(talker, p, toks, seed, sample) for p, toks, seed, _, _ in cases]
    per_step: list[int] = []
    talker.loop.on_step = lambda stats: per_step.append(stats.streams)
    try:
        with ThreadPoolExecutor(len(cases)) as pool:
            together = list(pool.map(lambda c: _spoken(talker, c[0], c[1], c[2], sample, c[3], c[4]), cases))
    finally:
        talker.loop.on_step = None
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        np.testing.assert_array_equal(b, a, err_msg=f"stream {i}")
    assert max(per_step) >= 4, per_step


def test_a_cancelled_or_failed_stream_leaves_at_once_and_the_others_go_on(reference, talker):
    """A barge-in cancels one stream mid-answer and another's thinker dies: each leaves the batch
    (its slot free at once), the third speaks on to the frames it writes alone."""
    _, processor = reference
    prompt = _chat_ids(processor, "What is in Paris?")
    tokens = list(range(300, 316))
    alone = _spoken(talker, prompt, tokens, 21, True)

    survivor = talker.stream(
        ThinkerPrompt(prompt), "ethan", seed=21, sampling=qt.Sampling(max_frames=MAX_CODES)
    )
    barged = talker.stream(
        ThinkerPrompt(prompt), "ethan", seed=22, sampling=qt.Sampling(max_frames=MAX_CODES)
    )
    orphan = talker.stream(
        ThinkerPrompt(prompt), "ethan", seed=23, sampling=qt.Sampling(max_frames=MAX_CODES)
    )
    for s in (survivor, barged):
        s.feed(tokens)
        s.finish()
    orphan.feed(tokens[:4])  # its thinker writes four tokens, then dies
    kept, cut = survivor.frames(timeout=30), barged.frames(timeout=30)
    got = [next(kept)]
    next(cut)
    barged.cancel()
    orphan_frames = orphan.frames(timeout=30)
    next(orphan_frames)
    orphan.finish(ConnectionError("the decode replica died"))
    with pytest.raises(ConnectionError):
        list(orphan_frames)
    got.extend(kept)
    np.testing.assert_array_equal(np.concatenate(got), alone)
    assert (
        len(list(cut)) < len(alone) - 5
    )  # its reader gets its end: a frame or two written before the cancel
    deadline = time.time() + 5
    while len(talker.batch.kv.free) < talker.loop.max_streams and time.time() < deadline:
        time.sleep(0.01)
    assert len(talker.batch.kv.free) == talker.loop.max_streams  # every slot back


def test_the_compiled_code_predictor_writes_the_eager_ones_codes(talker):
    """The GPU profile's `compile` (the predictor over static shapes: batch buckets, every frame
    position in the cache, the mask as a tensor), traced here with torch.compile's aot_eager backend:
    greedy, the codes and the frame's embeddings of the eager, exact path, for batches that fill a
    bucket and that do not."""
    from services.models.qwen3_omni.code_predictor import CodePredictor

    traced = CodePredictor(talker.model.code_predictor, talker.codebooks, "aot_eager")
    hidden = talker.config.talker_config.text_config.hidden_size
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in (1, 3, 4):
            past, code = (
                torch.randn((rows, 1, hidden), generator=g),
                torch.randn((rows, 1, hidden), generator=g),
            )
            want = talker.batch.predictor(past, code, [False] * rows, [None] * rows)
            got = traced(past, code, [False] * rows, [None] * rows)
            assert torch.equal(got[0], want[0])
            torch.testing.assert_close(got[1], want[1])
