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

from rmq_core.errors import RemotingConnectError, RemotingError
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.transport import Channel, Listener, OnClose, OnCommand

log = logging.getLogger("rmq.remoting.inproc")

_registry_lock = threading.Lock()
_registry: dict[str, "InprocListener"] = {}


def _schedule(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Run fn(*args) soon on `loop`; False when that loop is gone."""
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

    async def connect(self, address: str, *, max_frame_length: int, timeout: float) -> InprocChannel:
        name = address
        with _registry_lock:
            listener = _registry.get(name)
            known = sorted(_registry)
        if listener is None or listener._closed:
            raise RemotingConnectError(
                f"connect to inproc://{name} failed: no in-process server by that name "
                f"(running: {', '.join(known) or 'none'})")
        n = next(listener._ids)
        client_addr = f"inproc://{name}#{n}"
        client = InprocChannel(asyncio.get_running_loop(), client_addr, listener.address, max_frame_length)
        server = InprocChannel(listener._loop, listener.address, client_addr, listener.max_frame_length)
        client.peer, server.peer = server, client
        if not _schedule(listener._loop, listener._accept, server):
            raise RemotingConnectError(f"connect to inproc://{name} failed: its event loop is closed")
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
