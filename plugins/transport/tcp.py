"""TCP transport: RocketMQ remoting frames over asyncio streams (TCP_NODELAY, bounded write buffer)."""
from __future__ import annotations

import asyncio
import logging
import socket
import struct

from rmq_core.errors import RemotingCommandError, RemotingConnectError, RemotingError
from rmq_core.message import parse_address
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.transport import Channel, Listener, OnClose, OnCommand

log = logging.getLogger("rmq.remoting.tcp")

_LENGTH = struct.Struct(">i")
READ_BUFFER_LIMIT = 1024 * 1024
# Above this much unsent data a writer waits for the peer; below it send() never blocks.
WRITE_BUFFER_HIGH = 4 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024


def _peer(sock_addr) -> str:
    if not sock_addr:
        return "?"
    host, port = sock_addr[0], sock_addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class TcpChannel(Channel):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_length: int):
        self._reader, self._writer = reader, writer
        self._max_frame_length = max_frame_length
        self._closed = False
        self._read_task: asyncio.Task | None = None
        self._on_close: OnClose | None = None
        self._drain_lock = asyncio.Lock()
        self._close_reason: BaseException | None = None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass  # not a TCP socket (never happens for this transport) or already closed
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self.local_address = _peer(writer.get_extra_info("sockname"))
        self.remote_address = _peer(writer.get_extra_info("peername"))
        self.done = asyncio.get_running_loop().create_future()

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self, on_command: OnCommand, on_close: OnClose) -> None:
        self._on_close = on_close
        self._read_task = asyncio.get_running_loop().create_task(
            self._read_loop(on_command), name=f"rmq-tcp-read {self.remote_address}")

    async def _read_loop(self, on_command: OnCommand) -> None:
        reader, max_len = self._reader, self._max_frame_length
        reason: BaseException | None = None
        try:
            while True:
                (length,) = _LENGTH.unpack(await reader.readexactly(4))
                if length < 4 or length > max_len:
                    log.warning("closing %s: frame length %d outside 4..%d", self.remote_address, length, max_len)
                    reason = RemotingCommandError(f"frame length {length} outside 4..{max_len}")
                    break
                frame = await reader.readexactly(length)
                try:
                    command = RemotingCommand.decode(frame)
                except RemotingCommandError as e:
                    log.warning("closing %s: undecodable frame: %s", self.remote_address, e)
                    reason = e
                    break
                on_command(command)
        except asyncio.IncompleteReadError:
            pass  # the peer closed the connection (possibly mid-frame)
        except (ConnectionError, OSError) as e:
            reason = e
        except asyncio.CancelledError:
            pass
        except Exception as e:  # a bug in on_command: log it, drop this connection only
            log.exception("closing %s: error while handling a frame", self.remote_address)
            reason = e
        finally:
            self._finish(reason)

    def _finish(self, reason: BaseException | None) -> None:
        if not self._closed:
            self._closed = True
            self._writer.close()
        if not self.done.done():
            self.done.set_result(None)
            if self._on_close is not None:
                try:
                    self._on_close(reason)
                except Exception:
                    log.exception("on_close callback failed for %s", self.remote_address)

    async def send(self, command: RemotingCommand) -> None:
        if self._closed:
            raise self._closed_error()
        body = command.body
        header = command.encode_header(len(body) if body is not None else 0)
        transport = self._writer.transport
        try:
            transport.write(header)
            if body:
                transport.write(body)
        except (RuntimeError, OSError) as e:
            raise RemotingError(f"cannot write to {self.remote_address}: {e}") from None
        if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
            async with self._drain_lock:  # one waiter drains; the others queue behind it
                try:
                    await self._writer.drain()
                except (ConnectionError, OSError) as e:
                    raise RemotingError(f"cannot write to {self.remote_address}: {e}") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        if self._read_task is not None and not self._read_task.done():
            self._read_task.cancel()
        elif self._read_task is None:
            self._finish(None)


class TcpListener(Listener):
    def __init__(self, max_frame_length: int, on_channel):
        self._max_frame_length = max_frame_length
        self._on_channel = on_channel
        self._server: asyncio.base_events.Server | None = None
        self._channels: set[TcpChannel] = set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = TcpChannel(reader, writer, self._max_frame_length)
        self._channels.add(channel)
        try:
            self._on_channel(channel)
            if channel._read_task is None:
                raise RemotingError("on_channel did not start the channel")
            await channel.done
        except Exception:
            log.exception("error accepting a connection from %s", channel.remote_address)
            channel.close()
        finally:
            self._channels.discard(channel)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for channel in list(self._channels):
            channel.close()
        for channel in list(self._channels):
            await channel.done
        if self._server is not None:
            await self._server.wait_closed()


class TcpTransport:
    scheme = "tcp"

    async def connect(self, address: str, *, max_frame_length: int, timeout: float) -> TcpChannel:
        host, port = parse_address(address)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=READ_BUFFER_LIMIT), timeout)
        except asyncio.TimeoutError:
            raise RemotingConnectError(f"connect to {address} timed out after {timeout:g}s") from None
        except OSError as e:
            raise RemotingConnectError(f"connect to {address} failed: {e.strerror or e}") from None
        return TcpChannel(reader, writer, max_frame_length)

    async def serve(self, address: str, on_channel, *, max_frame_length: int) -> TcpListener:
        host, port = parse_address(address)
        listener = TcpListener(max_frame_length, on_channel)
        try:
            listener._server = await asyncio.start_server(
                listener._accept, host, port, limit=READ_BUFFER_LIMIT, reuse_address=True)
        except OSError as e:
            raise RemotingError(f"cannot listen on {address}: {e.strerror or e}") from None
        sockname = listener._server.sockets[0].getsockname()
        listener.address = _peer(sockname)
        return listener
