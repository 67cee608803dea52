"""RemotingClient: one long-lived connection per address, requests multiplexed by opaque."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from rmq_core.errors import RemotingConnectError, RemotingTimeoutError
from rmq_core.remoting.codes import code_name
from rmq_core.remoting.aliases import resolve_inproc_alias
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.context import DEFAULT_MAX_INFLIGHT, ChannelContext, ProcessorTable
from rmq_core.remoting.pipelined import PipelinedChannel
from rmq_core.remoting.steps import CLIENT, RequestSteps
from rmq_core.remoting.transport import DEFAULT_MAX_FRAME_LENGTH, resolve_transport

log = logging.getLogger("rmq.remoting")


class RemotingClient:
    """Connects lazily to each address it is asked to invoke and reconnects after a failure.

    An address is "host:port", "tcp://host:port" or "inproc://name".  A client belongs to the
    event loop it is first used on.  Requests the peer sends back (broker -> client) are served by
    processors registered here, exactly as on a server.  Every request sent passes the
    client-side steps (the rmq_client_* hooks, then `request_steps`), on every route.  With
    `local_aliases`, an address a server of this process registered an alias for (an embedded
    broker's "host:port") is reached through that alias (remoting/aliases.py).
    """

    def __init__(self, *, name: str = "client", connect_timeout: float = 3.0,
                 max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH,
                 max_inflight_per_connection: int = DEFAULT_MAX_INFLIGHT, request_steps=(),
                 local_aliases: bool = False):
        self.name = name
        self.connect_timeout = connect_timeout
        self.max_frame_length = max_frame_length
        self.max_inflight_per_connection = max_inflight_per_connection
        self._table = ProcessorTable(name)
        self.request_steps = list(request_steps or ())
        self.steps = RequestSteps.resolve(CLIENT, self.request_steps)  # (None: no step registered)
        self._contexts: dict[str, ChannelContext] = {}
        self._connect_locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        self.local_aliases = local_aliases
        self.on_channel_close: list[Callable[[ChannelContext], None]] = []

    def register_processor(self, code: int, processor) -> None:
        self._table.register(code, processor)

    def register_default_processor(self, processor) -> None:
        self._table.register_default(processor)

    def connected_addresses(self) -> list[str]:
        return [addr for addr, ctx in self._contexts.items() if not ctx.closed]

    def target(self, addr: str) -> str:
        """The address `addr` is reached at (its alias, with local_aliases)."""
        return resolve_inproc_alias(addr) if self.local_aliases else addr

    def is_connected(self, addr: str) -> bool:
        """True when invoke(addr, ...) will not have to connect first."""
        ctx = self._contexts.get(self.target(addr))
        return ctx is not None and not ctx.closed

    def connect_pipelined(self, addr: str, *, read_frames, from_command=None, name: str | None = None):
        """A pipelined connection to `addr` (rmq_core.remoting.pipelined: many requests in
        flight, written from the caller's thread) over its transport's `connect_pipelined`, with
        this client's request steps as its interception step."""
        target = self.target(addr)
        transport, location = resolve_transport(target)
        steps = self.steps
        kw = dict(read_frames=read_frames, from_command=from_command, connect_timeout=self.connect_timeout,
                  intercept=None if steps is None else steps.frame_step(target), name=name)
        connect = getattr(transport, "connect_pipelined", None)
        if connect is not None:  # a transport that moves no bytes has its own (inproc)
            return connect(location, **kw)
        if hasattr(transport, "open_socket"):  # a byte stream: remoting's pipelined channel on it
            return PipelinedChannel(target, **kw)
        raise RemotingConnectError(f"cannot open a pipelined connection to {target}: transport "
                                   f"{getattr(transport, 'scheme', transport)!r} offers none")

    async def get_channel(self, addr: str, timeout: float | None = None) -> ChannelContext:
        """The open connection to `addr`, connecting if needed (RemotingConnectError names addr)."""
        if self._closed:
            raise RemotingConnectError(f"{self.name} is closed; cannot connect to {addr}")
        ctx = self._contexts.get(addr)
        if ctx is not None and not ctx.closed:
            return ctx
        lock = self._connect_locks.get(addr)
        if lock is None:
            lock = self._connect_locks[addr] = asyncio.Lock()
        async with lock:
            ctx = self._contexts.get(addr)
            if ctx is not None and not ctx.closed:
                return ctx
            transport, location = resolve_transport(addr)
            connect_timeout = self.connect_timeout if timeout is None else min(self.connect_timeout, timeout)
            try:
                channel = await transport.connect(location, max_frame_length=self.max_frame_length,
                                                  timeout=connect_timeout)
            except RemotingConnectError:
                raise
            except OSError as e:
                raise RemotingConnectError.connecting(addr, e) from None
            ctx = ChannelContext(channel, self._table, owner=self.name, on_closed=self._on_closed,
                                 max_inflight=self.max_inflight_per_connection, peer_name=addr, steps=self.steps)
            ctx.attributes["addr"] = addr
            self._contexts[addr] = ctx
            ctx.start()
            log.debug("%s: connected to %s", self.name, addr)
            return ctx

    async def invoke(self, addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send `request` to `addr` and return the response; the timeout covers connecting too."""
        if self.local_aliases:
            addr = resolve_inproc_alias(addr)
        ctx = self._contexts.get(addr)
        if ctx is not None and not ctx.closed and not self._closed:
            remaining = timeout  # connected already: no clock reads on the hot path
        else:
            deadline = time.monotonic() + timeout
            ctx = await self.get_channel(addr, timeout)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RemotingTimeoutError(
                    f"no response to {code_name(request.code)} from {addr} within {timeout:g}s (connecting took it all)")
        return await ctx.invoke(request, remaining)

    def request_nowait(self, addr: str, request: RemotingCommand, timeout: float,
                       on_answer=None) -> asyncio.Future | None:
        """Send `request` now over the open connection to `addr` and return the future of its
        response (ChannelContext.request_nowait); None, with nothing sent, when there is no open
        connection or the write buffer is full: then use invoke()."""
        if self.local_aliases:
            addr = resolve_inproc_alias(addr)
        ctx = self._contexts.get(addr)
        if ctx is None or ctx.closed or self._closed:
            return None
        return ctx.request_nowait(request, timeout, on_answer)

    async def invoke_oneway(self, addr: str, request: RemotingCommand) -> None:
        ctx = await self.get_channel(self.target(addr))
        await ctx.invoke_oneway(request)

    def _on_closed(self, ctx: ChannelContext) -> None:
        addr = ctx.attributes.get("addr")
        if addr is not None and self._contexts.get(addr) is ctx:
            del self._contexts[addr]
        for callback in list(self.on_channel_close):
            try:
                callback(ctx)
            except Exception:
                log.exception("%s: on_channel_close callback %r failed", self.name, callback)

    async def close(self) -> None:
        self._closed = True
        contexts = list(self._contexts.values())
        self._contexts.clear()
        tasks = [t for ctx in contexts for t in ctx.cancel_tasks()]
        for ctx in contexts:
            ctx.close()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)

    async def __aenter__(self) -> "RemotingClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
