"""RemotingServer: accepts connections on any transport and serves requests through processors."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Sequence

from rmq_core.errors import IllegalArgumentError, RemotingError
from rmq_core.remoting.context import DEFAULT_MAX_INFLIGHT, ChannelContext, ProcessorTable
from rmq_core.remoting.transport import DEFAULT_MAX_FRAME_LENGTH, DEFAULT_SERVER_SOCKET_BACKLOG, Channel, Listener, resolve_transport

log = logging.getLogger("rmq.remoting")

__all__ = ["RemotingServer", "ChannelContext"]


class RemotingServer:
    """Listens on "host:port", "tcp://host:port" or "inproc://name" — or on several at once
    (`RemotingServer(["127.0.0.1:9876", "inproc://ns"])`, the embedded mode: in-process clients
    skip the sockets, others use TCP; processors and channels are shared).

    Each connection gets a ChannelContext; each request runs in its own task, so a long-polling
    pull never holds up other requests on the same connection; responses go out as they finish.
    """

    def __init__(self, address: str | Sequence[str], *, name: str = "server",
                 max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH,
                 max_inflight_per_connection: int = DEFAULT_MAX_INFLIGHT,
                 backlog: int = DEFAULT_SERVER_SOCKET_BACKLOG, broker: bool = False, request_steps=()):
        addresses = [address] if isinstance(address, str) else list(address)
        if not addresses:
            raise IllegalArgumentError(f"{name}: no listen address given")
        self.address = address
        self.name = name
        self.max_frame_length = max_frame_length
        self.max_inflight_per_connection = max_inflight_per_connection
        self.backlog = backlog  # serverSocketBacklog
        self._endpoints = [resolve_transport(a) for a in addresses]  # an unknown scheme fails here
        # a broker's server runs the broker-side request steps (see steps.py) on every request
        self._table = ProcessorTable(name, broker=broker)
        if request_steps is not None:  # (a list is kept as is: its owner may add steps before start)
            self._table.request_steps = request_steps if type(request_steps) is list else list(request_steps)
        self._listeners: list[Listener] = []
        self._contexts: dict[str, ChannelContext] = {}
        self.on_channel_close: list[Callable[[ChannelContext], None]] = []
        self.listen_addresses: list[str] = []

    @property
    def listen_address(self) -> str | None:
        """The first bound address ("127.0.0.1:40211" after binding port 0, or "inproc://name")."""
        return self.listen_addresses[0] if self.listen_addresses else None

    def register_processor(self, code: int, processor) -> None:
        self._table.register(code, processor)

    def register_default_processor(self, processor) -> None:
        self._table.register_default(processor)

    def set_rpc_latency(self, recorder) -> None:
        """Time each request into `recorder` (rmq_core.metrics.RpcLatency) while metrics run."""
        self._table.set_rpc_latency(recorder)

    def register_fast_lane(self, factory) -> None:
        """`factory(ctx)` gives a connection's native lane (or None); see ChannelContext.start."""
        self._table.register_fast_lane(factory)

    @property
    def processor_table(self) -> ProcessorTable:
        """Its processors and, on a broker, its `request_steps` (resolved when it starts)."""
        return self._table

    @property
    def request_steps(self) -> list:
        """A broker's own request steps (RequestStep objects), run before the rmq_broker_* hooks."""
        return self._table.request_steps

    @property
    def channels(self) -> list[ChannelContext]:
        """The open connections (a broker looks a client's channel up here to call it back)."""
        return list(self._contexts.values())

    @property
    def started(self) -> bool:
        return bool(self._listeners)

    async def start(self) -> None:
        if self._listeners:
            raise RemotingError(f"{self.name} is already listening on {', '.join(self.listen_addresses)}")
        self._table.enable_steps()
        self.listen_addresses = []
        try:
            for transport, location in self._endpoints:
                listener = await transport.serve(location, self._on_channel, max_frame_length=self.max_frame_length,
                                                 backlog=self.backlog)
                self._listeners.append(listener)
                self.listen_addresses.append(listener.address)
        except BaseException:
            await self.stop()  # do not leave the first listeners bound when a later one fails
            raise
        log.info("%s listening on %s", self.name, ", ".join(self.listen_addresses))

    def _on_channel(self, channel: Channel) -> None:
        ctx = ChannelContext(channel, self._table, owner=self.name, on_closed=self._on_closed,
                             answer_in_peer_type=True, max_inflight=self.max_inflight_per_connection)
        self._contexts[ctx.channel_id] = ctx
        log.debug("%s: connection from %s", self.name, ctx.remote_address)
        ctx.start()

    def _on_closed(self, ctx: ChannelContext) -> None:
        self._contexts.pop(ctx.channel_id, None)
        log.debug("%s: connection from %s closed", self.name, ctx.remote_address)
        for callback in list(self.on_channel_close):
            try:
                callback(ctx)
            except Exception:
                log.exception("%s: on_channel_close callback %r failed", self.name, callback)

    async def stop(self) -> None:
        listeners, self._listeners = self._listeners, []
        if not listeners:
            return
        contexts = list(self._contexts.values())
        tasks = [t for ctx in contexts for t in ctx.cancel_tasks()]
        for listener in listeners:
            await listener.close()
        for ctx in contexts:
            ctx.close()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # let close callbacks scheduled by the transport run
        log.info("%s on %s stopped", self.name, ", ".join(self.listen_addresses))

    async def __aenter__(self) -> "RemotingServer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
