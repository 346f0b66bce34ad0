"""A measuring OpenAI-compatible streaming client: per-request TTFT, audio TTFP, E2E and audio
duration, parsed from the SSE stream as it arrives."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field

import httpx

from services.quota import LOCAL_API_KEY


@dataclass
class Result:
    ok: bool
    ttft: float | None = None
    ttfp: float | None = None
    e2e: float = 0.0
    last_audio: float | None = None
    audio_seconds: float = 0.0
    completion_tokens: int = 0
    error: str = ""
    chunk_times: list[float] = field(default_factory=list)

    def add(self, msg: dict, now: float) -> None:
        """One parsed SSE chunk that arrived `now` seconds after the request was sent."""
        if isinstance(msg.get("error"), dict):  # the server ended the stream with an error chunk
            self.error = f"stream error {msg['error'].get('code')}: {msg['error'].get('message', '')[:200]}"
            return
        if msg.get("usage"):
            self.completion_tokens = msg["usage"]["completion_tokens"]
        if not msg.get("choices"):
            return  # usage-only chunks and document progress events
        delta = msg["choices"][0]["delta"]
        audio = delta.get("audio") or {}
        # The first token: the first chunk after the role chunk that carries content (its text may
        # be empty: a token that decodes to nothing yet still counts, and servers send it).
        first_token = "role" not in delta and ("content" in delta or "transcript" in audio)
        if first_token and self.ttft is None:
            self.ttft = now
        if audio.get("data"):
            pcm = base64.b64decode(audio["data"])
            if self.ttfp is None:
                self.ttfp = now
            self.last_audio = now
            self.audio_seconds += len(pcm) / 2 / audio["sample_rate"]
            self.chunk_times.append(now)

    @property
    def rtf(self) -> float | None:
        if not self.audio_seconds or self.last_audio is None:
            return None
        return self.last_audio / self.audio_seconds


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict) -> Result:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    res = Result(ok=False)
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                res.add(json.loads(line[6:]), time.perf_counter() - t0)
        res.ok = not res.error
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = repr(e)
    finally:
        res.e2e = time.perf_counter() - t0
    return res


async def run_closed_loop(
    url: str, bodies: list[dict], concurrency: int, api_key: str = LOCAL_API_KEY
) -> tuple[list[Result], float]:
    """`concurrency` workers send `bodies` back to back; returns results and wall time."""
    queue: asyncio.Queue = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    results: list[Result] = []
    limits = httpx.Limits(max_connections=concurrency + 4)
    headers = {"Authorization": f"Bearer {api_key}"}

    async with httpx.AsyncClient(timeout=300, limits=limits, headers=headers) as client:

        async def worker():
            while not queue.empty():
                results.append(await stream_chat(client, url, queue.get_nowait()))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results, time.perf_counter() - t0
