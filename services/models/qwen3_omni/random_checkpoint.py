"""A random-weight Qwen3-Omni checkpoint at a tiny size (`qwen3-omni-tiny`), built by `make models`.

The real classes (`Qwen3OmniMoeForConditionalGeneration`: thinker with MoE, deepstack vision, the
audio encoder, talker with its code predictor, code2wav), the real vocabulary size and special-token
ids, interleaved M-RoPE, 16 code groups and 1920 samples per code at 24 kHz — only the widths and
depths are small, so the GPU profile's code paths run on a CPU in seconds. No Qwen tokenizer ships in
any package: a small BPE is trained here (fixed corpus) and the special, role and tool-call tokens
are placed at the real ids; the rest of the vocabulary is filler that decodes to `<fN>`. The
processor (image, video, audio features, tokenizer) is saved with it, as the real checkpoint has one.

Keys transformers 5.19 does not default but it or vLLM read (vision `image_size`,
`apply_vit_abs_pos_embed`, talker `spatial_merge_size`, `shared_expert_intermediate_size`, `head_dim`,
the text config's `tie_word_embeddings`) are set explicitly, and so are Qwen3-Omni's token ids
(transformers defaults to Qwen2.5-Omni's).
"""

from __future__ import annotations

import json
from pathlib import Path

from services.models.options import Qwen3OmniSizes

VOCAB_SIZE = 152_064
SAMPLE_RATE = 24_000
SPECIAL_TOKENS = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151652: "<|vision_start|>",
    151653: "<|vision_end|>",
    151655: "<|image_pad|>",
    151656: "<|video_pad|>",
    151669: "<|audio_start|>",
    151670: "<|audio_end|>",
    151671: "<tts_pad>",
    151672: "<tts_text_bos>",
    151673: "<tts_text_eod>",
    151675: "<|audio_pad|>",
}
# Qwen's tool-call markers: added tokens, not special ones (decode writes them, vLLM's hermes parser
# reads them; a token talker stops at <tool_call>).
TOOL_TOKENS = {151657: "<tool_call>", 151658: "</tool_call>"}
ROLE_TOKENS = {872: "user", 8948: "system", 77091: "assistant"}  # the talker finds turns by these
IDS = {name.strip("<|>"): i for i, name in SPECIAL_TOKENS.items()} | {v: k for k, v in ROLE_TOKENS.items()}
# The processor finds media placeholders by these tokenizer attributes.
MEDIA_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
# Bump when the builder's output changes: `make models` rebuilds checkpoints of another version.
BUILDER_VERSION = 3
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}  # the talker's speaker ids (codec vocabulary)
# The codec's control codes (Qwen3-Omni-30B-A3B's; transformers defaults to Qwen2.5-Omni's, outside
# the 3072-code vocabulary): codes 0-2047 are audio, the rest control codes and speakers.
CODEC_IDS = {"codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
             "codec_think_bos_id": 2156, "codec_think_eos_id": 2157}  # fmt: skip

# ChatML as Qwen3-Omni writes it; media parts are their start / pad / end tokens (the engine expands
# a pad to the item's length).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def config(sizes: Qwen3OmniSizes):
    from transformers import Qwen3OmniMoeConfig

    mrope = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": _mrope_section(sizes.head_dim),
             "mrope_interleaved": True}  # fmt: skip
    heads = {
        "num_attention_heads": sizes.heads,
        "num_key_value_heads": sizes.kv_heads,
        "head_dim": sizes.head_dim,
    }
    moe = {"num_experts": sizes.experts, "num_experts_per_tok": sizes.experts_per_token,
           "moe_intermediate_size": sizes.expert_width}  # fmt: skip
    text = {"vocab_size": VOCAB_SIZE, "hidden_size": sizes.text_hidden, "intermediate_size": 2 * sizes.text_hidden,
            "num_hidden_layers": sizes.text_layers, "max_position_embeddings": 32_768, "tie_word_embeddings": False,
            "rope_parameters": mrope, **heads, **moe}  # fmt: skip
    audio = {"num_mel_bins": 128, "encoder_layers": sizes.audio_layers, "encoder_attention_heads": 2,
             "encoder_ffn_dim": 2 * sizes.audio_width, "d_model": sizes.audio_width, "n_window": 50,
             "output_dim": sizes.text_hidden, "downsample_hidden_size": sizes.audio_width // 2}  # fmt: skip
    # deepstack: every vision layer feeds a thinker layer (the talker's accept layer must be past them)
    vision = {"depth": sizes.vision_layers, "hidden_size": sizes.vision_width, "intermediate_size": 2 * sizes.vision_width,
              "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "out_hidden_size": sizes.text_hidden, "num_position_embeddings": 2304,
              "deepstack_visual_indexes": list(range(sizes.vision_layers)), "image_size": 768,
              "apply_vit_abs_pos_embed": True}  # fmt: skip
    media_ids = {"audio_token_id": IDS["audio_pad"], "image_token_id": IDS["image_pad"],
                 "video_token_id": IDS["video_pad"], "audio_start_token_id": IDS["audio_start"],
                 "vision_start_token_id": IDS["vision_start"]}  # fmt: skip
    thinker = {"audio_config": audio, "vision_config": vision, "text_config": text, "user_token_id": IDS["user"],
               **media_ids}  # fmt: skip
    talker_text = {"vocab_size": 3072, "hidden_size": sizes.talker_width, "intermediate_size": 2 * sizes.talker_width,
                   "num_hidden_layers": sizes.talker_layers, "shared_expert_intermediate_size": sizes.talker_width,
                   "rope_parameters": mrope, **heads, **moe}  # fmt: skip
    predictor = {"vocab_size": 2048, "hidden_size": sizes.talker_width, "intermediate_size": 2 * sizes.talker_width,
                 "num_hidden_layers": sizes.talker_layers, "num_code_groups": 16, **heads}  # fmt: skip
    talker = {"code_predictor_config": predictor, "text_config": talker_text, "num_code_groups": 16,
              "thinker_hidden_size": sizes.text_hidden, "accept_hidden_layer": sizes.vision_layers + 1,
              "spatial_merge_size": 2, "speaker_id": SPEAKERS, **CODEC_IDS, **media_ids}  # fmt: skip
    code2wav = {"codebook_size": 2048, "hidden_size": sizes.code2wav_width, "num_attention_heads": 4,
                "num_key_value_heads": 4, "intermediate_size": 2 * sizes.code2wav_width,
                "num_hidden_layers": sizes.code2wav_layers, "num_quantizers": 16, "upsample_rates": [8, 5, 4, 3],
                "upsampling_ratios": [2, 2], "decoder_dim": sizes.code2wav_width}  # fmt: skip
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
        im_start_token_id=IDS["im_start"], im_end_token_id=IDS["im_end"], tts_pad_token_id=IDS["tts_pad"],
        tts_bos_token_id=IDS["tts_text_bos"], tts_eos_token_id=IDS["tts_text_eod"],
        system_token_id=IDS["system"], user_token_id=IDS["user"], assistant_token_id=IDS["assistant"],
    )  # fmt: skip


def _mrope_section(head_dim: int) -> list[int]:
    """Temporal / height / width shares of the rotary half-dimension (the real model's 24/20/20 of 64)."""
    half = head_dim // 2
    h = w = half * 5 // 16
    return [half - h - w, h, w]


def build(dest: Path, sizes: Qwen3OmniSizes) -> None:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(sizes.seed)
    model = Qwen3OmniMoeForConditionalGeneration(config(sizes))
    model.save_pretrained(dest, safe_serialization=True)
    processor().save_pretrained(dest)
    (dest / "omniray_model.json").write_text(json.dumps({"role": "thinker", "family": "qwen3-omni-tiny"}))


def processor():
    """The model's processor as the real checkpoint ships it: Qwen2-VL's image and video processors
    (16 px patches, 2x2 merge), Whisper's 128-bin log-mel features, the tokenizer."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    patches = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2}
    text = tokenizer()
    return Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(**patches),
        video_processor=Qwen2VLVideoProcessor(**patches),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=text,
        chat_template=text.chat_template,
    )


def tokenizer():
    """A BPE trained on a fixed corpus, laid out on Qwen3-Omni's ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from services.models.tiny.thinker import corpus

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    # The role words as whole tokens (after <|im_start|> they have no leading space).
    bpe.train_from_iterator(corpus() + list(ROLE_TOKENS.values()) * 500, trainer=trainer)
    data = json.loads(bpe.to_str())
    by_id = {i: token for token, i in data["model"]["vocab"].items()}
    by_id |= {i: f"<f{i}>" for i in range(len(by_id), min(SPECIAL_TOKENS))}
    for want, word in ROLE_TOKENS.items():  # swap each role word onto its real id
        have = next(i for i, t in by_id.items() if t == word)
        by_id[have], by_id[want] = by_id[want], word
    named = SPECIAL_TOKENS | TOOL_TOKENS
    by_id |= {i: named.get(i, f"<|extra_{i}|>") for i in range(min(SPECIAL_TOKENS), VOCAB_SIZE)}
    data["model"]["vocab"] = {token: i for i, token in by_id.items()}
    data["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": i in SPECIAL_TOKENS}
        for i, t in sorted(named.items())
    ]  # fmt: skip
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        extra_special_tokens=MEDIA_TOKENS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
