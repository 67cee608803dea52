"""What a server and a client share: the processor table and the per-connection ChannelContext.

Both ends of a remoting connection can send requests (the broker sends CHECK_TRANSACTION_STATE or
NOTIFY_CONSUMER_IDS_CHANGED to a client), so one ChannelContext does both jobs: it matches
responses to its own pending requests by opaque, and it runs incoming requests through a
ProcessorTable, writing each response when its processor finishes.  A processor runs at once where\nits request arrived; only one that suspends (a long-polling pull, a sync flush) gets its own task.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import itertools
import logging
import time
import types
from typing import Any, Callable

from rmq_core.errors import (
    IllegalArgumentError, RemotingCommandError, RemotingConnectError, RemotingError, RemotingTimeoutError,
)
from rmq_core.remoting.codes import RequestCode, ResponseCode, code_name, not_supported_remark
from rmq_core.remoting.command import ONEWAY_FLAG, RESPONSE_FLAG, RemotingCommand, SerializeType, next_opaque
from rmq_core.remoting.steps import BROKER, RequestRefused, RequestSteps
from rmq_core.remoting.transport import Channel

log = logging.getLogger("rmq.remoting")

_CoroutineType = types.CoroutineType
_monotonic = time.monotonic

DEFAULT_MAX_INFLIGHT = 16384  # per connection; beyond it requests get SYSTEM_BUSY, not memory growth

_channel_ids = itertools.count(1)


def _processor_entry(processor) -> tuple[Any, Callable, Callable | None]:
    """(processor, its process_request callable, its reject_request or None): looked up once, at
    registration, not per request."""
    fn = getattr(processor, "process_request", None)
    if fn is None:
        if not callable(processor):
            raise TypeError(f"processor {processor!r} has no process_request(ctx, request) and is not callable")
        fn = processor
    return processor, fn, getattr(processor, "reject_request", None)


class ProcessorTable:
    """request code -> processor (`async process_request(ctx, request)`, optional `reject_request()`)."""

    def __init__(self, owner: str, *, broker: bool = False):
        self.owner = owner
        self._processors: dict[int, tuple[Any, Callable, Callable | None]] = {}
        self._default: tuple[Any, Callable, Callable | None] | None = None
        # A broker's table runs the broker-side request steps (steps.py) on every request it
        # serves: its own `request_steps` (the access check) and the rmq_broker_* hooks, resolved
        # into `steps` when its server starts (None: nothing registered, nothing run).
        self.broker = broker
        self.request_steps: list = []
        self.steps: RequestSteps | None = None
        # fast_lane(ctx) -> a native lane for a connection's read chunks, or None (see
        # ChannelContext.start): the broker's send lane answers plain sends without a command
        self.fast_lane_factory: Callable[["ChannelContext"], Any] | None = None
        self.rpc_latency = None  # rmq_core.metrics.RpcLatency while a metrics exporter runs

    def register(self, code: int, processor) -> None:
        self._processors[int(code)] = _processor_entry(processor)

    def register_default(self, processor) -> None:
        """`processor` answers every code nobody registered (None: "not supported" again)."""
        self._default = None if processor is None else _processor_entry(processor)

    def register_fast_lane(self, factory: Callable[["ChannelContext"], Any]) -> None:
        self.fast_lane_factory = factory

    def enable_steps(self) -> None:
        """Resolve the broker-side steps (a broker's table only; at its server's start)."""
        self.steps = RequestSteps.resolve(BROKER, self.request_steps) if self.broker else None

    def set_rpc_latency(self, recorder) -> None:
        """Time every request from arrival to answer into `recorder` (an RpcLatency; None stops).
        The timed dispatch shadows `dispatch` on this table only, so a server without metrics
        pays nothing per request."""
        self.rpc_latency = recorder
        if recorder is None:
            self.__dict__.pop("dispatch", None)
        else:
            self.dispatch = self._timed_dispatch

    def _timed_dispatch(self, ctx: "ChannelContext", request: RemotingCommand):
        recorder = self.rpc_latency
        t0 = _monotonic()
        response = ProcessorTable.dispatch(self, ctx, request)
        if recorder is None:
            return response
        if type(response) is _CoroutineType:
            # (the recorder taken now: a held pull may finish after the exporter stopped)
            return self._timed_finish(response, request.code, t0, recorder)
        recorder.observe(request.code, response.code if response is not None else 0, _monotonic() - t0)
        return response

    @staticmethod
    async def _timed_finish(coro, code: int, t0: float, recorder):
        response = await coro
        recorder.observe(code, response.code if response is not None else 0, _monotonic() - t0)
        return response

    async def run(self, ctx: "ChannelContext", request: RemotingCommand) -> RemotingCommand | None:
        """The response to `request` (None for none); never raises except on cancellation."""
        response = self.dispatch(ctx, request)
        if type(response) is _CoroutineType:
            response = await response
        return response

    def dispatch(self, ctx: "ChannelContext", request: RemotingCommand):
        """run() without a coroutine of its own: the response (None for none) when the processor
        answered at once, else a coroutine giving it; never raises except on cancellation."""
        entry = self._processors.get(request.code, self._default)
        if entry is None:
            return request.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                         not_supported_remark(request.code, self.broker))
        _, fn, reject = entry
        steps = self.steps
        try:
            if reject is not None and reject():
                return request.make_response(
                    ResponseCode.SYSTEM_BUSY, "[REJECTREQUEST]system busy, start flow control for a while")
            if steps is not None:
                steps.run_before(ctx.remote_address, request, ctx)
            response = fn(ctx, request)
            # (a coroutine is by far the usual awaitable; inspect.isawaitable only for the rest)
            if type(response) is _CoroutineType or (
                    response is not None and type(response) is not RemotingCommand and inspect.isawaitable(response)):
                return self.finish_steps(ctx, request, response, steps)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return self._failed(ctx, request, e)
        if steps is None:  # (the usual case: no call)
            return response
        return self._answered(ctx, request, response, steps)

    async def finish_steps(self, ctx: "ChannelContext", request: RemotingCommand, awaitable, steps):
        """`awaitable`'s answer after it passed the after steps (failures answered as dispatch
        answers them): dispatch's for a processor that suspends, the send lane's for a put to wait for."""
        try:
            response = await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return self._failed(ctx, request, e)
        return self._answered(ctx, request, response, steps)

    def _answered(self, ctx: "ChannelContext", request: RemotingCommand, response, steps):
        """`response` after the after steps (a step's failure answered as a processor's is)."""
        if steps is None or response is None:
            return response
        try:
            steps.run_after(ctx.remote_address, request, response, ctx)
        except Exception as e:
            return self._failed(ctx, request, e)
        return response

    def _failed(self, ctx: "ChannelContext", request: RemotingCommand, e: Exception) -> RemotingCommand:
        if isinstance(e, RequestRefused):  # a broker step refused it: answered with its code and remark
            log.debug("%s: %s from %s refused: %s", self.owner, code_name(request.code), ctx.remote_address, e.remark)
            return request.make_response(e.code, e.remark)
        if isinstance(e, (RemotingCommandError, IllegalArgumentError, json.JSONDecodeError, RecursionError)):
            # A malformed request (bad header field, unparsable or absurdly nested JSON body): the
            # caller's mistake, answered without a traceback in our log.
            log.warning("%s: bad %s from %s: %s: %s", self.owner, code_name(request.code), ctx.remote_address,
                        type(e).__name__, e)
        else:
            log.error("%s: processor for %s from %s failed", self.owner, code_name(request.code),
                      ctx.remote_address, exc_info=e)
        return request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")


class Resume:
    """Awaitable that carries on a coroutine which already ran its first step outside any task.

    A request is first driven with `coro.send(None)` right where it arrived: most processors
    finish without suspending, and then no Task is made at all.  When one does suspend, it has
    just yielded a future to the event loop's protocol; a Task awaiting `Resume(coro, yielded)`
    re-yields that very future (so the Task waits on it, and its cancellation reaches it), then
    passes every later value or exception through, exactly as `await` would have.
    """

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro, yielded):
        self._coro, self._yielded = coro, yielded

    def __await__(self):
        coro, yielded = self._coro, self._yielded
        self._coro = self._yielded = None
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation thrown into the awaiting task
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


class _TimedLane:
    """A connection's native lane timed per read chunk while metrics run: the sends it answered
    share the chunk's time (the frames it hands back are timed by dispatch and left out)."""

    __slots__ = ("lane", "latency", "aside")

    def __init__(self, lane, latency):
        self.lane = lane
        self.latency = latency
        self.aside = 0.0

    def __getattr__(self, name):  # handled / declined / waiting ...: the lane's own
        return getattr(self.lane, name)

    def deliver(self, data, max_frame_length, on_frame, emit):
        lane = self.lane
        before = lane.handled
        self.aside = 0.0

        def timed_on_frame(frame):
            t = _monotonic()
            try:
                return on_frame(frame)
            finally:
                self.aside += _monotonic() - t

        t0 = _monotonic()
        try:
            return lane.deliver(data, max_frame_length, timed_on_frame, emit)
        finally:
            n = lane.handled - before
            if n:
                self.latency.observe(RequestCode.SEND_MESSAGE_V2, ResponseCode.SUCCESS, max(0.0, _monotonic() - t0 - self.aside) / n, n)


class _StepFailed(Exception):
    def __init__(self, error: BaseException):
        self.error = error


class _AfterSteps:
    """on_answer of a request sent with client steps: their after() first, then the caller's."""

    __slots__ = ("after", "addr", "request", "on_answer")

    def __init__(self, after, addr, request, on_answer):
        self.after, self.addr, self.request, self.on_answer = after, addr, request, on_answer

    def __call__(self, response) -> None:
        try:
            for step in self.after:
                step(self.addr, self.request, response)
        except Exception as e:  # noqa: BLE001 - fails this request only
            raise _StepFailed(e) from None
        if self.on_answer is not None:
            self.on_answer(response)


class ChannelContext:
    """One connection: `invoke` / `invoke_oneway` towards the peer, and the peer's requests served."""

    def __init__(self, channel: Channel, table: ProcessorTable, *, owner: str,
                 on_closed: Callable[["ChannelContext"], None] | None = None,
                 answer_in_peer_type: bool = False, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                 peer_name: str | None = None, steps: RequestSteps | None = None):
        self.channel = channel
        self._steps = steps  # the client-side steps every request we send passes (None: none)
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
        self._lane = None  # the channel's native lane, if any: its waiting answers count as in flight
        # opaque -> (future, deadline, request code, timeout, on_answer or None) of our requests
        # awaiting an answer
        self._pending: dict[int, tuple[asyncio.Future, float, int, float, Any]] = {}
        # One timer per connection, due at (or before) the earliest pending deadline, instead of a
        # call_later per request: requests mostly share one timeout, so it seldom moves.
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0
        self._tasks: set[asyncio.Task] = set()  # requests whose processor suspended, and slow writes
        self._loop = asyncio.get_running_loop()
        self._closed = False

    def start(self) -> None:
        factory = self._table.fast_lane_factory
        if factory is not None:
            # A transport that reads frames in chunks (TCP) may hand them to a native lane first;
            # the lane gives every frame it does not answer back, in order, to _on_command.
            attach = getattr(self.channel, "set_fast_lane", None)
            if attach is not None:
                lane = factory(self)
                if lane is not None:
                    if self._table.rpc_latency is not None:
                        lane = _TimedLane(lane, self._table.rpc_latency)
                    attach(lane)
                    self._lane = lane
        self.channel.start(self._on_command, self._on_channel_closed)

    @property
    def processor_table(self) -> ProcessorTable:
        return self._table

    @property
    def tasks(self) -> set:
        """The tasks of requests in flight (a native lane reads its size, see `max_inflight`)."""
        return self._tasks

    @property
    def max_inflight(self) -> int:
        return self._max_inflight

    @property
    def closed(self) -> bool:
        return self._closed or self.channel.closed

    @property
    def inflight(self) -> int:
        """Requests from the peer still being processed (or answered) on this connection: tasks,
        and sends a native lane put and answers once their flush is done."""
        lane = self._lane
        return len(self._tasks) + (lane.waiting if lane is not None else 0)

    # --- towards the peer --------------------------------------------------------------------------
    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send `request` and wait up to `timeout` seconds for the response with its opaque (the
        client-side steps run before it leaves and on its answer)."""
        steps = self._steps
        if steps is not None:
            steps.run_before(self.peer_name, request)
        opaque, future = self._expect(request, timeout)
        try:
            channel = self.channel
            if not channel.send_nowait(request):
                await channel.send(request)
        except RemotingError as e:
            self._forget(opaque, future)
            self.close()
            raise RemotingConnectError(f"send {code_name(request.code)} to {self.peer_name} failed: {e}") from None
        except BaseException:
            self._forget(opaque, future)
            raise
        try:
            response = await future
        except BaseException:  # cancelled by the caller (answers and timeouts remove the entry themselves)
            self._forget(opaque, future)
            raise
        if steps is not None:
            for step in steps.after:
                step(self.peer_name, request, response)
        return response

    def request_nowait(self, request: RemotingCommand, timeout: float,
                       on_answer: Callable[[RemotingCommand], None] | None = None) -> asyncio.Future | None:
        """Put `request` on the wire now and return the future of its response, to be awaited
        later; None, with nothing sent, when the write buffer is full.  `on_answer(response)` is
        called inside the read that brought the answer, before the future's waiter runs: what it
        sends joins the write at the end of that read (a consumer sends a queue's next pull there,
        before it decodes the pulled messages).  The client-side steps run as invoke's do (their
        after() before on_answer; one that raises fails the request)."""
        steps = self._steps
        if steps is not None:
            steps.run_before(self.peer_name, request)
            on_answer = _AfterSteps(steps.after, self.peer_name, request, on_answer)
        opaque, future = self._expect(request, timeout, on_answer)
        try:
            sent = self.channel.send_nowait(request)
        except RemotingError as e:
            self._forget(opaque, future)
            self.close()
            raise RemotingConnectError(f"send {code_name(request.code)} to {self.peer_name} failed: {e}") from None
        if not sent:
            if steps is not None:  # the steps ran: it goes out as it is once the buffer drains
                self._spawn(self._send_later(request, opaque, future))
                return future
            self._forget(opaque, future)
            return None
        return future

    async def _send_later(self, request: RemotingCommand, opaque: int, future: asyncio.Future) -> None:
        try:
            await self.channel.send(request)
        except RemotingError as e:
            self._forget(opaque, future)
            if not future.done():
                future.set_exception(RemotingConnectError(
                    f"send {code_name(request.code)} to {self.peer_name} failed: {e}"))
            self.close()

    def _expect(self, request: RemotingCommand, timeout: float, on_answer=None) -> tuple[int, asyncio.Future]:
        """Register `request` as awaiting its answer for `timeout` s: (its opaque, the future)."""
        if self.closed:
            raise RemotingConnectError(f"connection to {self.peer_name} is closed")
        if self._answer_in_peer_type:
            request.serialize_type = self.peer_serialize_type
        request.flag &= ~RESPONSE_FLAG
        pending = self._pending
        if request.opaque in pending:  # a re-sent command: give it its own id so answers cannot cross
            request.opaque = next_opaque()
        opaque = request.opaque
        loop = self._loop
        future = loop.create_future()
        deadline = loop.time() + timeout
        pending[opaque] = (future, deadline, request.code, timeout, on_answer)
        if self._sweep_handle is None or deadline < self._sweep_at:
            self._arm_sweep(deadline)
        return opaque, future

    def _forget(self, opaque: int, future: asyncio.Future) -> None:
        entry = self._pending.get(opaque)
        if entry is not None and entry[0] is future:
            del self._pending[opaque]

    def _arm_sweep(self, when: float) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = when
        self._sweep_handle = self._loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Fail the requests whose deadline passed; re-arm for the earliest one left."""
        self._sweep_handle = None
        now = self._loop.time()
        expired = [opaque for opaque, entry in self._pending.items() if entry[1] <= now]
        for opaque in expired:
            future, _, code, timeout, _ = self._pending.pop(opaque)
            if not future.done():
                future.set_exception(RemotingTimeoutError(
                    f"no response to {code_name(code)} (opaque {opaque}) from {self.peer_name} within {timeout:g}s"))
        if self._pending and not self._closed:
            self._arm_sweep(min(entry[1] for entry in self._pending.values()))

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        if self.closed:
            raise RemotingConnectError(f"connection to {self.peer_name} is closed")
        if self._answer_in_peer_type:
            request.serialize_type = self.peer_serialize_type
        request.mark_oneway()
        steps = self._steps
        if steps is not None:
            steps.run_before(self.peer_name, request)
        try:
            channel = self.channel
            if not channel.send_nowait(request):
                await channel.send(request)
        except RemotingError as e:
            self.close()
            raise RemotingConnectError(f"send {code_name(request.code)} to {self.peer_name} failed: {e}") from None

    def close(self) -> None:
        self.channel.close()

    # --- from the peer -----------------------------------------------------------------------------
    def _on_command(self, command: RemotingCommand) -> None:
        if command.flag & RESPONSE_FLAG:
            entry = self._pending.pop(command.opaque, None)
            if entry is not None and not entry[0].done():
                if entry[4] is not None:
                    try:
                        entry[4](command)
                    except _StepFailed as e:  # a client step refused the answer: the request fails
                        entry[0].set_exception(e.error)
                        return
                    except Exception:  # its request's waiter still gets the answer
                        log.exception("%s: on_answer callback for opaque=%d failed", self._owner, command.opaque)
                entry[0].set_result(command)
            else:  # a late answer to a timed-out request, or an answer to a oneway the peer answered anyway
                log.debug("%s: dropping unmatched response opaque=%d from %s", self._owner, command.opaque,
                          self.remote_address)
            return
        self.peer_serialize_type = command.serialize_type
        lane = self._lane
        if len(self._tasks) + (lane.waiting if lane is not None else 0) >= self._max_inflight:  # (inflight)
            if not command.is_oneway:
                busy = command.make_response(
                    ResponseCode.SYSTEM_BUSY,
                    f"[OVERLOAD]system busy: {self.inflight} requests in flight on this connection")
                self._send_response(busy)
            return
        # Most processors answer at once (no coroutine at all); an awaitable answer gets its first
        # step run here, and only one that suspends costs a Task (see Resume).
        try:
            response = self._table.dispatch(self, command)
        except asyncio.CancelledError:
            return
        if type(response) is not _CoroutineType:
            if response is not None and not command.flag & ONEWAY_FLAG:  # _answer, inline
                response.opaque = command.opaque
                response.flag |= RESPONSE_FLAG
                response.serialize_type = command.serialize_type
                self._send_response(response)
            return
        self.answer_later(command, response)

    def answer_later(self, request: RemotingCommand, coro) -> None:
        """Answer `request` with what coroutine `coro` returns: run at once up to its first
        suspension, a task only if it suspends (_on_command's way with a processor's coroutine)."""
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            self._answer(request, stop.value)
            return
        except asyncio.CancelledError:
            return
        self._spawn(self._finish(request, coro, yielded))

    def answer_failure(self, request: RemotingCommand, exc: Exception) -> None:
        """Answer `request` whose handling raised `exc` as ProcessorTable.dispatch does (logged,
        SYSTEM_ERROR naming the exception; a RequestRefused with its code and remark)."""
        self._answer(request, self._table._failed(self, request, exc))

    def _spawn(self, coro) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, request: RemotingCommand, coro, yielded) -> None:
        self._answer(request, await Resume(coro, yielded))

    def _answer(self, request: RemotingCommand, response: RemotingCommand | None) -> None:
        if response is None or request.flag & ONEWAY_FLAG:
            return
        response.opaque = request.opaque
        response.flag |= RESPONSE_FLAG
        response.serialize_type = request.serialize_type
        self._send_response(response)

    def _send_response(self, response: RemotingCommand) -> None:
        try:
            if self.channel.send_nowait(response):
                return
        except RemotingCommandError as e:  # e.g. a field out of range for the binary header
            log.warning("%s: cannot encode the answer to %s: %s", self._owner, self.remote_address, e)
            return
        except RemotingError as e:
            log.debug("%s: cannot answer %s: %s", self._owner, self.remote_address, e)
            return
        self._spawn(self._write(response))  # the write buffer is full: wait for it, counted in flight

    async def _write(self, response: RemotingCommand) -> None:
        try:
            await self.channel.send(response)
        except RemotingError as e:
            log.debug("%s: cannot answer %s: %s", self._owner, self.remote_address, e)

    def _on_channel_closed(self, reason: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        pending, self._pending = self._pending, {}
        for opaque, entry in pending.items():
            future = entry[0]
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
