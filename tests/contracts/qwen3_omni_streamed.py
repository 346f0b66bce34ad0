"""vLLM's greedy thinker tokens for a three-image prompt two ways, in a process of its own: the images'
features inline (whole), and streamed — the prompt sent with only the images' grids and uuids while
another thread writes their features into an encoder-side NIXL feature pool one by one
(kv_store/features.py), read by omniray's EC connector (services/extensions/vllm/ec_connector.py).
Then a prompt whose image is never written: it fails at the connector's wait bound and the engine
serves the next prompt. Prints `RUN {"name", "tokens", "finish", "seconds", "written_before_done"}`."""

import json
import threading
import time

import numpy as np
from omni.v1 import common_pb2, stages_pb2
from PIL import Image
from vllm import LLM, SamplingParams
from vllm.config import ECTransferConfig

from kv_store.features import FeaturePool
from services.common.redis_config import redis_url, sync_client
from services.dataplane import tensors
from services.engine.thinker import vllm_prompt
from services.extensions.vllm.plugin import EC_CONNECTOR
from services.models.profile import load_profile
from services.models.registry import adapter_module
from services.models.versions import FeatureVersions

WAIT_S = 3.0
GAP_S = 0.6  # between two images' writes


def main() -> None:
    profile = load_profile("qwen3-omni-tiny")
    path = profile.model_path(profile.models.thinker)
    vision = adapter_module("qwen3_omni_vision").load(path, profile.models.vision.options)
    rng = np.random.default_rng(1)
    images = [Image.fromarray((rng.random((224, 288, 3)) * 255).astype(np.uint8)) for _ in range(3)]
    outs = [vision.assemble(vision.encode_tiles([vision.preprocess(img)]), 1, 1) for img in images]

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    head = tok.encode("<|im_start|>user\nCompare the pictures.", add_special_tokens=False)
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    version = FeatureVersions.for_profile(profile, "image").encode()
    llm_version = FeatureVersions.parse(version).llm
    ec = ECTransferConfig(ec_connector=EC_CONNECTOR, ec_role="ec_consumer",
                          ec_connector_extra_config={"redis_url": redis_url(), "wait_s": WAIT_S})  # fmt: skip
    llm = LLM(model=str(path), dtype="float32", max_model_len=2048, enforce_eager=True, max_num_seqs=2,
              kv_cache_memory_bytes=256 << 20, ec_transfer_config=ec, enable_prefix_caching=False,
              scheduler_cls="services.extensions.vllm.scheduler.OmnirayScheduler", **profile.engine.extra)  # fmt: skip
    greedy = SamplingParams(max_tokens=12, temperature=0)

    def prompt(keys: list[str] | None) -> dict:
        p = stages_pb2.Prompt()
        p.segments.add(tokens=stages_pb2.TokenSpan(ids=head))
        for n, out in enumerate(outs):
            pl = out.placement
            if keys is None:
                desc = tensors.describe(out.embeddings, producer_version=version)
            else:
                desc = common_pb2.TensorDescriptor(shape=list(out.embeddings.shape), producer_version=version,
                                                   feature_key=keys[n])  # fmt: skip
            seg = p.segments.add(embeddings=desc)
            seg.placement.CopyFrom(stages_pb2.MediaPlacement(
                modality="image", placeholder_id=pl.placeholder, prefix_ids=pl.prefix, suffix_ids=pl.suffix,
                grid_thw=pl.grid_thw))  # fmt: skip
        p.segments.add(tokens=stages_pb2.TokenSpan(ids=tail))
        request, _, _ = vllm_prompt(p, llm_version, lambda: None)
        return request

    def run(name: str, request: dict, written: list | None = None) -> None:
        started = time.monotonic()
        (out,) = llm.generate([request], greedy)
        line = {"name": name, "tokens": list(out.outputs[0].token_ids), "finish": out.outputs[0].finish_reason,
                "seconds": round(time.monotonic() - started, 3),
                "written_before_done": None if written is None else len(written)}  # fmt: skip
        print("RUN", json.dumps(line), flush=True)

    run("whole", prompt(None))

    pool = FeaturePool(
        f"contract-encoder-{time.monotonic_ns()}", 16 << 20, sync_client(), hold_s=60, ttl_s=120
    )
    stop = threading.Event()

    def serve() -> None:  # the encoder replica's progress for readers
        while not stop.wait(0.001):
            pool.pool.progress()

    keys = [f"contract/{time.monotonic_ns()}/{n}" for n in range(3)]
    written: list[str] = []

    def encode() -> None:  # the encoder pool finishing one image after another
        for key, out in zip(keys, outs, strict=True):
            time.sleep(GAP_S)
            pool.put(key, out.embeddings)
            written.append(key)

    threading.Thread(target=serve, daemon=True).start()
    writer = threading.Thread(target=encode)
    writer.start()
    run("streamed", prompt(keys), written)
    writer.join()
    run("streamed_again", prompt(keys))  # all written: no wait
    run("never_written", prompt([keys[0], keys[1], "contract/never"]))
    run("after_failure", prompt(keys))
    stop.set()


if __name__ == "__main__":
    main()
