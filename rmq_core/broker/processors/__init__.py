"""Request processors: a table from request code to handler (RocketMQ's processorTable).

Each processor class lists the codes it serves in `CODES` ({code: method name}); `register`
wires them into a remoting server.  A handler `h(ctx, request)` answers a response (or None) or
an awaitable of it: `async def` handlers, and ones that answer at once when they need not wait
(no coroutine made per request).
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
            server.register_processor(int(code), Handler(getattr(self, name)))


class Handler:
    """The remoting contract (`process_request(ctx, request)`) around one handler: the server's
    dispatch takes its answer, or awaits the awaitable it gives."""

    __slots__ = ("process_request",)

    def __init__(self, fn):
        self.process_request = fn


def born_host_of(ctx) -> tuple[str, int]:
    """The client's address as (ip, port) for BORNHOST; in-proc peers count as loopback."""
    addr = getattr(ctx, "remote_address", "") or ""
    host, _, port = addr.rpartition(":")
    try:
        return (host, int(port)) if host and "//" not in host else ("127.0.0.1", 0)
    except ValueError:
        return ("127.0.0.1", 0)
