"""A blocking OpenAI-Realtime client for benchmarks and tests: one WebSocket, a reader thread that
keeps every server event with its arrival time, and waits on event types. The voice benchmark, the
turn-cost benchmark and the realtime e2e tests drive sessions with it."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable

import websockets
import websockets.sync.client as ws_client

from services.quota import LOCAL_API_KEY

RATE = 24_000  # realtime audio: pcm16 mono at 24 kHz


class RealtimeClient:
    def __init__(
        self, url: str, api_key: str = LOCAL_API_KEY, on_event: Callable[[dict], None] | None = None
    ):
        """`url`: ws://host:port/v1/realtime. `on_event` sees each server event as it arrives (under
        the client's lock)."""
        self.conn = ws_client.connect(
            url, additional_headers={"Authorization": f"Bearer {api_key}"}, max_size=None
        )
        self.cond = threading.Condition()
        self.events: list[tuple[float, dict]] = []  # (time.monotonic() at arrival, event)
        self.closed = False
        self._on_event = on_event
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for raw in self.conn:
                event, now = json.loads(raw), time.monotonic()
                with self.cond:
                    if self._on_event is not None:
                        self._on_event(event)
                    self.events.append((now, event))
                    self.cond.notify_all()
        except websockets.exceptions.ConnectionClosed:
            pass
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()

    def send(self, event: dict) -> None:
        self.conn.send(json.dumps(event))

    def append(self, pcm: bytes) -> None:
        self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})

    def wait(self, kind: str, after: int = 0, timeout: float = 120) -> tuple[int, float, dict]:
        """The first event of `kind` at index `after` or later: (index, arrival time, event)."""

        def found() -> int | None:
            return next(
                (i for i in range(after, len(self.events)) if self.events[i][1]["type"] == kind), None
            )

        with self.cond:
            self.cond.wait_for(lambda: found() is not None or self.closed, timeout)
            i = found()
            if i is None:
                raise TimeoutError(f"no {kind} within {timeout:g} s")
            return i, self.events[i][0], self.events[i][1]

    def mark(self) -> int:
        """Where the next event will be (for `wait(..., after=mark)`)."""
        with self.cond:
            return len(self.events)

    def errors(self) -> list[dict]:
        with self.cond:
            return [e["error"] for _, e in self.events if e["type"] == "error"]

    def close(self) -> None:
        self.conn.close()
