"""Time to first audio over WebRTC vs WebSocket on the same session workload: one deployment, one
spoken question per turn (espeak-ng) followed by silence, server VAD ends the turn; TTFP is from the
end of the question at the client to the first audio the client has (WebSocket: the first
`response.output_audio.delta`; WebRTC: the first frame with sound on the RTP track — after Opus,
the transport's real-time pacing and the client's jitter buffer). Transports alternate turn by turn
so that drift of the machine falls on both.

    python -m loadtest.benchmarks.webrtc_bench --profile tiny --turns 10
"""

from __future__ import annotations

import argparse
import statistics
import time

from loadtest import results
from loadtest.clients.realtime_client import CHUNK_MS, RATE, RealtimeClient
from loadtest.clients.speech import SENTENCES, speech
from loadtest.clients.webrtc_client import WebRtcClient
from services import runtime
from services.models.profile import load_profile

SILENCE = bytes(RATE * 2 * 8 // 10)
VAD = {"type": "server_vad", "silence_duration_ms": 400}


def _settings(max_tokens: int) -> dict:
    return {"type": "session.update", "session": {"type": "realtime", "max_output_tokens": max_tokens,
                                                  "audio": {"input": {"turn_detection": VAD}}}}  # fmt: skip


def websocket_turn(client: RealtimeClient, pcm: bytes) -> float:
    at = client.mark()
    sent = client.say(pcm)
    spoken = sent[-1] + CHUNK_MS / 1000
    client.say(SILENCE)
    first = client.wait("response.output_audio.delta", at)
    client.wait("response.done", at)
    return client.at(first) - spoken


def webrtc_turn(client: WebRtcClient, pcm: bytes) -> float:
    at = client.mark()
    spoken = client.say(pcm)
    client.say(SILENCE)
    heard = client.wait_sound(spoken)
    done = client.wait("response.done", at)
    client.wait("output_audio_buffer.stopped", done)  # its audio played out: the next turn is clean
    return heard - spoken


def _stats(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--turns", type=int, default=10, help="per transport")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    questions = [speech(s) for s in SENTENCES]
    with runtime.temporary(args.profile, prefix="omniray-webrtc-", timeout_s=600) as cluster:
        model = load_profile(args.profile).served_model_name
        ws = RealtimeClient(f"{cluster.http_url.replace('http', 'ws', 1)}/v1/realtime?model={model}")
        rtc = WebRtcClient(cluster.http_url, model=model)
        try:
            for client in (ws, rtc):
                client.wait("session.created")
                client.send(_settings(args.max_tokens))
                client.wait("session.updated")
            ttfp = {"websocket": [], "webrtc": []}
            for k in range(args.turns):
                pcm = questions[k % len(questions)]
                ttfp["websocket"].append(websocket_turn(ws, pcm))
                ttfp["webrtc"].append(webrtc_turn(rtc, pcm))
                time.sleep(0.5)
        finally:
            ws.close()
            rtc.close()
    print(f"profile {args.profile}, {args.turns} turns per transport, max_output_tokens {args.max_tokens}")
    for name, xs in ttfp.items():
        p50, p90 = _stats(xs)
        print(f"{name:9s} TTFP p50 {p50 * 1000:6.0f} ms  P90 {p90 * 1000:6.0f} ms  ({len(xs)} turns)")
    (w50, w90), (r50, r90) = _stats(ttfp["websocket"]), _stats(ttfp["webrtc"])
    print(f"webrtc - websocket: p50 {(r50 - w50) * 1000:+.0f} ms, P90 {(r90 - w90) * 1000:+.0f} ms")
    data = {**results.header(args.profile, turns=args.turns, max_tokens=args.max_tokens), "ttfp_s": ttfp}
    print(f"[webrtc] wrote {results.write('webrtc', args.profile, data)}")


if __name__ == "__main__":
    main()
