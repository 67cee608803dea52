"""The transport interface the remoting layer runs on (implemented by `rmq_plugins.transport`).

A transport only connects, serves and moves commands (or their bytes) between two endpoints; the
remoting layer above it owns everything else, once for every transport: opaque matching, the
pending table and its timeout sweep, completion, the request steps (steps.py), processors and
the idle exchange (ChannelContext, context.py).  A transport over a byte stream (TCP, a Unix
socket...) does not even frame: `rmq_core.remoting.stream.StreamChannel` is the asyncio Protocol
that splits frames, coalesces writes, applies back-pressure and hands read chunks to the broker's
native lane; the transport's connect is `loop.create_connection(lambda: StreamChannel(max), ...)`
and its serve `loop.create_server(StreamListener(max, on_channel).make_channel, ...)` - see
plugins/transport/tcp.py, and tests/remoting/unix_transport.py for a third one in ~40 lines.

    class Transport:
        scheme: str                                        # "tcp", "inproc", ...
        async def connect(address, *, max_frame_length, timeout) -> Channel
        async def serve(address, on_channel, *, max_frame_length, backlog) -> Listener

    Channel            one connection end, bound to the event loop that created it
        local_address, remote_address: str
        closed: bool
        start(on_command, on_close)   begin delivering: on_command(cmd) for every command received,
                                      then on_close(exc_or_None) exactly once when the connection ends
        async send(cmd)               write one command (waits while the write buffer is full);
                                      raises RemotingError when the channel is closed
        send_nowait(cmd) -> bool      optional fast path: write without waiting and return True,
                                      or return False (the buffer is full, or the transport has no
                                      fast path) and write nothing: the caller then awaits send()
        close()                       idempotent; on_close follows

    Listener
        address: str                  the bound address ("127.0.0.1:40211", "inproc://ns")
        async close()                 stop accepting and close every channel it accepted

    optional, for the routes that run without an event loop (the producer's pipelined sends, the
    blocking pool); a transport with neither is used through connect/serve only:
        open_socket(address, *, timeout) -> socket.socket
                                      a byte-stream transport (tcp, unix): a connected blocking
                                      socket; remoting runs its own thread-driven connections on it
                                      (pipelined.PipelinedChannel, blocking.BlockingChannel)
        connect_pipelined(address, *, read_frames, from_command, intercept, connect_timeout, name)
        connect_blocking(address, *, max_frame_length, timeout)
                                      a transport that moves no bytes (inproc): those connections
                                      itself.  The pipelined one is a subclass of
                                      pipelined.HandedOverChannel giving only
                                      `_hand_over(frame) -> None | why not` and
                                      `_hand_over_close()`: the step, the pending table, the sweep,
                                      a sync send's exchange, failure and close are remoting's;
                                      the blocking one likewise of blocking.HandedOverBlockingChannel
                                      (with an intercept, send, exchange and send_oneway take
                                      `request=` a send not yet written, frame None:
                                      steps.FrameStep.before_request; or True, the frame
                                      written with the steps applied: not intercepted)

`serve` calls `on_channel(channel)` (in the listener's loop) for every accepted connection; the
callee must call `channel.start(...)` before returning.  A frame the transport cannot decode, or one
above `max_frame_length`, is logged and closes that connection only.
"""
from __future__ import annotations

import abc
from typing import Callable

from rmq_core.errors import IllegalArgumentError, RemotingConnectError, RemotingError
from rmq_core.remoting.command import RemotingCommand

from rmq_core.config import DEFAULT_SERVER_SOCKET_BACKLOG

DEFAULT_SCHEME = "tcp"
DEFAULT_MAX_FRAME_LENGTH = 16 * 1024 * 1024

OnCommand = Callable[[RemotingCommand], None]
OnClose = Callable[[BaseException | None], None]


def split_address(address: str) -> tuple[str, str]:
    """'tcp://h:p' -> ('tcp', 'h:p'); 'h:p' -> ('tcp', 'h:p'); 'inproc://ns' -> ('inproc', 'ns')."""
    if not isinstance(address, str) or not address.strip():
        raise IllegalArgumentError(f"bad address {address!r}: expected host:port or scheme://...")
    address = address.strip()
    scheme, sep, rest = address.partition("://")
    if not sep:
        return DEFAULT_SCHEME, address
    if not scheme or not rest:
        raise IllegalArgumentError(f"bad address {address!r}: expected scheme://location")
    return scheme.lower(), rest


def resolve_transport(address: str):
    """(transport, location) for an address, asking the plugin manager for its scheme."""
    from rmq_core.plugins import get_transport  # late: the plugin manager imports hookspecs only

    scheme, rest = split_address(address)
    return get_transport(scheme), rest


def open_socket(address: str, *, timeout: float):
    """A connected blocking socket to `address` from its transport's open_socket; RemotingConnectError
    names the address when the connect fails or the transport moves no byte stream."""
    transport, location = resolve_transport(address)
    opener = getattr(transport, "open_socket", None)
    if opener is None:
        raise RemotingConnectError(f"cannot open a socket to {address}: transport "
                                   f"{getattr(transport, 'scheme', transport)!r} moves no byte stream")
    try:
        return opener(location, timeout=timeout)
    except OSError as e:
        raise RemotingConnectError.connecting(address, e) from None


class Channel(abc.ABC):
    local_address: str = ""
    remote_address: str = ""

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...

    @abc.abstractmethod
    def start(self, on_command: OnCommand, on_close: OnClose) -> None: ...

    @abc.abstractmethod
    async def send(self, command: RemotingCommand) -> None: ...

    def send_nowait(self, command: RemotingCommand) -> bool:
        """Write `command` at once if that needs no waiting (True); False: nothing written, await send()."""
        return False

    @abc.abstractmethod
    def close(self) -> None: ...

    def _closed_error(self) -> RemotingError:
        return RemotingError(f"connection {self.local_address} -> {self.remote_address} is closed")


class Listener(abc.ABC):
    address: str = ""

    @abc.abstractmethod
    async def close(self) -> None: ...


def with_backlog(server_class: type, backlog: int = DEFAULT_SERVER_SOCKET_BACKLOG) -> type:
    """A socketserver server class (http.server, wsgiref) that listens with `backlog`
    (serverSocketBacklog) instead of socketserver's 5."""
    return type(server_class.__name__, (server_class,), {"request_queue_size": int(backlog)})
