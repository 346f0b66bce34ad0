"""vLLM's NixlConnector without NIXL's background progress thread, for CPU hosts.

On a CPU host the progress thread spins on the cores the engine computes on (a 2-core machine
lost both cores to two idle engines). vLLM's NIXL worker already polls transfer state every engine
step (`check_xfer_state`), which drives the transfers without the thread. Selected with
`kv_connector="CpuNixlConnector"`, `kv_connector_module_path="services.engine.nixl_cpu"`.
"""

from __future__ import annotations

import functools

from vllm.distributed import nixl_utils
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector

if nixl_utils.nixl_agent_config is not None:
    # base_worker builds its agent config from this name; every engine process that loads this
    # module (scheduler and workers) gets agents with progress driven by polling.
    base_worker.nixl_agent_config = functools.partial(nixl_utils.nixl_agent_config, enable_prog_thread=False)


class CpuNixlConnector(NixlConnector):
    pass
