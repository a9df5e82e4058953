"""gRPC plumbing every funke process shares: message limits, channel options, and serving a
service so that a request that does not decode is the client's error, not the server's.

grpc-python decodes a request before any handler runs; bytes that are not the method's message
make it answer UNKNOWN ("Unexpected DecodeError"). `add_service` registers a servicer with a
decoder that never raises: an undecodable request reaches a wrapper that answers
INVALID_ARGUMENT naming the method and what was wrong, and the servicer never sees it. The
services are registered from their descriptors, so this covers every method of every service,
unary or streaming, without a hand-written list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import socket

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from funke.common.ids import status_message

# How a standby JobManager's UNAVAILABLE answers begin (then "; the leader is HOST:PORT (epoch
# N)" or why none is named): clients tell a standby that answered from a JobManager not reached.
STANDBY_PREFIX = "this JobManager is a standby (high availability)"

# Job graphs carry pickled functions and artifacts; validation bounds each part (see
# `funke.common.graph.validation`), this bounds the whole request.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MESSAGE_SIZE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


@dataclass(frozen=True, slots=True)
class Malformed:
    """What the decoder hands on instead of a message it could not decode."""

    type_name: str
    size: int
    reason: str

    def describe(self, method: str) -> str:
        return (f"{method}: the request ({self.size:,} bytes) is not a valid {self.type_name} "
                f"message: {self.reason[:200]}")


def _decoder(message_class: type[Message]) -> Callable[[bytes], Message | Malformed]:
    name = message_class.DESCRIPTOR.full_name

    def decode(data: bytes) -> Message | Malformed:
        try:
            return message_class.FromString(data)
        except (DecodeError, ValueError, RuntimeError) as exc:  # upb raises DecodeError; others, ValueError
            return Malformed(name, len(data), str(exc) or type(exc).__name__)

    return decode


async def _refuse(context: grpc.aio.ServicerContext, method: str, malformed: Malformed) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_message(malformed.describe(method)))


def _unary_request(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await _refuse(context, method, request)
        return await behavior(request, context)

    return handle


def _unary_request_stream_response(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Malformed):
            await _refuse(context, method, request)
        async for response in behavior(request, context):
            yield response

    return handle


def _checked_requests(method: str, requests: AsyncIterator[Any],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async def checked() -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Malformed):
                await _refuse(context, method, request)
            yield request

    return checked()


def _stream_request(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behavior(_checked_requests(method, requests, context), context)

    return handle


def _stream_request_stream_response(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for response in behavior(_checked_requests(method, requests, context), context):
            yield response

    return handle


_SHAPES = {
    (False, False): (_unary_request, grpc.unary_unary_rpc_method_handler),
    (False, True): (_unary_request_stream_response, grpc.unary_stream_rpc_method_handler),
    (True, False): (_stream_request, grpc.stream_unary_rpc_method_handler),
    (True, True): (_stream_request_stream_response, grpc.stream_stream_rpc_method_handler),
}


def _handler(servicer: object, method: MethodDescriptor) -> grpc.RpcMethodHandler:
    wrap, make = _SHAPES[(method.client_streaming, method.server_streaming)]
    full_name = f"{method.containing_service.full_name}/{method.name}"
    return make(
        wrap(full_name, getattr(servicer, method.name)),
        request_deserializer=_decoder(GetMessageClass(method.input_type)),
        response_serializer=GetMessageClass(method.output_type).SerializeToString,
    )


def add_service(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor) -> None:
    """Serve every method of `service` (a descriptor, e.g.
    `jobmanager_pb2.DESCRIPTOR.services_by_name["JobManager"]`) from `servicer`'s coroutines."""
    handlers = {method.name: _handler(servicer, method) for method in service.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


def host_port(host: str, port: int) -> str:
    """`host:port`, an IPv6 literal in brackets ("[::1]:6123")."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
# Where a wildcard-bound process with nobody in particular to reach looks for its own address:
# the route it would take there (TEST-NET-1; a UDP connect sends nothing, it only asks the
# routing table).
_ROUTE_PROBE = "192.0.2.1:9"


def advertised_host(bind_host: str, advertise_host: str | None, toward: str | None = None) -> str:
    """The host others are told to dial. `--advertise-host` wins (NAT, containers); a concrete
    bind address is itself; a wildcard bind ("0.0.0.0" is no address anyone can dial) advertises
    this machine's address on the route to `toward` (a TaskManager: its JobManager, which then
    sees it connect from that very address), or on the default route. The host name is the last
    resort: on Debian it resolves to 127.0.1.1."""
    if advertise_host:
        return advertise_host
    if bind_host not in WILDCARD_HOSTS:
        return bind_host
    host, _, port = (toward or _ROUTE_PROBE).rpartition(":")
    host = host.strip("[]")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port) if port.isdigit() else 9))
            return probe.getsockname()[0]
    except (OSError, ValueError):
        return socket.gethostname()
