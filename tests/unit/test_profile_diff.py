"""`qwen3-omni-tiny` is the GPU profile on a CPU: the two files may differ only in names, model path
and sizes, dtype, engine limits and resources. Anything else (a stage, an adapter, a policy, a limit
of the API) would let the CPU tests pass on a configuration the GPU never runs."""

from __future__ import annotations

import fnmatch

import yaml

from services.models.profile import CONFIG_DIR, load_profile

ALLOWED = [
    "name", "served_model_name", "description",
    "models.*.path", "models.*.options.random_init",  # where the weights come from, and their sizes
    "models.*.options.dtype", "models.talker.options.max_streams",  # an engine limit, as max_num_seqs
    "models.*.options.compile",  # as engine.enforce_eager
    "engine.dtype", "engine.max_model_len", "engine.enforce_eager", "engine.max_num_seqs",
    "engine.kv_cache_space_gib", "engine.cpu_threads_bind",
    "stages.*.ray_actor_options", "stages.*.autoscaling_config.min_replicas",  # resources
    "stages.*.autoscaling_config.max_replicas",
    "stages.*.sessions.cap",  # sessions a replica holds, as max_num_seqs
    "video.frame_px", "video.max_frames",  # sizes: a clip's frames, as max_model_len its tokens
    "encoder_pool.stream_mib",  # host memory, as kv_cache_space_gib
]  # fmt: skip


def _leaves(data, prefix: str = "") -> dict[str, object]:
    if isinstance(data, dict):
        out: dict[str, object] = {}
        for key, value in data.items():
            out |= _leaves(value, f"{prefix}.{key}" if prefix else str(key))
        return out or {prefix: {}}
    return {prefix: data}


def _differences(a: dict, b: dict) -> set[str]:
    left, right = _leaves(a), _leaves(b)
    return {k for k in left.keys() | right.keys() if left.get(k, "<absent>") != right.get(k, "<absent>")}


def _allowed(path: str) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p + ".*") for p in ALLOWED)


def test_the_tiny_profile_differs_from_the_gpu_profile_only_in_size_dtype_paths_and_resources():
    gpu, tiny = (
        yaml.safe_load((CONFIG_DIR / f"{n}.yaml").read_text()) for n in ("qwen3-omni", "qwen3-omni-tiny")
    )
    extra = sorted(p for p in _differences(gpu, tiny) if not _allowed(p))
    assert not extra, f"qwen3-omni-tiny differs from qwen3-omni beyond size/dtype/paths/resources: {extra}"
    # and so do the loaded profiles (defaults included)
    loaded = [load_profile(n).model_dump(mode="json") for n in ("qwen3-omni", "qwen3-omni-tiny")]
    extra = sorted(p for p in _differences(*loaded) if not _allowed(p))
    assert not extra, extra


def test_the_check_sees_a_difference_that_is_not_allowed():
    gpu = yaml.safe_load((CONFIG_DIR / "qwen3-omni.yaml").read_text())
    changed = yaml.safe_load((CONFIG_DIR / "qwen3-omni.yaml").read_text())
    changed["models"]["thinker"]["adapter"] = "tiny_llama"
    changed["stages"]["talker"]["num_replicas"] = 2
    changed["engine"]["dtype"] = "float32"
    assert {p for p in _differences(gpu, changed) if not _allowed(p)} == {
        "models.thinker.adapter", "stages.talker.num_replicas"}  # fmt: skip
