"""RemotingServer: accepts connections on any transport and serves requests through processors."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from rmq_core.errors import RemotingError
from rmq_core.remoting.context import DEFAULT_MAX_INFLIGHT, ChannelContext, ProcessorTable
from rmq_core.remoting.transport import DEFAULT_MAX_FRAME_LENGTH, Channel, Listener, resolve_transport

log = logging.getLogger("rmq.remoting")

__all__ = ["RemotingServer", "ChannelContext"]


class RemotingServer:
    """Listens on "host:port", "tcp://host:port" or "inproc://name".

    Each connection gets a ChannelContext; each request runs in its own task, so a long-polling
    pull never holds up other requests on the same connection; responses go out as they finish.
    """

    def __init__(self, address: str, *, name: str = "server", max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH,
                 max_inflight_per_connection: int = DEFAULT_MAX_INFLIGHT):
        self.address = address
        self.name = name
        self.max_frame_length = max_frame_length
        self.max_inflight_per_connection = max_inflight_per_connection
        self._transport, self._location = resolve_transport(address)  # unknown scheme fails here
        self._scheme = self._transport.scheme
        self._table = ProcessorTable(name)
        self._listener: Listener | None = None
        self._contexts: dict[str, ChannelContext] = {}
        self.on_channel_close: list[Callable[[ChannelContext], None]] = []
        self.listen_address: str | None = None

    def register_processor(self, code: int, processor) -> None:
        self._table.register(code, processor)

    def register_default_processor(self, processor) -> None:
        self._table.register_default(processor)

    @property
    def channels(self) -> list[ChannelContext]:
        """The open connections (a broker looks a client's channel up here to call it back)."""
        return list(self._contexts.values())

    @property
    def started(self) -> bool:
        return self._listener is not None

    async def start(self) -> None:
        if self._listener is not None:
            raise RemotingError(f"{self.name} is already listening on {self.listen_address}")
        self._table.enable_rpc_hooks()
        self._listener = await self._transport.serve(
            self._location, self._on_channel, max_frame_length=self.max_frame_length)
        self.listen_address = self._listener.address
        log.info("%s listening on %s", self.name, self.listen_address)

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
        listener, self._listener = self._listener, None
        if listener is None:
            return
        contexts = list(self._contexts.values())
        tasks = [t for ctx in contexts for t in ctx.cancel_tasks()]
        await listener.close()
        for ctx in contexts:
            ctx.close()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # let close callbacks scheduled by the transport run
        log.info("%s on %s stopped", self.name, self.listen_address)

    async def __aenter__(self) -> "RemotingServer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
