"""Adapter registry (a plugins.Registry, the shape of every plugin table): the names deploy profiles
use, mapped to modules with `prepare` and `load`.

`prepare(dest, options)` builds or fetches the weights into `dest` (run by `make models`);
`load(path, options)` returns the object a stage serves. A model with an absolute `path` is mounted
by the deployment instead: its module has `verify(path, options)`. `options` is the adapter's class
in services/models/options.py, validated at profile load. Imports are lazy so a stage loads only
the adapters it serves.
"""

from __future__ import annotations

from types import ModuleType

from plugins import Registry
from services.models import options as o

ADAPTERS: Registry[ModuleType] = Registry(
    "model adapter",
    {
        "hf_checkpoint": "services.models.hf_checkpoint",
        "qwen3_omni_code2wav": "services.models.qwen3_omni.code2wav",
        "qwen3_omni_vision": "services.models.qwen3_omni.vision",
        "qwen3_omni_audio": "services.models.qwen3_omni.audio",
        "qwen3_omni_talker": "services.models.qwen3_omni.talker",
        "tiny_llama": "services.models.tiny.thinker",
        "tiny_vit": "services.models.tiny.vision",
        "tiny_audio": "services.models.tiny.audio",
        "tiny_talker": "services.models.tiny.talker",
        "tiny_vocoder": "services.models.tiny.vocoder",
        "smollm2": "services.models.small.thinker",
        "whisper_ct2": "services.models.small.asr",
        "mobilenet_v2": "services.models.small.vision",
        "piper_talker": "services.models.small.piper_talker",
        "piper_vocoder": "services.models.small.piper_vocoder",
    },
    params={
        "hf_checkpoint": o.HfCheckpoint,
        "qwen3_omni_code2wav": o.Qwen3OmniCode2Wav,
        "qwen3_omni_vision": o.Qwen3OmniVision,
        "qwen3_omni_audio": o.Qwen3OmniAudio,
        "qwen3_omni_talker": o.Qwen3OmniTalker,
        "tiny_llama": o.TinyThinker,
        "tiny_vit": o.TinyVision,
        "tiny_audio": o.TinyAudio,
        "tiny_talker": o.TinyTalker,
        "tiny_vocoder": o.TinyVocoder,
        "smollm2": o.SmolLM2,
        "whisper_ct2": o.WhisperCt2,
        "mobilenet_v2": o.MobileNetV2,
        "piper_talker": o.PiperTalker,
        "piper_vocoder": o.PiperVocoder,
    },
)
adapter_module = ADAPTERS.module
# Adapters whose model is a Transcriber (services/models/base.py): a profile's `transcriber`, or its
# audio encoder standing in for one.
TRANSCRIBERS = frozenset({"whisper_ct2"})
