"""omniray's vLLM general plugin (entry point `vllm.general_plugins` in pyproject.toml): vLLM calls it
in every process it starts, before it resolves a model architecture. Registration is by name, so
nothing is imported until an engine serves the model."""

from __future__ import annotations

# Qwen3-Omni's thinker taking encoder outputs (services/extensions/vllm/qwen3_omni_thinker.py).
QWEN3_OMNI_THINKER = "OmnirayQwen3OmniThinker"
# The thinker's encoder-cache connector: features streamed by the encoder pool over NIXL
# (services/extensions/vllm/ec_connector.py).
EC_CONNECTOR = "OmniEcConnector"


def register() -> None:
    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from services.extensions.vllm import shm_wait

        shm_wait.install()  # a paced engine's worker sleeps between its messages (shm_wait.py)

    if QWEN3_OMNI_THINKER not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(
            QWEN3_OMNI_THINKER, "services.extensions.vllm.qwen3_omni_thinker:OmnirayQwen3OmniThinker"
        )
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory

    if EC_CONNECTOR not in ECConnectorFactory._registry:  # no public lookup; register_connector raises twice
        ECConnectorFactory.register_connector(
            EC_CONNECTOR, "services.extensions.vllm.ec_connector", EC_CONNECTOR
        )
