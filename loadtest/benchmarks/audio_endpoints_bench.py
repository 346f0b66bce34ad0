"""`make bench-audio`: the audio endpoints on one deployment, one request at a time.

- `/v1/audio/speech`, streamed pcm: time to the first audio byte vs time to the whole file (the
  baseline, measured in the same requests: what a client that waits for the file sees), and the
  real-time factor (whole time / audio seconds); for mp3 too (the encoder's added delay).
- `/v1/audio/transcriptions` of espeak-ng sentences: latency per audio second, and with `--wer` the
  word error rate of speech made by `/v1/audio/speech` and transcribed back (a cascade with real
  speech models: `small`).

Medians over `--requests` requests per sentence set.

    python -m loadtest.benchmarks.audio_endpoints_bench --profile small --requests 6 --wer
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import time

import httpx

from loadtest import results
from loadtest.clients.speech import SENTENCES, spoken_wav
from services import runtime
from services.quota import LOCAL_API_KEY

TEXT = " ".join(SENTENCES[:3])
AUTH = {"authorization": f"Bearer {LOCAL_API_KEY}"}


def _speech(client: httpx.Client, fmt: str) -> dict:
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": fmt}
    start = time.perf_counter()
    first, data = None, bytearray()
    with client.stream("POST", "/v1/audio/speech", json=body, headers=AUTH) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - start
            data += chunk
    whole = time.perf_counter() - start
    out = {"first_byte_s": first, "whole_s": whole, "bytes": len(data)}
    if fmt == "pcm":
        out["audio_s"] = len(data) / 2 / 24_000
    return out


def _transcribe(client: httpx.Client, name: str, data: bytes) -> tuple[float, str]:
    start = time.perf_counter()
    r = client.post(
        "/v1/audio/transcriptions", files={"file": (name, data)}, data={"model": "whisper-1"}, headers=AUTH
    )
    r.raise_for_status()
    return time.perf_counter() - start, r.json()["text"]


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="small")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--wer", action="store_true", help="transcribe the speech back (real speech models)")
    args = ap.parse_args(argv)
    import jiwer
    import soundfile

    spoken = [spoken_wav(s) for s in SENTENCES]
    spoken_s = [soundfile.info(io.BytesIO(w)).duration for w in spoken]
    with (
        runtime.temporary(args.profile, prefix="omniray-audio-") as cluster,
        httpx.Client(base_url=cluster.http_url, timeout=300) as client,
    ):
        _speech(client, "pcm")  # warm-up
        pcm = [_speech(client, "pcm") for _ in range(args.requests)]
        mp3 = [_speech(client, "mp3") for _ in range(args.requests)]
        heard = [_transcribe(client, "q.wav", w) for w in spoken[: args.requests]]
        wer = []
        if args.wer:
            for _ in range(args.requests):
                r = client.post("/v1/audio/speech", headers=AUTH,
                                json={"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "wav"})  # fmt: skip
                wer.append(jiwer.wer(_words(TEXT), _words(_transcribe(client, "s.wav", r.content)[1])))

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    report = results.header(args.profile, requests=args.requests, text_chars=len(TEXT))
    report |= {
        "pcm_first_byte_s": med(pcm, "first_byte_s"),
        "pcm_whole_s": med(pcm, "whole_s"),
        "pcm_audio_s": med(pcm, "audio_s"),
        "mp3_first_byte_s": med(mp3, "first_byte_s"),
        "mp3_whole_s": med(mp3, "whole_s"),
        "transcription_s_per_audio_s": statistics.median(
            t / s for (t, _), s in zip(heard, spoken_s, strict=False)
        ),
        "speech_wer": statistics.median(wer) if wer else None,
    }
    r = report
    print(f"speech pcm: first byte {r['pcm_first_byte_s'] * 1000:.0f} ms, whole {r['pcm_whole_s'] * 1000:.0f} ms "
          f"({r['pcm_whole_s'] / r['pcm_first_byte_s']:.1f}x the first byte), audio {r['pcm_audio_s']:.2f} s, "
          f"RTF {r['pcm_whole_s'] / r['pcm_audio_s']:.2f}")  # fmt: skip
    print(
        f"speech mp3: first byte {r['mp3_first_byte_s'] * 1000:.0f} ms, whole {r['mp3_whole_s'] * 1000:.0f} ms"
    )
    print(f"transcription: {r['transcription_s_per_audio_s']:.3f} s per audio second")
    if wer:
        print(f"speech -> transcription WER median {r['speech_wer']:.3f} (max {max(wer):.3f})")
    print(f"saved {results.write('audio-endpoints', args.profile, report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
