"""omni.v1.Omni registered through grpcio's public API with lenient deserializers, on a real grpcio
server: bytes that are not the method's request reach the servicer as `Undecodable` (unary and
streaming requests alike), good ones as their message."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from omni.v1 import omni_pb2, omni_pb2_grpc

from services.gateway.grpc_wire import Undecodable, add_omni_servicer_to_server

INVALID_UTF8 = b"\x0a\x02\xff\xfe"  # field 1 (a string) holding bytes that are not UTF-8


class _Seen(omni_pb2_grpc.OmniServicer):
    """Answers with what its request decoded to (the model name, or the reason it did not)."""

    def Chat(self, request, context):
        text = request.reason if isinstance(request, Undecodable) else request.model
        yield omni_pb2.ChatChunk(id=text)

    def Realtime(self, request_iterator, context):
        for event in request_iterator:
            yield omni_pb2.RealtimeServerEvent(type=event.reason if isinstance(event, Undecodable) else "ok")


@pytest.fixture(scope="module")
def channel():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_omni_servicer_to_server(_Seen(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    server.stop(None)


def _raw(channel, method: str, streaming_request: bool):
    call = (channel.stream_stream if streaming_request else channel.unary_stream)(
        f"/omni.v1.Omni/{method}", request_serializer=None, response_deserializer=None
    )
    return call


def test_a_good_request_decodes_and_a_bad_one_arrives_as_undecodable(channel):
    chat = _raw(channel, "Chat", False)
    (good,) = chat(omni_pb2.ChatRequest(model="tiny").SerializeToString(), timeout=10)
    assert omni_pb2.ChatChunk.FromString(good).id == "tiny"
    (bad,) = chat(INVALID_UTF8, timeout=10)
    assert omni_pb2.ChatChunk.FromString(bad).id == "a string field is not valid UTF-8"


def test_a_streaming_request_keeps_going_past_an_undecodable_message(channel):
    realtime = _raw(channel, "Realtime", True)
    good = omni_pb2.RealtimeClientEvent(event_id="e1").SerializeToString()
    answers = [
        omni_pb2.RealtimeServerEvent.FromString(r).type
        for r in realtime(iter([good, b"\xff", good]), timeout=10)
    ]
    assert answers == ["ok", "the protobuf wire format is corrupt", "ok"]
