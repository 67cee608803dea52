"""TCP transport: connects and serves; RocketMQ remoting frames travel over the socket as
rmq_core.remoting.stream's StreamChannel carries them (framing, coalesced writes, back-pressure,
the broker's native lane - the channel machinery every stream transport shares).  TCP_NODELAY is
set on every connection (StreamChannel does it where the socket has the option)."""
from __future__ import annotations

import asyncio
import socket

from rmq_core.errors import RemotingConnectError, RemotingError
from rmq_core.message import parse_address
from rmq_core.remoting.stream import StreamChannel, StreamListener, peer_name
from rmq_core.remoting.transport import DEFAULT_SERVER_SOCKET_BACKLOG

TcpChannel = StreamChannel  # (a TCP connection's end is a stream channel)


class TcpTransport:
    scheme = "tcp"

    async def connect(self, address: str, *, max_frame_length: int, timeout: float) -> StreamChannel:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        try:
            _, channel = await asyncio.wait_for(
                loop.create_connection(lambda: StreamChannel(max_frame_length), host, port), timeout)
        except asyncio.TimeoutError:
            raise RemotingConnectError(f"connect to {address} timed out after {timeout:g}s") from None
        except OSError as e:
            raise RemotingConnectError.connecting(address, e) from None
        return channel

    def open_socket(self, address: str, *, timeout: float) -> socket.socket:
        """A connected blocking socket (remoting's thread-driven connections run on it)."""
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise RemotingConnectError(f"bad address {address!r}: expected host:port")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    async def serve(self, address: str, on_channel, *, max_frame_length: int,
                    backlog: int = DEFAULT_SERVER_SOCKET_BACKLOG) -> StreamListener:
        host, port = parse_address(address)
        listener = StreamListener(max_frame_length, on_channel)
        loop = asyncio.get_running_loop()
        try:
            listener.server = await loop.create_server(listener.make_channel, host, port, reuse_address=True,
                                                       backlog=backlog)
        except OSError as e:
            raise RemotingError(f"cannot listen on {address}: {e.strerror or e}") from None
        listener.address = peer_name(listener.server.sockets[0].getsockname())
        return listener
