"""A test-only transport over Unix domain sockets, `unix:///path/to/socket`: proof that a transport
only connects and serves - the channel machinery (framing, writes, back-pressure) is
rmq_core.remoting.stream's, the rest (pending requests, timeouts, steps) the remoting layer's.
Registered through the rmq_transports hook by the tests that use it."""
from __future__ import annotations

import asyncio
import os
import socket

from rmq_core.errors import RemotingConnectError, RemotingError
from rmq_core.plugins import hookimpl
from rmq_core.remoting.stream import StreamChannel, StreamListener


class UnixTransport:
    scheme = "unix"

    async def connect(self, address: str, *, max_frame_length: int, timeout: float) -> StreamChannel:
        loop = asyncio.get_running_loop()
        try:
            _, channel = await asyncio.wait_for(
                loop.create_unix_connection(lambda: StreamChannel(max_frame_length), address), timeout)
        except asyncio.TimeoutError:
            raise RemotingConnectError(f"connect to unix://{address} timed out after {timeout:g}s") from None
        except OSError as e:
            raise RemotingConnectError(f"connect to unix://{address} failed: {e.strerror or e}") from None
        channel.remote_address = f"unix://{address}"
        return channel

    def open_socket(self, address: str, *, timeout: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock

    async def serve(self, address: str, on_channel, *, max_frame_length: int, backlog: int = 100) -> StreamListener:
        listener = StreamListener(max_frame_length, on_channel)
        try:
            listener.server = await asyncio.get_running_loop().create_unix_server(
                listener.make_channel, address, backlog=backlog)
        except OSError as e:
            raise RemotingError(f"cannot listen on unix://{address}: {e.strerror or e}") from None
        listener.address = f"unix://{os.path.abspath(address)}"
        return listener


class UnixTransportPlugin:
    @hookimpl
    def rmq_transports(self):
        return {"unix": UnixTransport()}
