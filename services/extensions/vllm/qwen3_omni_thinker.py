"""vLLM's Qwen3-Omni thinker, taking the encoder pool's outputs as multimodal embeddings.

vLLM 0.32's thinker runs its own audio tower and vision encoder: a request may carry raw media, mel
features (audio) — but not encoder outputs (its data parser drops the image embedding fields and
takes no audio embeddings). omniray runs the model's encoders in its encoder pool (services/models/
qwen3_omni/encoders.py), so this subclass accepts what they produce, and nothing else changes:

- image: `{"image_embeds": [tokens, hidden * (1 + deepstack levels)], "image_grid_thw": [1, 3]}` —
  the merger's output with the deepstack mergers' outputs beside it, as vLLM's own vision path
  produces them (its embed_input_ids splits them off for the deepstack layers);
- audio: `{"audio_embeds": [tokens, hidden], "audio_feature_lengths": [mel frames]}` — the mel frame
  count sizes the placeholder span and the M-RoPE positions exactly as for raw audio;
- video: `{"video_embeds": [tokens, hidden * (1 + levels)], "video_grid_thw": [1, 3],
  "second_per_grid_ts": [1]}` — a clip's key frames through the same vision encoder, in temporal
  patches; seconds per patch set the M-RoPE time axis as for a raw clip.

Placeholders, M-RoPE positions, deepstack injection and the prefix cache's media hashes are vLLM's
own code. Registered as `OmnirayQwen3OmniThinker` (plugin.QWEN3_OMNI_THINKER) by the `vllm.general_plugins` entry point
(services/extensions/vllm/plugin.py); the engine selects it for a Qwen3-Omni checkpoint
(services/engine/thinker.py). Upstream: drop this when vLLM's Qwen3-Omni parser keeps
`image_embeds` and gains audio embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from vllm.model_executor.models.qwen2_5_omni_thinker import create_qwen2_5_omni_thinker_field_factory
from vllm.model_executor.models.qwen2_vl import Qwen2VLMultiModalDataParser, _create_qwen2vl_field_factory
from vllm.model_executor.models.qwen3_omni_moe_thinker import (
    Qwen3OmniMoeThinkerDummyInputsBuilder,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    Qwen3OmniMoeThinkerMultiModalDataParser,
    Qwen3OmniMoeThinkerMultiModalProcessor,
    Qwen3OmniMoeThinkerProcessingInfo,
    _get_feat_extract_output_lengths,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import DictEmbeddingItems

AUDIO_KEYS = ("input_audio_features", "audio_embeds")
IMAGE_KEYS = ("pixel_values", "image_embeds")
VIDEO_KEYS = ("pixel_values_videos", "video_embeds")


def _audio_embed_fields(data: Mapping[str, torch.Tensor]) -> Mapping[str, MultiModalFieldConfig]:
    lengths = data.get("audio_feature_lengths", torch.empty((0,), dtype=torch.long)).flatten()
    return {
        "audio_embeds": MultiModalFieldConfig.flat_from_sizes(
            "audio", _get_feat_extract_output_lengths(lengths)
        ),
        "audio_feature_lengths": MultiModalFieldConfig.batched("audio", keep_on_cpu=True),
    }


class EncoderOutputParser(Qwen3OmniMoeThinkerMultiModalDataParser):
    embedding_fields = {
        "image": Qwen2VLMultiModalDataParser.embedding_fields["image"],
        "video": {**Qwen2VLMultiModalDataParser.embedding_fields["video"], "second_per_grid_ts": "metadata"},
        "audio": {"audio_embeds": "values", "audio_feature_lengths": "metadata"},
    }

    def _embedding_items(self, data: dict, modality: str, fields_factory) -> DictEmbeddingItems:
        """A request's encoder outputs for `modality` (a dict of tensors) as vLLM's items."""
        required, optional = self.embedding_field_sets(modality)
        return DictEmbeddingItems(
            data,
            modality=modality,
            required_fields=required,
            optional_fields=optional,
            fields_factory=fields_factory,
        )

    def _parse_video_data(self, data):
        if isinstance(data, dict):
            factory = create_qwen2_5_omni_thinker_field_factory(self._spatial_merge_size)
            return self._embedding_items(data, "video", factory)
        return super()._parse_video_data(data)

    def _parse_image_data(self, data):
        if isinstance(data, dict):
            return self._embedding_items(
                data, "image", _create_qwen2vl_field_factory(self._spatial_merge_size)
            )
        return super()._parse_image_data(data)

    def _parse_audio_data(self, data):
        if isinstance(data, dict):
            data = dict(data)
            data["audio_feature_lengths"] = torch.as_tensor(data["audio_feature_lengths"]).flatten()
            return self._embedding_items(data, "audio", _audio_embed_fields)
        return super()._parse_audio_data(data)


class EncoderOutputProcessingInfo(Qwen3OmniMoeThinkerProcessingInfo):
    def get_data_parser(self):
        return EncoderOutputParser(
            spatial_merge_size=self.get_hf_config().vision_config.spatial_merge_size,
            target_sr=self.get_feature_extractor().sampling_rate,
            target_channels=self.get_target_channels(),
            expected_hidden_size=self._get_expected_hidden_size(),
            allow_missing_mm_embeddings=self.allow_missing_mm_embeddings,
        )


class EncoderOutputProcessor(Qwen3OmniMoeThinkerMultiModalProcessor):
    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs) -> Mapping[str, MultiModalFieldConfig]:
        # The processor's own table drives which fields reach the model: audio embeddings join it.
        fields = dict(super()._get_mm_fields_config(hf_inputs, hf_processor_mm_kwargs))
        if "audio_embeds" in hf_inputs:
            fields["audio_embeds"] = _audio_embed_fields(hf_inputs)["audio_embeds"]
        return fields


def _per_item(embeds, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    if isinstance(embeds, torch.Tensor):
        return tuple(embeds.split(sizes))
    return tuple(embeds)


@MULTIMODAL_REGISTRY.register_processor(
    EncoderOutputProcessor,
    info=EncoderOutputProcessingInfo,
    dummy_inputs=Qwen3OmniMoeThinkerDummyInputsBuilder,
)
class OmnirayQwen3OmniThinker(Qwen3OmniMoeThinkerForConditionalGeneration):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # The talker reads the residual stream after this many layers at the media placeholders:
        # vLLM's aux-hidden-state hook keeps it (services/extensions/vllm/media_rows.py).
        # Only where the media-rows worker extension will read it: elsewhere no step pays for it.
        talker = getattr(vllm_config.model_config.hf_config, "talker_config", None)
        if talker is not None and vllm_config.parallel_config.worker_extension_cls.endswith(
            ".MediaRowsWorker"
        ):
            self.language_model.model._set_aux_hidden_state_layers((talker.accept_hidden_layer,))
        self._step_rows: torch.Tensor | None = None
        self._step_mask: torch.Tensor | None = None

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
        self._step_mask = is_multimodal
        return super().embed_input_ids(input_ids, multimodal_embeddings, is_multimodal=is_multimodal)

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if isinstance(out, tuple):  # (hidden states, [the talker's layer])
            out, (self._step_rows,) = out
        return out

    def take_media_rows(self):
        """This step's rows at the talker's layer where media embeddings were placed, and the mask
        over the step's tokens (numpy), or None; cleared for the next step."""
        rows, mask = self._step_rows, self._step_mask
        self._step_rows = self._step_mask = None
        if rows is None or mask is None:
            return None
        mask = mask[: rows.shape[0]].cpu().numpy().astype(bool)
        if not mask.any():
            return None
        return rows.float().cpu().numpy(), mask

    def _parse_and_validate_multimodal_inputs(self, **kwargs: object) -> dict:
        by_modality: dict = {}
        for key in list(kwargs):  # in the order the request's modalities came
            if key in IMAGE_KEYS and "image" not in by_modality:
                by_modality["image"] = self._parse_and_validate_image_input(**kwargs)
            elif key in VIDEO_KEYS and "video" not in by_modality:
                by_modality["video"] = self._parse_and_validate_video_input(**kwargs)
            elif key in AUDIO_KEYS and "audio" not in by_modality:
                by_modality["audio"] = self._parse_and_validate_audio_input(**kwargs)
        return by_modality

    def _parse_and_validate_audio_input(self, **kwargs: object):
        embeds = kwargs.get("audio_embeds")
        if embeds is None:
            return super()._parse_and_validate_audio_input(**kwargs)
        return {
            "type": "audio_embeds",
            "audio_embeds": embeds,
            "audio_feature_lengths": kwargs["audio_feature_lengths"],
        }

    def _process_audio_input(self, audio_input) -> tuple[torch.Tensor, ...]:
        if audio_input["type"] != "audio_embeds":
            return super()._process_audio_input(audio_input)
        lengths = torch.as_tensor(audio_input["audio_feature_lengths"]).flatten()
        sizes = _get_feat_extract_output_lengths(lengths).tolist()
        dtype = self.language_model.model.embed_tokens.weight.dtype
        return tuple(e.to(dtype) for e in _per_item(audio_input["audio_embeds"], sizes))

    def _process_video_input(self, video_input) -> tuple[torch.Tensor, ...]:
        if video_input["type"] != "video_embeds":
            return super()._process_video_input(video_input)
        return self._vision_items(video_input["video_embeds"], video_input["video_grid_thw"])

    def _process_image_input(self, image_input) -> tuple[torch.Tensor, ...]:
        if image_input["type"] != "image_embeds":
            return super()._process_image_input(image_input)
        return self._vision_items(image_input["image_embeds"], image_input["image_grid_thw"])

    def _vision_items(self, embeds, grid) -> tuple[torch.Tensor, ...]:
        """Images' or clips' encoder rows, one tensor per item (its grid's merged patches)."""
        merge = self.visual.spatial_merge_size
        sizes = (torch.as_tensor(grid).reshape(-1, 3).prod(-1) // merge // merge).tolist()
        return tuple(e.to(self.visual.dtype) for e in _per_item(embeds, sizes))
