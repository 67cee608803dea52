"""Consume services: hand buffered messages to the user's listener on the consume threads
(ConsumeThreads: consume_thread_min..consume_thread_max threads fed from one task deque).

Concurrent (ConsumeMessageConcurrentlyService): the listener gets batches of up to
`consume_message_batch_max_size`; RECONSUME_LATER (or an exception) sends the batch back to the
broker (clustering) so it returns through %RETRY%<group>; the lowest unconsumed offset is committed.
A pulled batch goes to the consume threads as a few tasks ("chunks") of listener calls, not as one
task per call: a chunk runs its calls one after another and does the bookkeeping once (process-queue
removal, the commit offset, stats).  How many calls a chunk gets follows the measured cost of a call:
a fast listener gets whole pulled batches (a thread hand-off per call would cost more than the call),
a slow one (I/O) one call per chunk as in Java, so up to consume_thread_max calls run at once; a chunk
that runs past CHUNK_TIME hands its remaining calls back, split by the new estimate.  The listener
batches are cut on the consume thread, not on the event loop that pulls.  Chunks wait in one queue;
"drainer" tasks on the consume threads take them one after another, and more drainers join only
when chunks are slow or every drainer is held in a long listener call.

Orderly (ConsumeMessageOrderlyService): one thread at a time per queue, only while the broker
lock is held; SUSPEND_CURRENT_QUEUE_A_MOMENT retries locally after a pause, up to
max_reconsume_times, then the message goes to %DLQ%<group>.  A thread takes up to
ORDERLY_TAKE_BATCH messages from the process queue at once, calls the listener for each listener
batch of them in order under the queue's consume lock, and commits once per take.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Callable

from rmq_core import plugins
from rmq_core.client.process_queue import ProcessQueue
from rmq_core.client.pull_api import reset_retry_topic
from rmq_core.client.stats import ConsumerStats
from rmq_core.client.trace import ConsumeReturnType
from rmq_core.errors import IllegalArgumentError, MQBrokerError, MQClientError, RemotingError
from rmq_core.message import (
    ConsumeStatus, Message, MessageClientIDSetter, MessageConst, MessageModel, MessageQueue, MixAll,
)
from rmq_core.remoting.codes import RequestCode
from rmq_core.remoting.command import RemotingCommand

log = logging.getLogger("rmq.client.consume")

MAX_TIME_CONSUME_CONTINUOUSLY = 60.0
# A chunk of listener calls should take about this long: long enough that the hand-off to a consume
# thread (a wake-up, the bookkeeping) is small beside it and that a thread made to wait for the
# GIL (5 ms switch interval) does not look like a slow listener, short enough that a slow
# listener's messages soon run in parallel on the other threads.
CHUNK_TIME = 0.01
# Orderly: messages taken from the process queue per take (listener batches are cut from them).
ORDERLY_TAKE_BATCH = 64
# A consume thread beyond consume_thread_min leaves after this long without work (Java: 60 s).
KEEP_ALIVE = 60.0
_OK = (ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.SUCCESS)


def _estimate(old: float, sample: float) -> float:
    """A running estimate of a listener's time that follows a faster sample at once and a slower
    one by at most a quarter per sample: a call that only waited for the GIL, or was paused by the
    scheduler, moves it little; a listener that really got slower is caught up with in a few
    chunks.  (A race between two threads loses a sample, nothing more.)"""
    if old == 0.0 or sample < old:
        return sample
    return min(sample, old * 1.25)


class ConsumeThreads:
    """RocketMQ's consumeExecutor: the threads the listeners run on.  Up to `max_threads` run
    tasks at once; once idle, `min_threads` of them wait for work and the others leave after
    KEEP_ALIVE s without any.

    Tasks wait in one deque; an idle thread waits on a lock of its own, and `execute` hands it a
    task with one release of that lock.  (A ThreadPoolExecutor.submit per pulled batch - a Future,
    a work item, the idle-semaphore bookkeeping on both sides - was the largest cost a pulled
    batch had on the consumer's threads.)  An idle thread that was busy last is woken first, so a
    fast listener keeps running on one warm thread."""

    def __init__(self, name: str, min_threads: int, max_threads: int):
        self.name = name
        self.min_threads = min_threads
        self.max_threads = max_threads
        self._tasks: collections.deque = collections.deque()
        self._idle: list = []  # the wake-up locks of idle threads, the most recently idle last
        self._threads: set = set()
        self._lock = threading.Lock()
        self._shutdown = False
        self._ids = itertools.count()

    def execute(self, fn, *args) -> bool:
        """Run fn(*args) on a consume thread; False when shut down (the task is not run)."""
        with self._lock:
            if self._shutdown:
                return False
            self._tasks.append((fn, args))
            if self._idle:
                wake = self._idle.pop()
            else:
                if len(self._threads) < self.max_threads:
                    self._start_thread()
                return True
        wake.release()
        return True

    def _start_thread(self) -> None:
        t = threading.Thread(target=self._run, name=f"{self.name}_{next(self._ids)}", daemon=True)
        self._threads.add(t)
        t.start()

    def _run(self) -> None:
        me = threading.current_thread()
        wake = threading.Lock()
        wake.acquire()
        tasks = self._tasks
        while True:
            with self._lock:
                if tasks:
                    fn, args = tasks.popleft()
                elif self._shutdown:
                    self._threads.discard(me)
                    return
                else:
                    fn = None
                    self._idle.append(wake)
                    keep = len(self._threads) <= self.min_threads
            if fn is not None:
                try:
                    fn(*args)
                except BaseException:
                    log.exception("consume task %r failed", fn)
                fn = args = None
                continue
            if wake.acquire(timeout=-1 if keep else KEEP_ALIVE):
                continue
            with self._lock:
                if wake in self._idle and len(self._threads) > self.min_threads:
                    self._idle.remove(wake)
                    self._threads.discard(me)
                    return
            wake.acquire()  # handed a task (or shut down) just as the wait ran out

    def shutdown(self, wait: bool = True) -> None:
        """Drop the tasks not started; with `wait`, return once the running ones are done (never
        waits for the calling thread itself)."""
        with self._lock:
            self._shutdown = True
            self._tasks.clear()
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for wake in idle:
            wake.release()
        if wait:
            me = threading.current_thread()
            for t in threads:
                if t is not me:
                    t.join()

    def __len__(self) -> int:
        return len(self._threads)


class _RunningChunk:
    """A chunk of listener calls in progress, as the expired-message cleaner sees it: the messages
    in the listener now and since when (monotonic s), and those consumed but not yet removed.
    (Java stamps CONSUME_START_TIME on every message for this; a record per chunk costs less.)"""

    __slots__ = ("done", "current", "started", "__weakref__")

    def __init__(self):
        self.done: list = []
        self.current = ()
        self.started = 0.0


class _ConsumeContext:
    __slots__ = ("consumer_group", "queue", "messages", "status", "success", "orderly")

    def __init__(self, group, mq, msgs, orderly):
        self.consumer_group, self.queue, self.messages, self.orderly = group, mq, msgs, orderly
        self.status = None
        self.success = False


class _BaseConsumeService:
    def __init__(self, consumer, listener: Callable, threads: ConsumeThreads):
        self.consumer = consumer
        self.listener = listener
        self.threads = threads
        self.group = consumer.group
        self._hooks = plugins.has_impls("rmq_before_consume") or plugins.has_impls("rmq_after_consume")
        self._trace = consumer.trace  # ConsumeMessageTraceHookImpl's notes (None: not traced)
        self.consume_stats = ConsumerStats()  # per topic, for the running info's statusTable
        self.stats = {"sent_back": 0, "dlq": 0}
        self._warned_none = False
        self._stats_lock = threading.Lock()

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    def _call_listener(self, msgs, mq, orderly: bool):
        ctx = None
        if self._hooks:
            ctx = _ConsumeContext(self.group, mq, msgs, orderly)
            plugins.get_plugin_manager().hook.rmq_before_consume(context=ctx)
        trace = self._trace
        token = trace.on_consume_before(msgs) if trace is not None else None
        try:
            status = self.listener(msgs)
        except Exception:
            log.exception("consume message exception, group=%s %s (%d message(s))", self.group, mq, len(msgs))
            status = False  # not None: an exception is not "returned None"
        returned = status
        if status is not ConsumeStatus.CONSUME_SUCCESS and status is not ConsumeStatus.SUCCESS:
            status = self._status_of(status, orderly)
        if trace is not None:
            ok = status in _OK
            trace.on_consume_after(token, ok, ConsumeReturnType.SUCCESS if ok else (
                ConsumeReturnType.EXCEPTION if returned is False else
                ConsumeReturnType.RETURNNULL if returned is None else ConsumeReturnType.FAILED))
        if ctx is not None:
            ctx.status = status
            ctx.success = status in _OK
            plugins.get_plugin_manager().hook.rmq_after_consume(context=ctx)
        return status

    def consume_message_directly(self, msg, broker_name: str | None) -> dict:
        """CONSUME_MESSAGE_DIRECTLY (mqadmin queryMsgById -g -d): the listener called with this one
        message, outside the queues and offsets; the answer is RocketMQ's
        ConsumeMessageDirectlyResult (consumeResult CR_SUCCESS / CR_LATER / CR_RETURN_NULL /
        CR_THROW_EXCEPTION, the traceback as remark)."""
        import traceback

        if broker_name:
            msg.broker_name = broker_name
        reset_retry_topic([msg], self.group)
        begin = time.monotonic()
        remark = None
        try:
            status = self.listener([msg])
        except Exception:  # noqa: BLE001 - reported to the admin as Java reports it
            status, remark, result = None, traceback.format_exc(), "CR_THROW_EXCEPTION"
        else:
            if status is None:
                result = "CR_RETURN_NULL"
            else:
                status = self._status_of(status, self.orderly)
                result = "CR_SUCCESS" if status in _OK else "CR_LATER"
        log.info("consume message directly, group=%s msg=%s: %s", self.group, msg.msg_id, result)
        return {"order": self.orderly, "autoCommit": True, "consumeResult": result, "remark": remark,
                "spentTimeMills": int((time.monotonic() - begin) * 1000)}

    def _status_of(self, status, orderly: bool):
        """A listener's answer other than the usual success, as a ConsumeStatus (None: failed)."""
        if status is None and not self._warned_none:
            self._warned_none = True
            log.warning("the message listener of group %s returned None: treated as %s (return a "
                        "ConsumeStatus)", self.group, "SUSPEND_CURRENT_QUEUE_A_MOMENT" if orderly else "RECONSUME_LATER")
        if isinstance(status, str):
            try:
                return ConsumeStatus(status)
            except ValueError:
                return None
        return status if isinstance(status, ConsumeStatus) else None

    def send_message_back(self, msg, mq: MessageQueue, delay_level: int) -> bool:
        """CONSUMER_SEND_MSG_BACK; if the broker refuses, re-send the message to %RETRY%<group>
        ourselves (as Java's client does).  True when one of the two worked."""
        inst = self.consumer.instance
        timeout = inst.config.mq_client_api_timeout + 5
        try:
            inst.run(self._send_back(msg, mq, delay_level), timeout=timeout)
            return True
        except (MQClientError, MQBrokerError, RemotingError) as e:
            log.warning("send message back failed, group=%s msg=%s: %s; re-sending to the retry topic",
                        self.group, msg.msg_id, e)
        if delay_level < 0:
            return False  # a DLQ request has no retry-topic fallback
        try:
            self._resend_to_retry_topic(msg)
            return True
        except (MQClientError, MQBrokerError, RemotingError, IllegalArgumentError) as e:
            log.warning("re-send to the retry topic failed, group=%s msg=%s: %s", self.group, msg.msg_id, e)
            return False

    def _resend_to_retry_topic(self, msg) -> None:
        """Java's fallback of sendMessageBack: a new message in %RETRY%<group> carrying the
        original's body, flag and properties (RETRY_TOPIC the original topic, ORIGIN_MESSAGE_ID its
        id, a new UNIQ_KEY, delay level 3 + its reconsume times), sent by the client instance's inner
        producer (CLIENT_INNER_PRODUCER) on the send pipeline; the request header carries the
        reconsume times + 1 and the group's max reconsume times."""
        props = dict(msg.properties)
        props.pop(MessageConst.TRANSACTION_PREPARED, None)
        props.setdefault(MessageConst.RETRY_TOPIC, msg.topic)
        props.setdefault(MessageConst.ORIGIN_MESSAGE_ID, msg.msg_id)
        props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = MessageClientIDSetter.create_uniq_id()
        props[MessageConst.DELAY_TIME_LEVEL] = str(3 + msg.reconsume_times)
        props[MessageConst.RECONSUME_TIME] = str(msg.reconsume_times + 1)
        props[MessageConst.MAX_RECONSUME_TIMES] = str(self.consumer.effective_max_reconsume_times())
        copy = Message(MixAll.get_retry_topic(self.group), bytes(msg.body or b""), flag=msg.flag, properties=props,
                       wait_store_msg_ok=props.get(MessageConst.WAIT_STORE_MSG_OK) != "false")
        inst = self.consumer.instance
        inst.inner_producer().resend(copy, timeout=inst.config.mq_client_api_timeout)

    async def _send_back(self, msg, mq: MessageQueue, delay_level: int) -> None:
        inst = self.consumer.instance
        addr = await inst.find_broker_addr_in_publish_async(mq)
        req = RemotingCommand.create_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": msg.commit_log_offset, "group": self.group, "delayLevel": delay_level,
            "originMsgId": msg.msg_id, "originTopic": msg.topic, "unitMode": False,
            "maxReconsumeTimes": self.consumer.effective_max_reconsume_times(),
        })
        await inst.invoke_broker(addr, req)


class ConsumeConcurrentlyService(_BaseConsumeService):
    orderly = False

    def __init__(self, consumer, listener, threads):
        super().__init__(consumer, listener, threads)
        self._retry_topic = MixAll.get_retry_topic(self.group)
        self._call_time = 0.0  # moving average of one listener call's wall time (s); 0 until measured
        self._chunk_time = 0.0  # the same for a whole chunk
        # chunks not yet started, taken by "drainer" tasks on the consume threads: a thread that
        # finishes a chunk takes the next one without a hand-off
        self._chunks: collections.deque = collections.deque()
        self._drainers = 0
        self._drain_lock = threading.Lock()
        self._running: dict = {}  # id -> _RunningChunk of every chunk in progress

    def submit_consume_request(self, msgs, pq: ProcessQueue, mq: MessageQueue, dispatch: bool) -> None:
        if mq.topic == self._retry_topic:  # every message of a pull comes from the queue's topic
            reset_retry_topic(msgs, self.group)
        self._dispatch(msgs, pq, mq)

    def _dispatch(self, msgs: list, pq: ProcessQueue, mq: MessageQueue, first: bool = False) -> None:
        """Queue messages as chunks of listener calls of about CHUNK_TIME each (the listener
        batches are cut on the consume thread), and start a drainer if the running ones will not
        get to them soon.  first: the rest of a chunk that ran long goes ahead of everything
        queued, so messages still start in the order they were pulled (a clean shutdown then
        leaves no consumed message above the commit offset)."""
        n = max(1, self.consumer.consume_message_batch_max_size)
        calls = -(-len(msgs) // n)
        if self._call_time * calls <= CHUNK_TIME:
            chunks = [(msgs, pq, mq)]
        else:
            step = max(1, int(CHUNK_TIME / self._call_time)) * n
            chunks = [(msgs[i:i + step], pq, mq) for i in range(0, len(msgs), step)]
        if first:
            self._chunks.extendleft(reversed(chunks))
        else:
            self._chunks.extend(chunks)
        self._start_drainers()

    def _start_drainers(self) -> None:
        """No drainer running: start one.  Up to consume_thread_max (Java runs that many listeners
        at once), start another when chunks are waiting and either chunks are slow (half of
        CHUNK_TIME or more: a listener that waits on I/O, so another thread pays off) or every
        drainer is inside a listener call that has run past CHUNK_TIME (one stuck listener must
        not hold up the other messages)."""
        with self._drain_lock:
            active = self._drainers
            if not self._chunks:
                return
            if active:
                if active >= self.consumer.consume_thread_max:
                    return
                if self._chunk_time < CHUNK_TIME / 2 and not self._all_drainers_held(active):
                    return
            self._drainers = active + 1
        if not self.threads.execute(self._drain):  # shut down: the consumer is stopping
            with self._drain_lock:
                self._drainers -= 1

    def _all_drainers_held(self, active: int) -> bool:
        running = list(self._running.values())
        if len(running) < active:
            return False  # a drainer between chunks takes the next one soon
        now = time.monotonic()
        return all(c.current and now - c.started > CHUNK_TIME for c in running)

    def check_drainers(self) -> None:
        """Every pull_time_delay_when_flow_control: chunks that wait while no pull comes (all
        queues flow-controlled) behind drainers held in listener calls get a drainer."""
        if self._chunks:
            self._start_drainers()

    def _drain(self) -> None:
        chunks = self._chunks
        try:
            while self.consumer.running:
                try:
                    msgs, pq, mq = chunks.popleft()
                except IndexError:
                    with self._drain_lock:
                        if chunks:
                            continue  # queued after our look, while the queuer saw us running
                        self._drainers -= 1
                        return
                self._consume(msgs, pq, mq)
                if chunks:
                    self._start_drainers()
        except BaseException:
            log.exception("consume thread of group %s failed", self.group)
        # stopping (or failed): chunks left are not consumed, so never committed, and come back
        with self._drain_lock:
            self._drainers -= 1

    def _consume(self, msgs: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        """One chunk: the listener for each listener batch of `msgs` in turn, then the bookkeeping
        once."""
        if pq.dropped:
            return
        chunk = _RunningChunk()
        done = chunk.done  # consumed, still in the process queue until this chunk's bookkeeping
        failed: list = []
        pq.add_running_chunk(chunk)  # what the expired-message cleaner looks at
        self._running[id(chunk)] = chunk
        call_listener = self._call_listener
        monotonic = time.monotonic
        ok, ok_too = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.SUCCESS
        try:
            total = len(msgs)
            n = max(1, self.consumer.consume_message_batch_max_size)
            calls = 0
            now = start = monotonic()
            for i in range(0, total, n):
                batch = msgs if n >= total else msgs[i:i + n]
                chunk.current, chunk.started = batch, now
                status = call_listener(batch, mq, False)
                if pq.dropped:
                    log.info("processQueue dropped while consuming, group=%s %s: %d message(s) will be redelivered",
                             self.group, mq, len(batch) + len(done) + len(failed))
                    return
                if status is ok or status is ok_too:
                    done += batch
                else:
                    failed += batch
                chunk.current = ()
                calls += 1
                now = monotonic()
                if i + n < total and now - start > CHUNK_TIME:  # a slow listener: the rest may run on other threads
                    self._call_time = _estimate(self._call_time, (now - start) / calls)
                    self._dispatch(msgs[i + n:], pq, mq, first=True)
                    break
            else:
                self._call_time = _estimate(self._call_time, (now - start) / calls)
            self.consume_stats.consumed(mq.topic, len(done), len(failed), (now - start) * 1000.0, calls)
            self._process_result(done, failed, pq, mq)
            self._chunk_time = _estimate(self._chunk_time, monotonic() - start)
        finally:
            pq.remove_running_chunk(chunk)
            self._running.pop(id(chunk), None)

    def _process_result(self, done: list, failed: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        """One chunk's bookkeeping: send-back of the failed ones, process-queue removal and the
        commit offset (the lowest message still unconsumed)."""
        if failed:
            if self.consumer.message_model is MessageModel.BROADCASTING:
                for m in failed:
                    log.warning("BROADCASTING, the message consume failed, drop it, %s", m.msg_id)
                done += failed
            else:
                later = []
                for m in failed:
                    # delay level 0: the broker picks 3 + reconsume times
                    if self.send_message_back(m, mq, 0):
                        self._count("sent_back")
                        done.append(m)
                    else:
                        m.reconsume_times = m.reconsume_times + 1
                        later.append(m)
                if later:
                    # the broker would not take them back: consume again here after a pause
                    self.consumer.instance.scheduler.schedule(
                        lambda: self.submit_consume_request(later, pq, mq, True), None,
                        self.consumer.consume_later_delay, "consume later")
        self._remove_consumed(done, pq, mq)

    def _remove_consumed(self, msgs: list, pq: ProcessQueue, mq: MessageQueue) -> None:
        offset = pq.remove_messages(msgs)
        if offset >= 0 and not pq.dropped:
            self.consumer.offset_store.update_offset(mq, offset, True)
        pq.wake_flow_waiter()

    def clean_expired_messages(self, pq: ProcessQueue, mq: MessageQueue, timeout: float) -> int:
        """Send back messages consumed for longer than `timeout` s (they are stuck in a listener)."""
        if self.consumer.message_model is not MessageModel.CLUSTERING:
            return 0
        cleaned = 0
        now = time.monotonic()
        finished = set()
        started = {}
        for chunk in pq.running_chunks():
            finished.update(map(id, list(chunk.done)))
            since = chunk.started
            for m in chunk.current:
                started[id(m)] = since
        for m in pq.first_messages(16):
            if id(m) in finished:
                continue  # its listener returned; its chunk has not done the bookkeeping yet
            since = started.get(id(m))
            if since is None or now - since <= timeout:
                break  # not in a listener yet, or not for long
            log.warning("send expired msg back, group=%s msg=%s queue_offset=%d", self.group, m.msg_id, m.queue_offset)
            if self.send_message_back(m, mq, 3):
                self._count("sent_back")
                self._remove_consumed([m], pq, mq)
                cleaned += 1
        return cleaned


class ConsumeOrderlyService(_BaseConsumeService):
    orderly = True

    def __init__(self, consumer, listener, threads):
        super().__init__(consumer, listener, threads)
        self._retry_topic = MixAll.get_retry_topic(self.group)
        self._mq_locks: dict[MessageQueue, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _mq_lock(self, mq: MessageQueue) -> threading.Lock:
        with self._locks_guard:
            lk = self._mq_locks.get(mq)
            if lk is None:
                lk = self._mq_locks[mq] = threading.Lock()
            return lk

    def submit_consume_request(self, msgs, pq: ProcessQueue, mq: MessageQueue, dispatch: bool) -> None:
        if dispatch:
            self.threads.execute(self._consume, pq, mq)

    def _later(self, pq: ProcessQueue, mq: MessageQueue, delay: float) -> None:
        self.consumer.instance.scheduler.schedule(lambda: self.threads.execute(self._consume, pq, mq), None, delay,
                                                  "orderly consume later")

    def _try_lock_later_and_reconsume(self, pq: ProcessQueue, mq: MessageQueue, delay: float) -> None:
        def job():
            if pq.dropped:
                return
            locked = self.consumer.rebalance.lock(mq)
            self._later(pq, mq, 0.01 if locked else self.consumer.pull_time_delay_when_exception)
        self.consumer.instance.scheduler.schedule(job, None, delay, "orderly lock later")

    def _consume(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        if pq.dropped:
            return
        clustering = self.consumer.message_model is MessageModel.CLUSTERING
        max_live = self.consumer.lock_max_live_time
        with self._mq_lock(mq):
            if clustering and (not pq.locked or pq.is_lock_expired(max_live)):
                self._try_lock_later_and_reconsume(pq, mq, 0.1)
                return
            begin = time.monotonic()
            batch = max(1, self.consumer.consume_message_batch_max_size)
            take = max(batch, ORDERLY_TAKE_BATCH)
            while True:
                if pq.dropped or not self.consumer.running:
                    return
                if clustering and (not pq.locked or pq.is_lock_expired(max_live)):
                    self._try_lock_later_and_reconsume(pq, mq, 0.01)
                    return
                if time.monotonic() - begin > MAX_TIME_CONSUME_CONTINUOUSLY:
                    self._later(pq, mq, 0.01)  # let other queues have the thread
                    return
                msgs = pq.take_messages(take)
                if not msgs:
                    return
                if mq.topic == self._retry_topic:
                    reset_retry_topic(msgs, self.group)
                if not self._consume_taken(msgs, batch, pq, mq):
                    return

    def _consume_taken(self, msgs: list, batch: int, pq: ProcessQueue, mq: MessageQueue) -> bool:
        """Call the listener for each listener batch of the taken messages, in order, under the
        queue's consume lock (held for at most about CHUNK_TIME plus one call, so a rebalance
        waiting to unlock the queue gets it soon), then commit once.  A failed batch to retry puts
        itself and the rest back, consumed again after suspend_current_queue_time; a take running
        past CHUNK_TIME puts back what it has not reached (the loop re-checks the broker lock
        before taking again).  False: stop this queue's loop."""
        n = len(msgs)
        ok = calls = 0
        failed_at = -1
        status = None
        with pq.consume_lock:
            start = time.monotonic()
            for i in range(0, n, batch):
                if pq.dropped:
                    pq.rollback()
                    return False
                status = self._call_listener(msgs if batch >= n else msgs[i:i + batch], mq, True)
                calls += 1
                if status is not ConsumeStatus.SUCCESS and status is not ConsumeStatus.CONSUME_SUCCESS:
                    failed_at = i
                    break
                ok += batch
                if i + batch < n and time.monotonic() - start > CHUNK_TIME:
                    pq.make_messages_to_consume_again(msgs[i + batch:])
                    break
        cont = True
        part = msgs[failed_at:failed_at + batch] if failed_at >= 0 else ()
        self.consume_stats.consumed(mq.topic, min(ok, n), len(part), (time.monotonic() - start) * 1000.0, calls)
        if failed_at >= 0:
            if self._check_reconsume_times(part, mq):
                pq.make_messages_to_consume_again(msgs[failed_at:])
                self._later(pq, mq, self.consumer.suspend_current_queue_time)
                cont = False
            else:  # past max_reconsume_times, it went to the DLQ (consumed); the rest waits for the next take
                pq.make_messages_to_consume_again(msgs[failed_at + batch:])
        offset = pq.commit()
        if offset >= 0 and not pq.dropped:
            self.consumer.offset_store.update_offset(mq, offset, False)
        pq.wake_flow_waiter()
        return cont

    def _check_reconsume_times(self, msgs, mq: MessageQueue) -> bool:
        """True: suspend and retry locally.  Messages past max_reconsume_times go to the DLQ."""
        suspend = False
        max_times = self.consumer.effective_max_reconsume_times()
        for m in msgs:
            if m.reconsume_times >= max_times:
                # delay level -1: the broker stores it straight into %DLQ%<group>
                if self.consumer.message_model is MessageModel.CLUSTERING and self.send_message_back(m, mq, -1):
                    self._count("dlq")
                    log.warning("orderly message %s reached max reconsume times %d: moved to the DLQ",
                                m.msg_id, max_times)
                elif self.consumer.message_model is MessageModel.BROADCASTING:
                    log.warning("BROADCASTING, orderly message %s failed %d times: dropped", m.msg_id, max_times)
                else:
                    suspend = True
                    m.reconsume_times = m.reconsume_times + 1
            else:
                suspend = True
                m.reconsume_times = m.reconsume_times + 1
        return suspend


__all__ = ["ConsumeConcurrentlyService", "ConsumeOrderlyService", "ConsumeThreads"]
