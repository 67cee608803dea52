"""Pipelined request/response connections written by any thread and read by one thread of their own
(the producer's send pipeline: every send travels on one).

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
arrives (or after coalesce_delay), as does a caller that starts waiting: a burst of small requests
leaves in a few system calls, not one each (every write to a local peer costs ~15 us of CPU and
often a context switch: 16 KiB / 2 ms by default), a request with nothing in flight is written at
once, and none waits long for a reader that cannot get the GIL while a caller keeps sending.

Reads: one thread at a time holds the channel's read token and reads.  A thread waiting for one
answer (wait(future, timeout): LeanFuture.result) takes the token when it is free and reads and
completes answers itself until its own comes, so "send N, then wait for all" runs on one thread
with no hand-off to the reader and back; while another thread holds the token it sleeps on its
future until the answer or the token comes.  The reader thread reads when nobody else does (answers
nobody waits for: callbacks, futures not asked yet); while a caller holds the token, or sent within
the last `reader_defer` seconds and the answers have been waiting less than that, it leaves them to
the caller (bounded: no answer waits longer than reader_defer for it).  The token is re-entrant:
a completion that waits for another answer on the token holder's thread reads it itself (frames
are parsed and the buffer compacted before any completion runs).

Failures: a request without an answer by its deadline fails with RemotingTimeoutError (the reader
sweeps the pending table whenever its receive times out, and at least every `sweep_interval`);
a broken connection fails every pending request with RemotingConnectError and the channel stays
closed (its owner opens a new one for the next request); close() lets the pending requests finish
for up to `drain_timeout` seconds, fails the rest and joins the reader.  Requests the broker
initiates are never sent on such a connection (the client heartbeats on the event loop's); any
that comes is refused with REQUEST_CODE_NOT_SUPPORTED, as a BlockingChannel does.
"""
from __future__ import annotations

import abc
import _thread
import functools
import logging
import select
import socket
import threading
import time
from threading import get_ident
from typing import Any, Callable

from rmq_core._native.send_pipeline import deliver_responses
from rmq_core._native.socket_io import PipelinedWrites, exchange as socket_exchange
from rmq_core.errors import (RemotingCommandError, RemotingConnectError, RemotingError, RemotingTimeoutError,
                              os_error_text)
from rmq_core.remoting.blocking import refusal, set_kernel_timeouts
from rmq_core.remoting.codes import code_name
from rmq_core.remoting.command import (RESPONSE_FLAG, FrameCommand, RemotingCommand, native_decode_frames, new_command,
                                       set_frame)
from rmq_core.remoting.frames import split_frames
from rmq_core.remoting.transport import DEFAULT_MAX_FRAME_LENGTH, open_socket

log = logging.getLogger("rmq.remoting")

OnDone = Callable[[Any, Any, "BaseException | None"], None]  # (context, response, error)

_READ_BUFFER = 256 * 1024
_NOBODY = 0  # (thread ids are never 0)
_GONE = -1
# the reader's short waits (reader_defer each) while a caller holds the read token, before it parks
# until the token is let go: a sync send's exchange is answered within them, a long poll is not
_SHORT_PARKS = 25
# how long a parked reader sleeps unless woken (the token's holder sweeps meanwhile; the bound only
# makes a lost wake-up cost a second, never a hang)
_PARKED_WAIT = 1.0
_POLL_IN = select.POLLIN | select.POLLERR | select.POLLHUP


def decode_command_frames(data, max_frame_length: int) -> tuple[list, int]:
    """The default frame reader: every whole frame of `data` as a RemotingCommand (or, where the
    native codec declines it, as its bytes for RemotingCommand.decode), and the bytes used."""
    if native_decode_frames is not None:
        items, consumed = native_decode_frames(data, max_frame_length)
        return [bytes(i) if type(i) is memoryview else i for i in items], consumed
    frames, consumed = split_frames(data, max_frame_length)
    return [bytes(f) for f in frames], consumed


class HookFailed:
    """An answer whose interception step raised: its request fails with `error`."""

    __slots__ = ("flag", "opaque", "error")

    def __init__(self, opaque: int, error: BaseException):
        self.flag, self.opaque, self.error = RESPONSE_FLAG, opaque, error


class HookedRequests:
    """A connection's interception step (the client's request steps: steps.FrameStep, with
    before(frame) -> (frame, request) and after(request, response command)) and the requests that passed it, by opaque,
    until their answers pass it too.  The answers are read by the connection's own reader and
    completed as usual (natively, for send responses); after() runs as the frames are read, with
    a FrameCommand over a copy of the answer's frame (decoded only if a hook reads it)."""

    __slots__ = ("step", "requests", "tracks")

    def __init__(self, step):
        self.step = step
        self.requests: dict[int, Any] = {}
        # a step with no after() keeps no request and leaves the answers to the usual reader
        self.tracks = getattr(step, "has_after", True)

    def intercept(self, frame, opaque: int, on_done: OnDone, context: Any, request=None):
        """The request `frame` (length prefix included) through the step's before() - or, for a
        send handed over before it is written (`request`, a SendRequest; frame None), its
        before_request(), which writes the frame: the frame to write (the step may have changed
        it), or None when the step raised - then this request failed: on_done(context, None,
        error) was called.  Nothing else fails."""
        try:
            if request is None:
                frame, request = self.step.before(frame)
            else:
                frame, request = self.step.before_request(request)
        except Exception as e:  # noqa: BLE001 - a failing step fails this request, not the channel
            on_done(context, None, e)
            return None
        if self.tracks:
            self.requests[opaque] = request
        return frame

    def read(self, read_frames, from_command, data, max_frame_length: int) -> tuple[list, int]:
        """The connection's frame reader (read_frames(data, max_frame_length) -> (items, consumed))
        with each answer to an intercepted request passed through the step's after(); an answer
        whose after() raised becomes a HookFailed.  A frame read_frames declined is decoded here
        (and made from_command(command) when given, as the channel would)."""
        items, consumed = read_frames(data, max_frame_length)
        requests = self.requests
        if items and requests:
            frames = None
            for k, item in enumerate(items):
                if type(item) is bytes:
                    item = RemotingCommand.decode(item)  # RemotingCommandError: the connection goes
                    if not item.flag & RESPONSE_FLAG:
                        items[k] = item
                        continue
                    command = item
                    if from_command is not None:
                        item = items[k] = from_command(item)
                    else:
                        items[k] = item
                elif not item.flag & RESPONSE_FLAG:
                    continue
                elif type(item) is RemotingCommand:
                    command = item
                else:
                    command = None
                request = requests.pop(item.opaque, None)
                if request is None:
                    continue
                if command is None:
                    if frames is None:  # (one frame per item, in order: the same lengths were read)
                        frames, _ = split_frames(data, max_frame_length)
                    command = new_command(FrameCommand)
                    set_frame(command, bytes(frames[k]))
                try:
                    self.step.after(request, command)
                except Exception as e:  # noqa: BLE001 - a failing step fails this request, not the channel
                    items[k] = HookFailed(item.opaque, e)
        return items, consumed

    def answer(self, item, command):
        """One answer handed over as it is (an in-proc broker's): `item`, or a HookFailed."""
        request = self.requests.pop(item.opaque, None)
        if request is not None:
            try:
                self.step.after(request, command)
            except Exception as e:  # noqa: BLE001
                return HookFailed(item.opaque, e)
        return item

    def forget(self, opaques) -> None:
        """Requests that will get no answer (timed out)."""
        for opaque in opaques:
            self.requests.pop(opaque, None)


def _hand_over(box: list, response, error) -> None:
    """A sync send's answer handed to its waiting thread (PendingRequests.exchange)."""
    box[1], box[2] = response, error
    box[0].release()


class PendingRequests:
    """The pending table every pipelined connection keeps, whatever carries its bytes (this
    module's TCP one, a transport's own - the in-proc one): `_pending` maps an opaque to
    (deadline, on_done, context); an answer completes its request (`_complete`), the deadline
    sweep fails the late ones (`_expire`), a broken connection fails them all (`_fail_pending`);
    `_hooks` is the interception step (HookedRequests) or None.  Each request's on_done runs
    exactly once."""

    addr: str = ""
    _pending: dict
    _hooks: "HookedRequests | None" = None

    _intercept = None

    def _take_step(self, intercept, read_frames, from_command) -> None:
        """The connection's reading of frames (read_frames, from_command: see PipelinedChannel) and
        its interception step: `intercept`, a step every request and its answer pass (request
        steps: steps.FrameStep, see HookedRequests), or None; `self.intercept(frame, opaque,
        on_done, context, request)` is its way in."""
        self._intercept = intercept
        self._hooks = hooks = None if intercept is None else HookedRequests(intercept)
        self.intercept = None if hooks is None else hooks.intercept
        self._read_frames = read_frames if hooks is None or not hooks.tracks else functools.partial(
            hooks.read, read_frames or decode_command_frames, from_command)
        self._from_command = from_command

    def _oneway_step(self, frame, request):
        """A oneway request through the interception step (no answer: its before() only);
        request: a send as its SendHeader has it (see send()), or None for a built frame."""
        frame, _ = self._intercept.before(frame) if request is None else self._intercept.before_request(request)
        return frame

    @property
    def intercepted(self) -> bool:
        """True when requests pass an interception step (then only send() may write them)."""
        return self._intercept is not None

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def abandon(self, opaque: int, error: BaseException) -> bool:
        """Fail the request `opaque` with `error` now if it is still pending - its caller gave up on
        it (a long poll at its consumer's shutdown): an answer that comes later is dropped, and a
        close does not wait for it.  False when it was answered (or failed) already."""
        entry = self._pending.pop(opaque, None)
        if entry is None:
            return False
        writes = self.writes
        if writes is not None:  # (no answer counted on for it any more, as for a timed-out one)
            writes.answered(1)
        self._complete_with(entry, error)
        return True

    def _complete(self, item) -> bool:
        """One answer (a response item: a RemotingCommand, a natively read response or a
        HookFailed): its request completed; False when none waits for it (timed out)."""
        entry = self._pending.pop(item.opaque, None)
        if entry is None:
            log.debug("pipelined channel to %s: no request waits for opaque %d (timed out?)", self.addr, item.opaque)
            return False
        try:
            if type(item) is HookFailed:
                entry[1](entry[2], None, item.error)
            else:
                entry[1](entry[2], item, None)
        except Exception:  # noqa: BLE001 - one bad callback must not stop the others
            log.exception("pipelined channel to %s: completion of opaque %d failed", self.addr, item.opaque)
        return True

    def _timed_out(self, opaque: int) -> RemotingTimeoutError:
        return RemotingTimeoutError(f"no response (opaque {opaque}) from {self.addr} in time")

    # A connection whose answers arrive on another thread (a transport's own: the in-proc one's
    # come on the server's thread) has no reader to sweep and to read a sync send's answer: it calls
    # _keep_swept() with each request (a sweeper thread runs while it is open) and its exchange is
    # this one.  `_closed` and `_wake` (a threading.Event set on close) are the connection's.
    sweep_interval: float = 0.05
    _sweeper = None
    _sweeper_lock = threading.Lock()  # (class-wide: only taken to start a connection's sweeper)

    def _keep_swept(self) -> None:
        if self._sweeper is None:
            with self._sweeper_lock:
                if self._sweeper is None and not self._closed:
                    self._sweeper = threading.Thread(target=self._sweep_loop, name=f"rmq-sweep-{self.addr}",
                                                     daemon=True)
                    self._sweeper.start()

    def _sweep_loop(self) -> None:
        while not self._closed:
            self._wake.wait(self.sweep_interval)
            self._expire(time.monotonic())

    def exchange(self, frame, opaque: int, timeout: float, on_done, context=None, request=None) -> None:
        """A sync send's (request: as send()'s): send(), then this thread waits on a plain lock and completes its own
        answer - the answering thread only hands it over (or the sweeper its timeout) and goes
        back to its work at once, as a tcp caller reads its own (PipelinedChannel.exchange)."""
        done = _thread.allocate_lock()
        done.acquire()
        box = [done, None, None]
        self.send(frame, opaque, timeout, _hand_over, box, request)
        if not done.acquire(timeout=max(0.0, timeout) + 1.0):
            if self._pending.pop(opaque, None) is not None:  # (the sweeper never came to it)
                on_done(context, None, self._timed_out(opaque))
                return
            done.acquire()  # being handed over right now
        on_done(context, box[1], box[2])

    def _expire(self, now: float) -> list:
        """Fail the requests whose deadline passed (RemotingTimeoutError); their opaques."""
        # dict.copy() clones the table without running Python code; list(items()) allocates a tuple
        # per entry, and a garbage collection there may run a finalizer that lets a writer thread in
        # to add a request mid-iteration ('dictionary changed size during iteration')
        expired = [opaque for opaque, entry in self._pending.copy().items() if entry[0] <= now]
        if expired and self._hooks is not None:
            self._hooks.forget(expired)
        for opaque in expired:
            entry = self._pending.pop(opaque, None)
            if entry is not None:
                self._complete_with(entry, self._timed_out(opaque))
        return expired

    def _fail_pending(self, error: BaseException) -> None:
        """Fail every request still pending with `error` (the connection is gone)."""
        while self._pending:
            try:
                _, entry = self._pending.popitem()
            except KeyError:  # emptied meanwhile by another thread
                break
            self._complete_with(entry, error)
        if self._hooks is not None:
            self._hooks.requests.clear()

    @staticmethod
    def _complete_with(entry: tuple, error: BaseException) -> None:
        try:
            entry[1](entry[2], None, error)
        except Exception:  # noqa: BLE001
            log.exception("pipelined channel: failing a request's completion raised")



class HandedOverChannel(PendingRequests, metaclass=abc.ABCMeta):
    """A pipelined connection over a transport that hands whole frames to the other end instead of
    writing bytes on a socket (the in-proc one): no write buffer, no reader thread - answers come
    on the other end's thread through `_deliver_frames` (frames it wrote) or `_deliver` (a command
    handed over as it is).  The interception step, the pending table, its sweeper, a sync send's
    exchange, failure and close are all here; a transport's subclass calls `_open` and gives
    `_hand_over(frame)` (None once handed over, else why it could not be: the connection fails)
    and `_hand_over_close()` (tell the other end this one closed)."""

    _loop = None  # (answers are completed as they are handed over: in the other end's thread)
    writes = None  # (no write buffer: a frame is handed over whole)

    def _open(self, address: str, local_address: str, remote_address: str, *, max_frame_length: int, read_frames,
              from_command=None, intercept=None, sweep_interval: float = 0.05) -> None:
        self.addr, self.local_address, self.remote_address = address, local_address, remote_address
        self.max_frame_length = max_frame_length
        self._take_step(intercept, read_frames, from_command)
        self._pending: dict[int, tuple] = {}  # opaque -> (deadline, on_done, context)
        self._closed = False
        self._error: BaseException | None = None
        self.sweep_interval = sweep_interval
        self._wake = threading.Event()  # (set on close: the sweeper leaves)

    @abc.abstractmethod
    def _hand_over(self, frame: bytes) -> str | None:
        """Give the request to the other end; None once given, else why it could not be."""

    @abc.abstractmethod
    def _hand_over_close(self) -> None:
        """Tell the other end this one closed."""

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, frame, opaque: int, timeout: float, on_done, context=None, request=None) -> None:
        """PipelinedChannel.send: on_done(context, response, None) or on_done(context, None, error),
        exactly once (request: as its)."""
        if self._hooks is not None and request is not True:
            frame = self.intercept(frame, opaque, on_done, context, request)
            if frame is None:
                return
        if self._closed:
            on_done(context, None, self._error or RemotingConnectError(f"connection to {self.addr} is closed"))
            return
        if type(frame) is not bytes:  # the other end reads it later: a buffer the caller may reuse is copied
            frame = bytes(frame)
        self._pending[opaque] = (time.monotonic() + timeout, on_done, context)
        self._keep_swept()
        why = self._hand_over(frame)
        if why is not None:
            self._fail(RemotingConnectError(f"connection to {self.addr} is closed: {why}"))

    def send_oneway(self, frame, request=None) -> None:
        """A request no answer is expected to (its flag says oneway); request: as send()'s."""
        if self._intercept is not None and request is not True:
            frame = self._oneway_step(frame, request)
        if self._closed:
            raise self._error or RemotingConnectError(f"connection to {self.addr} is closed")
        why = self._hand_over(bytes(frame))
        if why is not None:
            self._fail(RemotingConnectError(f"connection to {self.addr} is closed: {why}"))
            raise self._error

    # the other end's calls, in its thread
    def _deliver_frames(self, frames: bytes) -> None:
        """Answers the other end wrote (whole frames)."""
        try:
            items, _ = (self._read_frames or decode_command_frames)(frames, self.max_frame_length)
            items = [RemotingCommand.decode(i) if type(i) is bytes else i for i in items]  # (what the reader declined)
        except RemotingCommandError as e:
            self._fail(RemotingConnectError(f"bad frame from {self.addr}: {e}"))
            return
        for item in items:
            self._deliver(item)

    def _deliver(self, item) -> None:
        """One answer (a RemotingCommand handed over as it is, or a natively read response)."""
        if not item.flag & RESPONSE_FLAG:
            log.debug("pipelined channel %s: dropping %r", self.local_address, item)
            return
        if type(item) is RemotingCommand:  # (not read by _read_frames: the step's after() runs here)
            if self._hooks is not None:
                item = self._hooks.answer(item, item)
            if self._from_command is not None and type(item) is RemotingCommand:
                item = self._from_command(item)
        self._complete(item)

    def _peer_closed(self) -> None:
        self._fail(RemotingConnectError(f"connection to {self.addr} closed by the broker"))

    # PipelinedChannel's reading side: answers come on the other end's thread, nothing to read here
    def wait(self, future, timeout: float | None = None) -> None:
        return None

    def read_ready(self) -> int:
        return 0

    def flush(self) -> None:
        return None

    def _fail(self, error: BaseException) -> None:
        if not self._closed:
            self._closed = True
            self._error = error
            self._wake.set()
        self._fail_pending(self._error)

    def close(self, drain_timeout: float = 0.0) -> None:
        """Let the pending requests finish for up to drain_timeout seconds, fail the rest."""
        deadline = time.monotonic() + drain_timeout
        while self._pending and not self._closed and time.monotonic() < deadline:
            time.sleep(0.005)
        was_closed = self._closed
        self._fail(RemotingConnectError(f"connection to {self.addr} closed with the request pending"))
        if not was_closed:
            self._hand_over_close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.addr}, {'closed' if self._closed else f'{len(self._pending)} pending'})"


class PipelinedChannel(PendingRequests):
    """One connection of a byte-stream transport (transport.open_socket) carrying many requests at once.

    read_frames(data, max_frame_length) -> (items, consumed) turns the bytes read into one item per
    whole frame: an object with `flag` and `opaque` (a RemotingCommand, a natively read response),
    or the frame's bytes (without the length prefix) where it declined; those are decoded with
    RemotingCommand.decode and, when they are responses, handed to from_command(command) to make
    the same kind of item.  A bad frame breaks the connection (its framing is lost)."""

    def __init__(self, addr: str, *, connect_timeout: float = 3.0,
                 max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH,
                 read_frames: Callable[[Any, int], tuple[list, int]] = decode_command_frames,
                 from_command: Callable[[RemotingCommand], Any] | None = None,
                 sweep_interval: float = 0.05, write_timeout: float = 10.0, coalesce_bytes: int = 16384,
                 coalesce_delay: float = 0.002, reader_defer: float = 0.002, name: str | None = None,
                 intercept=None):
        if sweep_interval <= 0:
            raise ValueError(f"bad sweep_interval {sweep_interval!r}: must be > 0")
        if reader_defer < 0:
            raise ValueError(f"bad reader_defer {reader_defer!r}: must be >= 0")
        self.addr = addr
        self.max_frame_length = max_frame_length
        self.sweep_interval = sweep_interval
        self._take_step(intercept, read_frames, from_command)
        sock = open_socket(addr, timeout=connect_timeout)  # (any byte-stream transport's)
        # Two socket objects on one connection, one blocking descriptor (a duplicate shares its
        # blocking mode).  The reader's object reads and writes with MSG_DONTWAIT (it polls; its
        # writes take what the buffer takes), except a sync send's exchange: one receive that
        # sleeps until the answer, bounded by SO_RCVTIMEO (socket_io.exchange).  The writers'
        # object has a Python timeout, which bounds a caller's write into a full buffer and
        # polls when a send would block (also should anything make the descriptor non-blocking:
        # uvloop's watch of a duplicate does); SO_SNDTIMEO bounds an exchange's write.
        self._wsock = sock.dup()
        self._wsock.settimeout(write_timeout)  # (this leaves the descriptor non-blocking...)
        self._rsock = sock
        sock.settimeout(None)  # (...and this blocking again)
        set_kernel_timeouts(sock, write_timeout)
        self._recv_timeout = write_timeout  # the SO_RCVTIMEO set (an exchange sets its own)
        self._fd = sock.fileno()  # (used by the read token's holder, while the socket is surely open)
        self._pending: dict[int, tuple[float, OnDone, Any]] = {}  # opaque -> (deadline, on_done, context)
        # the write side: requests registered, frames gathered, who writes (each step atomic, natively)
        self.writes = PipelinedWrites(self._pending, coalesce_bytes, coalesce_delay)
        self._drained = threading.Condition(threading.Lock())
        # the read token (see the module doc): its holder's thread id, _NOBODY, or _GONE once the
        # reader left (the socket is closed by whoever holds the token then)
        self.reader_defer = reader_defer
        self._tlock = threading.Lock()
        self._token_owner = _NOBODY
        self._token_waiters: set = set()  # futures whose waiters sleep until the token is released
        # ends the reader's pause when the channel fails or closes, or a long-held token is let go
        self._reader_wake = threading.Event()
        self._reader_parked = False  # the reader waits for the token's release (set, cleared by the reader)
        self._rbuf = bytearray(_READ_BUFFER)  # the read buffer, used by the token holder only
        self._rview = memoryview(self._rbuf)
        self._rhave = 0  # bytes of _rbuf holding an incomplete frame
        self._rfull = False  # the last receive filled the buffer
        self._reads = 0  # receives that got data, by whichever thread (the reader's deferral restarts)
        self._reader_gone = False
        self._next_sweep = time.monotonic() + sweep_interval  # (the reader's, or a reading caller's)
        self._error: BaseException | None = None
        self._reader = threading.Thread(target=self._read_loop, name=name or f"rmq-pipe-{addr}", daemon=True)
        self._reader.start()

    # --- requests ------------------------------------------------------------------------------------
    def send(self, frame: bytes | None, opaque: int, timeout: float, on_done: OnDone, context: Any = None,
             request=None) -> None:
        """Write an encoded request (length prefix included) whose opaque is `opaque`;
        on_done(context, response, None) with its response, or on_done(context, None, error) -
        exactly once, on the thread that reads the answer (a waiter's or the reader), or on this
        thread when the channel is closed or the write fails.  (A context instead of a closure per
        request: one tuple, no function object.)  While a write is in progress or answers are due
        the frame gathers (PipelinedWrites.offer): a burst leaves in a few writes instead of one
        system call per request.  request: a send handed over before it is written (a SendRequest,
        frame None: the connection's step writes it, HookedRequests.intercept), given only to a
        connection with a step."""
        if self._hooks is not None and request is not True:
            frame = self.intercept(frame, opaque, on_done, context, request)
            if frame is None:
                return
        data = self.writes.offer(frame, opaque, timeout, on_done, context)
        if data is not None:
            self.after_offer(data, opaque, on_done, context)

    def exchange(self, frame: bytes | None, opaque: int, timeout: float, on_done: OnDone, context: Any = None,
                 request=None) -> None:
        """send() for a caller that waits for this answer at once (a sync send).  When the
        connection is idle - nothing in flight or gathered, no write in progress, nobody reading -
        this thread takes the read token, writes the request and receives its answer in one native
        call (socket_io.exchange: the GIL released once, one receive that sleeps until the answer
        comes) and completes what came; whatever is left its wait (LeanFuture.result -> wait) reads
        as usual.  Otherwise it is send()."""
        writes = self.writes
        if writes.unanswered or writes.writing or writes.gathered or self._token_owner:  # (_NOBODY is 0)
            self.send(frame, opaque, timeout, on_done, context, request)
            return
        me = get_ident()
        with self._tlock:
            if self._token_owner == _NOBODY:
                self._token_owner = me
            else:
                me = _NOBODY
        if me == _NOBODY:
            self.send(frame, opaque, timeout, on_done, context, request)
            return
        try:
            if self._hooks is not None and request is not True:  # (as send() does)
                frame = self.intercept(frame, opaque, on_done, context, request)
                if frame is None:
                    return
            data = writes.offer(frame, opaque, timeout, on_done, context)
            if data is None:  # gathered beside a write begun meanwhile: that writer sends it
                return
            if data is False:
                on_done(context, None, RemotingConnectError(f"connection to {self.addr} is closed"))
                return
            set_to = self._recv_timeout
            if timeout < set_to - 0.001 or timeout > set_to * 2:
                # (set again only when it would end the receive more than 1 ms late, or much too
                # early - one that ends early is waited out with a poll: a send's remaining time,
                # a little less on every retry, costs no system call)
                set_kernel_timeouts(self._rsock, timeout, send=False)
                self._recv_timeout = timeout
            have = self._rhave
            try:
                n = socket_exchange(self._fd, data, self._rview[have:] if have else self._rview, timeout)
            except OSError as e:
                writes.write_failed()
                self._fail(RemotingConnectError(f"exchange with {self.addr} failed: {os_error_text(e)}"))
                return
            more = writes.next_write()  # what other threads gathered meanwhile (this one is the writer)
            if more is not None:
                self._write_out(more)
            if n > 0:
                try:
                    if not have:  # (_consume's usual case inline: nothing kept from the last read)
                        items, consumed = self._read_frames(self._rview[:n], self.max_frame_length)
                        if consumed == n:  # whole answers, nothing kept for the next read
                            self._reads += 1
                        else:
                            self._keep(n, consumed)
                        # (_deliver's usual case inline: every item a send response waited for)
                        answered, rest = deliver_responses(items, self._pending, self._completion_failed)
                        if rest or writes.closing:
                            answered += self._deliver(rest)
                    else:
                        answered = self._consume(n)
                except (OSError, RemotingCommandError) as e:
                    self._fail(self._read_error(e))
                    return
                writes.answered(answered)
            elif n == 0:
                self._fail(RemotingConnectError(f"connection closed by {self.addr}"))
        finally:
            with self._tlock:  # (_release_token's usual case inline)
                if self._reader_gone or self._token_waiters:
                    me = _NOBODY
                else:
                    self._token_owner = _NOBODY
            if me == _NOBODY:
                self._release_token()
            elif self._reader_parked:
                self._reader_wake.set()

    def send_oneway(self, frame: bytes | None, request=None) -> None:
        """Write a request no answer is expected to (its flag says oneway): nothing registered,
        written with what gathered; raises RemotingConnectError when the channel is closed.
        request: as send()'s."""
        if self._intercept is not None and request is not True:
            frame = self._oneway_step(frame, request)
        if self.closed or self.writes.closing:
            raise self._error or RemotingConnectError(f"connection to {self.addr} is closed")
        self.writes.add_response(frame)
        self._flush_blocking()

    def after_offer(self, data, opaque: int, on_done: OnDone, context: Any) -> None:
        """What PipelinedWrites.offer decided, done: False - closed, the request fails here; bytes -
        this thread writes them (and what gathers meanwhile)."""
        if data is False:
            on_done(context, None, RemotingConnectError(f"connection to {self.addr} is closed"))
            return
        self._write_out(data)
        if self.closed:  # closed meanwhile: the failure may have drained the table before this entry
            entry = self._pending.pop(opaque, None)
            if entry is not None:
                self._complete_with(entry, self._error or RemotingConnectError(
                    f"connection to {self.addr} is closed"))

    def send_command(self, request: RemotingCommand, timeout: float, on_done: OnDone, context: Any = None) -> None:
        """send() of a RemotingCommand (its answer through on_done; `invoke` is request -> response
        everywhere in remoting, a completion callback is send's)."""
        request.flag &= ~RESPONSE_FLAG
        body = request.body
        frame = request.encode_header(len(body)) + bytes(body) if body else request.encode_header(0)
        self.send(frame, request.opaque, timeout, on_done, context)

    @property
    def closed(self) -> bool:
        return self.writes.closed

    # the write side's coalescing settings (PipelinedWrites'), read and set through the channel
    coalesce_bytes = property(lambda self: self.writes.coalesce_bytes,
                              lambda self, value: setattr(self.writes, "coalesce_bytes", value))
    coalesce_delay = property(lambda self: self.writes.coalesce_delay,
                              lambda self, value: setattr(self.writes, "coalesce_delay", value))

    def _write_out(self, data: bytes) -> None:
        """A caller's blocking write (this thread is the writer), then whatever gathered meanwhile."""
        writes = self.writes
        try:
            while data is not None:
                self._wsock.sendall(data)
                data = writes.next_write()
            if self.closed:
                self._wsock.close()  # the reader left it to the write in progress
        except OSError as e:
            writes.write_failed()
            # part of a frame may be out: the connection cannot carry another one
            self._fail(RemotingConnectError(f"write to {self.addr} failed: {os_error_text(e)}"))
            if not writes.writing:
                self._wsock.close()

    def _flush_gathered(self, answered: int = 0) -> bool:
        """The reader's write of what gathered, without blocking, after `answered` answers came:
        True when some is left (the socket buffer is full), to be written when the socket is
        writable again."""
        writes = self.writes
        while True:
            data = writes.start_flush(answered)
            answered = 0
            if data is None:
                return False
            try:
                sent = self._rsock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError as e:
                writes.end_flush(None)
                raise ConnectionResetError(f"write to {self.addr} failed: {os_error_text(e)}") from None
            if sent < len(data):  # the rest (maybe part of a frame) goes first next time
                writes.end_flush(data[sent:])
                return True
            writes.end_flush(None)

    # --- waiting callers read ------------------------------------------------------------------------
    def wait(self, future, timeout: float | None = None) -> None:
        """Block until `future` (a concurrent Future completed by one of this channel's answers, whose
        `channel` attribute names this channel while that holds) is done, stops being this channel's,
        the channel closes or `timeout` seconds pass; meanwhile read answers on this thread whenever
        no other thread reads (see the module doc).  Never raises for the future's outcome."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        me = threading.get_ident()
        while not future.done() and future.channel is self and not self.closed:
            if self._token_owner == me:  # a completion on the token holder's thread waits: it reads
                self._read_for(future, deadline)
                return
            with self._tlock:
                got = self._token_owner == _NOBODY
                if got:
                    self._token_owner = me
                else:
                    self._token_waiters.add(future)
            if got:
                try:
                    self._read_for(future, deadline)
                finally:
                    self._release_token()
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                with self._tlock:
                    self._token_waiters.discard(future)
                return
            with self._tlock:  # released meanwhile (and told nobody yet, or us already)? then don't sleep
                waiting = future in self._token_waiters
            if waiting and not future.done():
                # (woken by its completion or by wake(), which a wake() before this sleep is not
                # lost to; bounded all the same: a lost wake-up costs a second, never a hang)
                future.sleep(1.0 if remaining is None else min(remaining, 1.0))
            with self._tlock:
                self._token_waiters.discard(future)

    def read_ready(self) -> int:
        """Read and complete on this thread, without blocking, the answers the connection holds
        now - unless another thread reads - then write what gathered meanwhile (as the reader does
        after answers).  For an event loop that watches the connection (rmq_core.aio): the answers
        to its own sends complete on its thread, no other thread in between.  Answers completed."""
        if self.closed:
            return 0
        with self._tlock:
            if self._token_owner != _NOBODY:
                return 0
            self._token_owner = threading.get_ident()
        answered = 0
        try:
            while not self.closed:
                got = self._read_chunk()
                if got is None:
                    break
                answered += got
                if not self._rfull:  # the receive took all the socket held: no second one to learn that
                    break
            if (answered or self.writes.gathered) and not self.closed:
                self._flush_gathered(answered)
        except (OSError, RemotingCommandError) as e:
            self._fail(self._read_error(e))
        finally:
            self._release_token()
        return answered

    def _release_token(self) -> None:
        with self._tlock:
            gone = self._reader_gone
            self._token_owner = _GONE if gone else _NOBODY
            waiters = self._token_waiters
            if gone:
                self._token_waiters = set()
            elif waiters:
                # one waiter takes the token on: waking them all (threads sharing a consumer: a dozen)
                # made each release a herd of wake-ups for one reader; the others sleep on until
                # their answers complete them, or until a later release picks them
                chosen = next((f for f in waiters if not f.done()), None)
                if chosen is None:
                    waiters = ()
                else:
                    waiters.discard(chosen)
                    waiters = (chosen,)
        if gone:
            self._close_rsock()
        elif self._reader_parked:
            self._reader_wake.set()
        for future in waiters:  # each may take the token now
            future.wake()

    def _read_for(self, future, deadline: float | None) -> None:
        """Read and complete answers on this thread (it holds the token) until `future` is done, is
        no longer this channel's, the channel closes or the deadline passes."""
        poller = None
        fd = self._rsock.fileno()
        while not future.done() and future.channel is self and not self.closed:
            if self.writes.gathered:  # what gathered - maybe the awaited request itself - goes out first
                self._flush_blocking()
            try:
                answered = self._read_chunk()
            except (OSError, RemotingCommandError) as e:
                self._fail(self._read_error(e))
                return
            if answered is not None:
                if answered:
                    self.writes.answered(answered)
                continue
            now = time.monotonic()
            remaining = self.sweep_interval if deadline is None else min(deadline - now, self.sweep_interval)
            if remaining <= 0:
                return
            if now >= self._next_sweep:  # the reader cannot sweep on time while a caller reads
                self._next_sweep = now + self.sweep_interval
                self._sweep(now)
                continue
            if poller is None:
                poller = select.poll()
                poller.register(fd, _POLL_IN)
            poller.poll(remaining * 1000.0)

    def flush(self) -> None:
        """Write what gathered now from this thread, unless another write is in progress: for a
        sender that will wait for the answers anyway (an event loop about to go idle), so the
        gathered requests leave before the first answer comes instead of after it."""
        if self.writes.gathered and not self.closed:
            self._flush_blocking()

    def _flush_blocking(self) -> None:
        """Write what gathered from this thread (it may block), unless another write is in progress."""
        data = self.writes.start_flush()
        if data is not None:
            self._write_out(data)

    def _read_chunk(self) -> int | None:
        """One receive into the read buffer and the completion of every answer it finishes (token
        holder only): how many answers came, None when nothing was there to read.  The frames are
        parsed and the buffer compacted before any completion runs (a completion may read too)."""
        try:
            n = self._rsock.recv_into(self._rview[self._rhave:], 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        if n == 0:
            raise ConnectionResetError(f"connection closed by {self.addr}")
        return self._consume(n)

    def _consume(self, n: int) -> int:
        """`n` bytes just received at the end of the read buffer: every answer they finish
        completed (token holder only); how many answers there were."""
        have = self._rhave
        self._rfull = n == len(self._rview) - have  # the buffer filled: more may be waiting
        have += n
        items, consumed = self._read_frames(self._rview[:have], self.max_frame_length)
        self._keep(have, consumed)
        return self._deliver(items) if items else 0

    def _keep(self, have: int, consumed: int) -> None:
        """`have` bytes in the read buffer, the first `consumed` of them read as frames: what is
        left (the start of the next frame) moves to the front, and the buffer grows to hold that
        frame whole (token holder only)."""
        self._reads += 1
        view = self._rview
        if consumed:
            rest = have - consumed
            if rest:  # (copied: may overlap)
                self._rbuf[:rest] = bytes(view[consumed:have])
            have = rest
        if have >= 4:
            need = 4 + int.from_bytes(self._rbuf[:4], "big", signed=True)
            if need > len(self._rbuf):  # one frame bigger than the buffer: grow it
                view.release()
                self._rbuf.extend(bytes(need - len(self._rbuf)))
                self._rview = memoryview(self._rbuf)
        self._rhave = have

    def _read_error(self, e: BaseException) -> BaseException:
        if isinstance(e, RemotingCommandError):
            return RemotingConnectError(f"bad frame from {self.addr}: {e}")
        return RemotingConnectError(
            f"connection to {self.addr} closed" if self.writes.closing else f"connection to {self.addr} broke: {os_error_text(e)}")

    def _close_rsock(self) -> None:
        self._rview.release()
        self._rsock.close()

    # --- the reader ----------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        sock = self._rsock
        poller = select.poll()
        poller.register(sock.fileno(), _POLL_IN)
        want_out = False
        answered = 0
        waiting_since = 0.0  # when the reader first left readable answers to a caller (0: it did not)
        reads_seen = 0
        parks = 0  # the reader's waits in a row while a caller held the read token
        error: BaseException | None = None
        try:
            while not self.closed:  # (a caller reading may have seen the connection break)
                held = self.writes.held_since
                if held and not want_out:
                    wait = max(0.0, held + self.coalesce_delay - time.monotonic())
                else:
                    wait = self.sweep_interval
                readable = False
                if self._token_owner != _NOBODY:
                    # a caller reads (a sync send's exchange, a waiter): it completes what comes;
                    # waking on every answer it reads would only take the GIL from it
                    parks += 1
                    if parks <= _SHORT_PARKS:
                        self._reader_wake.wait(self.reader_defer or 0.0001)
                    else:  # held long (a long poll's wait): parked until let go, woken by the release
                        self._reader_parked = True
                        if self._token_owner != _NOBODY and self._reader_wake.wait(_PARKED_WAIT):
                            # let go: short waits again (a token passed from caller to caller would
                            # otherwise wake the parked reader on every release)
                            parks = 0
                        self._reader_parked = False
                        if not self.closed:
                            self._reader_wake.clear()
                else:
                    parks = 0
                    for _, event in poller.poll(wait * 1000.0):
                        if event & _POLL_IN:
                            readable = True
                if readable:
                    now = time.monotonic()
                    defer = self.reader_defer
                    if self._reads != reads_seen:  # read by someone since: what is there now came later
                        reads_seen = self._reads
                        waiting_since = 0.0
                    if self._token_owner != _NOBODY:  # a caller reads: let it
                        self._reader_wake.wait(defer or 0.0001)
                    elif defer and now - self.writes.last_send < defer and (
                            not waiting_since or now - waiting_since < defer):
                        # a caller is sending and will likely wait for these answers itself
                        if not waiting_since:
                            waiting_since = now
                        self._reader_wake.wait(max(0.0001, waiting_since + defer - now))
                    else:
                        waiting_since = 0.0
                        with self._tlock:
                            got = self._token_owner == _NOBODY
                            if got:
                                self._token_owner = threading.get_ident()
                        if got:
                            try:
                                answered += self._read_chunk() or 0
                            finally:
                                self._release_token()
                else:
                    waiting_since = 0.0
                if answered or self.writes.gathered:
                    left = self._flush_gathered(answered)
                    answered = 0
                    if left != want_out:
                        want_out = left
                        poller.modify(sock.fileno(), _POLL_IN | select.POLLOUT if left else _POLL_IN)
                now = time.monotonic()
                if now >= self._next_sweep:
                    self._next_sweep = now + self.sweep_interval
                    if self._pending:
                        self._sweep(now)
                    if self.writes.closing and not self._pending:
                        return
        except (RemotingCommandError, OSError) as e:
            error = self._read_error(e)
        except BaseException as e:  # noqa: BLE001 - whatever it was, every waiter must hear of it
            log.exception("pipelined channel to %s: reader failed", self.addr)
            error = RemotingConnectError(f"reader of {self.addr} failed: {e!r}")
        finally:
            self._fail(error or RemotingConnectError(f"connection to {self.addr} closed"))
            # Sockets are closed by the threads that use them, never under a call in progress
            # (a closed descriptor's number may be reused at once): the reading one here, or by a
            # caller holding the read token when it lets go of it; the writers' here unless a write
            # is in progress, which then closes it.
            with self._tlock:
                self._reader_gone = True
                close_now = self._token_owner == _NOBODY
                if close_now:
                    self._token_owner = _GONE
            if close_now:
                self._close_rsock()
            if not self.writes.writing:
                self._wsock.close()


    def _deliver(self, items: list) -> int:
        """Complete the requests these frames answer; returns how many answers there were."""
        pending = self._pending
        # the usual answers (natively read send responses) completed in one native call
        answers, items = deliver_responses(items, pending, self._completion_failed)
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
            self._complete(item)
        if self.writes.closing and not pending:
            with self._drained:
                self._drained.notify_all()
        return answers

    def _completion_failed(self, opaque: int) -> None:  # (inside the except clause: the traceback is logged)
        log.exception("pipelined channel to %s: completion of opaque %d failed", self.addr, opaque)

    def _refuse(self, command: RemotingCommand) -> None:
        log.warning("pipelined channel to %s: unexpected %s request from the peer", self.addr,
                    code_name(command.code))
        response = refusal(command)
        if response is not None:  # written with what gathered, at the end of this read
            self.writes.add_response(response)

    def _sweep(self, now: float) -> None:
        expired = self._expire(now)
        if expired:  # no answer counted on for them any more (one coming late is counted again: >= 0)
            self.writes.answered(len(expired))

    def _fail(self, error: BaseException) -> None:
        """Close for good and fail every pending request with `error` - or with the first failure's
        when the channel was closed already (the reader leaving after a close() drains too)."""
        first = self.writes.mark_closed(error)
        error = self.writes.error
        if first:
            self._error = error
            self._reader_wake.set()
            try:  # wakes the reader (and a blocked writer); the descriptors stay open until they leave
                self._rsock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._fail_pending(error)
        with self._drained:
            self._drained.notify_all()

    # --- life cycle ----------------------------------------------------------------------------------
    def close(self, drain_timeout: float = 0.0) -> None:
        """Stop taking requests; let the pending ones finish for up to drain_timeout seconds, fail
        the rest with RemotingConnectError and join the reader."""
        self.writes.closing = True
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


__all__ = ["PipelinedChannel", "HandedOverChannel", "decode_command_frames", "RemotingError"]
