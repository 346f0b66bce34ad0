"""The worker half of the bounded session KV (services/extensions/vllm/sink_window.py). vLLM imports
`SinkWindowWorker` (the engine's `worker_extension_cls`) in each worker process before it builds the
model; importing this module there makes `SinkWindowBackend` the CPU attention backend of that
process. Only engines configured with `engine.sink_window` load it."""

from __future__ import annotations

from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

from services.extensions.vllm import pins

pins.check(__name__)

register_backend(AttentionBackendEnum.CPU_ATTN, "services.extensions.vllm.sink_window.SinkWindowBackend")


class SinkWindowWorker:
    """No worker methods: the import above is the extension."""
