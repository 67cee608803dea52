"""In-process transport: `inproc://name` hands RemotingCommand objects across without encoding.

A process-wide registry maps a name to its listener.  Each end of a connection belongs to the
event loop that created it (client and server may run on different loops in different threads);
a command is delivered by scheduling the receiver's callback on the receiver's loop with
`call_soon_threadsafe`, which also keeps commands in send order.  The receiver gets a copy, so a
sender that mutates or reuses its command afterwards cannot change what was delivered.

A pipelined connection (connect_pipelined: the producer's send pipeline, many requests in flight)
and a blocking one (connect_blocking: BlockingChannelPool's, InprocBlockingChannel.invoke_frame)
also carry encoded frames: their server end hands them to the broker's native send lane when the
broker installed one (set_fast_lane, as on a TCP connection), which answers a
plain send with the response frame the client reads natively; frames the lane declines are
decoded and take the general path, whose RemotingCommand answer is encoded for the reader.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading

from rmq_core.errors import RemotingCommandError, RemotingConnectError, RemotingError
from rmq_core.remoting.blocking import HandedOverBlockingChannel
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.pipelined import HandedOverChannel
from rmq_core.remoting.stream import hand_on
from rmq_core.remoting.transport import Channel, Listener, OnClose, OnCommand

log = logging.getLogger("rmq.remoting.inproc")

_registry_lock = threading.Lock()
_registry: dict[str, "InprocListener"] = {}


def _schedule(loop: asyncio.AbstractEventLoop | None, fn, *args) -> bool:
    """Run fn(*args) soon on `loop`; False when that loop is gone.  loop None: an end with no loop
    (InprocBlockingChannel) takes the call at once, in the caller's thread."""
    if loop is None:
        fn(*args)
        return True
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    try:
        if running is loop:
            loop.call_soon(fn, *args)
        else:
            loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed
        return False
    return True


class InprocChannel(Channel):
    def __init__(self, loop: asyncio.AbstractEventLoop, local_address: str, remote_address: str,
                 max_frame_length: int):
        self._loop = loop
        self.local_address, self.remote_address = local_address, remote_address
        self._max_frame_length = max_frame_length
        self.peer: InprocChannel | None = None
        self._on_command: OnCommand | None = None
        self._on_close: OnClose | None = None
        self._backlog: list = []  # arrived before start() (commands; frames too on a frame channel)
        self._closed = False
        self._close_reported = False
        self._listener: InprocListener | None = None  # set on the server end

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self, on_command: OnCommand, on_close: OnClose) -> None:
        self._on_command, self._on_close = on_command, on_close
        backlog, self._backlog = self._backlog, []
        for item in backlog:  # in arrival order
            self._deliver_held(item)
        if self._closed:
            self._report_close(None)

    def _held(self, item) -> bool:
        """True when `item` is not for the handler now: dropped (this end is closed) or kept for
        start() (not started yet)."""
        if self._closed:
            return True
        if self._on_command is None:
            self._backlog.append(item)
            return True
        return False

    def send_nowait(self, command: RemotingCommand) -> bool:
        peer = self.peer
        if self._closed or peer is None:
            raise self._closed_error()
        if not _schedule(peer._loop, peer._deliver, command.copy()):
            self.close()
            raise self._closed_error()
        return True

    async def send(self, command: RemotingCommand) -> None:
        self.send_nowait(command)

    def _deliver(self, command: RemotingCommand) -> None:
        if self._held(command):
            return
        size = len(command.body) if command.body is not None else 0
        if size > self._max_frame_length:
            log.warning("closing %s: command of %d body bytes exceeds the frame limit %d",
                        self.remote_address, size, self._max_frame_length)
            self.close(RemotingError(f"frame of {size} bytes exceeds {self._max_frame_length}"))
            return
        try:
            self._on_command(command)
        except Exception as e:  # a bug in the handler: drop this connection only, as TCP does
            log.exception("closing %s: error while handling a command", self.remote_address)
            self.close(e)

    def close(self, reason: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._backlog.clear()
        if self._listener is not None:
            self._listener._forget(self)
        peer = self.peer
        if peer is not None:
            _schedule(peer._loop, peer._peer_closed)
        if self._on_close is not None:
            _schedule(self._loop, self._report_close, reason)

    def _peer_closed(self) -> None:
        if not self._closed:
            self.close()

    _deliver_held = _deliver  # (what start() does with what arrived before it)

    def _report_close(self, reason: BaseException | None) -> None:
        if self._close_reported or self._on_close is None:
            return
        self._close_reported = True
        try:
            self._on_close(reason)
        except Exception:
            log.exception("on_close callback failed for %s", self.remote_address)


class InprocFrameChannel(InprocChannel):
    """The server end of a blocking in-proc connection: besides commands (invoke) it takes whole
    encoded frames (invoke_frame) on its loop, through the broker's native lane when it has one."""

    _fast_lane = None  # a native lane that answers some frames itself (set_fast_lane)

    def set_fast_lane(self, lane) -> None:
        """Hand frames to `lane.deliver(data, max_frame_length, on_frame, emit)` first (see
        TcpChannel.set_fast_lane): its answers go to the client as bytes, every frame it does not
        answer is decoded and given to on_command."""
        self._fast_lane = lane

    def _deliver_held(self, item) -> None:
        # what arrived before start(): commands and frames
        if type(item) is bytes:
            self._deliver_frame(item)
        else:
            self._deliver(item)

    def _deliver_frame(self, frame: bytes) -> None:
        """One whole frame, its length prefix included (on this end's loop)."""
        if self._held(frame):
            return
        lane = self._fast_lane
        if lane is not None:
            try:
                consumed, error = lane.deliver(frame, self._max_frame_length, self._on_frame, self._emit)
            except Exception as e:  # a bug in the lane: drop this connection only, as TCP does
                log.exception("closing %s: error while handling a frame", self.remote_address)
                self.close(e)
                return
            if error is None and consumed != len(frame) and not self._closed:
                # (a TCP read may end inside a frame; a frame handed over here is whole or bad)
                error = (f"frame length {int.from_bytes(frame[consumed:consumed + 4], 'big', signed=True)} "
                         f"at byte {consumed} runs past the {len(frame)} bytes given")
            if error is not None and not self._closed:
                log.warning("closing %s: %s", self.remote_address, error)
                self.close(RemotingCommandError(error))
            return
        length = int.from_bytes(frame[:4], "big", signed=True)
        if length != len(frame) - 4 or not 4 <= length <= self._max_frame_length:
            error = (f"frame length {length} outside 4..{self._max_frame_length} or not the "
                     f"{len(frame) - 4} bytes given")
            log.warning("closing %s: %s", self.remote_address, error)
            self.close(RemotingCommandError(error))
            return
        self._on_frame(memoryview(frame)[4:])

    def _on_frame(self, frame) -> bool:
        """A frame (without its length prefix) for the general path; False once closed."""
        return hand_on(frame, self._on_command, self.close, self.remote_address) and not self._closed

    def _emit(self, frames: bytes) -> None:
        """The lane's answers (written during deliver): straight to the waiting client."""
        peer = self.peer
        if peer is not None and not self._closed:
            peer._deliver_frames(frames)

    def write_frames(self, frames: bytes) -> None:
        """The lane's late answers (a SYNC_FLUSH group's, on this end's loop)."""
        self._emit(frames)



class InprocBlockingChannel(HandedOverBlockingChannel):
    """The client end of an in-proc connection used by one thread at a time, without an event loop
    of its own: a request is handed to the server's loop and its answer, taken in the server's
    thread, wakes the waiting caller - two hand-offs instead of four through a client loop.  The
    server sees an ordinary in-proc channel; the rest is remoting's HandedOverBlockingChannel."""

    def __init__(self, address: str, server: InprocFrameChannel):
        self._server = server
        self._open(address, server.remote_address, server.local_address, server._max_frame_length)

    def _hand_over(self, item) -> str | None:
        server = self._server
        deliver = server._deliver_frame if type(item) is bytes else server._deliver
        return None if _schedule(server._loop, deliver, item) else "its event loop is gone"

    def _hand_over_close(self) -> None:
        server = self._server
        _schedule(server._loop, server._peer_closed)


class InprocPipelinedChannel(HandedOverChannel):
    """The client end of an in-proc connection with PipelinedChannel's interface (the producer's
    send pipeline): each request frame handed to the server's loop - through the broker's native
    lane when it has one - and every answer back on the server's thread.  Everything else is
    remoting's HandedOverChannel; this end only hands frames over."""

    def __init__(self, address: str, server: "InprocFrameChannel", *, read_frames, from_command=None,
                 intercept=None, sweep_interval: float = 0.05):
        self._server = server
        self._open(address, server.remote_address, server.local_address, max_frame_length=server._max_frame_length,
                   read_frames=read_frames, from_command=from_command, intercept=intercept,
                   sweep_interval=sweep_interval)

    def _hand_over(self, frame: bytes) -> str | None:
        server = self._server
        return None if _schedule(server._loop, server._deliver_frame, frame) else "its event loop is gone"

    def _hand_over_close(self) -> None:
        server = self._server
        _schedule(server._loop, server._peer_closed)


class InprocListener(Listener):
    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, on_channel, max_frame_length: int):
        self.name = name
        self.address = f"inproc://{name}"
        self._loop = loop
        self._on_channel = on_channel
        self.max_frame_length = max_frame_length
        self._ids = itertools.count(1)
        self._channels: set[InprocChannel] = set()
        self._closed = False

    def _accept(self, channel: InprocChannel) -> None:
        if self._closed:
            channel.close()
            return
        self._channels.add(channel)
        channel._listener = self
        try:
            self._on_channel(channel)
        except Exception:
            log.exception("error accepting inproc connection %s", channel.remote_address)
            channel.close()

    def _forget(self, channel: InprocChannel) -> None:
        self._channels.discard(channel)

    async def close(self) -> None:
        with _registry_lock:
            if _registry.get(self.name) is self:
                del _registry[self.name]
        self._closed = True
        for channel in list(self._channels):
            channel.close()
        self._channels.clear()
        await asyncio.sleep(0)  # let the scheduled close callbacks run


class InprocTransport:
    scheme = "inproc"

    @staticmethod
    def _listener(name: str) -> InprocListener:
        with _registry_lock:
            listener = _registry.get(name)
            known = sorted(_registry)
        if listener is None or listener._closed:
            raise RemotingConnectError(
                f"connect to inproc://{name} failed: no in-process server by that name "
                f"(running: {', '.join(known) or 'none'})")
        return listener

    async def connect(self, address: str, *, max_frame_length: int, timeout: float) -> InprocChannel:
        name = address
        listener = self._listener(name)
        n = next(listener._ids)
        client_addr = f"inproc://{name}#{n}"
        client = InprocChannel(asyncio.get_running_loop(), client_addr, listener.address, max_frame_length)
        server = InprocChannel(listener._loop, listener.address, client_addr, listener.max_frame_length)
        client.peer, server.peer = server, client
        if not _schedule(listener._loop, listener._accept, server):
            raise RemotingConnectError(f"connect to inproc://{name} failed: its event loop is closed")
        return client

    def connect_blocking(self, address: str, *, max_frame_length: int, timeout: float) -> InprocBlockingChannel:
        """A connection for one thread at a time, with no event loop (BlockingChannelPool uses it)."""
        listener = self._listener(address)
        n = next(listener._ids)
        client_addr = f"inproc://{address}#{n}"
        server = InprocFrameChannel(listener._loop, listener.address, client_addr, listener.max_frame_length)
        client = InprocBlockingChannel(listener.address, server)
        server.peer = client
        if not _schedule(listener._loop, listener._accept, server):
            raise RemotingConnectError(f"connect to inproc://{address} failed: its event loop is closed")
        return client

    def connect_pipelined(self, address: str, *, read_frames, from_command=None, intercept=None,
                          connect_timeout: float = 0.0, name: str | None = None) -> InprocPipelinedChannel:
        """A connection with PipelinedChannel's interface (the producer's send pipeline)."""
        listener = self._listener(address)
        n = next(listener._ids)
        client_addr = f"inproc://{address}#{n}"
        server = InprocFrameChannel(listener._loop, listener.address, client_addr, listener.max_frame_length)
        client = InprocPipelinedChannel(listener.address, server, read_frames=read_frames, from_command=from_command,
                                        intercept=intercept)
        server.peer = client
        if not _schedule(listener._loop, listener._accept, server):
            raise RemotingConnectError(f"connect to inproc://{address} failed: its event loop is closed")
        return client

    async def serve(self, address: str, on_channel, *, max_frame_length: int,
                    backlog: int = 0) -> InprocListener:  # (no accept queue in process)
        name = address
        if not name or "#" in name:
            raise RemotingError(f"bad inproc address inproc://{name}: use inproc://<name> without '#'")
        listener = InprocListener(name, asyncio.get_running_loop(), on_channel, max_frame_length)
        with _registry_lock:
            if name in _registry:
                raise RemotingError(f"cannot listen on inproc://{name}: the name is already in use")
            _registry[name] = listener
        return listener
