"""The channel machinery over a byte stream, for every stream transport (TCP, Unix sockets, ...):
remoting frames in and out of an asyncio Protocol, with TCP_NODELAY where the socket has it and
bounded writes.  A stream transport (plugins/transport/tcp.py, a Unix-socket one) only connects
and serves: `loop.create_connection(lambda: StreamChannel(max_frame_length), ...)` /
`loop.create_server(listener.make_channel, ...)`; everything above the bytes is here.

Why a Protocol rather than streams: `data_received` splits every frame that arrived in one read
and hands them all to the remoting layer in one go, without a `readexactly` coroutine per frame;
and the commands written meanwhile (the answers of processors that finished at once) are
coalesced into one `transport.write` at the end of that read, so a burst of 64 pipelined requests
costs one receive and one send syscall, not 64 of each.  Writes made outside a read (a client's
request, a late answer) are coalesced per event-loop iteration with one `call_soon`.

Back-pressure: above WRITE_BUFFER_HIGH unsent bytes the transport pauses us; `send_nowait` then
declines (the caller falls back to `await send`, which waits until the buffer is below
WRITE_BUFFER_LOW).  Reading never pauses: two peers that both stopped reading would deadlock.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket

from rmq_core.errors import RemotingCommandError, RemotingError
from rmq_core.remoting.command import (
    ManyMessageTransfer, RemotingCommand, SerializeType, native_decode_frames as _decode_frames,
    native_encode_json_header as _encode_json_header,
)
from rmq_core.remoting.frames import split_frames
from rmq_core.remoting.transport import Channel, Listener, OnClose, OnCommand

_JSON = SerializeType.JSON

log = logging.getLogger("rmq.remoting.stream")

# Above this much unsent data a writer waits for the peer; below it send() never blocks.
WRITE_BUFFER_HIGH = 4 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024
# A part at least this big is written on its own instead of being joined (joining copies it).
_JOIN_LIMIT = 64 * 1024
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024  # buffers per writev


def hand_on(frame, on_command, fail, remote_address: str) -> bool:
    """A frame (without its length prefix) decoded and given to `on_command`; False when it could
    not be: then `fail(error)` closed the connection (an undecodable frame, or a bug in on_command:
    logged, that connection only).  Every channel that takes frames hands them on this way."""
    try:
        command = RemotingCommand.decode(frame)
    except RemotingCommandError as e:
        log.warning("closing %s: undecodable frame: %s", remote_address, e)
        fail(e)
        return False
    try:
        on_command(command)
    except Exception as e:  # a bug in on_command: log it, drop this connection only
        log.exception("closing %s: error while handling a frame", remote_address)
        fail(e)
        return False
    return True


def peer_name(sock_addr) -> str:
    """'host:port' ('[v6]:port') of a socket address; a Unix socket's path as it is."""
    if not sock_addr:
        return "?"
    if isinstance(sock_addr, (str, bytes)):
        return sock_addr.decode() if isinstance(sock_addr, bytes) else sock_addr
    host, port = sock_addr[0], sock_addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class StreamChannel(Channel, asyncio.Protocol):
    """One connection end over a byte stream (a TCP or Unix socket); also the asyncio Protocol of
    its socket."""

    def __init__(self, max_frame_length: int, on_connected=None):
        self._max_frame_length = max_frame_length
        self._on_connected = on_connected  # the listener's accept callback (server side)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._closed = False
        self._on_command: OnCommand | None = None
        self._on_close: OnClose | None = None
        self._close_reason: BaseException | None = None
        self._lost = False  # connection_lost arrived (possibly before start())
        self._reported = False
        self._buffer = b""  # received bytes not yet forming a whole frame
        self._out: list = []  # encoded parts waiting for the next flush
        self._out_big = False  # some part is at least _JOIN_LIMIT bytes
        self._flush_scheduled = False
        self._in_read = False  # inside data_received: the flush happens at its end
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self._fast_lane = None  # a native lane that answers some frames itself (set_fast_lane)
        self._fd = -1  # the socket's descriptor, for a vectored write of big parts (_write_parts)
        self.done = self._loop.create_future()

    # --- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass  # not a TCP socket (never happens for this transport) or already closed
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self._fd = sock.fileno()
        self.local_address = peer_name(transport.get_extra_info("sockname"))
        self.remote_address = peer_name(transport.get_extra_info("peername"))
        if self._on_connected is not None:
            self._on_connected(self)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if self._buffer:
            # A frame spans reads: accumulate in a bytearray (amortised appends, not O(n^2) joins).
            buf = self._buffer
            if type(buf) is not bytearray:
                buf = bytearray(buf)
            buf += data
            data = buf
        if self._on_command is None:  # not started yet: keep everything for start()
            self._buffer = data
            return
        self._deliver_in_read(data)

    def _deliver_in_read(self, data) -> None:
        # answers written while the frames are handled go out in one joint write at the end
        self._in_read = True
        try:
            lane = self._fast_lane
            if lane is not None and not self._write_paused:  # paused: the usual path waits per answer
                self._deliver_through_lane(lane, data)
            else:
                self._deliver_frames(data)
        finally:
            self._in_read = False
            if self._out:
                self._write_out()

    def set_fast_lane(self, lane) -> None:
        """Hand read chunks to `lane.deliver(data, max_frame_length, on_frame, emit)` first: it
        answers the frames it knows (writing their answers through `emit`) and gives every
        other one, in its place in the order, to `on_frame` — the usual decode and on_command."""
        self._fast_lane = lane

    def _deliver_frames(self, data) -> None:
        try:
            if _decode_frames is not None:
                # Commands decoded natively; a frame the native codec declines comes as a
                # memoryview, decoded (or refused with the reason) by the Python codec below.
                frames, consumed = _decode_frames(data, self._max_frame_length)
            else:
                frames, consumed = split_frames(data, self._max_frame_length)
        except RemotingCommandError as e:
            log.warning("closing %s: %s", self.remote_address, e)
            self._fail(e)
            return
        if consumed == 0:
            self._buffer = data  # a bytearray keeps growing in place
        else:
            self._buffer = data[consumed:] if consumed < len(data) else b""
        on_command = self._on_command
        for command in frames:
            if type(command) is not RemotingCommand:
                try:
                    command = RemotingCommand.decode(command)
                except RemotingCommandError as e:
                    log.warning("closing %s: undecodable frame: %s", self.remote_address, e)
                    self._fail(e)
                    return
            try:
                on_command(command)
            except Exception as e:  # a bug in on_command: log it, drop this connection only
                log.exception("closing %s: error while handling a frame", self.remote_address)
                self._fail(e)
                return
            if self._closed and not self._lost:  # closed by us meanwhile (a handler, a bad frame)
                return

    def _deliver_through_lane(self, lane, data) -> None:
        try:
            consumed, error = lane.deliver(data, self._max_frame_length, self._on_frame, self._emit)
        except Exception as e:  # a bug in the lane: log it, drop this connection only
            log.exception("closing %s: error while handling a frame", self.remote_address)
            self._fail(e)
            return
        if self._closed:
            return
        if error is not None:  # the frames before the bad length were handled
            log.warning("closing %s: %s", self.remote_address, error)
            self._fail(RemotingCommandError(error))
            return
        if consumed == 0:
            self._buffer = data  # a bytearray keeps growing in place
        else:
            self._buffer = data[consumed:] if consumed < len(data) else b""

    def _on_frame(self, frame) -> bool:
        """One frame the lane did not answer: decode it and pass it on; False once closed."""
        if not hand_on(frame, self._on_command, self._fail, self.remote_address):
            return False
        return not (self._closed and not self._lost)  # (bytes of a peer gone before start() still count)

    def write_frames(self, frames: bytes) -> None:
        """Whole encoded frames (a lane's late answers): queued and written as _queue does."""
        if self._closed:
            return
        self._out.append(frames)
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
            self._write_out()

    def _emit(self, frames: bytes) -> None:
        """Answers written by the lane: they join the write at the end of the read."""
        if not self._closed:
            self._out.append(frames)

    def eof_received(self):
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._lost = True
        self._out = []
        reason = self._close_reason if self._close_reason is not None else exc
        self._wake_drain_waiters(reason)
        if self._on_close is not None:
            self._report_close(reason)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain_waiters(None)

    # --- Channel -----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def start(self, on_command: OnCommand, on_close: OnClose) -> None:
        self._on_command, self._on_close = on_command, on_close
        if self._buffer:  # bytes that arrived before start(), even if the peer has gone since
            data, self._buffer = self._buffer, b""
            self._deliver_in_read(data)
        if self._lost:
            self._report_close(self._close_reason)

    def send_nowait(self, command: RemotingCommand) -> bool:
        if self._closed:
            raise self._closed_error()
        if self._write_paused:
            return False
        if self._in_read and command.body is None and command.serialize_type is _JSON \
                and _encode_json_header is not None:
            # The usual answer (a header, no body, inside the read that brought its request):
            # its frame joins the write at the end of the read — _queue's work in one step.
            header = _encode_json_header(command, 0)
            if header is not None:
                self._out.append(header)
                return True
        self._queue(command)
        return True

    async def send(self, command: RemotingCommand) -> None:
        if self._closed:
            raise self._closed_error()
        while self._write_paused:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter  # raises RemotingError when the connection goes meanwhile
            if self._closed:
                raise self._closed_error()
        self._queue(command)

    def _queue(self, command: RemotingCommand) -> None:
        body = command.body
        out = self._out
        out.append(command.encode_header(len(body) if body is not None else 0))
        if body:
            if type(body) is ManyMessageTransfer:
                # views of the mapped commit log: written as they are (a viewed mapping stays)
                out += body.buffers
            else:
                if type(body) is not bytes:
                    # The write happens later in this loop iteration: snapshot a bytearray (the caller
                    # may reuse it) or a memoryview (its mapping may go) now, as an immediate write would.
                    body = bytes(body)
                out.append(body)
            if len(body) >= _JOIN_LIMIT:
                self._out_big = True
        if not self._in_read and not self._flush_scheduled:
            # The first command of a loop iteration goes out at once (no added latency); the ones
            # that follow in the same iteration wait for one joint write at its end.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
            self._write_out()

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_out()

    def _write_out(self) -> None:
        out = self._out
        if not out or self._transport is None:
            return
        self._out = []
        big, self._out_big = self._out_big, False
        transport = self._transport
        try:
            if len(out) == 1:
                transport.write(out[0])
            elif not big:
                transport.write(b"".join(out))
            else:
                self._write_parts(transport, out)
        except (RuntimeError, OSError) as e:  # the transport is closing under us
            log.debug("cannot write to %s: %s", self.remote_address, e)

    def _write_parts(self, transport, out: list) -> None:
        """Parts with a big one among them (a pull answer's views of the mapped log): one writev
        of them all while the transport has nothing queued (what its write does with one buffer,
        and the order stays), the rest through transport.write, which copies what the socket did
        not take - so no view outlives this call."""
        sent = 0
        if self._fd >= 0 and transport.get_write_buffer_size() == 0 and not transport.is_closing():
            try:
                sent = os.writev(self._fd, out[:_IOV_MAX])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as e:  # the connection failed: transport.write below reports it
                log.debug("writev to %s: %s", self.remote_address, e)
        small = []
        for part in out:
            n = len(part)
            if sent >= n:
                sent -= n
                continue
            if sent:
                part, sent = memoryview(part)[sent:], 0
            if len(part) >= _JOIN_LIMIT:  # a big part on its own; the small ones joined
                if small:
                    transport.write(b"".join(small))
                    small = []
                transport.write(part)
            else:
                small.append(part)
        if small:
            transport.write(b"".join(small))

    def _wake_drain_waiters(self, reason: BaseException | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                if self._closed:
                    waiter.set_exception(RemotingError(
                        f"cannot write to {self.remote_address}: connection closed"
                        + (f" ({reason})" if reason is not None else "")))
                else:
                    waiter.set_result(None)

    def _fail(self, reason: BaseException) -> None:
        self._close_reason = reason
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        if self._out:
            self._write_out()  # what was sent before close() still goes out
        self._closed = True
        if self._transport is not None:
            self._transport.close()
        self._wake_drain_waiters(self._close_reason)
        # Report at once: a peer that stops reading would hold connection_lost back indefinitely.
        if self._on_close is not None:
            self._loop.call_soon(self._report_close, self._close_reason)

    def _report_close(self, reason: BaseException | None) -> None:
        if self._reported:
            return
        self._reported = True
        if not self.done.done():
            self.done.set_result(None)
        if self._on_close is not None:
            try:
                self._on_close(reason)
            except Exception:
                log.exception("on_close callback failed for %s", self.remote_address)


class StreamListener(Listener):
    """The connections an asyncio server accepted (`_server`, set by the transport's serve)."""

    def __init__(self, max_frame_length: int, on_channel):
        self._max_frame_length = max_frame_length
        self._on_channel = on_channel
        self.server: asyncio.base_events.Server | None = None  # set by the transport that serves
        self._channels: set[StreamChannel] = set()

    def make_channel(self) -> StreamChannel:
        """The protocol factory of its asyncio server: a channel reported to on_channel once connected."""
        return StreamChannel(self._max_frame_length, self._accept)

    def _accept(self, channel: StreamChannel) -> None:
        self._channels.add(channel)
        channel.done.add_done_callback(lambda _f: self._channels.discard(channel))
        try:
            self._on_channel(channel)
            if channel._on_command is None:
                raise RemotingError("on_channel did not start the channel")
        except Exception:
            log.exception("error accepting a connection from %s", channel.remote_address)
            channel.close()
            if channel._on_close is None:  # never started: nobody else resolves `done`
                channel._report_close(None)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for channel in list(self._channels):
            channel.close()
        for channel in list(self._channels):
            await channel.done
        if self.server is not None:
            await self.server.wait_closed()


