"""The one OpenAI-Realtime WebSocket client of tests, benchmarks and Locust: a blocking connection, a
reader thread (a greenlet under Locust's gevent) that keeps every server event with its arrival time,
waits on event types or predicates, and audio sent at real-time pace. The event log is shared with
the WebRTC client (loadtest/clients/webrtc_client.py).

Events are kept as the JSON the server sent (dicts), each checked against the server's own
definition (services/realtime/server_events.py) as it arrives: an event the server could not have
meant to send is a protocol error the client records in `malformed` (benchmarks and Locust count
it; tests assert none)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable

import websockets
import websockets.sync.client as ws_client
from pydantic import ValidationError

from services.quota import LOCAL_API_KEY
from services.realtime import server_events

RATE = 24_000  # realtime audio: pcm16 mono at 24 kHz
CHUNK_MS = 100  # audio is appended in 100 ms chunks

Match = str | Callable[[dict], bool]


def _matcher(match: Match) -> Callable[[dict], bool]:
    return (lambda e: e["type"] == match) if isinstance(match, str) else match


class ServerEventLog:
    """The server events of one realtime connection, whatever its transport, as they arrive; waits
    on them. A transport calls `received` for each event and `ended` once when it closes."""

    def __init__(self, on_event: Callable[[dict], None] | None, timeout: float):
        self.timeout = timeout
        self.cond = threading.Condition()
        self.events: list[tuple[float, dict]] = []  # (time.monotonic() at arrival, event)
        self.malformed: list[str] = []  # why events failed the server's own definition
        self.closed = False
        self.close_code: int | None = None  # the server's close code, once closed
        self._on_event = on_event

    def received(self, raw: str | bytes) -> None:
        event, now = json.loads(raw), time.monotonic()
        try:
            server_events.parse(event)
            bad = None
        except ValidationError as e:
            bad = f"{event.get('type')}: {e.errors()[0]['msg']}"
        with self.cond:
            if bad is not None:
                self.malformed.append(bad)
            if self._on_event is not None:
                self._on_event(event)
            self.events.append((now, event))
            self.cond.notify_all()

    def ended(self, close_code: int | None = None) -> None:
        with self.cond:
            self.closed = True
            self.close_code = close_code
            self.cond.notify_all()

    def find(self, match: Match, after: int = 0) -> int | None:
        """Index of the first event at `after` or later that `match`es (a type, or a predicate)."""
        is_it = _matcher(match)
        with self.cond:
            return next((i for i in range(after, len(self.events)) if is_it(self.events[i][1])), None)

    def wait(self, match: Match, after: int = 0, timeout: float | None = None, what: str = "") -> int:
        """Index of the first event at `after` or later that `match`es; TimeoutError (saying `what`
        was awaited) when none came within `timeout` s or the connection closed first."""
        timeout = self.timeout if timeout is None else timeout
        with self.cond:
            self.cond.wait_for(lambda: self.find(match, after) is not None or self.closed, timeout)
            i = self.find(match, after)
            if i is None:
                seen = [e["type"] for _, e in self.events[after:]][-8:]
                why = "the connection closed" if self.closed else f"{timeout:g} s passed"
                raise TimeoutError(f"no {what or match} before {why}; saw {seen}")
            return i

    def wait_closed(self, timeout: float | None = None) -> int | None:
        """The server's close code once the connection closed; TimeoutError if it stays open."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.closed, self.timeout if timeout is None else timeout):
                raise TimeoutError("the connection stayed open")
            return self.close_code

    def event(self, i: int) -> dict:
        return self.events[i][1]

    def at(self, i: int) -> float:
        """When event `i` arrived (time.monotonic())."""
        return self.events[i][0]

    def mark(self) -> int:
        """Where the next event will be (for `wait(..., after=mark)`)."""
        with self.cond:
            return len(self.events)

    def errors(self) -> list[dict]:
        with self.cond:
            return [e["error"] for _, e in self.events if e["type"] == "error"]


class RealtimeClient(ServerEventLog):
    def __init__(
        self,
        url: str,
        api_key: str = LOCAL_API_KEY,
        on_event: Callable[[dict], None] | None = None,
        timeout: float = 120,
    ):
        """`url`: ws://host:port/v1/realtime[?model=...]. `on_event` sees each server event as it
        arrives (under the client's lock). `timeout`: for the connect and, by default, each wait."""
        super().__init__(on_event, timeout)
        self.conn = ws_client.connect(
            url,
            additional_headers={"Authorization": f"Bearer {api_key}"},
            max_size=None,
            open_timeout=timeout,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for raw in self.conn:
                self.received(raw)
        except websockets.exceptions.ConnectionClosed:
            pass
        finally:
            self.ended(self.conn.close_code)

    def send(self, event: dict) -> None:
        self.conn.send(json.dumps(event))

    def send_raw(self, data: str | bytes) -> None:
        """A frame as it is (tests of malformed input)."""
        self.conn.send(data)

    def append(self, pcm: bytes) -> None:
        self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})

    def say(self, pcm: bytes, chunk_ms: int = CHUNK_MS) -> list[float]:
        """Append audio at real-time pace; returns when each chunk was sent (time.monotonic())."""
        step, sent = RATE * 2 * chunk_ms // 1000, []
        for k in range(0, len(pcm), step):
            sent.append(time.monotonic())
            self.append(pcm[k : k + step])
            time.sleep(chunk_ms / 1000)
        return sent

    def close(self) -> None:
        self.conn.close()
        self._reader.join(timeout=5)
