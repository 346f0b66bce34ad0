"""Drain, never drop: rolling the decode deployment (a new config, as `serve deploy` of an update
does) under streaming load fails no request — the old replica takes no new requests and finishes
the ones it has (graceful_shutdown_timeout_s), new ones wait for the new replica."""

from __future__ import annotations

import json
import threading
import time

import httpx

from services import runtime
from tests.conftest import AUTH
from tests.faults import rolled


def _stream(omniray, model_name, max_tokens: int) -> str:
    """'ok', or what went wrong."""
    body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}  # fmt: skip
    try:
        with httpx.stream(
            "POST", f"{omniray.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=300
        ) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}"
            lines = [line for line in r.iter_lines() if line]
    except httpx.TransportError as e:
        return type(e).__name__
    if any('"error"' in line for line in lines):
        return next(line for line in lines if '"error"' in line)
    if lines[-1] != "data: [DONE]":
        return "no [DONE]"
    finish = json.loads(lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"]
    return "ok" if finish in ("length", "stop") else f"finish {finish}"


def test_rolling_decode_under_load_fails_nothing(omniray, model_name):
    results: list[str] = []
    stop = threading.Event()

    def load(max_tokens: int) -> None:
        while not stop.is_set():
            results.append(_stream(omniray, model_name, max_tokens))

    long_reply = threading.Thread(target=lambda: results.append(_stream(omniray, model_name, 2000)))
    users = [threading.Thread(target=load, args=(200,)) for _ in range(2)]
    for t in [long_reply, *users]:
        t.start()
    time.sleep(3)  # streams in flight on the old replica

    t0 = time.monotonic()
    runtime.apply(omniray, rolled(runtime.applied(omniray), "Decode"), timeout_s=300)
    rolled_s = time.monotonic() - t0
    time.sleep(5)  # and a little load on the new replica
    stop.set()
    for t in [long_reply, *users]:
        t.join(300)
    failed = [r for r in results if r != "ok"]
    print(
        f"\n[drain] decode rolled in {rolled_s:.0f} s under load: {len(results)} streams, {len(failed)} failed"
    )
    assert len(results) >= 5 and not failed, failed
