"""The broker's gRPC server: HTTP/2 and gRPC of rmq's own, an asyncio Protocol on the broker's event
loop (the RPCs call the broker's coroutines directly, no thread hand-off).

The wire work — HTTP/2 framing and flow control, HPACK, gRPC's message framing — is
rmq_core/_native/h2's H2Connection; this module turns its events into calls of MessagingService's
RPCs and their answers into its frames:

    HEADERS   a call: the method from :path, its metadata (the request headers: x-mq-client-id,
              authorization ...), its deadline from grpc-timeout
    message   unary / server streaming: the one request, run when the client half-closes;
              bidirectional (Telemetry): fed to the RPC's request iterator as it comes
    answer    headers, the response message(s), trailers (grpc-status, grpc-message
              percent-encoded); an RPC ending with GrpcAbort, or failing, is answered with its
              status in trailers only

Messages are not compressed either way: a request with a grpc-encoding other than identity is
answered UNIMPLEMENTED (the 5.x clients do not compress)."""
from __future__ import annotations

import asyncio
import logging
import time

from google.protobuf.message import DecodeError

from rmq_core._native import h2, proto_send
from rmq_core.errors import ConfigError
from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2 as spb
from rmq_core.proxy.service import GRPC_INTERNAL, GRPC_UNIMPLEMENTED, GrpcAbort, MessagingService
from rmq_core.remoting.context import Resume

log = logging.getLogger("rmq.proxy")

# RocketMQ 5's clients send bodies up to the max body size the settings answer gives (4 MiB by
# default) plus the message's other fields
_MAX_MESSAGE_BYTES = 130 * 1024 * 1024
_SERVICE = "/apache.rocketmq.v2.MessagingService/"
UNARY, SERVER_STREAMING, BIDI_STREAMING = 0, 1, 2
# MessagingService's RPCs: name -> (request decoder, kind); SendMessage's request is decoded natively
# into plain values (rmq_core._native.proto_send), every other by protobuf
METHODS = {
    "QueryRoute": (spb.QueryRouteRequest.FromString, UNARY),
    "Heartbeat": (spb.HeartbeatRequest.FromString, UNARY),
    "SendMessage": (proto_send.decode_send_request, UNARY),
    "QueryAssignment": (spb.QueryAssignmentRequest.FromString, UNARY),
    "ReceiveMessage": (spb.ReceiveMessageRequest.FromString, SERVER_STREAMING),
    "AckMessage": (spb.AckMessageRequest.FromString, UNARY),
    "ForwardMessageToDeadLetterQueue": (spb.ForwardMessageToDeadLetterQueueRequest.FromString, UNARY),
    "PullMessage": (spb.PullMessageRequest.FromString, SERVER_STREAMING),
    "UpdateOffset": (spb.UpdateOffsetRequest.FromString, UNARY),
    "GetOffset": (spb.GetOffsetRequest.FromString, UNARY),
    "QueryOffset": (spb.QueryOffsetRequest.FromString, UNARY),
    "EndTransaction": (spb.EndTransactionRequest.FromString, UNARY),
    "Telemetry": (spb.TelemetryCommand.FromString, BIDI_STREAMING),
    "NotifyClientTermination": (spb.NotifyClientTerminationRequest.FromString, UNARY),
    "ChangeInvisibleDuration": (spb.ChangeInvisibleDurationRequest.FromString, UNARY),
}
_PATHS = {_SERVICE + name: (name, decode, kind) for name, (decode, kind) in METHODS.items()}
_RESPONSE_HEADERS = h2.encode_headers([(":status", "200"), ("content-type", "application/grpc")])
_TRAILERS_OK = h2.encode_headers([("grpc-status", "0")])
_REFUSED_STREAM = 7


def _trailers(code: int, message: str, headers_sent: bool) -> bytes:
    fields = [("grpc-status", str(code)), ("grpc-message", h2.percent_encode(message))]
    if not headers_sent:  # (trailers only: the response's headers with them)
        fields = [(":status", "200"), ("content-type", "application/grpc")] + fields
    return h2.encode_headers(fields)


class Call:
    """One RPC as its handler sees it: the request headers (`metadata`: x-mq-client-id,
    authorization ...), the client's address, its deadline."""

    __slots__ = ("sid", "metadata", "peer", "started", "fn", "decode", "kind", "message", "task",
                 "inbox", "headers_sent")

    def __init__(self, sid: int, metadata: dict, peer: str, fn, decode, kind: int):
        self.sid, self.metadata, self.peer = sid, metadata, peer
        self.fn, self.decode, self.kind = fn, decode, kind
        self.started = time.monotonic()
        self.message = self.task = self.inbox = None
        self.headers_sent = False

    def time_remaining(self) -> float | None:
        """Seconds to the client's deadline (its grpc-timeout; None: it gave none)."""
        timeout = self.metadata.get("grpc-timeout")
        if timeout is None:
            return None
        return max(0.0, self.started + h2.grpc_timeout(timeout) - time.monotonic())


class _Connection(asyncio.Protocol):
    """One client connection: H2Connection's events to calls, their answers back."""

    def __init__(self, server: "GrpcServer"):
        self.server = server
        self.h2 = h2.H2Connection(server.max_message)
        self.calls: dict[int, Call] = {}
        self.transport = None
        self.peer = ""
        self.going_away = False
        self._flush_pending = False
        self._loop = asyncio.get_running_loop()

    # --- transport --------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        addr = transport.get_extra_info("peername")
        if isinstance(addr, tuple):
            self.peer = f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"
        self.server.connections.add(self)
        transport.write(self.h2.take_output())  # (the server's preface)

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        self.transport = None
        calls, self.calls = self.calls, {}
        for call in calls.values():
            if call.task is not None:
                call.task.cancel()

    def data_received(self, data: bytes) -> None:
        calls = self.calls
        for kind, sid, value in self.h2.feed(data):
            if kind == h2.EV_MESSAGE:
                call = calls.get(sid)
                if call is None:
                    continue
                if call.inbox is not None:
                    call.inbox.put_nowait(value)
                elif call.message is None:
                    call.message = value
                else:
                    self._abort(call, GRPC_UNIMPLEMENTED, f"a second request message on unary {call.fn.__name__}")
            elif kind == h2.EV_END:
                call = calls.get(sid)
                if call is None:
                    continue
                if call.inbox is not None:
                    call.inbox.put_nowait(None)
                elif call.task is None:
                    self._start(call)
            elif kind == h2.EV_HEADERS:
                self._headers(sid, value)
            elif kind == h2.EV_RESET:
                call = calls.pop(sid, None)
                if call is not None and call.task is not None:
                    call.task.cancel()
            elif kind == h2.EV_REFUSED:
                call = calls.get(sid)
                if call is not None:
                    self._abort(call, *value)
            elif kind == h2.EV_GOAWAY:
                self.going_away = True
            elif kind == h2.EV_ERROR:
                log.info("gRPC connection from %s closed: HTTP/2 error %s: %s", self.peer, sid, value)
                self._flush()
                self.transport.close()
                return
        # what the codec answered itself (SETTINGS and PING acks - a grpc client pings with its
        # data -, WINDOW_UPDATEs) goes out with the calls' answers of this turn: one write, not two
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        """Write what the calls answered once this turn of the loop is over (one write for many)."""
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        out = self.h2.take_output()
        if out and self.transport is not None:
            self.transport.write(out)

    def close(self) -> None:
        """GOAWAY (no error) and close: the broker is stopping."""
        if self.transport is not None:
            self.h2.goaway(0, "the broker is shutting down")
            self._flush()
            self.transport.close()

    # --- calls --------------------------------------------------------------------------------------
    def _headers(self, sid: int, headers: dict) -> None:
        if self.going_away or self.server.closing:
            self.h2.reset(sid, _REFUSED_STREAM)
            return
        path = headers.get(":path", "")
        method = self.server.handlers.get(path)
        call = Call(sid, headers, self.peer, *(method or (None, None, UNARY)))
        self.calls[sid] = call
        if method is None:
            return self._abort(call, GRPC_UNIMPLEMENTED, f"method {path} is not served (rmq serves "
                               f"apache.rocketmq.v2.MessagingService)")
        encoding = headers.get("grpc-encoding")
        if encoding is not None and encoding != "identity":
            return self._abort(call, GRPC_UNIMPLEMENTED, f"grpc-encoding {encoding} is not supported: rmq's gRPC "
                               f"server takes uncompressed messages (identity)")
        timeout = headers.get("grpc-timeout")
        if timeout is not None:  # (checked here, read when an RPC asks: Call.time_remaining)
            try:
                h2.grpc_timeout(timeout)
            except ValueError as e:
                return self._abort(call, GRPC_INTERNAL, str(e))
        if call.kind == BIDI_STREAMING:
            call.inbox = asyncio.Queue()
            call.task = self._loop.create_task(self._stream(call, call.fn(self._requests(call), call)))

    def _start(self, call: Call) -> None:
        """A unary or server-streaming call with its request: run its RPC."""
        message, call.message = call.message, None
        if message is None:
            return self._abort(call, GRPC_INTERNAL, f"{call.fn.__name__} without a request message")
        try:
            request = call.decode(message)
        except (DecodeError, ValueError) as e:
            return self._abort(call, GRPC_INTERNAL, f"cannot decode the request of {call.fn.__name__}: {e}")
        if call.kind == UNARY:
            self._unary(call, call.fn(request, call))
        else:
            call.task = self._loop.create_task(self._stream(call, call.fn(request, call)))

    async def _requests(self, call: Call):
        """A bidirectional call's requests, as they come, until the client half-closes."""
        while True:
            message = await call.inbox.get()
            if message is None:
                return
            yield call.decode(message)

    def _unary(self, call: Call, coro) -> None:
        """Run a unary RPC's coroutine right here until it first waits (a send to an async-flush
        store never does): answered now, without a task; else a task carries it on."""
        try:
            waiting = coro.send(None)
        except StopIteration as e:
            return self._answer(call, e.value)
        except BaseException as e:
            return self._failed(call, e)
        call.task = self._loop.create_task(self._unary_rest(call, coro, waiting))

    async def _unary_rest(self, call: Call, coro, waiting) -> None:
        try:
            response = await Resume(coro, waiting)  # (the remoting side's way: one owner)
        except Exception as e:
            return self._failed(call, e)
        self._answer(call, response)

    def _answer(self, call: Call, response) -> None:
        if self.calls.pop(call.sid, None) is not None:
            payload = response if type(response) is bytes else response.SerializeToString()  # (SendMessage's: encoded)
            self.h2.respond(call.sid, _RESPONSE_HEADERS, payload, _TRAILERS_OK)
            self._schedule_flush()

    def _failed(self, call: Call, e: BaseException) -> None:
        if isinstance(e, GrpcAbort):
            return self._abort(call, e.code, e.message)
        if not isinstance(e, Exception):
            raise e
        log.exception("gRPC %s failed", call.fn.__name__, exc_info=e)
        self._abort(call, GRPC_INTERNAL, f"{call.fn.__name__} failed: {type(e).__name__}: {e}")

    async def _stream(self, call: Call, responses) -> None:
        h = self.h2
        try:
            async for response in responses:
                if call.sid not in self.calls:
                    return
                if not call.headers_sent:
                    call.headers_sent = True
                    h.send_headers(call.sid, _RESPONSE_HEADERS)
                h.send_message(call.sid, response.SerializeToString())
                self._schedule_flush()
        except GrpcAbort as e:
            return self._abort(call, e.code, e.message)
        except Exception as e:
            log.exception("gRPC %s failed", call.fn.__name__)
            return self._abort(call, GRPC_INTERNAL, f"{call.fn.__name__} failed: {type(e).__name__}: {e}")
        finally:
            await responses.aclose()
        if self.calls.pop(call.sid, None) is not None:
            h.end_stream(call.sid, _TRAILERS_OK)
            self._schedule_flush()

    def _abort(self, call: Call, code: int, message: str) -> None:
        """End the call with a status (trailers only when no response headers went yet)."""
        if self.calls.pop(call.sid, None) is None:
            return
        if call.task is not None and call.task is not asyncio.current_task():
            call.task.cancel()
        self.h2.end_stream(call.sid, _trailers(code, message, call.headers_sent))
        self._schedule_flush()


class GrpcServer:
    def __init__(self, ctrl, host: str, port: int):
        self.ctrl, self.host, self.port = ctrl, host, port
        self.service: MessagingService | None = None
        self.max_message = max(_MAX_MESSAGE_BYTES, ctrl.store_config.max_message_size + 1024 * 1024)
        self.connections: set[_Connection] = set()
        self.handlers: dict = {}  # :path -> (RPC, request decoder, kind)
        self.closing = False
        self._server = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self.service = MessagingService(self.ctrl, self.port)
        self.handlers = {path: (getattr(self.service, name), decode, kind)
                         for path, (name, decode, kind) in _PATHS.items()}
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(lambda: _Connection(self), self.host, self.port, reuse_address=True)
        except OSError as e:
            raise ConfigError(f"cannot serve gRPC on {self.host}:{self.port} (grpcServerPort): {e}") from None
        self.port = server.sockets[0].getsockname()[1]
        self.service.grpc_port = self.port
        self._server = server
        log.info("The broker[%s] serves RocketMQ 5's gRPC protocol on %s", self.ctrl.broker_config.broker_name,
                 self.address)

    async def stop(self, grace: float = 1.0) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self.closing = True
        server.close()
        for c in list(self.connections):
            c.close()
        try:
            await asyncio.wait_for(server.wait_closed(), grace)
        except asyncio.TimeoutError:
            pass
