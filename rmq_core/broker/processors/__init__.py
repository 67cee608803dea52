"""Request processors: a table from request code to handler (RocketMQ's processorTable).

Each processor class lists the codes it serves in `CODES` ({code: method name}); `register`
wires them into a remoting server.  Handlers are `async def h(ctx, request) -> response | None`.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (typing only: the controller imports the processors)
    from rmq_core.broker.controller import BrokerController

log = logging.getLogger("rmq.broker")


class Processor:
    CODES: dict = {}

    def __init__(self, controller: BrokerController):
        self.ctrl: BrokerController = controller

    def register(self, server) -> None:
        for code, name in self.CODES.items():
            server.register_processor(int(code), _Bound(self, getattr(self, name)))


class _Bound:
    """Adapter to the remoting contract: an object with `process_request(ctx, request)`."""

    __slots__ = ("owner", "fn")

    def __init__(self, owner, fn):
        self.owner, self.fn = owner, fn

    async def process_request(self, ctx, request):
        return await self.fn(ctx, request)

    def reject_request(self) -> bool:
        return False


def born_host_of(ctx) -> tuple[str, int]:
    """The client's address as (ip, port) for BORNHOST; in-proc peers count as loopback."""
    addr = getattr(ctx, "remote_address", "") or ""
    host, _, port = addr.rpartition(":")
    try:
        return (host, int(port)) if host and "//" not in host else ("127.0.0.1", 0)
    except ValueError:
        return ("127.0.0.1", 0)
