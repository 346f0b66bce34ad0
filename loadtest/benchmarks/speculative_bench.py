"""`make bench-speculative`: audio TTFP after the end of user speech with and without speculative
prefill (the turn encoded and prefilled while it is spoken), same engine, same history, one run.

Each session sets a system prompt of `--history-tokens` tokens (unique per session, so no other
session's cache helps), then speaks `--turns` espeak-ng questions at real-time pace; server VAD ends
each turn. Sessions alternate between speculative prefill on and off (`session.omniray.
speculative_prefill`), one at a time (same load). Turn 1 meets a context no engine has seen (the
whole history is prefilled at the end of speech unless it was prefilled while the user spoke);
later turns find the history in the KV store in both arms, so only the turn's own audio differs.
TTFP = `input_audio_buffer.speech_stopped` → first `response.output_audio.delta` at the client.

The thinker is the tiny profile's Llama at `--hidden`/`--layers` (random weights, built locally), so
that prefill costs what it costs a model of that size on this machine.

    python -m loadtest.benchmarks.speculative_bench --hidden 512 --layers 8 --history-tokens 2000 --pairs 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import uuid
from pathlib import Path

from transformers import AutoTokenizer

from loadtest import results
from loadtest.benchmarks.profiles import derive, widen_thinker
from loadtest.benchmarks.voice_bench import Client
from loadtest.clients.speech import SENTENCES, speech
from services import runtime
from services.models.profile import load_profile


def bench_profile(hidden: int, layers: int, tmp: Path) -> Path:
    def edit(data: dict) -> None:
        widen_thinker(data, hidden, layers)
        data["realtime"]["admission"] = {"initial": 64, "max": 64}

    return derive("tiny", tmp, f"tiny-{hidden}x{layers}", edit)


def system_prompt(tokenizer, tokens: int) -> str:
    """Distinct words until the prompt has `tokens` tokens."""
    salt = uuid.uuid4().hex[:6]
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < tokens:
        words.extend(f"{salt}w{len(words) + k}" for k in range(50))
    return " ".join(words)


def one_session(url: str, utterances: list[bytes], instructions: str, ahead: bool, turns: int) -> list[float]:
    client = Client(url, utterances, 0.0, seed=0,
                    session={"instructions": instructions, "max_output_tokens": 16,
                             "omniray": {"speculative_prefill": ahead}})  # fmt: skip
    ttfp = []
    try:
        client.wait("session.updated", 0)
        for turn in range(turns):
            mark = client.rt.mark()
            client.say(utterances[turn % len(utterances)])
            stopped, t_stop = client.wait("input_audio_buffer.speech_stopped", mark)
            _, t_audio = client.wait("response.output_audio.delta", stopped)
            client.wait("response.done", stopped)
            ttfp.append(t_audio - t_stop)
    finally:
        client.rt.close()
    if client.stats.errors:
        raise RuntimeError(client.stats.errors)
    return ttfp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--history-tokens", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=4, help="sessions per arm (alternating)")
    args = ap.parse_args()
    report: dict = {"args": vars(args), "ttfp_s": {"on": [], "off": []}}
    with tempfile.TemporaryDirectory(prefix="omniray-spec-") as tmp:
        path = bench_profile(args.hidden, args.layers, Path(tmp))
        profile = load_profile(str(path))
        tokenizer = AutoTokenizer.from_pretrained(str(profile.model_path(profile.models.thinker)))
        utterances = [speech(s) for s in SENTENCES]
        with runtime.temporary(str(path), prefix="omniray-spec-", timeout_s=600) as cluster:
            url = f"{cluster.http_url.replace('http', 'ws', 1)}/v1/realtime"
            one_session(url, utterances, system_prompt(tokenizer, 64), True, 1)  # warm-up
            for pair in range(args.pairs):
                for arm in ("on", "off") if pair % 2 else ("off", "on"):
                    ttfp = one_session(url, utterances[pair:] + utterances[:pair],
                                       system_prompt(tokenizer, args.history_tokens), arm == "on", args.turns)  # fmt: skip
                    report["ttfp_s"][arm].append(ttfp)
                    print(f"pair {pair} {arm:3}: " + " ".join(f"{t * 1000:.0f} ms" for t in ttfp), flush=True)
    for turn in range(args.turns):
        on = statistics.median(s[turn] for s in report["ttfp_s"]["on"])
        off = statistics.median(s[turn] for s in report["ttfp_s"]["off"])
        label = "turn 1 (new context)" if turn == 0 else f"turn {turn + 1} (history in the store)"
        report[f"turn{turn + 1}"] = {"median_on_s": on, "median_off_s": off, "off/on": off / on}
        print(f"{label}: TTFP median without {off * 1000:.0f} ms, with {on * 1000:.0f} ms -> {off / on:.2f}x")
    print(f"saved {results.write('speculative', f'tiny-{args.hidden}x{args.layers}', report)}")
    print(json.dumps({k: v for k, v in report.items() if k.startswith("turn")}))


if __name__ == "__main__":
    main()
