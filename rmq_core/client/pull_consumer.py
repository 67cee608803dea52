"""PullConsumer: RocketMQ's lite pull consumer (DefaultLitePullConsumer).

Background tasks pull the owned (subscribe) or assigned (assign) queues into per-queue buffers;
`poll(timeout)` hands out the next batch.  Offsets: what poll returned counts as consumed;
`commit()` (or auto-commit every `auto_commit_interval` s, checked in poll) stores it.
`seek`, `seek_to_begin`, `seek_to_end`, `offset_for_timestamp`, `pause` / `resume` as in Java.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Iterable

from rmq_core.client.process_queue import ProcessQueue
from rmq_core.client.pull_api import (
    max_offset, min_offset, reset_retry_topic, search_offset,
)
from rmq_core.client.consumer_base import READ_FROM_STORE, ConsumerBase
from rmq_core.client.subscription import build_subscription
from rmq_core.client.trace import ConsumeReturnType
from rmq_core.common.subscription import SubscriptionData
from rmq_core.common.sysflag import build_pull_sys_flag
from rmq_core.errors import ConfigError, IllegalArgumentError, MQClientError
from rmq_core.loops import cancel_and_wait
from rmq_core.message import MessageQueue, MixAll, PullStatus

log = logging.getLogger("rmq.client.pull")


class _QueueState:
    __slots__ = ("pq", "pull_offset", "seek_offset", "consumed_offset", "paused", "task", "version")

    def __init__(self, pq: ProcessQueue):
        self.pq = pq
        self.pull_offset = -1
        self.seek_offset = -1
        self.consumed_offset = -1
        self.paused = False
        self.task = None
        self.version = 0


class PullConsumer(ConsumerBase):
    """Poll-style consumer.

    Keywords besides its own settings: ConsumerBase.SHARED_SETTINGS (message_model,
    consume_from_where, allocate_strategy, offset_store, ...) and the client's (ClientConfig).

    >>> c = PullConsumer("CG", namesrv="127.0.0.1:9876", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    >>> c.subscribe("TopicA", "*"); c.start()
    >>> msgs = c.poll(timeout=1.0)
    """

    consume_type = "CONSUME_ACTIVELY"
    # a poll waits longer at the broker, and retries sooner after an error, than a push consumer's pull
    SHARED_SETTINGS = {**ConsumerBase.SHARED_SETTINGS, "broker_suspend_max_time": 20.0,
                       "pull_time_delay_when_exception": 1.0}

    def __init__(self, group: str, namesrv=None, *,
                 auto_commit: bool = True,
                 auto_commit_interval: float = 5.0,
                 pull_batch_size: int = 10,
                 pull_threshold_for_queue: int = 1000,
                 pull_threshold_for_all: int = 10000,
                 poll_timeout: float = 5.0,
                 **client_options):
        super().__init__(group, namesrv, client_options)
        if not 1 <= pull_batch_size <= 1024:
            raise ConfigError(f"bad pull_batch_size {pull_batch_size!r}: must be within 1..1024")
        if auto_commit_interval <= 0:
            raise ConfigError(f"bad auto_commit_interval {auto_commit_interval!r}: must be > 0")
        # (set in groups: what commits, what a pull asks)
        self.auto_commit, self.auto_commit_interval, self.poll_timeout = auto_commit, auto_commit_interval, poll_timeout
        self.pull_batch_size, self.pull_threshold_for_queue, self.pull_threshold_for_all = (
            pull_batch_size, pull_threshold_for_queue, pull_threshold_for_all)
        self._states: dict[MessageQueue, _QueueState] = {}
        self._states_lock = threading.RLock()
        self._requests: queue.Queue = queue.Queue()
        self._assigned_mode = False
        self._assigned: set = set()
        self._paused_stash: dict[MessageQueue, list] = {}
        self._next_auto_commit = 0.0
        self._cached = 0
        # called (on the client's loop) when a batch becomes ready for poll: rmq_core.aio wakes
        # its `async for` with it instead of waiting in a thread
        self.on_ready = None
        self._trace_token = None  # the last polled batch's SubBefore (message trace)

    # --- subscription ----------------------------------------------------------------------------
    def subscribe(self, topic: str, expression="*") -> None:
        if self._assigned_mode:
            raise MQClientError("subscribe and assign are mutually exclusive")
        super().subscribe(topic, expression)

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        """Consume exactly these queues (no rebalance)."""
        mqs = list(mqs)
        if not mqs:
            raise IllegalArgumentError("assign() needs at least one message queue")
        if self.subscription_inner and not self._assigned_mode:
            raise MQClientError("subscribe and assign are mutually exclusive")
        self._assigned_mode = True
        for mq in mqs:
            if mq.topic not in self.subscription_inner:
                self.subscription_inner[mq.topic] = build_subscription(mq.topic, "*")
        self._assigned = set(mqs)
        if self._started:
            self._apply_assignment()

    def subscriptions(self) -> list[SubscriptionData]:
        # a pull consumer's heartbeat carries no subscriptions when it assigns queues itself
        return [] if self._assigned_mode else list(self.subscription_inner.values())

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        inst = self._require_started()
        inst.run(inst.update_topic_route(topic), timeout=30)
        route = inst.topic_route_table.get(topic)
        if route is None:
            raise inst.route_error(topic) or MQClientError(f"no route info of topic {topic!r}")
        return route.subscribe_queues(topic)

    def assignment(self) -> set[MessageQueue]:
        with self._states_lock:
            return set(self._states)

    # --- life cycle ------------------------------------------------------------------------------
    def start(self) -> "PullConsumer":
        with self._state_lock:
            if self._started:
                return self
            if not self.subscription_inner:
                raise MQClientError(f"pull consumer {self.group!r}: subscribe() or assign() before start()")
            # unlike PushConsumer, no %RETRY% subscription: a lite pull consumer never sends back
            self._start_common(False)
            self._started = True
            self._next_auto_commit = time.monotonic() + self.auto_commit_interval
        if self._assigned_mode:
            self._apply_assignment()
        else:
            self.instance.rebalance_immediately()
        log.info("the lite pull consumer [%s] start OK, client id %s", self.group, self.client_id)
        return self

    def shutdown(self) -> None:
        with self._state_lock:
            if not self._started:
                return
            if self.auto_commit:
                try:
                    self.commit()
                except Exception as e:
                    log.warning("final commit of %s failed: %s", self.group, e)
            self._started = False
        inst = self.instance
        with self._states_lock:
            states = list(self._states.values())
            for st in states:
                st.pq.dropped = True

        try:
            inst.run(cancel_and_wait([st.task for st in states]), timeout=10)
        except Exception as e:
            log.warning("stopping pull tasks of %s: %s", self.group, e)
        self._trace_consumed()
        self._stop_trace()
        inst.unregister_consumer(self.group)

    def __enter__(self) -> "PullConsumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def _require_started(self):
        if not self._started:
            raise MQClientError(f"the pull consumer {self.group!r} is not started; call start() first")
        return self.instance

    # --- assignment plumbing ---------------------------------------------------------------------
    def do_rebalance(self) -> None:
        if self._started and not self._assigned_mode:
            self.rebalance.do_rebalance()

    def _apply_assignment(self) -> None:
        wanted = set(self._assigned)
        with self._states_lock:
            for mq in list(self._states):
                if mq not in wanted:
                    self._release(mq)
            for mq in sorted(wanted):
                if mq not in self._states:
                    offset = self.compute_pull_from_where(mq)
                    if offset < 0:
                        raise MQClientError(f"cannot find a start offset for {mq}")
                    self._add(mq, ProcessQueue(), offset)

    def _add(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        st = _QueueState(pq)
        st.pull_offset = offset
        st.consumed_offset = offset
        with self._states_lock:
            self._states[mq] = st

        async def start():
            st.task = self.instance.spawn(self._pull_loop(mq, st))

        self.instance.submit(start())

    def _release(self, mq: MessageQueue) -> None:
        with self._states_lock:
            st = self._states.pop(mq, None)
        if st is None:
            return
        st.pq.dropped = True
        if st.task is not None:
            self.instance.loop.call_soon_threadsafe(st.task.cancel)

    # rebalance callbacks (subscribe mode)
    def remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        with self._states_lock:
            st = self._states.get(mq)
            if self.auto_commit and st is not None and st.consumed_offset >= 0:
                self.offset_store.update_offset(mq, st.consumed_offset, False)
        self.commit_offsets_sync([mq])
        self.offset_store.remove_offset(mq)
        self._release(mq)
        return True

    def dispatch_pull(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        self._add(mq, pq, offset)

    def message_queue_changed(self, topic: str, mq_all: list, mq_divided: set) -> None:
        """Rebalance listener hook: the lite pull consumer learns its queues from dispatch_pull."""

    def persist_consumer_offset(self) -> None:
        # only what was committed is in the offset store, so persisting it is always safe
        mqs = self.assignment()
        if mqs and self.offset_store is not None:
            self.offset_store.persist_all(mqs)

    def reset_offset(self, topic: str, table: dict) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET from the broker: seek the queues this consumer holds."""
        for mq, offset in table.items():
            with self._states_lock:
                st = self._states.get(mq)
            if st is None:
                continue
            st.version += 1
            st.pq.clear()
            st.seek_offset = offset
            self._restart_pull(mq, st)

    # --- the pull loop ---------------------------------------------------------------------------
    async def _pull_loop(self, mq: MessageQueue, st: _QueueState) -> None:
        pq = st.pq
        topic = mq.topic

        requests = self._pull_requests_of(mq)
        sys_flag = build_pull_sys_flag(False, True, True, lite_pull=True)

        def make_request(at: int):
            return requests().request(at, sys_flag, 0)

        def may_pull_ahead(answer, batches: int) -> bool:
            # what the loop checks before its next pull, with the batches pulled ahead counted in
            n = batches * self.pull_batch_size
            return (self._started and not st.paused and not pq.dropped and st.seek_offset < 0
                    and topic in self.subscription_inner
                    and pq.msg_count + n <= self.pull_threshold_for_queue
                    and self._cached + n <= self.pull_threshold_for_all)

        chain, stopped = self._pull_chain(mq, pq, make_request, may_pull_ahead)
        try:
            while not pq.dropped and self._started:
                pq.last_pull_timestamp = time.monotonic()
                if st.paused:
                    await asyncio.sleep(0.1)
                    continue
                if pq.msg_count > self.pull_threshold_for_queue or self._cached > self.pull_threshold_for_all:
                    await asyncio.sleep(self.pull_time_delay_when_flow_control)
                    continue
                if st.seek_offset >= 0:
                    st.pull_offset = st.seek_offset
                    st.consumed_offset = st.seek_offset
                    st.seek_offset = -1
                    chain.cancel()  # a pull sent ahead is for the old position
                version = st.version
                offset = st.pull_offset
                sub = self.subscription_inner.get(topic)
                if sub is None:
                    await asyncio.sleep(self.pull_time_delay_when_exception)
                    continue
                result = await chain.pull_or_back_off(MixAll.MASTER_ID, offset, sub,
                                                      self.pull_time_delay_when_exception, stopped)
                if result is None:
                    if stopped():
                        return
                    continue
                if pq.dropped:
                    return
                if version != st.version or st.seek_offset >= 0:
                    chain.cancel()
                    continue  # a seek happened while pulling: drop this result
                st.pull_offset = result.next_begin_offset
                if result.status is PullStatus.FOUND and result.messages:
                    pq.put_messages(result.messages)
                    self._cached += len(result.messages)
                    self._requests.put((mq, st, version, result.messages))
                    if self.on_ready is not None:
                        self.on_ready()
                elif result.status is PullStatus.OFFSET_ILLEGAL:
                    log.warning("the pull request offset illegal, %s offset=%d -> %d", mq, offset, result.next_begin_offset)
        finally:
            chain.cancel()

    # --- poll and offsets ------------------------------------------------------------------------
    def poll(self, timeout: float | None = None) -> list:
        """The next batch of messages (up to pull_batch_size, one queue), or [] after `timeout` s."""
        self._require_started()
        if self.auto_commit_due():
            self.commit()
        return self.take(self.poll_timeout if timeout is None else timeout)

    def auto_commit_due(self) -> bool:
        """True (once per auto_commit_interval) when poll should commit before taking a batch."""
        if self.auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.auto_commit_interval
            return True
        return False

    def take(self, timeout: float) -> list:
        """poll without its auto-commit: the next ready batch, waiting up to `timeout` s (0: never)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                mq, st, version, msgs = self._requests.get(timeout=max(0.0, remaining)) if remaining > 0 \
                    else self._requests.get_nowait()
            except queue.Empty:
                return []
            self._cached -= len(msgs)
            if st.pq.dropped or version != st.version:
                continue
            if st.paused:
                # a paused queue keeps its buffered batches until it is resumed
                with self._states_lock:
                    self._paused_stash.setdefault(mq, []).append((mq, st, version, msgs))
                continue
            offset = st.pq.remove_messages(msgs)
            if offset >= 0:
                st.consumed_offset = offset
            reset_retry_topic(msgs, self.group)
            if self.trace is not None:
                self._trace_consumed()
                self._trace_token = self.trace.on_consume_before(msgs)
            return msgs

    def _trace_consumed(self) -> None:
        """The last polled batch's SubAfter: a polled batch counts as consumed (successfully) when
        the application polls again, commits or shuts down - as its offset does."""
        token, self._trace_token = self._trace_token, None
        if token is not None:
            self.trace.on_consume_after(token, True, ConsumeReturnType.SUCCESS)

    def __iter__(self):
        """Iterate forever over polled messages (one message at a time)."""
        while self._started:
            for m in self.poll():
                yield m

    async def __aiter__(self):
        """`async for msg in consumer:` — polls in a worker thread so the caller's loop stays free."""
        loop = asyncio.get_running_loop()
        while self._started:
            msgs = await loop.run_in_executor(None, self.poll, 1.0)
            for m in msgs:
                yield m

    def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Store consumed offsets (all polled queues, or the given {mq: next offset}) on the broker
        (clustering) or in the local file (broadcasting)."""
        self._require_started()
        self._trace_consumed()
        with self._states_lock:
            if offsets is None:
                offsets = {mq: st.consumed_offset for mq, st in self._states.items() if st.consumed_offset >= 0}
            else:
                for mq in offsets:
                    if mq not in self._states:
                        raise IllegalArgumentError(f"cannot commit {mq}: it is not assigned to this consumer")
        for mq, off in offsets.items():
            self.offset_store.update_offset(mq, off, False)
        self.commit_offsets_sync(list(offsets))

    def committed(self, mq: MessageQueue) -> int:
        """The offset stored for mq (on the broker for clustering), -1 when none."""
        self._require_started()
        return self.offset_store.read_offset(mq, READ_FROM_STORE)

    def _state(self, mq: MessageQueue) -> _QueueState:
        with self._states_lock:
            st = self._states.get(mq)
        if st is None:
            raise IllegalArgumentError(f"{mq} is not assigned to this consumer (assignment: {sorted(self._states)})")
        return st

    def seek(self, mq: MessageQueue, offset: int) -> None:
        inst = self._require_started()
        st = self._state(mq)
        lo = inst.run(min_offset(inst, mq), timeout=10)
        hi = inst.run(max_offset(inst, mq), timeout=10)
        if not lo <= offset <= hi:
            raise IllegalArgumentError(f"seek offset {offset} of {mq} is outside the queue's range [{lo}, {hi}]")
        st.version += 1
        st.pq.clear()
        st.seek_offset = offset
        self._restart_pull(mq, st)

    def _restart_pull(self, mq: MessageQueue, st: _QueueState) -> None:
        """Abandon an in-flight (long-polling) pull so a seek takes effect at once."""
        async def restart():
            old = st.task
            if old is not None and not old.done():
                old.cancel()
                try:
                    await old
                except (asyncio.CancelledError, Exception):
                    pass
            if not st.pq.dropped and self._started:
                st.task = self.instance.spawn(self._pull_loop(mq, st))

        self.instance.run(restart(), timeout=10)

    def seek_to_begin(self, mq: MessageQueue) -> None:
        inst = self._require_started()
        self.seek(mq, inst.run(min_offset(inst, mq), timeout=10))

    def seek_to_end(self, mq: MessageQueue) -> None:
        inst = self._require_started()
        self.seek(mq, inst.run(max_offset(inst, mq), timeout=10))

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        inst = self._require_started()
        return inst.run(search_offset(inst, mq, timestamp_ms), timeout=10)

    def pause(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in mqs:
            self._state(mq).paused = True

    def resume(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in mqs:
            self._state(mq).paused = False
            with self._states_lock:
                stashed = self._paused_stash.pop(mq, [])
            for item in stashed:
                self._cached += len(item[3])
                self._requests.put(item)
            if stashed and self.on_ready is not None:
                self.on_ready()

    def is_paused(self, mq: MessageQueue) -> bool:
        return self._state(mq).paused


__all__ = ["PullConsumer"]
