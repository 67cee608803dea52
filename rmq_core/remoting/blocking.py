"""Blocking request/response connections for a caller's own thread (the admin client's calls, the
Spark source's pulls; the producer sends on its pipelined connections, rmq_core.remoting.pipelined).

A BlockingChannel is a plain TCP socket that one thread at a time uses for one exchange: write
the request, read frames until its response, return.  No other thread is involved.

BlockingChannelPool keeps idle channels per address and lends one per call, so concurrent
callers each get their own connection (up to `max_per_address`; beyond that the call declines).
The broker sees ordinary client connections.  Requests the broker initiates (transaction checks,
consumer-id changes) never arrive here: the broker sends those on the connection a client
heartbeats on, which is the event loop's.
"""
from __future__ import annotations

import abc
import logging
import socket
import struct
import threading
import time
from typing import Any, Callable

from rmq_core._native.socket_io import exchange
from rmq_core.errors import RemotingCommandError, RemotingConnectError, RemotingTimeoutError, os_error_text
from rmq_core.remoting.codes import ResponseCode, code_name
from rmq_core.remoting.frames import split_frames
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand
from rmq_core.remoting.steps import CLIENT, RequestSteps
from rmq_core.remoting.transport import DEFAULT_MAX_FRAME_LENGTH, open_socket, resolve_transport

log = logging.getLogger("rmq.remoting")

_LENGTH = struct.Struct(">i")
_TIMEVAL = struct.Struct("@ll")  # struct timeval
_READ_CHUNK = 64 * 1024


def set_kernel_timeouts(sock: socket.socket, seconds: float, *, send: bool = True) -> None:
    """The timeouts the kernel keeps for a blocking socket's receives (SO_RCVTIMEO) and, with
    send, its sends (SO_SNDTIMEO): an expired one ends the call with EAGAIN.  One system call per
    send or receive; a Python socket timeout polls before each call instead: twice the calls."""
    seconds = max(seconds, 0.001)  # (0 would mean "never")
    tv = _TIMEVAL.pack(int(seconds), int((seconds % 1) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    if send:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def refusal(command: RemotingCommand) -> bytes | None:
    """The encoded REQUEST_CODE_NOT_SUPPORTED answer to a request that arrived on a connection
    serving none (None for a oneway request, which gets no answer)."""
    if command.is_oneway:
        return None
    response = command.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                      f"request code {command.code} not served on this connection")
    response.opaque = command.opaque
    response.flag |= RESPONSE_FLAG
    return response.encode()


class BlockingChannel:
    """One connection of a byte-stream transport (transport.open_socket) used by one thread at a time; any failure closes it for good."""

    def __init__(self, addr: str, *, connect_timeout: float = 3.0,
                 max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH):
        self.addr = addr
        self.max_frame_length = max_frame_length
        self._sock = open_socket(addr, timeout=connect_timeout)  # (any byte-stream transport's)
        # a blocking socket whose timeouts the kernel keeps (set_kernel_timeouts)
        self._sock.settimeout(None)
        self._timeout: float | None = None
        self._set_timeout(connect_timeout)
        self._buf = bytearray()  # bytes read past the last frame handed out
        self._chunk = memoryview(bytearray(_READ_CHUNK))  # each receive lands here (no bytes object per call)
        self.closed = False

    def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Write `request`, return the response carrying its opaque; raises RemotingConnectError
        (the channel broke) or RemotingTimeoutError (no answer within `timeout` seconds)."""
        request.flag &= ~RESPONSE_FLAG
        body = request.body
        frame = request.encode_header(len(body)) + bytes(body) if body else request.encode_header(0)
        return self.invoke_frame(frame, request.opaque, timeout, RemotingCommand.decode, request.code)

    def invoke_frame(self, frame: bytes, opaque: int, timeout: float, read: Callable[[bytes], Any],
                     code: int = 0) -> Any:
        """Write an encoded request `frame` (length prefix included) whose opaque is `opaque`, and
        return read(response frame without its length prefix) for the response carrying it.

        `read` gives an object with `flag` and `opaque` (a RemotingCommand, or e.g. a send
        response read natively); a request from the peer must come back as a RemotingCommand, which
        is refused.  Errors as invoke's; `code` names the request in them."""
        if self.closed:
            raise RemotingConnectError(f"connection to {self.addr} is closed")
        deadline = time.monotonic() + timeout
        try:
            if timeout != self._timeout:  # (most calls share the producer's timeout)
                self._set_timeout(timeout)
            if self._buf:  # (bytes past an earlier frame: the general way)
                self._sock.sendall(frame)
                item = read(self._read_frame(deadline, code))
            else:
                # the usual case: write and receive with the GIL released once (one hand-off of
                # it, not two), the answer whole in that one receive
                chunk = self._chunk
                # (the descriptor read now, as the socket's own calls do: -1 once closed, never stale)
                n = exchange(self._sock.fileno(), frame, chunk, timeout)
                if n < 0:
                    raise BlockingIOError("no answer in time")
                if n > 4 and _LENGTH.unpack_from(chunk, 0)[0] == n - 4 and n - 4 <= self.max_frame_length:
                    item = read(chunk[4:n])  # (in place: the caller is done with it before the next receive)
                else:
                    if not n:
                        raise OSError(f"connection closed by {self.addr}")
                    self._buf += chunk[:n]
                    item = read(self._read_frame(deadline, code))
            while True:
                if item.flag & RESPONSE_FLAG:
                    if item.opaque == opaque:
                        return item
                    # cannot happen on a channel that is closed after every failure; be safe
                    log.debug("blocking channel to %s: dropping response opaque=%d", self.addr, item.opaque)
                else:
                    self._refuse(item)
                item = read(self._read_frame(deadline, code))
        except (socket.timeout, BlockingIOError):  # (BlockingIOError: SO_RCVTIMEO / SO_SNDTIMEO expired)
            self.close()
            raise RemotingTimeoutError(
                f"no response to {code_name(code)} (opaque {opaque}) from {self.addr} "
                f"within {timeout:g}s") from None
        except RemotingTimeoutError:
            self.close()
            raise
        except RemotingCommandError as e:
            self.close()
            raise RemotingConnectError(f"bad frame from {self.addr}: {e}") from None
        except OSError as e:
            self.close()
            raise RemotingConnectError(f"{code_name(code)} to {self.addr} failed: {os_error_text(e)}") from None

    def _set_timeout(self, timeout: float) -> None:
        # set per call only when it changes: most calls share the producer's timeout
        if timeout != self._timeout:
            set_kernel_timeouts(self._sock, timeout)
            self._timeout = timeout

    def _read_frame(self, deadline: float, code: int):
        """The next whole frame, without its length prefix (valid until the next call)."""
        buf = self._buf
        while True:
            if len(buf) >= 4:
                (length,) = _LENGTH.unpack_from(buf, 0)
                if length <= 0 or length > self.max_frame_length:
                    raise RemotingCommandError(
                        f"frame length {length} outside 1..{self.max_frame_length}")
                if len(buf) >= 4 + length:
                    frame = bytes(buf[4:4 + length])
                    del buf[:4 + length]
                    return frame
            if buf:  # a partial frame: the clock matters only past the first read
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RemotingTimeoutError(
                        f"no complete response to {code_name(code)} from {self.addr} in time")
                self._set_timeout(remaining)
            chunk = self._chunk
            n = self._sock.recv_into(chunk)
            if not n:
                raise OSError(f"connection closed by {self.addr}")
            if not buf and n >= 4:
                (length,) = _LENGTH.unpack_from(chunk, 0)
                if n == 4 + length and 0 < length <= self.max_frame_length:
                    # the usual case: exactly one frame, read in place (the caller is done with
                    # it before the next receive: a view, not a copy)
                    return chunk[4:n]
            buf += chunk[:n]

    def _refuse(self, command: RemotingCommand) -> None:
        """A request from the peer on a connection that serves none: say so (unless oneway)."""
        log.warning("blocking channel to %s: unexpected %s request from the peer", self.addr,
                    code_name(command.code))
        response = refusal(command)
        if response is not None:
            self._sock.sendall(response)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._sock.close()
            except OSError:
                pass


def _take_all(channels: list) -> list:
    """Empty `channels` one atomic pop at a time (a lock-free give-back may append meanwhile:
    whatever it appended is either taken here or still there for it to take back)."""
    taken = []
    while True:
        try:
            taken.append(channels.pop())
        except IndexError:
            return taken


class HandedOverBlockingChannel(abc.ABC):
    """BlockingChannel's interface over a transport that hands requests to the other end instead of
    writing bytes (the in-proc one; its connect_blocking): a request - a command (invoke) or an
    encoded frame (invoke_frame) - goes out through `_hand_over(item)` (None once handed over, else
    why it could not be: the channel closes), and its answer, handed back on the other end's thread
    (`_deliver`: a command; `_deliver_frames`: the bytes a native lane wrote), wakes the caller.
    A transport's subclass calls `_open` and gives `_hand_over` and `_hand_over_close()` (tell the
    other end this one closed)."""

    _loop = None  # (answers are taken as they are handed over: in the other end's thread)

    def _open(self, address: str, local_address: str, remote_address: str, max_frame_length: int) -> None:
        self.addr, self.local_address, self.remote_address = address, local_address, remote_address
        self.max_frame_length = max_frame_length
        self._waiting: int | None = None  # the opaque of the request in flight
        self._response = None
        self._ready = threading.Lock()
        self._ready.acquire()
        self.closed = False

    @abc.abstractmethod
    def _hand_over(self, item) -> str | None:
        """Give the request to the other end; None once given, else why it could not be."""

    @abc.abstractmethod
    def _hand_over_close(self) -> None:
        """Tell the other end this one closed."""

    def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        if self.closed:
            raise RemotingConnectError(f"connection to {self.addr} is closed")
        request.flag &= ~RESPONSE_FLAG
        return self._exchange(request.copy(), request.opaque, request.code, timeout)

    def invoke_frame(self, frame: bytes, opaque: int, timeout: float, read: Callable[[bytes], Any],
                     code: int = 0) -> Any:
        """BlockingChannel.invoke_frame: hand the encoded request `frame` (length prefix included,
        opaque `opaque`) over and return read(response frame without its length prefix).  The
        answer is the bytes the other end's lane wrote, or its general path's RemotingCommand,
        encoded here in the caller's thread.  Errors as invoke's."""
        if self.closed:
            raise RemotingConnectError(f"connection to {self.addr} is closed")
        if type(frame) is not bytes:  # the other end reads it later: a buffer the caller may reuse is copied
            frame = bytes(frame)
        response = self._exchange(frame, opaque, code, timeout)
        if type(response) is not bytes:
            response = response.encode()
        try:
            item = self._read_answer(response, opaque, read)
        except RemotingCommandError as e:
            self.close()
            raise RemotingConnectError(f"bad frame from {self.addr}: {e}") from None
        if item is None:
            self.close()
            raise RemotingConnectError(
                f"connection to {self.addr}: no response carrying opaque {opaque} among the frames answered")
        return item

    def _exchange(self, item, opaque: int, code: int, timeout: float):
        """Hand `item` (a request) over and wait for the answer to `opaque`: the answer (a
        RemotingCommand, or the bytes the other end's lane wrote)."""
        self._waiting = opaque
        why = self._hand_over(item)
        if why is not None:
            self.close()
            raise RemotingConnectError(f"connection to {self.addr} is closed: {why}")
        if not self._ready.acquire(timeout=timeout):
            self._waiting = None
            self.close()
            raise RemotingTimeoutError(
                f"no response to {code_name(code)} (opaque {opaque}) from {self.addr} within {timeout:g}s")
        response, self._response = self._response, None
        if response is None:  # woken by a close
            raise RemotingConnectError(
                f"connection to {self.addr} closed before the response (opaque {opaque}) arrived")
        return response

    def _read_answer(self, data: bytes, opaque: int, read):
        """read() of the response in `data` (whole frames) that carries `opaque`, or None."""
        frames, consumed = split_frames(data, self.max_frame_length)
        if consumed != len(data):
            raise RemotingCommandError(f"a frame at byte {consumed} runs past the {len(data)} bytes answered")
        for frame in frames:
            item = read(frame)
            if item.flag & RESPONSE_FLAG and item.opaque == opaque:
                return item
            log.debug("blocking channel %s: dropping %r", self.local_address, item)
        return None

    # the other end's calls, in its thread
    def _deliver_frames(self, frames: bytes) -> None:
        """A lane's answer: read (and its opaque checked) in the caller's thread."""
        if self._waiting is not None and not self.closed:
            self._waiting = None
            self._response = frames
            self._wake()
        else:  # a late answer is dropped
            log.debug("blocking channel %s: dropping %d answer bytes", self.local_address, len(frames))

    def _deliver(self, command: RemotingCommand) -> None:
        if command.flag & RESPONSE_FLAG and command.opaque == self._waiting and not self.closed:
            self._waiting = None
            self._response = command
            self._wake()
        else:  # no requests are served on this end; a late answer is dropped
            log.debug("blocking channel %s: dropping %r", self.local_address, command)

    def _peer_closed(self) -> None:
        self._close(tell_peer=False)

    def close(self) -> None:
        self._close(tell_peer=True)

    def _close(self, tell_peer: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if tell_peer:
            self._hand_over_close()
        if self._waiting is not None:
            self._waiting = None
            self._wake()

    def _wake(self) -> None:
        try:
            self._ready.release()
        except RuntimeError:  # already woken (an answer and a close crossing)
            pass


class BlockingChannelPool:
    """Idle blocking channels per address, lent to one caller per exchange: BlockingChannel for
    tcp addresses, and whatever a transport's `connect_blocking(location, *, max_frame_length,
    timeout)` returns for others (an object with invoke(request, timeout), closed, close())."""

    def __init__(self, *, max_per_address: int = 4, connect_timeout: float = 3.0,
                 max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH, request_steps=()):
        self.max_per_address = max_per_address
        # every request passes the client-side steps (rmq_core.remoting.steps), as on the other routes
        self.steps = RequestSteps.resolve(CLIENT, request_steps)
        self.connect_timeout = connect_timeout
        self.max_frame_length = max_frame_length
        self._idle: dict[str, list[BlockingChannel]] = {}
        self._open: dict[str, int] = {}  # addr -> channels open (idle or lent)
        self._lock = threading.Lock()
        self._closed = False

    def invoke(self, addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand | None:
        """The response, or None when every channel to `addr` is busy (the caller goes another
        way).  Connect / timeout failures raise as RemotingClient.invoke's do."""
        channel = self._borrow(addr)
        if channel is None:
            return None
        steps = self.steps
        try:
            if steps is not None:
                steps.run_before(addr, request)
            response = channel.invoke(request, timeout)
        finally:
            self._give_back(addr, channel)
        if steps is not None:
            steps.run_after(addr, request, response)
        return response

    def invoke_frame(self, addr: str, frame: bytes, opaque: int, timeout: float, read: Callable[[bytes], Any],
                     code: int = 0) -> Any:
        """invoke_frame on a blocking channel to `addr` (a tcp BlockingChannel, or an in-proc
        InprocBlockingChannel, whose broker end answers frames as a tcp one does); None when every
        channel to it is busy."""
        idle = self._idle.get(addr)
        try:
            channel = idle.pop()  # (atomic under the GIL: the usual case takes no lock)
        except (AttributeError, IndexError):  # none idle (or none yet): the locked way
            channel = self._borrow(addr)
            if channel is None:
                return None
        try:
            response = channel.invoke_frame(frame, opaque, timeout, read, code)
        finally:
            self._give_back(addr, channel)
        return response

    def _borrow(self, addr: str) -> BlockingChannel | None:
        with self._lock:
            if self._closed:
                raise RemotingConnectError(f"blocking channels are closed; cannot reach {addr}")
            idle = self._idle.get(addr)
            if idle:
                return idle.pop()
            if self._open.get(addr, 0) >= self.max_per_address:
                return None
            self._open[addr] = self._open.get(addr, 0) + 1
        channel = None
        try:
            channel = self._connect(addr)
            return channel
        finally:
            if channel is None:  # failed, or this transport has no blocking connections
                with self._lock:
                    self._open[addr] -= 1

    def _connect(self, addr: str):
        transport, location = resolve_transport(addr)
        if hasattr(transport, "open_socket"):  # a byte stream: remoting's own blocking channel on it
            return BlockingChannel(addr, connect_timeout=self.connect_timeout, max_frame_length=self.max_frame_length)
        connect = getattr(transport, "connect_blocking", None)  # a transport's own (inproc), or none
        if connect is None:
            return None
        return connect(location, max_frame_length=self.max_frame_length, timeout=self.connect_timeout)

    def _give_back(self, addr: str, channel: BlockingChannel) -> None:
        idle = self._idle.get(addr)
        if idle is not None and not channel.closed and not self._closed:
            # the usual case takes no lock: an append is atomic under the GIL
            idle.append(channel)
            if not self._closed and self._idle.get(addr) is idle:
                return
            # close() / close_address() came meanwhile: they pop what they drop one by one under
            # the lock, so the channel is either theirs now (counted and closed) or still ours
            with self._lock:
                try:
                    idle.remove(channel)
                except ValueError:  # theirs (or a borrower's, who gives it back in turn)
                    return
                self._put_locked(addr, channel)
            return
        with self._lock:
            self._put_locked(addr, channel)

    def _put_locked(self, addr: str, channel: BlockingChannel) -> None:
        if channel.closed or self._closed:
            self._open[addr] -= 1
            channel.close()
        else:
            self._idle.setdefault(addr, []).append(channel)

    @property
    def closed(self) -> bool:
        return self._closed

    def open_count(self, addr: str) -> int:
        with self._lock:
            return self._open.get(addr, 0)

    def close_address(self, addr: str) -> None:
        """Drop the idle channels to `addr` (a broker left the route); lent ones close on return."""
        with self._lock:
            idle = _take_all(self._idle.pop(addr, []))
            self._open[addr] = self._open.get(addr, 0) - len(idle)
        for channel in idle:
            channel.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = []
            for addr, channels in self._idle.items():
                taken = _take_all(channels)
                self._open[addr] -= len(taken)
                idle.extend(taken)
            self._idle.clear()
        for channel in idle:
            channel.close()
