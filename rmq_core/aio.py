"""rmq's asyncio API: the same clients, awaited from your own event loop (asyncio or uvloop).

    from rmq_core import aio, Message
    async with aio.Producer("PG", namesrv=ns) as p:
        r = await p.send(Message("T", b"x"))      # send_batch, send_oneway, send_orderly(msg, selector, arg)
    async with aio.PullConsumer("CG", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
        c.subscribe("T", "*")
        async for msg in c: ...                     # await c.commit() / await c.seek(mq, offset)
    c = aio.PushConsumer("CG", namesrv=ns); c.subscribe("T", "*")
    c.register_message_listener(listener)          # async def listener(msgs) -> ConsumeStatus
    async with c: ...
    async with aio.SimpleConsumer("CG", namesrv=ns, subscriptions={"T": "*"}) as c:
        msgs = await c.receive(16, 30)              # up to 16 messages, invisible for 30 s
        await c.ack(msgs)                           # or each: c.ack(msg), c.change_invisible_duration(msg, 60)

A send is the producer's own async send, made from the loop's thread: written straight onto its
broker's pipelined connection (rmq_core.remoting.pipelined; retries from the completion of the
failed attempt, see rmq_core.client.producer.SendAttempts); no worker thread is involved per
call, and no Task either.  A plain message's send returns an asyncio Future the pipeline's native
completion finishes itself (_SendFuture.finish); others return one the client Future hands its
outcome to through its one lean callback (LeanFuture.add_lean_callback: no Condition made).  Your
loop watches each connection it sent on and reads the answers itself when the socket is readable
(PipelinedChannel.read_ready, as a thread waiting for its answer does), so they complete on the
loop's thread; answers completed elsewhere (the connection's reader thread when the loop was busy,
the client's loop) are handed over through one inbox, drained by one callback per burst
(_LoopInbox), not one wake-up each.  What
could block - starting, stopping, a topic's first route look-up and connect, offset commits and
seeks (broker round trips made by the blocking client API) - runs in the loop's default executor,
so the loop keeps running.  `async for` waits on an asyncio event the pull tasks set; it never
polls in a thread.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import threading
from typing import Any, Awaitable, Callable, Iterable

from asyncio import get_running_loop as _get_running_loop
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED as _FINISHED
from threading import get_ident

from rmq_core.client.futures import LeanFuture
from rmq_core.message import Message, MessageQueue, MixAll, SendResult

__all__ = ["Producer", "PullConsumer", "PushConsumer", "SimpleConsumer"]

_DONE_STATES = frozenset((_FINISHED, CANCELLED, CANCELLED_AND_NOTIFIED))


class _LoopInbox:
    """Client futures finished on other threads, handed to one asyncio loop: appended from any
    thread, moved into their asyncio futures by one loop callback per burst."""

    __slots__ = ("_loop", "_items", "_scheduled", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: collections.deque = collections.deque()
        self._scheduled = False
        self.thread = threading.get_ident()  # the loop's

    def put(self, waiter: asyncio.Future, fut: concurrent.futures.Future) -> None:
        """From another thread than the loop's."""
        self._put((waiter, fut))

    def put_outcome(self, waiter: asyncio.Future, result, error: BaseException | None) -> None:
        """From another thread than the loop's."""
        self._put((waiter, result, error))

    def _put(self, item: tuple) -> None:
        self._items.append(item)
        if not self._scheduled:  # (two threads may both schedule: one drain then finds nothing)
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody awaits any more
                pass

    def _drain(self) -> None:
        self._scheduled = False  # before popping: an item put from now on schedules another drain
        items = self._items
        while items:
            item = items.popleft()
            if len(item) == 2:
                _transfer(*item)
            else:
                _settle(*item)


class _ClientFuture(asyncio.Future):
    """An asyncio Future of a client Future (`source`): cancelling it cancels that one too."""

    __slots__ = ("source", "inbox")

    def cancel(self, *args, **kwargs) -> bool:
        if not super().cancel(*args, **kwargs):
            return False
        self.source.cancel()
        return True

    def take(self, fut: concurrent.futures.Future) -> None:
        """The source's done callback (on whichever thread finished it)."""
        inbox = self.inbox
        if get_ident() == inbox.thread:  # completed on the loop itself (read_ready)
            _transfer(self, fut)
        else:
            inbox.put(self, fut)


class _SendFuture(asyncio.Future):
    """An aio send's Future finished by the send pipeline itself: the native completion (or the
    send's SendAttempts) calls finish(result, error) on whichever thread read the answer - the
    loop's own (read_ready) sets it at once, another hands it over through the inbox.  No client
    Future between; cancelling it abandons the send (a written request cannot be taken back)."""

    channel = None  # the connection its answer comes on (set by the pipeline)
    inbox: _LoopInbox

    def set_channel(self, channel) -> None:
        self.channel = channel

    def finish(self, result, error: BaseException | None = None) -> None:
        inbox = self.inbox
        if get_ident() == inbox.thread:
            _settle(self, result, error)
        else:
            inbox.put_outcome(self, result, error)




def _settle(waiter: asyncio.Future, result, error: BaseException | None) -> None:
    if waiter.done():  # the awaiting task was cancelled
        return
    if error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(result)


def _transfer(waiter: asyncio.Future, fut: concurrent.futures.Future) -> None:
    """Move a finished client Future's outcome into its asyncio Future.  Read from the finished
    Future's fields: its result() / exception() would make a LeanFuture's Condition."""
    if waiter.done():  # the awaiting task was cancelled
        return
    state = fut._state
    if state == _FINISHED:
        error = fut._exception
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(fut._result)
    else:  # cancelled
        waiter.cancel()


class _ChannelWatch:
    """The loop's watch on one pipelined connection: a duplicate of its socket's descriptor (so a
    descriptor number the connection gives up and the system reuses is never the one watched)
    registered with loop.add_reader; on readable, the loop reads the answers (read_ready)."""

    __slots__ = ("channel", "fd", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, channel):
        self.loop, self.channel = loop, channel
        self.fd = os.dup(channel._rsock.fileno())
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        if self.channel.closed:
            self.close()
            return
        self.channel.read_ready()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1


class _OnLoop:
    """What every aio client keeps: the loop it was started on and that loop's inbox."""

    def __init__(self):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: _LoopInbox | None = None
        self._watches: dict[int, _ChannelWatch] = {}  # id(channel) -> the loop's watch on it
        self._flushing: set = set()  # connections whose gathered requests this iteration writes

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._inbox = loop, _LoopInbox(loop)
        elif self._loop is not loop:
            raise RuntimeError(f"{type(self).__name__} is bound to another event loop")
        return loop

    def _future_of(self, fut: concurrent.futures.Future) -> asyncio.Future:
        """The loop's Future of a client Future, completed on the loop; cancelling it cancels the
        client Future (a request already written cannot be taken back: its answer is then dropped).
        No Task and no Condition per call: a LeanFuture hands its outcome over through its one lean
        callback (LeanFuture.add_lean_callback), usually on the loop itself (read_ready)."""
        waiter = _ClientFuture(loop=self._loop)
        waiter.source, waiter.inbox = fut, self._inbox
        if fut._state in _DONE_STATES:
            _transfer(waiter, fut)
            return waiter
        if isinstance(fut, LeanFuture):
            fut.add_lean_callback(waiter.take)
        else:
            fut.add_done_callback(waiter.take)
        self._on_channel(fut.channel if type(fut) is LeanFuture else getattr(fut, "channel", None))
        return waiter

    def _on_channel(self, channel) -> None:
        """The loop reads the connection a send's answer comes on, and writes at the end of this
        iteration what gathered on it."""
        if channel is None:
            return
        if id(channel) not in self._watches:
            self._watch(channel)
        writes = channel.writes  # (None: an in-proc connection)
        if writes is not None and writes.gathered and channel not in self._flushing:
            # the requests this iteration of the loop made leave together at its end (as the
            # waiting thread of a send_async writes what gathered before it reads)
            self._flushing.add(channel)
            self._loop.call_soon(self._flush, channel)

    def _defer(self, fn: Callable, *args) -> None:
        """fn(*args) at the end of this iteration of the loop (what a client gathers until then:
        receives, acks); what it writes on the connections it returns leaves with that iteration's
        other requests, the loop reading their answers."""
        self._loop.call_soon(self._deferred, fn, args)

    def _deferred(self, fn: Callable, args) -> None:
        for channel in fn(*args):
            self._on_channel(channel)

    def _flush(self, channel) -> None:
        self._flushing.discard(channel)
        channel.flush()

    def _watch(self, channel) -> None:
        for key in [k for k, w in self._watches.items() if w.channel.closed]:  # broken ones go
            self._watches.pop(key).close()
        if not channel.closed and getattr(channel, "_rsock", None) is not None:  # (in-proc: nothing to watch)
            try:
                self._watches[id(channel)] = _ChannelWatch(self._loop, channel)
            except (OSError, NotImplementedError, ValueError):  # a loop that cannot watch it: the
                pass  # connection's reader thread completes the answers

    def _unwatch_all(self) -> None:
        for w in self._watches.values():
            w.close()
        self._watches.clear()

    async def _blocking(self, fn: Callable, *args):
        """A blocking client call (start, stop, a commit...) run in the loop's default executor."""
        return await self._bind().run_in_executor(None, fn, *args)


class Producer(_OnLoop):
    """rmq_core.Producer for asyncio: same options (group, namesrv, auto_batch, retries...)."""

    def __init__(self, group: str = MixAll.DEFAULT_PRODUCER_GROUP, namesrv=None, **options):
        super().__init__()
        from rmq_core.client.producer import Producer as _Producer

        self._producer = _Producer(group, namesrv, **options)
        self._warm: dict[str, asyncio.Future] = {}  # topic -> its first route look-up and connect

    @property
    def producer(self):
        """The underlying rmq_core.Producer (its blocking API must not be called on the loop)."""
        return self._producer

    async def start(self) -> "Producer":
        await self._blocking(self._producer.start)
        return self

    async def shutdown(self) -> None:
        try:
            await self._blocking(self._producer.shutdown)
        finally:
            self._unwatch_all()

    async def __aenter__(self) -> "Producer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    def _start(self, topic: str | None, send: Callable[..., concurrent.futures.Future], *args, **kwargs):
        """An awaitable of send(*args, **kwargs): the loop's Future of the producer's async send,
        made at once when the topic's route is ready; a topic's first send waits (in the executor)
        for its route and the connections to its brokers, which the loop's thread must not wait for,
        and is sent from a Task then.  Called outside a running loop (loop.run_until_complete(
        p.send(m))), it returns a coroutine that sends when run."""
        try:
            loop = _get_running_loop()
        except RuntimeError:
            return self._send_when_ready(topic, send, args, kwargs)
        if loop is not self._loop:
            self._bind()
        info = self._producer.topic_publish_info.get(topic)
        if topic is None or (info is not None and info.ok):
            return self._future_of(send(*args, **kwargs))
        return asyncio.ensure_future(self._send_when_ready(topic, send, args, kwargs))

    async def _send_when_ready(self, topic: str | None, send, args, kwargs):
        self._bind()
        if topic is None:
            return await self._future_of(send(*args, **kwargs))
        warm = self._warm.get(topic)
        if warm is None:
            warm = self._warm[topic] = asyncio.ensure_future(self._blocking(self._connect, topic))
        if not warm.done():
            await asyncio.shield(warm)
        elif warm.exception() is not None:  # failed: the next send looks again
            del self._warm[topic]
        return await self._future_of(send(*args, **kwargs))

    def _connect(self, topic: str) -> None:  # in the executor
        from rmq_core.client.producer import SendResponse, read_send_response_frames
        from rmq_core.errors import RemotingError

        p = self._producer
        inst = p.instance
        for mq in p.fetch_publish_message_queues(topic):
            addr = inst.find_broker_addr_in_publish(mq.broker_name)
            if addr is not None and inst.pipelined_send_possible():
                try:
                    inst.send_channel(addr, read_send_response_frames, SendResponse.from_command)
                except RemotingError:  # unreachable: the send's own retries deal with it
                    pass

    # The sends are plain methods returning an awaitable (an asyncio Future): `await p.send(m)`,
    # asyncio.gather(...) and ensure_future(...) take it as they take a coroutine, without a Task per
    # send; cancelling it (or the Task awaiting it) abandons the send.
    def send(self, msg: Message, *, queue: MessageQueue | None = None,
             timeout: float | None = None) -> Awaitable[SendResult]:
        """Send; await the SendResult (retried on another broker as a sync send is)."""
        p = self._producer
        info = p.topic_publish_info.get(msg.topic)
        if info is not None and info.ok and self._loop is not None:  # the usual case, in one step
            try:
                on_loop = _get_running_loop() is self._loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                if p._started and p._batch_accumulator is None and p._goes_native(False, queue, None):
                    # a plain message's native first attempt (what Producer._submit makes first) finishes
                    # the loop's Future itself; None: it does not go so, fut: the general attempt's
                    waiter = _SendFuture(loop=self._loop)
                    waiter.inbox = self._inbox
                    fut = p._pipelined_sender.send(msg, timeout or p.send_msg_timeout, "ASYNC", waiter)
                    if fut is waiter:
                        self._on_channel(waiter.channel)
                        return waiter
                    if fut is not None:
                        return self._future_of(fut)
                return self._future_of(p.send_async(msg, queue=queue, timeout=timeout))
        return self._start(msg.topic, p.send_async, msg, queue=queue, timeout=timeout)

    def send_orderly(self, msg: Message, selector=None, arg: Any = None, *,
                     timeout: float | None = None) -> Awaitable[SendResult]:
        """Ordered send: messages with the same `arg` (default: the keys) go to the same queue."""
        from rmq_core.client.selector import resolve_selector

        return self._start(msg.topic, self._producer.send_async, msg, selector=resolve_selector(selector), arg=arg,
                           timeout=timeout)

    def send_batch(self, msgs: Iterable[Message], *, queue: MessageQueue | None = None,
                   timeout: float | None = None) -> Awaitable[SendResult]:
        msgs = list(msgs)
        return self._start(msgs[0].topic if msgs else None, self._producer.send_batch_async, msgs, queue=queue,
                           timeout=timeout)

    def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None, selector=None,
                    arg: Any = None) -> Awaitable[None]:
        """Returns once the request is written; no answer is awaited."""
        return self._start(msg.topic, self._producer.send_oneway_async, msg, queue=queue, selector=selector, arg=arg)


class PullConsumer(_OnLoop):
    """rmq_core.PullConsumer for asyncio: `async for msg in consumer`."""

    def __init__(self, group: str, namesrv=None, **options):
        super().__init__()
        from rmq_core.client.pull_consumer import PullConsumer as _PullConsumer

        self._consumer = _PullConsumer(group, namesrv, **options)
        self._entered = False
        self._starting: asyncio.Future | None = None
        self._ready = asyncio.Event()
        self._waiting = False

    @property
    def consumer(self):
        return self._consumer

    def subscribe(self, topic: str, expression="*") -> None:
        """Before the consumer started: recorded at once; after: applied in the executor (the
        next iteration waits for it)."""
        c = self._consumer
        if not c._started:
            c.subscribe(topic, expression)
        else:
            self._starting = asyncio.ensure_future(self._blocking(c.subscribe, topic, expression))

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        c = self._consumer
        if not c._started:
            c.assign(mqs)
        else:
            self._starting = asyncio.ensure_future(self._blocking(c.assign, list(mqs)))

    async def start(self) -> "PullConsumer":
        loop = self._bind()
        c = self._consumer

        def ready() -> None:  # on the client's loop: a batch is ready
            if self._waiting:
                self._waiting = False
                loop.call_soon_threadsafe(self._ready.set)

        c.on_ready = ready
        await self._blocking(c.start)
        return self

    async def _ensure_started(self) -> None:
        if self._starting is None:
            if not self._consumer._started:
                self._starting = asyncio.ensure_future(self.start())
            else:
                return
        await asyncio.shield(self._starting)

    async def shutdown(self) -> None:
        self._consumer.on_ready = None
        await self._blocking(self._consumer.shutdown)
        self._ready.set()  # an `async for` waiting ends

    async def __aenter__(self) -> "PullConsumer":
        # started here when already subscribed, else by the first iteration (subscribe() usually
        # comes inside the `async with`)
        self._bind()
        if self._consumer.subscription_inner or self._consumer._assigned_mode:
            await self._ensure_started()
        return self

    async def __aexit__(self, *exc) -> None:
        if self._consumer._started:
            await self.shutdown()

    async def poll(self, timeout: float | None = None) -> list:
        """The next batch (one queue, up to pull_batch_size), or [] after `timeout` s."""
        await self._ensure_started()
        c = self._consumer
        if c.auto_commit_due():
            await self.commit()
        loop = self._loop
        deadline = loop.time() + (c.poll_timeout if timeout is None else timeout)
        while c._started:
            msgs = c.take(0)
            if msgs:
                return msgs
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            self._ready.clear()
            self._waiting = True
            msgs = c.take(0)  # one may have come between the look above and the flag
            if msgs:
                self._waiting = False
                return msgs
            try:
                await asyncio.wait_for(self._ready.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return []

    async def __aiter__(self):
        await self._ensure_started()
        while self._consumer._started:
            for msg in await self.poll(1.0):
                yield msg

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        await self._blocking(self._consumer.commit, offsets)

    async def committed(self, mq: MessageQueue) -> int:
        return await self._blocking(self._consumer.committed, mq)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        await self._blocking(self._consumer.seek, mq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        await self._blocking(self._consumer.seek_to_begin, mq)

    async def seek_to_end(self, mq: MessageQueue) -> None:
        await self._blocking(self._consumer.seek_to_end, mq)

    async def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._blocking(self._consumer.offset_for_timestamp, mq, timestamp_ms)

    def assignment(self) -> set[MessageQueue]:
        return self._consumer.assignment()

    def pause(self, mqs: Iterable[MessageQueue]) -> None:
        self._consumer.pause(mqs)

    def resume(self, mqs: Iterable[MessageQueue]) -> None:
        self._consumer.resume(mqs)


class PushConsumer(_OnLoop):
    """rmq_core.PushConsumer whose listener is a coroutine function run on your loop:
    `async def listener(msgs) -> ConsumeStatus`.  An exception (or RECONSUME_LATER) sends the
    messages back for a retry, as with a plain listener.  The consumer's threads wait for the
    coroutine while the loop runs it, so consumption never blocks the loop."""

    def __init__(self, group: str, namesrv=None, **options):
        super().__init__()
        from rmq_core.client.push_consumer import PushConsumer as _PushConsumer

        self._consumer = _PushConsumer(group, namesrv, **options)
        self._listener: Callable[[list], Awaitable[Any]] | None = None
        self._orderly = False

    @property
    def consumer(self):
        return self._consumer

    def subscribe(self, topic: str, expression="*") -> None:
        if self._consumer._started:
            raise RuntimeError("aio.PushConsumer: subscribe before start()")
        self._consumer.subscribe(topic, expression)

    def register_message_listener(self, listener: Callable[[list], Awaitable[Any]], orderly: bool = False) -> None:
        if not asyncio.iscoroutinefunction(listener) and not asyncio.iscoroutinefunction(
                getattr(listener, "__call__", None)):
            from rmq_core.errors import ConfigError

            raise ConfigError(f"aio message listener {listener!r} is not a coroutine function (async def)")
        self._listener = listener
        self._orderly = orderly

    async def start(self) -> "PushConsumer":
        loop = self._bind()
        listener = self._listener
        if listener is None:
            from rmq_core.errors import MQClientError

            raise MQClientError("aio.PushConsumer: register_message_listener() before start()")

        def on_messages(msgs):  # on a consume thread: the coroutine runs on the caller's loop
            return asyncio.run_coroutine_threadsafe(listener(msgs), loop).result()

        self._consumer.register_message_listener(on_messages, orderly=self._orderly)
        await self._blocking(self._consumer.start)
        return self

    async def shutdown(self) -> None:
        await self._blocking(self._consumer.shutdown)

    async def __aenter__(self) -> "PushConsumer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()


class SimpleConsumer(_OnLoop):
    """rmq_core.SimpleConsumer for asyncio (same options): receive, ack and
    change_invisible_duration return awaitables; the pop, ack or change runs on the client's loop
    (its long poll included), the caller's loop is never blocked."""

    def __init__(self, group: str, namesrv=None, **options):
        super().__init__()
        from rmq_core.client.simple_consumer import SimpleConsumer as _SimpleConsumer

        self._consumer = _SimpleConsumer(group, namesrv, **options)

    @property
    def consumer(self):
        """The underlying rmq_core.SimpleConsumer (its blocking API must not be called on the loop)."""
        return self._consumer

    def subscribe(self, topic: str, expression="*") -> Awaitable[None]:
        """Before start(): recorded at once; after: applied in the executor (await it to know when)."""
        c = self._consumer
        if not c.running:
            c.subscribe(topic, expression)
            fut = self._bind().create_future()
            fut.set_result(None)
            return fut
        return asyncio.ensure_future(self._blocking(c.subscribe, topic, expression))

    def unsubscribe(self, topic: str) -> Awaitable[None]:
        return asyncio.ensure_future(self._blocking(self._consumer.unsubscribe, topic))

    async def start(self) -> "SimpleConsumer":
        await self._blocking(self._consumer.start)
        return self

    async def shutdown(self) -> None:
        await self._blocking(self._consumer.shutdown)

    async def __aenter__(self) -> "SimpleConsumer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    def receive(self, max_message_num: int, invisible_duration) -> Awaitable[list]:
        """Up to max_message_num (1..1024; a RocketMQ broker takes 1..32) messages, invisible for
        invisible_duration (s or timedelta).  The receives tasks make in one iteration of the loop
        share one pop, made at its end."""
        self._bind()
        return self._future_of(self._consumer.receive_async(max_message_num, invisible_duration, self._defer))

    def ack(self, messages) -> Awaitable[None]:
        """A received message, or a list of them.  The acks tasks make in one iteration of the loop
        go at its end as one BATCH_ACK_MESSAGE per broker; each ack still fails or succeeds on its
        own."""
        self._bind()
        return self._future_of(self._consumer.ack_async(messages, self._defer))

    def change_invisible_duration(self, message, invisible_duration) -> Awaitable[None]:
        self._bind()
        return self._future_of(self._consumer.change_invisible_duration_async(message, invisible_duration))
