"""In-process transport: `inproc://name` hands RemotingCommand objects across without encoding.

A process-wide registry maps a name to its listener.  Each end of a connection belongs to the
event loop that created it (client and server may run on different loops in different threads);
a command is delivered by scheduling the receiver's callback on the receiver's loop with
`call_soon_threadsafe`, which also keeps commands in send order.  The receiver gets a copy, so a
sender that mutates or reuses its command afterwards cannot change what was delivered.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading

from rmq_core.errors import RemotingConnectError, RemotingError, RemotingTimeoutError
from rmq_core.remoting.codes import code_name
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand
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
        self._backlog: list[RemotingCommand] = []  # arrived before start()
        self._closed = False
        self._close_reported = False
        self._listener: InprocListener | None = None  # set on the server end

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self, on_command: OnCommand, on_close: OnClose) -> None:
        self._on_command, self._on_close = on_command, on_close
        backlog, self._backlog = self._backlog, []
        for command in backlog:
            self._deliver(command)
        if self._closed:
            self._report_close(None)

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
        if self._closed:
            return
        if self._on_command is None:
            self._backlog.append(command)
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

    def _report_close(self, reason: BaseException | None) -> None:
        if self._close_reported or self._on_close is None:
            return
        self._close_reported = True
        try:
            self._on_close(reason)
        except Exception:
            log.exception("on_close callback failed for %s", self.remote_address)


class InprocBlockingChannel:
    """The client end of an in-proc connection used by one thread at a time, without an event loop
    of its own: a request is handed to the server's loop, the server's answer is taken in the
    server's thread and wakes the waiting caller — two hand-offs instead of four through a client
    loop (see rmq_core.remoting.blocking).  The server sees an ordinary in-proc channel."""

    _loop = None  # answers arrive through _schedule(None, ...): at once, in the server's thread

    def __init__(self, address: str, server: InprocChannel):
        self.addr = address
        self.local_address, self.remote_address = server.remote_address, server.local_address
        self._server = server
        self._waiting: int | None = None  # the opaque of the request in flight
        self._response: RemotingCommand | None = None
        self._ready = threading.Lock()
        self._ready.acquire()
        self.closed = False

    def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        if self.closed:
            raise RemotingConnectError(f"connection to {self.addr} is closed")
        request.flag &= ~RESPONSE_FLAG
        self._waiting = request.opaque
        server = self._server
        if not _schedule(server._loop, server._deliver, request.copy()):
            self.close()
            raise RemotingConnectError(f"connection to {self.addr} is closed: its event loop is gone")
        if not self._ready.acquire(timeout=timeout):
            self._waiting = None
            self.close()
            raise RemotingTimeoutError(
                f"no response to {code_name(request.code)} (opaque {request.opaque}) from {self.addr} "
                f"within {timeout:g}s")
        response, self._response = self._response, None
        if response is None:  # woken by a close
            raise RemotingConnectError(
                f"connection to {self.addr} closed before the response (opaque {request.opaque}) arrived")
        return response

    def _deliver(self, command: RemotingCommand) -> None:  # in the server's thread
        if command.flag & RESPONSE_FLAG and command.opaque == self._waiting and not self.closed:
            self._waiting = None
            self._response = command
            self._wake()
        else:  # no requests are served on this end; a late answer is dropped
            log.debug("inproc blocking channel %s: dropping %r", self.local_address, command)

    def _peer_closed(self) -> None:  # in the server's thread
        self._close(notify_server=False)

    def close(self) -> None:
        self._close(notify_server=True)

    def _close(self, notify_server: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if notify_server:
            server = self._server
            _schedule(server._loop, server._peer_closed)
        if self._waiting is not None:
            self._waiting = None
            self._wake()

    def _wake(self) -> None:
        try:
            self._ready.release()
        except RuntimeError:  # already woken (an answer and a close crossing)
            pass


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
        server = InprocChannel(listener._loop, listener.address, client_addr, listener.max_frame_length)
        client = InprocBlockingChannel(listener.address, server)
        server.peer = client
        if not _schedule(listener._loop, listener._accept, server):
            raise RemotingConnectError(f"connect to inproc://{address} failed: its event loop is closed")
        return client

    async def serve(self, address: str, on_channel, *, max_frame_length: int) -> InprocListener:
        name = address
        if not name or "#" in name:
            raise RemotingError(f"bad inproc address inproc://{name}: use inproc://<name> without '#'")
        listener = InprocListener(name, asyncio.get_running_loop(), on_channel, max_frame_length)
        with _registry_lock:
            if name in _registry:
                raise RemotingError(f"cannot listen on inproc://{name}: the name is already in use")
            _registry[name] = listener
        return listener
