"""Pipelined request/response connections written by any thread and read by one thread of their own
(the async send's direct path).

The remoting client runs every connection on the client instance's event loop; an async send
through it posts a closure to that loop (a self-pipe write and a wake-up per burst), and the loop
steps the call.  A PipelinedChannel takes the loop out: the caller's thread writes the encoded
request straight to the socket and returns, and one reader thread per connection reads large
chunks, splits them into frames, matches each response to its pending request by opaque and
completes it.  Many requests are in flight at once; responses may come in any order.

Writes: a caller registers its request and decides under a short lock.  While another thread's
write is in progress (the socket call runs without the GIL) its frame is appended to a buffer that
writer flushes before it returns; while answers to written requests are due, frames gather in that
buffer too (Nagle's rule: up to coalesce_bytes or for coalesce_delay, then the next caller writes
them all) and the reader writes what gathered, without blocking, as soon as the next answer
arrives (or after coalesce_delay): a burst of small requests leaves in a few system calls, not one
each, a request with nothing in flight is written at once, and none waits long for a reader that
cannot get the GIL while a caller keeps sending.

Failures: a request without an answer by its deadline fails with RemotingTimeoutError (the reader
sweeps the pending table whenever its receive times out, and at least every `sweep_interval`);
a broken connection fails every pending request with RemotingConnectError and the channel stays
closed (its owner opens a new one for the next request); close() lets the pending requests finish
for up to `drain_timeout` seconds, fails the rest and joins the reader.  Requests the broker
initiates are never sent on such a connection (the client heartbeats on the event loop's); any
that comes is refused with REQUEST_CODE_NOT_SUPPORTED, as a BlockingChannel does.
"""
from __future__ import annotations

import logging
import select
import socket
import threading
import time
from typing import Any, Callable

from rmq_core.errors import RemotingCommandError, RemotingConnectError, RemotingError, RemotingTimeoutError
from rmq_core.remoting.blocking import refusal
from rmq_core.remoting.codes import code_name
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand, native_decode_frames
from rmq_core.remoting.frames import split_frames
from rmq_core.remoting.transport import DEFAULT_MAX_FRAME_LENGTH, split_address

log = logging.getLogger("rmq.remoting")

OnDone = Callable[[Any, Any, "BaseException | None"], None]  # (context, response, error)

_READ_BUFFER = 256 * 1024
_POLL_IN = select.POLLIN | select.POLLERR | select.POLLHUP


def decode_command_frames(data, max_frame_length: int) -> tuple[list, int]:
    """The default frame reader: every whole frame of `data` as a RemotingCommand (or, where the
    native codec declines it, as its bytes for RemotingCommand.decode), and the bytes used."""
    if native_decode_frames is not None:
        items, consumed = native_decode_frames(data, max_frame_length)
        return [bytes(i) if type(i) is memoryview else i for i in items], consumed
    frames, consumed = split_frames(data, max_frame_length)
    return [bytes(f) for f in frames], consumed


class PipelinedChannel:
    """One TCP connection carrying many requests at once.

    read_frames(data, max_frame_length) -> (items, consumed) turns the bytes read into one item per
    whole frame: an object with `flag` and `opaque` (a RemotingCommand, a natively read response),
    or the frame's bytes (without the length prefix) where it declined; those are decoded with
    RemotingCommand.decode and, when they are responses, handed to from_command(command) to make
    the same kind of item.  A bad frame breaks the connection (its framing is lost)."""

    def __init__(self, addr: str, *, connect_timeout: float = 3.0,
                 max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH,
                 read_frames: Callable[[Any, int], tuple[list, int]] = decode_command_frames,
                 from_command: Callable[[RemotingCommand], Any] | None = None,
                 sweep_interval: float = 0.05, write_timeout: float = 10.0, coalesce_bytes: int = 4096,
                 coalesce_delay: float = 0.0005, name: str | None = None):
        scheme, location = split_address(addr)
        if scheme != "tcp":
            raise RemotingConnectError(f"a pipelined channel needs a tcp address, not {addr!r}")
        host, sep, port = location.rpartition(":")
        if not sep or not port.isdigit():
            raise RemotingConnectError(f"bad address {addr!r}: expected host:port")
        if sweep_interval <= 0:
            raise ValueError(f"bad sweep_interval {sweep_interval!r}: must be > 0")
        self.addr = addr
        self.max_frame_length = max_frame_length
        self.sweep_interval = sweep_interval
        self._read_frames = read_frames
        self._from_command = from_command
        try:
            sock = socket.create_connection((host, int(port)), timeout=connect_timeout)
        except OSError as e:
            raise RemotingConnectError(f"connect to {addr} failed: {e}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Two socket objects on one connection (a timeout is per object): the reader's never blocks
        # (it polls, and its writes take what the buffer takes), the writers' send timeout bounds
        # a caller's write into a full buffer.
        self._rsock = sock
        self._rsock.settimeout(0)  # the reader polls; its writes never block
        self._wsock = sock.dup()
        self._wsock.settimeout(write_timeout)
        self.coalesce_bytes = coalesce_bytes
        self.coalesce_delay = coalesce_delay
        self._pending: dict[int, tuple[float, OnDone, Any]] = {}  # opaque -> (deadline, on_done, context)
        self._wlock = threading.Lock()
        self._wbuf: list[bytes] = []  # frames gathered for the next write, in order
        self._wbuf_bytes = 0
        self._wbuf_requests = 0  # requests among them
        self._unanswered = 0  # requests written whose answers have not been read (about: never < 0)
        self._held_since = 0.0  # when _wbuf got its first frame (0: empty)
        self._writing = False  # a thread is in a socket write
        self._closing = False
        self._drained = threading.Condition(threading.Lock())
        self.closed = False
        self._error: BaseException | None = None
        self._reader = threading.Thread(target=self._read_loop, name=name or f"rmq-pipe-{addr}", daemon=True)
        self._reader.start()

    # --- requests ------------------------------------------------------------------------------------
    def send(self, frame: bytes, opaque: int, timeout: float, on_done: OnDone, context: Any = None) -> None:
        """Write an encoded request (length prefix included) whose opaque is `opaque`;
        on_done(context, response, None) with its response, or on_done(context, None, error) -
        exactly once, on the reader thread, or on this thread when the channel is closed or the
        write fails.  (A context instead of a closure per request: one tuple, no function object.)"""
        if self.closed or self._closing:
            on_done(context, None, RemotingConnectError(f"connection to {self.addr} is closed"))
            return
        pending = self._pending
        now = time.monotonic()
        pending[opaque] = (now + timeout, on_done, context)
        with self._wlock:
            if not self.closed and (self._writing or (
                    self._unanswered > 0 and self._wbuf_bytes + len(frame) <= self.coalesce_bytes
                    and (not self._held_since or now - self._held_since < self.coalesce_delay))):
                # A write is in progress (its writer takes this frame too), or answers are due (the
                # reader writes what gathered when the next one comes - it counts them under this
                # lock, so none is missed - or after coalesce_delay): a burst leaves in a few
                # writes instead of one system call per request.
                if not self._wbuf:
                    self._held_since = time.monotonic()
                self._wbuf.append(frame)
                self._wbuf_bytes += len(frame)
                self._wbuf_requests += 1
                return
            self._wbuf_requests += 1
            if self._wbuf:  # what gathered goes first, in order
                self._wbuf.append(frame)
                frame = b"".join(self._wbuf)
            self._take_wbuf()
            self._writing = not self.closed
        if self._writing:
            self._write_out(frame)
        if self.closed:  # closed meanwhile: the failure may have drained the table before this entry
            entry = pending.pop(opaque, None)
            if entry is not None:
                self._complete_with(entry, self._error or RemotingConnectError(
                    f"connection to {self.addr} is closed"))

    def invoke(self, request: RemotingCommand, timeout: float, on_done: OnDone, context: Any = None) -> None:
        """send() of a RemotingCommand."""
        request.flag &= ~RESPONSE_FLAG
        body = request.body
        frame = request.encode_header(len(body)) + bytes(body) if body else request.encode_header(0)
        self.send(frame, request.opaque, timeout, on_done, context)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def _take_wbuf(self) -> None:  # under _wlock, when what gathered is taken to be written
        self._unanswered += self._wbuf_requests
        self._wbuf_requests = 0
        self._wbuf.clear()
        self._wbuf_bytes = 0
        self._held_since = 0.0

    def _write_out(self, data: bytes) -> None:
        """A caller's blocking write (this thread set _writing), then whatever gathered meanwhile."""
        try:
            while True:
                self._wsock.sendall(data)
                with self._wlock:
                    if not self._wbuf or self.closed:
                        self._writing = False
                        if self.closed:
                            self._wsock.close()  # the reader left it to the write in progress
                        return
                    data = b"".join(self._wbuf)
                    self._take_wbuf()
        except OSError as e:
            with self._wlock:
                self._writing = False
                self._take_wbuf()
            # part of a frame may be out: the connection cannot carry another one
            self._fail(RemotingConnectError(f"write to {self.addr} failed: {e}"))
            with self._wlock:
                if not self._writing:
                    self._wsock.close()

    def _flush_gathered(self, answered: int = 0) -> bool:
        """The reader's write of what gathered, without blocking, after `answered` answers came:
        True when some is left (the socket buffer is full), to be written when the socket is
        writable again."""
        while True:
            with self._wlock:
                if answered:
                    self._unanswered = max(0, self._unanswered - answered)
                    answered = 0
                if self._writing or not self._wbuf or self.closed:
                    return False
                data = self._wbuf[0] if len(self._wbuf) == 1 else b"".join(self._wbuf)
                self._take_wbuf()
                self._writing = True
            try:
                sent = self._rsock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError as e:
                with self._wlock:
                    self._writing = False
                raise ConnectionResetError(f"write to {self.addr} failed: {e}") from None
            with self._wlock:
                self._writing = False
                if sent < len(data):  # the rest (maybe part of a frame) goes first next time
                    self._wbuf.insert(0, data[sent:])
                    self._wbuf_bytes += len(data) - sent
                    if not self._held_since:
                        self._held_since = time.monotonic()
                    return True

    # --- the reader ----------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        sock = self._rsock
        buf = bytearray(_READ_BUFFER)
        view = memoryview(buf)
        have = 0  # bytes of buf holding an incomplete frame
        poller = select.poll()
        poller.register(sock.fileno(), _POLL_IN)
        want_out = False
        answered = 0
        next_sweep = time.monotonic() + self.sweep_interval
        error: BaseException | None = None
        try:
            while True:
                held = self._held_since
                if held and not want_out:
                    wait = max(0.0, held + self.coalesce_delay - time.monotonic())
                else:
                    wait = self.sweep_interval
                readable = False
                for _, event in poller.poll(wait * 1000.0):
                    if event & _POLL_IN:
                        readable = True
                if readable:
                    try:
                        n = sock.recv_into(view[have:])
                    except BlockingIOError:
                        n = -1
                    if n == 0:
                        raise ConnectionResetError(f"connection closed by {self.addr}")
                    if n > 0:
                        have += n
                        items, consumed = self._read_frames(view[:have], self.max_frame_length)
                        if items:
                            answered = self._deliver(items)
                        if consumed:
                            rest = have - consumed
                            if rest:  # the start of the next frame moves to the front (copied: may overlap)
                                buf[:rest] = bytes(view[consumed:have])
                            have = rest
                        if have >= 4:
                            need = 4 + int.from_bytes(buf[:4], "big", signed=True)
                            if need > len(buf):  # one frame bigger than the buffer: grow it
                                view.release()
                                buf.extend(bytes(need - len(buf)))
                                view = memoryview(buf)
                if answered or self._wbuf:
                    left = self._flush_gathered(answered)
                    answered = 0
                    if left != want_out:
                        want_out = left
                        poller.modify(sock.fileno(), _POLL_IN | select.POLLOUT if left else _POLL_IN)
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + self.sweep_interval
                    if self._pending:
                        self._sweep(now)
                    if self._closing and not self._pending:
                        return
        except RemotingCommandError as e:
            error = RemotingConnectError(f"bad frame from {self.addr}: {e}")
        except OSError as e:
            error = RemotingConnectError(
                f"connection to {self.addr} closed" if self._closing else f"connection to {self.addr} broke: {e}")
        except BaseException as e:  # noqa: BLE001 - whatever it was, every waiter must hear of it
            log.exception("pipelined channel to %s: reader failed", self.addr)
            error = RemotingConnectError(f"reader of {self.addr} failed: {e!r}")
        finally:
            view.release()
            self._fail(error or RemotingConnectError(f"connection to {self.addr} closed"))
            # Sockets are closed by the threads that use them, never under a call in progress
            # (a closed descriptor's number may be reused at once): the reader's here, the
            # writers' here unless a write is in progress, which then closes it.
            sock.close()
            with self._wlock:
                if not self._writing:
                    self._wsock.close()

    def _deliver(self, items: list) -> int:
        """Complete the requests these frames answer; returns how many answers there were."""
        pending = self._pending
        answers = 0
        for item in items:
            if type(item) is bytes:
                command = RemotingCommand.decode(item)  # RemotingCommandError: the connection goes
                if command.flag & RESPONSE_FLAG and self._from_command is not None:
                    item = self._from_command(command)
                else:
                    item = command
            if not item.flag & RESPONSE_FLAG:  # (a request is always a RemotingCommand)
                self._refuse(item)
                continue
            answers += 1
            entry = pending.pop(item.opaque, None)
            if entry is None:
                log.debug("pipelined channel to %s: no request waits for opaque %d (timed out?)",
                          self.addr, item.opaque)
                continue
            try:
                entry[1](entry[2], item, None)
            except Exception:  # noqa: BLE001 - one bad callback must not stop the others
                log.exception("pipelined channel to %s: completion of opaque %d failed", self.addr, item.opaque)
        if self._closing and not pending:
            with self._drained:
                self._drained.notify_all()
        return answers

    def _refuse(self, command: RemotingCommand) -> None:
        log.warning("pipelined channel to %s: unexpected %s request from the peer", self.addr,
                    code_name(command.code))
        response = refusal(command)
        if response is not None:  # written with what gathered, at the end of this read
            with self._wlock:
                if not self._wbuf:
                    self._held_since = time.monotonic()
                self._wbuf.append(response)
                self._wbuf_bytes += len(response)

    def _sweep(self, now: float) -> None:
        expired = [opaque for opaque, entry in list(self._pending.items()) if entry[0] <= now]
        if expired:  # no answer counted on for them any more (one coming late is counted again: >= 0)
            with self._wlock:
                self._unanswered = max(0, self._unanswered - len(expired))
        for opaque in expired:
            entry = self._pending.pop(opaque, None)
            if entry is not None:
                self._complete_with(entry, RemotingTimeoutError(
                    f"no response (opaque {opaque}) from {self.addr} in time"))

    def _fail(self, error: BaseException) -> None:
        """Close for good and fail every pending request with `error`."""
        with self._wlock:
            first = not self.closed
            self.closed = True
        if first:
            self._error = error
            try:  # wakes the reader (and a blocked writer); the descriptors stay open until they leave
                self._rsock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        while self._pending:
            try:
                _, entry = self._pending.popitem()
            except KeyError:  # emptied meanwhile by another thread
                break
            self._complete_with(entry, error)
        with self._drained:
            self._drained.notify_all()

    @staticmethod
    def _complete_with(entry: tuple, error: BaseException) -> None:
        try:
            entry[1](entry[2], None, error)
        except Exception:  # noqa: BLE001
            log.exception("pipelined channel: failing a request's completion raised")

    # --- life cycle ----------------------------------------------------------------------------------
    def close(self, drain_timeout: float = 0.0) -> None:
        """Stop taking requests; let the pending ones finish for up to drain_timeout seconds, fail
        the rest with RemotingConnectError and join the reader."""
        self._closing = True
        if drain_timeout > 0 and threading.current_thread() is not self._reader:
            deadline = time.monotonic() + drain_timeout
            with self._drained:
                while self._pending and not self.closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._drained.wait(min(remaining, self.sweep_interval))
        self._fail(RemotingConnectError(f"connection to {self.addr} closed with the request pending"))
        if threading.current_thread() is not self._reader:
            self._reader.join(5)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._pending)} pending"
        return f"PipelinedChannel({self.addr}, {state})"


__all__ = ["PipelinedChannel", "decode_command_frames", "RemotingError"]
