"""What a server and a client share: the processor table and the per-connection ChannelContext.

Both ends of a remoting connection can send requests (the broker sends CHECK_TRANSACTION_STATE or
NOTIFY_CONSUMER_IDS_CHANGED to a client), so one ChannelContext does both jobs: it matches
responses to its own pending requests by opaque, and it runs incoming requests through a
ProcessorTable, one task per request, writing each response when its processor finishes.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import itertools
import logging
from typing import Any, Callable

from rmq_core.errors import (
    IllegalArgumentError, RemotingCommandError, RemotingConnectError, RemotingError, RemotingTimeoutError,
)
from rmq_core.remoting.codes import ResponseCode, code_name
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand, SerializeType, next_opaque
from rmq_core.remoting.transport import Channel

log = logging.getLogger("rmq.remoting")

DEFAULT_MAX_INFLIGHT = 16384  # per connection; beyond it requests get SYSTEM_BUSY, not memory growth

_channel_ids = itertools.count(1)


def _processor_callable(processor) -> Callable:
    fn = getattr(processor, "process_request", None)
    if fn is None:
        if not callable(processor):
            raise TypeError(f"processor {processor!r} has no process_request(ctx, request) and is not callable")
        fn = processor
    return fn


class ProcessorTable:
    """request code -> processor (`async process_request(ctx, request)`, optional `reject_request()`)."""

    def __init__(self, owner: str):
        self.owner = owner
        self._processors: dict[int, tuple[Any, Callable]] = {}
        self._default: tuple[Any, Callable] | None = None
        self.rpc_hooks = None  # the pluggy hook relay, when some plugin implements an RPC hook

    def register(self, code: int, processor) -> None:
        self._processors[int(code)] = (processor, _processor_callable(processor))

    def register_default(self, processor) -> None:
        self._default = (processor, _processor_callable(processor))

    def enable_rpc_hooks(self) -> None:
        from rmq_core.plugins import get_plugin_manager, has_impls

        if has_impls("rmq_rpc_before_request") or has_impls("rmq_rpc_after_response"):
            self.rpc_hooks = get_plugin_manager().hook

    async def run(self, ctx: "ChannelContext", request: RemotingCommand) -> RemotingCommand | None:
        """The response to `request` (None for none); never raises except on cancellation."""
        entry = self._processors.get(request.code, self._default)
        if entry is None:
            return request.make_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {request.code} not supported")
        processor, fn = entry
        try:
            reject = getattr(processor, "reject_request", None)
            if reject is not None and reject():
                return request.make_response(
                    ResponseCode.SYSTEM_BUSY, "[REJECTREQUEST]system busy, start flow control for a while")
            hooks = self.rpc_hooks
            if hooks is not None:
                hooks.rmq_rpc_before_request(remote_addr=ctx.remote_address, request=request)
            response = fn(ctx, request)
            if inspect.isawaitable(response):
                response = await response
            if hooks is not None and response is not None:
                hooks.rmq_rpc_after_response(remote_addr=ctx.remote_address, request=request, response=response)
            return response
        except asyncio.CancelledError:
            raise
        except (RemotingCommandError, IllegalArgumentError, json.JSONDecodeError, RecursionError) as e:
            # A malformed request (bad header field, unparsable or absurdly nested JSON body): the
            # caller's mistake, answered without a traceback in our log.
            log.warning("%s: bad %s from %s: %s: %s", self.owner, code_name(request.code), ctx.remote_address,
                        type(e).__name__, e)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        except Exception as e:
            log.exception("%s: processor for %s from %s failed", self.owner, code_name(request.code),
                          ctx.remote_address)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")


def _expire(future: asyncio.Future, code: int, opaque: int, addr: str, timeout: float) -> None:
    if not future.done():
        future.set_exception(RemotingTimeoutError(
            f"no response to {code_name(code)} (opaque {opaque}) from {addr} within {timeout:g}s"))


class ChannelContext:
    """One connection: `invoke` / `invoke_oneway` towards the peer, and the peer's requests served."""

    def __init__(self, channel: Channel, table: ProcessorTable, *, owner: str,
                 on_closed: Callable[["ChannelContext"], None] | None = None,
                 answer_in_peer_type: bool = False, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                 peer_name: str | None = None):
        self.channel = channel
        self.remote_address = channel.remote_address
        # How errors name the peer: the address the caller dialled ("tcp://ns:9876"), else the peer's.
        self.peer_name = peer_name or channel.remote_address
        self.local_address = channel.local_address
        self.channel_id = f"{owner}#{next(_channel_ids)}"
        self.attributes: dict[str, Any] = {}  # per-connection state a processor may keep (client id...)
        self.peer_serialize_type = SerializeType.JSON
        self._table = table
        self._owner = owner
        self._on_closed = on_closed
        self._answer_in_peer_type = answer_in_peer_type
        self._max_inflight = max_inflight
        self._pending: dict[int, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()
        self._closed = False

    def start(self) -> None:
        self.channel.start(self._on_command, self._on_channel_closed)

    @property
    def closed(self) -> bool:
        return self._closed or self.channel.closed

    @property
    def inflight(self) -> int:
        return len(self._tasks)

    # --- towards the peer --------------------------------------------------------------------------
    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send `request` and wait up to `timeout` seconds for the response with its opaque."""
        if self.closed:
            raise RemotingConnectError(f"connection to {self.peer_name} is closed")
        if self._answer_in_peer_type:
            request.serialize_type = self.peer_serialize_type
        request.flag &= ~RESPONSE_FLAG
        if request.opaque in self._pending:  # a re-sent command: give it its own id so answers cannot cross
            request.opaque = next_opaque()
        opaque = request.opaque
        future = self._loop.create_future()
        self._pending[opaque] = future
        # A timer on the future is cheaper than asyncio.wait_for (no extra task per call).
        timer = self._loop.call_later(timeout, _expire, future, request.code, opaque, self.peer_name, timeout)
        try:
            try:
                await self.channel.send(request)
            except RemotingError as e:
                self.close()
                raise RemotingConnectError(f"send {code_name(request.code)} to {self.peer_name} failed: {e}") from None
            return await future
        finally:
            timer.cancel()
            if self._pending.get(opaque) is future:
                del self._pending[opaque]

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        if self.closed:
            raise RemotingConnectError(f"connection to {self.peer_name} is closed")
        if self._answer_in_peer_type:
            request.serialize_type = self.peer_serialize_type
        request.mark_oneway()
        try:
            await self.channel.send(request)
        except RemotingError as e:
            self.close()
            raise RemotingConnectError(f"send {code_name(request.code)} to {self.peer_name} failed: {e}") from None

    def close(self) -> None:
        self.channel.close()

    # --- from the peer -----------------------------------------------------------------------------
    def _on_command(self, command: RemotingCommand) -> None:
        if command.is_response:
            future = self._pending.pop(command.opaque, None)
            if future is not None and not future.done():
                future.set_result(command)
            else:  # a late answer to a timed-out request, or an answer to a oneway the peer answered anyway
                log.debug("%s: dropping unmatched response opaque=%d from %s", self._owner, command.opaque,
                          self.remote_address)
            return
        self.peer_serialize_type = command.serialize_type
        if len(self._tasks) >= self._max_inflight:
            if not command.is_oneway:
                busy = command.make_response(
                    ResponseCode.SYSTEM_BUSY,
                    f"[OVERLOAD]system busy: {len(self._tasks)} requests in flight on this connection")
                self._spawn(self._write(busy))
            return
        self._spawn(self._process(command))

    def _spawn(self, coro) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, request: RemotingCommand) -> None:
        response = await self._table.run(self, request)
        if response is None or request.is_oneway:
            return
        response.opaque = request.opaque
        response.flag |= RESPONSE_FLAG
        response.serialize_type = request.serialize_type
        await self._write(response)

    async def _write(self, response: RemotingCommand) -> None:
        try:
            await self.channel.send(response)
        except RemotingError as e:
            log.debug("%s: cannot answer %s: %s", self._owner, self.remote_address, e)

    def _on_channel_closed(self, reason: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        pending, self._pending = self._pending, {}
        for opaque, future in pending.items():
            if not future.done():
                future.set_exception(RemotingConnectError(
                    f"connection to {self.peer_name} closed before the response (opaque {opaque}) arrived"))
        if self._on_closed is not None:
            self._on_closed(self)

    def cancel_tasks(self) -> list[asyncio.Task]:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks

    def __repr__(self) -> str:
        return f"ChannelContext({self.channel_id} {self.local_address} <- {self.remote_address})"
