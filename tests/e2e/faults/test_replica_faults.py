"""The decode replica serving streamed responses dies (a real SIGKILL of its process and engine):
each response goes on from the tokens already sent once Serve has replaced the replica — REST and
gRPC finish with every token they asked for and usage that counts them as generated, the realtime
response completes — with one hiccup, counted in `omniray_gateway_decode_resumes_total`. An answer
under a grammar (structured output) cannot be resumed: its client gets a clean error within 5 s
(an SSE error chunk then `[DONE]`), never a hang. The same session's next turn is served. A speech
file whose talker replica dies mid-stream is cut off before its end (a failed transfer) or, killed
between pieces, comes whole from the replacement — never a short file that looks whole. A decode
engine that stalls (alive, not answering) is given up after the profile's deadline and the response
resumed."""

from __future__ import annotations

import functools
import os
import threading
import time

import grpc
import httpx
import psutil
import pytest
from omni.v1 import common_pb2, omni_pb2, omni_pb2_grpc

from services.gateway.audio.protocol import MAX_SPEECH_CHARS
from services.models.profile import load_profile
from services.realtime.server_events import WHOLE
from tests.conftest import AUTH, grpc_channel
from tests.faults import RECOVER_S, Outcome, RealtimeClient, counter, kill, replica_pid, rest_stream, resumes

DETECT_S = 5.0  # the bound: a clean error within 5 s of the replica's death


MAX_TOKENS = 1200  # still streaming when the kill lands (tiny writes ~100 tokens/s here)


def _grpc_stream(omniray, model_name, out: Outcome) -> None:
    channel = grpc_channel(omniray.grpc_target)
    request = omni_pb2.ChatRequest(
        model=model_name,
        messages=[omni_pb2.Message(role="user", content=[omni_pb2.ContentPart(text="hi")])],
        sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
    )
    try:
        for chunk in omni_pb2_grpc.OmniStub(channel).Chat(request, timeout=300):
            if chunk.text:
                out.started.set()
            if chunk.finish_reason:
                out.finish, out.tokens = chunk.finish_reason, chunk.usage.completion_tokens
    except grpc.RpcError as e:
        out.error_at, out.detail = time.monotonic(), f"{e.code().name}: {e.details()}"
    finally:
        channel.close()


def test_responses_survive_their_decode_replica(omniray, ray_driver, model_name):
    rest, rpc, grammar, spoken = Outcome(), Outcome(), Outcome(), Outcome()
    before = resumes(omniray.metrics_url)
    rt = RealtimeClient(omniray.http_url, model_name)
    rt.turn()
    rt.wait("response.output_text.delta")
    # 600 digits: still being written when the kill lands
    digits = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 600,
        "maxItems": 600,
    }
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": digits}}
    threads = [
        threading.Thread(target=rest_stream, args=(omniray.http_url, model_name, rest, MAX_TOKENS)),
        threading.Thread(target=_grpc_stream, args=(omniray, model_name, rpc)),
        threading.Thread(target=rest_stream, args=(omniray.http_url, model_name, grammar, MAX_TOKENS, {"response_format": schema})),
        threading.Thread(target=rest_stream, args=(omniray.http_url, model_name, spoken, MAX_TOKENS, {"modalities": ["text", "audio"],
                         "audio": {"voice": "alloy", "format": "pcm16"}})),
    ]  # fmt: skip
    for t in threads:
        t.start()
    # every stream under way when the kill lands (the structured one too: its JSON is content), so
    # none of them can reach the replacement replica instead
    started = (rest, rpc, spoken, grammar)
    assert all(o.started.wait(30) for o in started), "the streams did not start"
    time.sleep(1)

    killed_at = time.monotonic()
    segments = kill(replica_pid("Decode"))

    # the grammar-bound answer cannot be resumed: a clean error, fast
    threads[2].join(DETECT_S + 5)
    assert grammar.error_at is not None and grammar.error_at - killed_at <= DETECT_S, grammar.detail
    assert '"code": "stage_unavailable"' in grammar.detail and "last: data: [DONE]" in grammar.detail
    assert (
        "Traceback" not in grammar.detail
        and "ActorID" not in grammar.detail
        and "ray::" not in grammar.detail
    )

    # the others go on once a replica is back, with every token they asked for
    seen: list = []
    done = rt.wait("response.done", timeout=RECOVER_S, seen=seen)
    assert done["response"]["status"] in WHOLE, done
    assert not [e for _, e in seen if e["type"] == "error"], seen
    rt.turn()  # the same session's next turn is served (before the session idles out)
    assert rt.wait("response.done", timeout=120)["response"]["status"] in WHOLE
    rt.conn.close()
    for t in (threads[0], threads[1], threads[3]):
        t.join(RECOVER_S)
        assert not t.is_alive(), "a client hung after the replica died"
    print(f"\n[replica-faults] decode killed: streams finished {time.monotonic() - killed_at:.0f} s later")
    assert rest.error_at is None and (rest.finish, rest.tokens) == ("length", MAX_TOKENS), rest.detail
    assert rpc.error_at is None and (rpc.finish, rpc.tokens) == ("length", MAX_TOKENS), rpc.detail
    # the spoken answer too: all its tokens, and speech after the kill as well as before
    assert spoken.error_at is None and (spoken.finish, spoken.tokens) == ("length", MAX_TOKENS), spoken.detail
    assert [a for a in spoken.audio if a[0] < killed_at] and [
        a for a in spoken.audio if a[0] > killed_at + 10
    ]
    # the killed engine's shared memory, left in /dev/shm, was unlinked when its replacement started
    assert segments and not [path for path in segments if os.path.exists(path)]
    deadline = time.monotonic() + 60  # Ray exports metrics with a lag
    while resumes(omniray.metrics_url) < before + 4 and time.monotonic() < deadline:
        time.sleep(2)
    assert resumes(omniray.metrics_url) >= before + 4


def test_a_response_whose_decode_engine_stalls_goes_on(omniray, ray_driver, model_name):
    """The decode replica lives on and passes Serve's health checks while its engine answers
    nothing (the engine's processes stopped: SIGSTOP), as a deadlocked engine would. The gateway
    waits `pipeline.stage_deadlines.between_s` for the next token, cancels the call and resumes the
    response as for a lost replica — here on the same replica, whose engine is back by then: the
    response finishes with every token, counted as a stall and a resume. Before the deadlines the
    stream waited on the engine (for ever, had it not come back) and nothing was counted."""
    between_s = load_profile("tiny").pipeline.stage_deadlines.between_s
    stalls = functools.partial(
        counter, omniray.metrics_url, "omniray_gateway_stage_stalls_total", stage="decode"
    )
    stalled = functools.partial(resumes, omniray.metrics_url, cause="replica_stalled")
    before = stalls(), stalled()
    rest = Outcome()
    thread = threading.Thread(target=rest_stream, args=(omniray.http_url, model_name, rest, MAX_TOKENS))
    thread.start()
    assert rest.started.wait(30), "the stream did not start"
    engine = psutil.Process(replica_pid("Decode")).children(recursive=True)
    assert engine, "the decode replica runs its engine in processes of its own"
    for proc in engine:
        proc.suspend()
    try:
        time.sleep(between_s + 5)  # the gateway gives up on the call and sends the continuation
    finally:
        for proc in engine:
            proc.resume()
    thread.join(RECOVER_S)
    assert not thread.is_alive(), "the client hung on a stalled engine"
    assert rest.error_at is None and (rest.finish, rest.tokens) == ("length", MAX_TOKENS), rest.detail

    def counted() -> bool:
        return stalls() >= before[0] + 1 and stalled() >= before[1] + 1

    deadline = time.monotonic() + 60  # Ray exports metrics with a lag
    while not counted() and time.monotonic() < deadline:
        time.sleep(2)
    assert counted()


def test_a_speech_file_whose_talker_dies_is_whole_or_cut_never_short(omniray, model_name):
    """The status (200) goes out with the file's first bytes. A talker replica that dies after them
    either takes an in-flight piece with it — the body is cut off before its end, which the client
    sees as a failed transfer — or dies between pieces, and the next piece waits for its
    replacement: the file comes whole (as long as one made without a kill). Never a short file that
    looks whole."""
    words = "The talker goes on speaking, clause after clause, "
    text = (words * (MAX_SPEECH_CHARS // len(words)))[:MAX_SPEECH_CHARS]
    body = {"model": model_name, "voice": "alloy", "input": text, "response_format": "pcm"}
    url = f"{omniray.http_url}/v1/audio/speech"

    def read(victim: int | None) -> tuple[int, Exception | None]:
        got, error = 0, None
        with httpx.stream("POST", url, json=body, headers=AUTH, timeout=RECOVER_S) as r:
            assert r.status_code == 200
            try:
                for chunk in r.iter_bytes():
                    got += len(chunk)
                    if victim is not None:
                        kill(victim)
                        victim = None
            except httpx.TransportError as e:
                error = e
        return got, error

    got, error = read(replica_pid("Talker"))  # looked up first: the kill lands during the file
    if error is None:  # the kill fell between pieces: the rest came from the replacement
        whole, error = read(None)
        assert error is None and got == whole, (got, whole)
    print(f"\n[replica-faults] talker killed mid-file: {'cut' if error else 'whole'} after {got} bytes")


@pytest.fixture(autouse=True)
def _healthy_after(omniray):
    """Whatever happened, later tests find a serving system."""
    yield
    deadline = time.monotonic() + RECOVER_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{omniray.http_url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(2)
