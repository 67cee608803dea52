"""PushConsumer (RocketMQ's DefaultMQPushConsumer): long-polling pull dressed as push.

One pull task per owned queue runs on the client event loop; pulled messages go into the queue's
ProcessQueue and, as consume requests, to the consume thread pool where the listener runs.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

from rmq_core.client.consumer_base import READ_FROM_MEMORY, ConsumerBase
from rmq_core.client.consume_service import ConsumeConcurrentlyService, ConsumeOrderlyService, ConsumeThreads
from rmq_core.client.process_queue import ProcessQueue
from rmq_core.client.subscription import retry_subscription
from rmq_core.common.sysflag import build_pull_sys_flag
from rmq_core.errors import ConfigError, MQClientError
from rmq_core.loops import cancel_and_wait
from rmq_core.message import MessageModel, MessageQueue, MixAll, PullStatus

log = logging.getLogger("rmq.client.push")

def _settle(fut) -> None:
    if not fut.done():
        fut.set_result(None)


class PushConsumer(ConsumerBase):
    """Subscribe, register a listener, start: messages are pushed to the listener.

    Keywords besides its own settings: ConsumerBase.SHARED_SETTINGS (message_model,
    consume_from_where, allocate_strategy, offset_store, ...) and the client's (ClientConfig).

    >>> c = PushConsumer("CG", namesrv="127.0.0.1:9876", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    >>> c.subscribe("TopicA", "TagA || TagB")
    >>> c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    >>> c.start()
    """

    consume_type = "CONSUME_PASSIVELY"

    def __init__(self, group: str, namesrv=None, *,
                 consume_thread_min: int = 20,
                 consume_thread_max: int = 20,
                 consume_message_batch_max_size: int = 1,
                 pull_batch_size: int = 32,
                 pull_interval: float = 0.0,
                 pull_threshold_for_queue: int = 1000,
                 pull_threshold_size_for_queue: int = 100,
                 consume_concurrently_max_span: int = 2000,
                 max_reconsume_times: int = -1,
                 suspend_current_queue_time: float = 1.0,
                 consume_timeout: float = 15 * 60.0,
                 consume_later_delay: float = 5.0,
                 lock_interval: float = 20.0,
                 lock_max_live_time: float = 30.0,
                 **client_options):
        super().__init__(group, namesrv, client_options)
        checks = {
            "consume_thread_min": (consume_thread_min, 1, 1000), "consume_thread_max": (consume_thread_max, 1, 1000),
            "consume_message_batch_max_size": (consume_message_batch_max_size, 1, 1024),
            "pull_batch_size": (pull_batch_size, 1, 1024),
            "pull_threshold_for_queue": (pull_threshold_for_queue, 1, 65535),
            "pull_threshold_size_for_queue": (pull_threshold_size_for_queue, 1, 1024),
            "consume_concurrently_max_span": (consume_concurrently_max_span, 1, 65535),
            "max_reconsume_times": (max_reconsume_times, -1, 1 << 31),
        }
        for name, (value, lo, hi) in checks.items():
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ConfigError(f"bad {name} {value!r}: must be an int within {lo}..{hi}")
        if consume_thread_min > consume_thread_max:
            raise ConfigError(f"consume_thread_min {consume_thread_min} is larger than consume_thread_max "
                              f"{consume_thread_max}")
        for name, value in (("consume_timeout", consume_timeout), ("lock_interval", lock_interval),
                            ("lock_max_live_time", lock_max_live_time)):
            if value <= 0:
                raise ConfigError(f"bad {name} {value!r}: must be > 0")
        self.consume_thread_min = consume_thread_min
        self.consume_thread_max = consume_thread_max
        self.consume_message_batch_max_size = consume_message_batch_max_size
        self.pull_batch_size = pull_batch_size
        self.pull_interval = pull_interval
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue = pull_threshold_size_for_queue
        self.consume_concurrently_max_span = consume_concurrently_max_span
        self.max_reconsume_times = max_reconsume_times
        self.suspend_current_queue_time = suspend_current_queue_time
        self.consume_timeout = consume_timeout
        self.consume_later_delay = consume_later_delay
        self.lock_interval = lock_interval
        self.lock_max_live_time = lock_max_live_time
        self._listener: Callable | None = None
        self._orderly = False
        self._threads: ConsumeThreads | None = None
        self.consume_service = None
        self._pull_tasks: dict[MessageQueue, asyncio.Task] = {}
        self._jobs: list[int] = []
        self._paused = False
        self._resume_waiters: set = set()  # futures of pull loops waiting while paused
        self.flow_control_times = 0

    # --- configuration ---------------------------------------------------------------------------
    def register_message_listener(self, listener: Callable, orderly: bool = False) -> None:
        """listener(list[MessageExt]) -> ConsumeStatus.  orderly=True: one queue is consumed by one
        thread at a time, in queue order (return SUCCESS or SUSPEND_CURRENT_QUEUE_A_MOMENT)."""
        if not callable(listener):
            raise ConfigError(f"message listener {listener!r} is not callable")
        if self._started:
            raise MQClientError("register the message listener before start()")
        self._listener = listener
        self._orderly = bool(orderly)

    def effective_max_reconsume_times(self) -> int:
        if self.max_reconsume_times == -1:
            return 2**31 - 1 if self._orderly else 16
        return self.max_reconsume_times

    # --- life cycle ------------------------------------------------------------------------------
    def start(self) -> "PushConsumer":
        with self._state_lock:
            if self._started:
                return self
            if self._listener is None:
                raise MQClientError(f"consumer {self.group!r}: register a message listener before start()")
            if not self.subscription_inner:
                raise MQClientError(f"consumer {self.group!r}: subscribe to a topic before start()")
            if self.message_model is MessageModel.CLUSTERING:
                retry = retry_subscription(self.group)
                self.subscription_inner.setdefault(retry.topic, retry)
            self._threads = ConsumeThreads(f"rmq-consume-{self.group}", self.consume_thread_min,
                                           self.consume_thread_max)
            try:
                self._start_common(self._orderly)
            except BaseException:
                self._threads.shutdown(wait=False)
                raise
            svc_cls = ConsumeOrderlyService if self._orderly else ConsumeConcurrentlyService
            self.consume_service = svc_cls(self, self._listener, self._threads)
            sched = self.instance.scheduler
            if self._orderly and self.message_model is MessageModel.CLUSTERING:
                self._jobs.append(sched.schedule(self.rebalance.lock_all, self.lock_interval, 1.0, "lockAll"))
            if not self._orderly:
                self._jobs.append(sched.schedule(self._clean_expired, self.consume_timeout,
                                                 self.consume_timeout, "clean expired messages"))
                every = max(self.pull_time_delay_when_flow_control, 0.01)
                self._jobs.append(sched.schedule(self.consume_service.check_drainers, every, every,
                                                 "consume threads"))
            self._started = True
        self.instance.rebalance_immediately()
        log.info("the consumer [%s] start OK, client id %s, %s", self.group, self.client_id, self.message_model.value)
        return self

    def shutdown(self) -> None:
        with self._state_lock:
            if not self._started:
                return
            self._started = False
        inst = self.instance
        for h in self._jobs:
            inst.scheduler.cancel(h)
        self._jobs.clear()

        async def stop_pulls():
            await cancel_and_wait(list(self._pull_tasks.values()))
            self._pull_tasks.clear()

        try:
            inst.run(stop_pulls(), timeout=10)
        except Exception as e:
            log.warning("stopping pull tasks of %s: %s", self.group, e)
        # Listeners already running finish and their offsets count (queues are dropped only after
        # the final commit, as Java does); requests not yet started are cancelled and redelivered.
        # shutdown() called from inside a listener must not wait for its own thread.
        in_listener = threading.current_thread().name.startswith(f"rmq-consume-{self.group}")
        self._threads.shutdown(wait=not in_listener)
        try:
            self.commit_offsets_sync(list(self.rebalance.process_queue_table))
        except Exception:
            log.exception("persisting offsets of %s at shutdown failed", self.group)
        if self._orderly and self.message_model is MessageModel.CLUSTERING:
            self.rebalance.unlock_all(oneway=False)
        self.rebalance.drop_all()
        self._stop_trace()
        inst.unregister_consumer(self.group)
        log.info("the consumer [%s] shut down", self.group)

    def __enter__(self) -> "PushConsumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def suspend(self) -> None:
        """Pause pulling (the owned queues are kept).  May be called before start()."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        inst = self.instance
        if self._started and inst is not None:
            try:
                inst.loop.call_soon_threadsafe(self._wake_resumed)
            except RuntimeError:  # the client's loop is closed: no pull loop waits
                pass

    def _wake_resumed(self) -> None:
        waiters, self._resume_waiters = self._resume_waiters, set()
        for fut in waiters:
            _settle(fut)

    @property
    def running(self) -> bool:
        return self._started

    @property
    def process_queue_table(self) -> dict[MessageQueue, ProcessQueue]:
        return dict(self.rebalance.process_queue_table) if self.rebalance else {}

    @property
    def stats(self) -> dict:
        """Messages consumed OK and failed since the start, sent back for retry, moved to the DLQ."""
        service = self.consume_service
        if service is None:
            return {}
        ok, failed = service.consume_stats.totals()
        return {"ok": ok, "failed": failed, **service.stats}

    # --- rebalance callbacks ---------------------------------------------------------------------
    def remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        # beyond RocketMQ's default: the consumed offset is pushed to the broker before the queue
        # is released, so the next owner starts exactly where this one stopped
        self.commit_offsets_sync([mq])
        self.offset_store.remove_offset(mq)
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            self.instance.loop.call_soon_threadsafe(task.cancel)
        if self._orderly and self.message_model is MessageModel.CLUSTERING:
            if pq.consume_lock.acquire(timeout=1.0):
                try:
                    self.rebalance.unlock(mq, oneway=False)
                finally:
                    pq.consume_lock.release()
                return True
            pq.try_unlock_times += 1
            log.warning("[WRONG]mq is consuming, so can not unlock it, %s; try later", mq)
            return False
        return True

    def dispatch_pull(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        async def start():
            old = self._pull_tasks.get(mq)
            if old is not None and not old.done():
                old.cancel()
            self._pull_tasks[mq] = self.instance.spawn(self._pull_loop(mq, pq, offset))

        self.instance.submit(start())

    def message_queue_changed(self, topic: str, mq_all: list, mq_divided: set) -> None:
        # tell the brokers the new subscription version at once (Java sends a heartbeat)
        try:
            self.instance.heartbeat_now()
        except Exception as e:
            log.debug("heartbeat after rebalance failed: %s", e)

    # --- the pull loop ---------------------------------------------------------------------------
    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        inst = self.instance
        broker_id = MixAll.MASTER_ID
        clustering = self.message_model is MessageModel.CLUSTERING
        loop = asyncio.get_running_loop()
        topic = mq.topic

        requests = self._pull_requests_of(mq)

        def make_request(at: int):
            commit_offset = self.offset_store.read_offset(mq, READ_FROM_MEMORY) if clustering else 0
            guard = getattr(self.offset_store, "commit_guard", None)
            if commit_offset > 0 and guard is not None and not guard.admit(mq, commit_offset):
                commit_offset = 0  # older than one committed already (a reset moved the queue back meanwhile)
            return requests().request(at, build_pull_sys_flag(commit_offset > 0, True, True), max(commit_offset, 0))

        def may_pull_ahead(answer, batches: int) -> bool:
            # what the loop checks before its next pull, with the batches pulled ahead counted in
            return (self._started and not self._paused and not pq.dropped and self.pull_interval <= 0
                    and topic in self.subscription_inner
                    and not (self._orderly and clustering and not pq.locked)
                    and not self._flow_controlled(pq, batches * self.pull_batch_size,
                                                  batches * len(answer.body or b"")))

        chain, stopped = self._pull_chain(mq, pq, make_request, may_pull_ahead)
        try:
            while not pq.dropped and self._started:
                pq.last_pull_timestamp = time.monotonic()
                if self._paused:
                    # resume() wakes it at once; every second it looks again (and the queue's
                    # pull time stays fresh, so the rebalance does not rebuild a paused queue)
                    fut = loop.create_future()
                    self._resume_waiters.add(fut)
                    timer = loop.call_later(1.0, _settle, fut)
                    try:
                        if self._paused:
                            await fut
                    finally:
                        timer.cancel()
                        self._resume_waiters.discard(fut)
                    continue
                if self._flow_controlled(pq):
                    self.flow_control_times += 1
                    await self._wait_for_room(pq, loop)
                    continue
                if self._orderly and clustering and not pq.locked:
                    await asyncio.sleep(self.pull_time_delay_when_exception)
                    continue
                sub = self.subscription_inner.get(topic)
                if sub is None:
                    await asyncio.sleep(self.pull_time_delay_when_exception)
                    continue
                began = time.monotonic()
                result = await chain.pull_or_back_off(broker_id, offset, sub, self.pull_time_delay_when_exception,
                                                      stopped)
                if result is None:
                    if stopped():
                        return
                    continue
                self.consume_service.consume_stats.pulled(
                    topic, len(result.messages) if result.status is PullStatus.FOUND else 0,
                    (time.monotonic() - began) * 1000.0)
                broker_id = result.suggest_which_broker_id or MixAll.MASTER_ID
                if pq.dropped:
                    return
                status = result.status
                if status is PullStatus.FOUND:
                    offset = result.next_begin_offset
                    msgs = result.messages
                    if msgs:
                        dispatch = pq.put_messages(msgs)
                        pq.msg_acc_cnt = max(0, result.max_offset - msgs[-1].queue_offset)
                        self.consume_service.submit_consume_request(msgs, pq, mq, dispatch)
                    elif pq.msg_count == 0:
                        # every pulled message failed the exact tag check: move the offset past them
                        self.offset_store.update_offset(mq, offset, True)
                    if self.pull_interval > 0:
                        await asyncio.sleep(self.pull_interval)
                elif status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
                    offset = result.next_begin_offset
                    if pq.msg_count == 0:
                        self.offset_store.update_offset(mq, offset, True)
                else:  # OFFSET_ILLEGAL: start over from where the broker says, and remember it
                    log.warning("the pull request offset illegal, %s offset=%d -> %d", mq, offset, result.next_begin_offset)
                    offset = result.next_begin_offset
                    self.offset_store.update_offset(mq, offset, False)
                    await loop.run_in_executor(inst.blocking_executor, self.offset_store.persist, mq)
        finally:
            chain.cancel()

    def _flow_controlled(self, pq: ProcessQueue, more_msgs: int = 0, more_bytes: int = 0) -> bool:
        """Too much buffered for this queue (count, size, or offset span for concurrent
        consumption), also counting `more_msgs` / `more_bytes` about to be put."""
        return (pq.msg_count + more_msgs > self.pull_threshold_for_queue
                or pq.msg_size + more_bytes > self.pull_threshold_size_for_queue * 1024 * 1024
                or (not self._orderly and pq.max_span + more_msgs > self.consume_concurrently_max_span))

    async def _wait_for_room(self, pq: ProcessQueue, loop) -> None:
        """Wait until consumption brings the queue under the thresholds again, or at most
        pull_time_delay_when_flow_control (Java sleeps that long every time: a pull batch near the
        threshold then waited 50 ms per pull, so bigger batches consumed slower)."""
        fut = loop.create_future()

        def waiter():  # a consume thread, after removing consumed messages
            if not self._flow_controlled(pq):
                pq.flow_waiter = None
                try:
                    loop.call_soon_threadsafe(_settle, fut)
                except RuntimeError:  # the client's loop is closed: nobody is waiting any more
                    pass

        pq.flow_waiter = waiter
        if not self._flow_controlled(pq):  # room was made before the waiter was in place
            pq.flow_waiter = None
            return
        timer = loop.call_later(self.pull_time_delay_when_flow_control, _settle, fut)
        try:
            await fut
        finally:
            timer.cancel()
            pq.flow_waiter = None

    def _clean_expired(self) -> None:
        if self.rebalance is None or not isinstance(self.consume_service, ConsumeConcurrentlyService):
            return
        for mq, pq in list(self.rebalance.process_queue_table.items()):
            if not pq.dropped:
                self.consume_service.clean_expired_messages(pq, mq, self.consume_timeout)


__all__ = ["PushConsumer"]
