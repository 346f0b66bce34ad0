"""omni.v1.Omni registered with Serve's gRPC proxy, with request bytes that fail to decode kept as a
value instead of an exception.

grpcio answers a request its deserializer cannot parse (invalid UTF-8 in a string field, a length
past the end) with UNKNOWN and the parser's exception text. Here the generated handlers are
registered with a deserializer that returns `Undecodable` instead; the gateway answers that with
INVALID_ARGUMENT (Chat) or an `error` event with the session going on (Realtime). Serve's proxy
keeps each handler's request deserializer, so this runs in the proxy process."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from omni.v1 import omni_pb2_grpc


@dataclass(frozen=True)
class Undecodable:
    """Bytes that are not the method's request message; `reason` says why, in our words."""

    reason: str


def _lenient(parse):
    def deserialize(raw: bytes):
        try:
            return parse(raw)
        except DecodeError as e:
            utf8 = "UTF-8" in str(e)
            return Undecodable(
                "a string field is not valid UTF-8" if utf8 else "the protobuf wire format is corrupt"
            )

    return deserialize


def _handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    return handler._replace(request_deserializer=_lenient(handler.request_deserializer))


class _LenientServer:
    """Passes the generated registration through to `server`, deserializers swapped."""

    def __init__(self, server):
        self.server = server

    def add_generic_rpc_handlers(self, generic_handlers) -> None:
        for generic in generic_handlers:
            # grpcio's generic handler keeps its table here (Serve's own proxy rewrites it the same way).
            generic._method_handlers = {name: _handler(h) for name, h in generic._method_handlers.items()}
        self.server.add_generic_rpc_handlers(generic_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        self.server.add_registered_method_handlers(
            service_name, {name: _handler(h) for name, h in method_handlers.items()}
        )


def add_omni_servicer_to_server(servicer, server) -> None:
    omni_pb2_grpc.add_OmniServicer_to_server(servicer, _LenientServer(server))
