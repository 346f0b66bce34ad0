"""vLLM's greedy tokens for a prompt, in a process of its own (the engine binds threads and holds the
model): reads {"model", "prompt_token_ids", "max_tokens"} as JSON on stdin, prints the token ids."""

import json
import sys

from vllm import LLM, SamplingParams


def main() -> None:
    job = json.load(sys.stdin)
    llm = LLM(model=job["model"], dtype="float32", max_model_len=2048, enforce_eager=True, max_num_seqs=1,
              language_model_only=True, kv_cache_memory_bytes=256 << 20)  # fmt: skip
    out = llm.generate([{"prompt_token_ids": job["prompt_token_ids"]}],
                       SamplingParams(max_tokens=job["max_tokens"], temperature=0))  # fmt: skip
    print("TOKENS", json.dumps(list(out[0].outputs[0].token_ids)), flush=True)


if __name__ == "__main__":
    main()
