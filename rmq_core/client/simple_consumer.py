"""SimpleConsumer (RocketMQ 5's SimpleConsumer) over the 4.x remoting protocol's pop requests.

    with SimpleConsumer("CG", namesrv="127.0.0.1:9876", subscriptions={"TopicA": "TagA || TagB"}) as c:
        for msg in c.receive(16, invisible_duration=30):
            handle(msg)
            c.ack(msg)      # or c.change_invisible_duration(msg, 60) for more time

No queue is owned and nothing rebalances: consumers of one group share every queue.  A receive is
one POP_MESSAGE (queueId -1: the broker picks among the topic's queues) to the master of one
broker holding a subscribed topic, taken in turn; the brokers not in turn are asked without
waiting first, the one in turn long-polls for up to `await_duration`.  A received message stays
invisible to the group for `invisible_duration`; unless acked (ACK_MESSAGE) it is delivered again,
its delivery_attempt raised.  Its receipt handle is its POP_CK property, made from the answer's
startOffsetInfo / msgOffsetInfo / orderCountInfo as RocketMQ 5's remoting client makes it
(rmq_core.common.pop_extra_info); CHANGE_MESSAGE_INVISIBLETIME gives it a new one.  Acks and changes
travel on the broker's command channel, from the caller's thread (MQClientInstance.command_channel);
so do receives' pops when one broker serves the subscriptions (the answer read by whichever thread
reads the channel: a waiting caller, an aio caller's loop or the channel's reader; receives made
while a pop of theirs is in flight share the next one).  Otherwise pops go from the client's event
loop, shared the same way.  The consumer heartbeats like the others (CONSUME_ACTIVELY, as RocketMQ
5 registers a SimpleConsumer), so it shows in consumerConnection.
"""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import itertools
import logging
import math
import threading
import time
from datetime import timedelta
from typing import Any, Mapping

from rmq_core._native.receipt import group_by_checkpoint
from rmq_core.client.config import make_client_config
from rmq_core.client.futures import LeanFuture
from rmq_core.client.consumer_base import enum_setting, join_client
from rmq_core.client.subscription import build_subscription
from rmq_core.codec import decode_messages, queue_runs, stamp_popped
from rmq_core.common import fastjson
from rmq_core.common.clock import now_ms
from rmq_core.common.delegate import delegate
from rmq_core.common.pop_extra_info import (
    POP_ORDER_REVIVE_QUEUE, ExtraInfo, build_extra_info, extra_info_prefix, info_key, parse_info, queue_offset_key,
    retry_mark,
)
from rmq_core.errors import (
    ConfigError, IllegalArgumentError, MQBrokerError, MQClientError, ReceiptHandleExpiredError, RemotingError,
)
from rmq_core.message import ConsumeFromWhere, MessageConst, MixAll, PermName, check_group
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand

log = logging.getLogger("rmq.client.simple")

# rmq's broker hands out up to 1024 messages per POP_MESSAGE (fewer round trips per message: a receive
# of 32 is mostly its round trip); RocketMQ's broker refuses more than 32, and says so
MAX_MESSAGE_NUM = 1024
# where a group that never popped a queue starts in it (POP_MESSAGE's initMode, ConsumeInitMode):
# its end (MAX, what RocketMQ's proxy asks) or its first message (MIN)
_INIT_MODES = {ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET: "1", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET: "0"}
_NO_MESSAGE = (ResponseCode.PULL_NOT_FOUND, ResponseCode.POLLING_TIMEOUT)
_ROCKETMQ_MAX_POP = 32  # the most a RocketMQ broker hands out per POP_MESSAGE
_LOOP_LANE_POPS = 2  # pops of a lane an event loop's receives keep in flight (see _send_waiting_pops)


class _PopLane:
    """The pops of one (topic, broker, invisible time): how many are in flight (or taken to be sent
    at the end of a loop's iteration: `deferred`), the receives waiting for one to end, the most one
    pop asks (messages: `cap`; receives: `per_pop`, from `peak`, the most receives seen waiting at
    once), and whether the group pops orderly (None: not known yet - the broker decides by the
    group and no answer with messages came)."""

    __slots__ = ("in_flight", "deferred", "waiting", "cap", "per_pop", "peak", "ordered")

    def __init__(self, ordered: bool | None):
        self.in_flight = 0
        self.deferred = False
        self.waiting: list = []
        self.cap = MAX_MESSAGE_NUM
        self.per_pop = MAX_MESSAGE_NUM
        self.peak = 0
        self.ordered = ordered


class _PopWaiter:
    __slots__ = ("max_nums", "deadline", "future")

    def __init__(self, max_nums: int, deadline: int, future):
        self.max_nums, self.deadline, self.future = max_nums, deadline, future


def _seconds(value, what: str, *, allow_zero: bool = False) -> float:
    """A duration given in seconds (int/float) or as a timedelta; IllegalArgumentError naming it otherwise."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        raise IllegalArgumentError(f"bad {what} {value!r}: expected a {'non-negative' if allow_zero else 'positive'} "
                                   "number of seconds or a timedelta")
    return float(value)


class SimpleConsumer:
    """Receive, then ack each message (or change its invisible duration), in your own time.

    group: the consumer group; namesrv: as for the other clients; subscriptions: {topic: "TagA ||
    TagB" / "*" / MessageSelector}; await_duration: how long (s) a receive waits at the broker for
    messages; fifo: None (the broker goes by the group: consumeMessageOrderly), True / False (the
    POP_MESSAGE `order` flag sent as given); consume_from_where: where the group starts in a queue
    it never received from, CONSUME_FROM_LAST_OFFSET (its end, as RocketMQ 5's SimpleConsumer) or
    CONSUME_FROM_FIRST_OFFSET ("LAST" / "FIRST" for short).  Other keywords: the client's (ClientConfig:
    access_key / secret_key for ACL, instance_name, timers...)."""

    consume_type = "CONSUME_ACTIVELY"  # (RocketMQ 5 registers a SimpleConsumer so)
    message_model_name = "CLUSTERING"
    consume_from_where_name = delegate("consume_from_where.value")

    def __init__(self, group: str, namesrv=None, *, subscriptions: Mapping[str, Any] | None = None,
                 await_duration: float | timedelta = 20.0, fifo: bool | None = None,
                 consume_from_where: str | ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 **client_options):
        self.group = check_group(group)
        if MixAll.is_retry_topic(self.group) or MixAll.is_dlq_topic(self.group):
            raise ConfigError(f"bad consumer group {group!r}: a group is not named like a retry or DLQ topic")
        self.await_duration = _seconds(await_duration, "await_duration", allow_zero=True)
        if fifo is not None and not isinstance(fifo, bool):
            raise ConfigError(f"bad fifo {fifo!r}: expected None, True or False")
        self.fifo = fifo
        where = enum_setting(ConsumeFromWhere, consume_from_where, "consume_from_where")
        if where not in _INIT_MODES:
            raise ConfigError(f"bad consume_from_where {consume_from_where!r} for a SimpleConsumer: expected "
                              "CONSUME_FROM_LAST_OFFSET or CONSUME_FROM_FIRST_OFFSET")
        self.consume_from_where = where
        self.client_config = make_client_config("SimpleConsumer", namesrv, client_options, own=type(self).__init__)
        self.subscription_inner: dict = {}
        for topic, expression in (subscriptions or {}).items():
            self.subscription_inner[topic] = build_subscription(topic, expression)
        self.instance = None
        self.start_timestamp = 0
        self._started = False
        self._state_lock = threading.Lock()
        self._turn = itertools.count()
        # (topic, broker name, invisible ms) -> _PopLane: the loop's pops' (_pop) and the command
        # channel's (_pop_here), apart because their receives' futures differ (the loop's asyncio
        # ones, LeanFutures any thread completes); their state changes under _lanes_lock
        self._pop_lanes: dict = {}
        self._channel_lanes: dict = {}
        self._lanes_lock = threading.Lock()
        self._pops_here: dict = {}  # opaque -> the receives (_PopWaiter) of a pop of _pop_here in flight
        self._acks_gathered: list = []  # acks a deferring loop's iteration made (_gather_ack), under _lanes_lock

    client_id = delegate("client_config.client_id")

    # --- subscriptions ---------------------------------------------------------------------------
    def subscribe(self, topic: str, expression="*") -> None:
        """Add (or change) a subscription; after start() its route is looked up and the brokers
        told at once."""
        sub = build_subscription(topic, expression)
        self.subscription_inner[topic] = sub
        if self._started:
            inst = self.instance
            inst.run(inst.update_topic_route(topic), timeout=30)
            inst.heartbeat_now()

    def unsubscribe(self, topic: str) -> None:
        self.subscription_inner.pop(topic, None)
        if self._started:
            self.instance.heartbeat_now()

    def subscriptions(self) -> list:
        return list(self.subscription_inner.values())

    def subscribed_topics(self) -> set[str]:
        return set(self.subscription_inner)

    # --- life cycle ------------------------------------------------------------------------------
    def start(self) -> "SimpleConsumer":
        with self._state_lock:
            if self._started:
                return self
            if not self.subscription_inner:
                raise MQClientError(f"simple consumer {self.group!r}: subscribe to a topic before start() "
                                    "(subscriptions={topic: expression})")
            self.start_timestamp = int(time.time() * 1000)
            join_client(self)
            self._started = True
        log.info("the simple consumer [%s] start OK, client id %s", self.group, self.client_id)
        return self

    def shutdown(self) -> None:
        with self._state_lock:
            if not self._started:
                return
            self._started = False
        # the receives long polling on the command channel end now, cancelled as those on the loop
        # are, and the channel's close does not wait for their answers (see _pop_here)
        with self._lanes_lock:
            pops, self._pops_here = self._pops_here, {}
            waiting = [w for lane in self._channel_lanes.values() for w in lane.waiting]
            for lane in self._channel_lanes.values():
                lane.waiting = []
        for w in (*(w for taken in pops.values() for w in taken), *waiting):
            w.future.cancel()
        self.instance.unregister_consumer(self.group)
        log.info("the simple consumer [%s] shut down", self.group)

    def __enter__(self) -> "SimpleConsumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def running(self) -> bool:
        return self._started

    def _require_started(self):
        if not self._started:
            raise MQClientError(f"the simple consumer {self.group!r} is not started; call start() first")
        return self.instance

    # --- what the client instance calls on its consumers -----------------------------------------
    def on_route_changed(self, topic, route) -> None:
        """(Each receive reads the routes as they are: nothing is kept from them.)"""

    def do_rebalance(self) -> None:
        """A pop consumer owns no queue: nothing to rebalance."""

    def persist_consumer_offset(self) -> None:
        """The broker keeps a pop group's offsets: nothing to persist."""

    def reset_offset(self, topic: str, table: dict) -> None:
        log.info("RESET_CONSUMER_CLIENT_OFFSET of %s for simple consumer %s: the broker moves a pop group's "
                 "offsets itself", topic, self.group)

    def running_info(self) -> dict:
        return {
            "properties": {"consumeType": self.consume_type, "messageModel": self.message_model_name,
                           "consumeFromWhere": self.consume_from_where_name, "clientId": self.client_id,
                           "PROP_CONSUME_TYPE": self.consume_type, "PROP_CONSUMEORDERLY": str(bool(self.fifo)).lower(),
                           "PROP_CONSUMER_START_TIMESTAMP": str(self.start_timestamp)},
            "subscriptionSet": [s.to_json() for s in self.subscriptions()],
            "mqTable": [],
        }

    # --- receive ---------------------------------------------------------------------------------
    def receive(self, max_message_num: int, invisible_duration: float | timedelta) -> list:
        """Up to `max_message_num` (1..1024; a RocketMQ broker takes 1..32) messages, each invisible to the group for
        `invisible_duration` (s or timedelta); [] when none came within await_duration."""
        args = self._receive_args(max_message_num, invisible_duration)
        inst = self._require_started()
        fut = self._pop_here(*args)
        if fut is None:
            return inst.run(self._receive(*args), timeout=self._receive_timeout() + 5)
        return fut.result()

    def receive_async(self, max_message_num: int, invisible_duration: float | timedelta,
                      defer=None) -> concurrent.futures.Future:
        """receive() as a Future (rmq_core.aio awaits it).  defer: see _pop_here."""
        args = self._receive_args(max_message_num, invisible_duration)
        inst = self._require_started()
        fut = self._pop_here(*args, defer)
        return inst.submit(self._receive(*args)) if fut is None else fut

    def _receive_args(self, max_message_num, invisible_duration) -> tuple[int, int]:
        if isinstance(max_message_num, bool) or not isinstance(max_message_num, int) \
                or not 1 <= max_message_num <= MAX_MESSAGE_NUM:
            raise IllegalArgumentError(f"bad max_message_num {max_message_num!r}: expected an int within "
                                       f"1..{MAX_MESSAGE_NUM}")
        invisible_ms = round(_seconds(invisible_duration, "invisible_duration") * 1000)
        if invisible_ms < 1:
            raise IllegalArgumentError(f"bad invisible_duration {invisible_duration!r}: under a millisecond")
        return max_message_num, invisible_ms

    def _receive_timeout(self) -> float:
        return self.await_duration + self.client_config.mq_client_api_timeout

    def _targets(self) -> list[tuple[str, str]]:
        """(topic, broker name) of every subscribed topic's brokers with readable queues."""
        out = []
        table = self.instance.topic_route_table
        for topic in list(self.subscription_inner):
            route = table.get(topic)
            if route is None:
                continue
            for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
                if PermName.is_readable(qd.perm) and qd.read_queue_nums > 0:
                    out.append((topic, qd.broker_name))
        return out

    async def _receive(self, max_nums: int, invisible_ms: int) -> list:
        inst = self.instance
        targets = self._targets()
        if not targets:
            for topic in list(self.subscription_inner):
                await inst.update_topic_route(topic)
            targets = self._targets()
            if not targets:
                topics = sorted(self.subscription_inner)
                errors = [inst.route_error(t) for t in topics]
                raise next((e for e in errors if e is not None), None) or MQClientError(
                    f"simple consumer {self.group!r}: no broker serves a readable queue of {', '.join(topics)}")
        n = len(targets)
        turn = next(self._turn)
        failure = None
        answered = False
        for i in range(n):
            topic, broker_name = targets[(turn + i) % n]
            # the brokers before the one in turn are asked without waiting; it long-polls
            poll_ms = round(self.await_duration * 1000) if i == n - 1 else 0
            try:
                msgs = await self._pop(topic, broker_name, max_nums, invisible_ms, poll_ms)
            except (RemotingError, MQClientError, MQBrokerError) as e:
                if n == 1:
                    raise
                log.warning("pop of %s from broker %s failed: %s", topic, broker_name, e)
                failure = e
                continue
            if msgs:
                return msgs
            answered = True
        if not answered:  # every broker failed: say why (one that answered "nothing" makes it [])
            raise failure
        return []

    async def _pop(self, topic: str, broker_name: str, max_nums: int, invisible_ms: int, poll_ms: int) -> list:
        """The messages of one POP_MESSAGE to `broker_name`'s master - or of one shared with the
        receives that wait with this one.  Receives of one (topic, broker, invisible time) made while
        a pop of theirs is in flight go as one pop when it ends, of their maxima summed (up to
        MAX_MESSAGE_NUM), its messages handed out in order, each receive up to its own maximum: the
        group commit of receives (threads sharing a consumer pay a round trip per pop, not per
        receive).  Never for an orderly group, nor (fifo=None) before an answer said the group is not
        one: a queue's messages stay with one receive, which handles them in order."""
        if self.fifo:
            return await self._pop_once(topic, broker_name, max_nums, invisible_ms, poll_ms)
        key = (topic, broker_name, invisible_ms)
        with self._lanes_lock:
            lane = self._lane(key)
            waiter = None
            if lane.in_flight:
                waiter = _PopWaiter(max_nums, now_ms() + poll_ms, asyncio.get_running_loop().create_future())
                lane.waiting.append(waiter)
            else:
                lane.in_flight = 1
        if waiter is not None:
            return await waiter.future
        try:
            msgs = await self._pop_once(topic, broker_name, max_nums, invisible_ms, poll_ms, lane)
        finally:
            self._pop_next(key, lane)
        return msgs

    def _lane(self, key, lanes: dict | None = None) -> "_PopLane":
        """The lane of `key` in `lanes` (the loop's by default), under _lanes_lock."""
        if lanes is None:
            lanes = self._pop_lanes
        lane = lanes.get(key)
        if lane is None:
            lane = lanes[key] = _PopLane(None if self.fifo is None else False)
        return lane

    def _take_waiting(self, lane: "_PopLane"):
        """(receives, their maxima summed) of the next pop of `lane`, in the place of one in flight:
        the receives waiting, in order, up to the lane's caps (an orderly lane's: one receive); None
        with none waiting, that place then free.  Under _lanes_lock."""
        waiting = [w for w in lane.waiting if not w.future.done()]  # (a cancelled receive is gone)
        if not waiting:
            lane.waiting.clear()
            lane.in_flight -= 1
            return None
        cap = lane.cap if lane.ordered is False else waiting[0].max_nums  # (orderly: one receive's)
        taken, total = [], 0
        for w in waiting:
            if taken and (total + w.max_nums > cap or len(taken) == lane.per_pop):
                break
            taken.append(w)
            total += w.max_nums
        lane.waiting = waiting[len(taken):]
        return taken, total

    def _hand_out(self, key, lane: "_PopLane | None", taken: list, total: int, msgs, error) -> None:
        """A pop's outcome to its receives `taken`: the messages in order, each up to its maximum (one
        whose share is empty waits for the lane's next pop while its own poll lasts), or the error
        each raises.  A pop of over 32 a RocketMQ broker refused: the lane pops 32 at most from then
        on, the same receives again."""
        topic, broker_name, _ = key
        if error is not None:
            if isinstance(error, MQBrokerError) and lane is not None and total > _ROCKETMQ_MAX_POP \
                    and lane.cap > _ROCKETMQ_MAX_POP:
                log.info("broker %s refused a pop of %d (%s): pops of its topic %s take %d at most", broker_name,
                         total, error, topic, _ROCKETMQ_MAX_POP)
                with self._lanes_lock:
                    lane.cap = _ROCKETMQ_MAX_POP
                    lane.waiting[:0] = [w for w in taken if not w.future.done()]  # (popped again, 32 at most)
                return
            for w in taken:
                if not w.future.done():
                    _resolve(w.future, None, error)
            return
        at, later, now = 0, [], now_ms()
        for w in taken:
            if w.future.done():
                continue
            share = msgs[at:at + w.max_nums]
            at += len(share)
            if share:
                _resolve(w.future, share, None)
            elif lane is not None and w.deadline > now:
                later.append(w)
            else:
                _resolve(w.future, [], None)
        if later:
            with self._lanes_lock:
                lane.waiting[:0] = later
        if at < len(msgs) and lane is not None and lane.ordered is False:
            at = self._hand_rest(lane, msgs, at)
        if at < len(msgs):  # (no receive left to take them: they come back after their invisible time)
            log.warning("%d popped messages of %s had no receive left to take them", len(msgs) - at, topic)

    def _hand_rest(self, lane: "_PopLane", msgs: list, at: int) -> int:
        """msgs[at:], popped for receives that gave up meanwhile (cancelled, timed out), to the
        receives waiting for the lane's next pop, in order, each up to its maximum, rather than left
        invisible until their invisible time ends; where the messages handed out end.  Not for an
        orderly lane: a queue's messages stay with one receive."""
        given = []
        with self._lanes_lock:
            rest = []
            for w in lane.waiting:
                if w.future.done():
                    continue
                if at < len(msgs):
                    given.append((w, msgs[at:at + w.max_nums]))
                    at += len(given[-1][1])
                else:
                    rest.append(w)
            lane.waiting = rest
        for w, share in given:
            _resolve(w.future, share, None)
        return at

    def _pop_next(self, key, lane: "_PopLane") -> None:
        """After a lane's pop: the receives that waited meanwhile go as the next one (on the loop)."""
        with self._lanes_lock:
            nxt = self._take_waiting(lane)
        if nxt is not None:
            self.instance.spawn(self._pop_for(key, lane, *nxt))  # (cancelled if the client stops)

    async def _pop_for(self, key, lane: "_PopLane", taken: list, total: int) -> None:
        """One pop for the receives `taken`: the messages in order, each up to its maximum; one whose
        share is empty waits for the next pop while its own poll lasts."""
        topic, broker_name, invisible_ms = key
        try:
            poll_ms = max(0, min(w.deadline for w in taken) - now_ms())
            msgs = error = None
            try:
                msgs = await self._pop_once(topic, broker_name, total, invisible_ms, poll_ms, lane)
            except Exception as e:  # noqa: BLE001 - each receive of the pop raises it
                error = e
            self._hand_out(key, lane, taken, total, msgs, error)
        except asyncio.CancelledError:  # (the client is stopping: so are the receives waiting)
            with self._lanes_lock:
                waiting, lane.waiting = lane.waiting, []
                lane.in_flight = 0
            for w in (*taken, *waiting):
                w.future.cancel()
            raise
        self._pop_next(key, lane)

    async def _pop_once(self, topic: str, broker_name: str, max_nums: int, invisible_ms: int, poll_ms: int,
                        lane: "_PopLane | None" = None) -> list:
        inst = self.instance
        addr = self._master(broker_name)
        if addr is None:
            await inst.update_topic_route(topic)
            addr = self._master(broker_name)
            if addr is None:
                raise MQClientError(f"broker {broker_name!r} of topic {topic!r} has no master to pop from")
        sub = self.subscription_inner.get(topic)
        if sub is None:
            return []
        req = self._pop_request(topic, sub, max_nums, invisible_ms, poll_ms)
        try:
            resp = await inst.invoke(addr, req, poll_ms / 1000 + self.client_config.mq_client_api_timeout)
        except (RemotingError, TimeoutError) as e:
            inst.note_request_failed(addr, e)
            raise
        return self._pop_answer(resp, topic, broker_name, sub, addr, lane)

    def _pop_here(self, max_nums: int, invisible_ms: int, defer=None) -> LeanFuture | None:
        """A receive's pop on the broker's command channel, as acks go: a LeanFuture of its
        messages, completed by whichever thread reads the answer - a sync caller's own (waiting,
        it reads the channel itself), an aio caller's loop, or the channel's reader - so no hop
        through the client's event loop.  When one broker serves the subscriptions and its master
        is known; None otherwise: the loop's route, which takes the brokers in turn or looks a
        route up.  Receives made while a pop of theirs (topic, broker, invisible time) is in flight
        go as one pop when it ends, of their maxima summed (up to MAX_MESSAGE_NUM), its messages
        handed out in order, each receive up to its own maximum: the group commit of receives
        (threads or tasks sharing a consumer pay a round trip per pop, not per receive).  Never
        for an orderly group, nor (fifo=None) before an answer said the group is not one: a
        queue's messages stay with one receive, which handles them in order.
        defer: an event loop's call_soon (rmq_core.aio's), for receives made on it: they pop at the
        end of the loop's iteration (_send_waiting_pops), so the receives of tasks woken together
        (by one pop's or one ack's answer) go as one pop, not as a pop of the first and one of the
        rest after it; and two pops of the lane may be in flight."""
        targets = self._targets()
        if len(targets) != 1:
            return None
        topic, broker_name = targets[0]
        addr = self._master(broker_name)
        if addr is None or topic not in self.subscription_inner:
            return None
        inst = self.instance
        try:
            channel = inst.command_channel(addr)
        except RemotingError as e:
            inst.note_request_failed(addr, e)
            fut = LeanFuture()
            fut.finish(None, e)
            return fut
        fut = LeanFuture(channel)
        waiter = _PopWaiter(max_nums, now_ms() + round(self.await_duration * 1000), fut)
        key = (topic, broker_name, invisible_ms)
        lane = None
        if not self.fifo:
            with self._lanes_lock:
                lane = self._lane(key, self._channel_lanes)
                if defer is not None:
                    lane.waiting.append(waiter)
                    if not lane.deferred and lane.in_flight < (_LOOP_LANE_POPS if lane.ordered is False else 1):
                        lane.in_flight += 1
                        lane.deferred = True
                        defer(self._send_waiting_pops, key, lane, addr)
                    return fut
                if lane.in_flight:
                    lane.waiting.append(waiter)
                    return fut
                lane.in_flight = 1
        self._send_pop(key, lane, [waiter], max_nums, addr, channel)
        return fut

    def _send_pop(self, key, lane: "_PopLane | None", taken: list, total: int, addr: str, channel) -> None:
        """One POP_MESSAGE on the command channel for the receives `taken` (_popped_here ends it)."""
        topic, broker_name, invisible_ms = key
        sub = self.subscription_inner.get(topic)
        if sub is None:  # (unsubscribed meanwhile)
            self._hand_out(key, None, taken, total, [], None)
            self._next_pop_here(key, lane, addr)
            return
        poll_ms = max(0, min(w.deadline for w in taken) - now_ms())
        req = self._pop_request(topic, sub, total, invisible_ms, poll_ms)
        req.language = "PYTHON"  # (as MQClientInstance.invoke marks its requests)
        opaque = req.opaque
        if len(taken) == 1:
            # a receive cancelled (an aio caller's, or at the consumer's shutdown) takes its pop off
            # the channel: the lane goes on at once, a later answer is dropped (its messages come
            # back after their invisible time, as a cancelled pop's on the loop), a close waits for none
            taken[0].future.on_cancel = lambda: channel.abandon(opaque, MQClientError("the receive was cancelled"))
        with self._lanes_lock:
            self._pops_here[opaque] = taken
        timeout = poll_ms / 1000 + self.client_config.mq_client_api_timeout
        # (sent, not exchanged: a sync caller's wait reads the answer on its thread all the same,
        # and it notices its receive cancelled at a shutdown within a sweep interval, where an
        # exchange's receive sleeps until the long poll's answer comes)
        channel.send(req.encode(), opaque, timeout, _popped_here, (self, key, lane, taken, total, sub, addr, opaque))

    def _next_pop_here(self, key, lane: "_PopLane | None", addr: str) -> None:
        """After a pop of _pop_here: the receives that waited meanwhile go as the next one."""
        if lane is None:
            return
        while True:
            with self._lanes_lock:
                nxt = self._take_waiting(lane)
            if nxt is None:
                return
            try:
                channel = self.instance.command_channel(addr)  # (the connection may have been replaced)
            except RemotingError as e:  # (these fail as a receive made now would; the lane goes on)
                self.instance.note_request_failed(addr, e)
                self._hand_out(key, None, nxt[0], nxt[1], None, e)
                continue
            self._send_pop(key, lane, *nxt, addr, channel)
            return

    def _send_waiting_pops(self, key, lane: "_PopLane", addr: str) -> list:
        """At the end of a deferring loop's iteration: the receives waiting in `lane` go as pops -
        in the place taken when the first of them came, and in a second one while fewer than two are
        in flight - each taking at most half the most receives seen waiting at once.  Tasks sharing
        a consumer so settle into two groups taking turns: while the broker answers one group's pop,
        the loop hands out and acks the other's (with one group, the client and the broker would
        each wait for the other in turn).  The connections written to."""
        with self._lanes_lock:
            lane.deferred = False
            lane.peak = max(lane.peak, sum(1 for w in lane.waiting if not w.future.done()))
            lane.per_pop = max(1, -(-lane.peak // _LOOP_LANE_POPS))
            pops = []
            while True:
                nxt = self._take_waiting(lane)
                if nxt is None:
                    break
                pops.append(nxt)
                if not lane.waiting or lane.ordered is not False or lane.in_flight >= _LOOP_LANE_POPS:
                    break
                lane.in_flight += 1  # (the next one's place)
        written = []
        for taken, total in pops:
            try:
                channel = self.instance.command_channel(addr)
            except RemotingError as e:  # (these fail as a receive made now would; the lane goes on)
                self.instance.note_request_failed(addr, e)
                self._hand_out(key, None, taken, total, None, e)
                self._next_pop_here(key, lane, addr)
                continue
            self._send_pop(key, lane, taken, total, addr, channel)
            written.append(channel)
        return written

    def _master(self, broker_name: str) -> str | None:
        return self.instance.find_broker_addr_in_subscribe(broker_name, MixAll.MASTER_ID, only_this_broker=True)

    def _pop_request(self, topic: str, sub, max_nums: int, invisible_ms: int, poll_ms: int) -> RemotingCommand:
        # (the header's values as the strings they travel as: no conversion per field in create_request)
        fields = {"consumerGroup": self.group, "topic": topic, "queueId": "-1", "maxMsgNums": str(max_nums),
                  "invisibleTime": str(invisible_ms), "pollTime": str(poll_ms), "bornTime": str(now_ms()),
                  "initMode": _INIT_MODES[self.consume_from_where], "expType": str(sub.expression_type),
                  "exp": sub.sub_string}
        if self.fifo is not None:
            fields["order"] = "true" if self.fifo else "false"
        return RemotingCommand.create_request(RequestCode.POP_MESSAGE, fields)

    def _pop_answer(self, resp: RemotingCommand, topic: str, broker_name: str, sub, addr: str,
                    lane: "_PopLane | None") -> list:
        """A POP_MESSAGE answer's messages ([] for none); MQBrokerError for a refusal."""
        if resp.code in _NO_MESSAGE:
            return []
        if resp.code != ResponseCode.SUCCESS:
            error = MQBrokerError(resp.code, resp.remark, addr)
            self.instance.note_request_failed(addr, error)
            raise error
        if lane is not None:
            lane.ordered = resp.get_int("reviveQid", 0) == POP_ORDER_REVIVE_QUEUE
        return self._popped(resp, topic, broker_name, sub, addr)

    def _popped(self, resp: RemotingCommand, topic: str, broker_name: str, sub, addr: str) -> list:
        """The answer's messages, each with its receipt handle (POP_CK: MQClientAPIImpl.processPopResponse)."""
        msgs = decode_messages(resp.body or b"", broker_name=broker_name)
        pop_time = resp.get_int("popTime", 0)
        invisible = resp.get_int("invisibleTime", 0)
        revive_qid = resp.get_int("reviveQid", 0)
        start_info = parse_info(resp.get_str("startOffsetInfo"), "startOffsetInfo")
        offset_info = {k: v.split(",") for k, v in parse_info(resp.get_str("msgOffsetInfo"), "msgOffsetInfo").items()}
        order_info = parse_info(resp.get_str("orderCountInfo"), "orderCountInfo")
        # (record topic, queue) -> [retry mark, info key, the prefix its messages' POP_CKs share (from
        # startOffsetInfo, else from the first offset seen), its msgOffsetInfo offsets (the i-th message
        # takes the i-th; None without startOffsetInfo: each message's own), how many were taken]; a run
        # is a stretch of messages of one queue (a revived message the broker rewrote carries its own
        # POP_CK and is in none)
        ck_runs: dict = {}
        handles = [None] * len(msgs)
        for record_topic, queue_id, start, stop in queue_runs(msgs, MessageConst.POP_CK):
            run = ck_runs.get((record_topic, queue_id))
            if run is None:
                run = ck_runs[(record_topic, queue_id)] = self._ck_run(resp, start_info, offset_info, record_topic,
                                                                       queue_id, pop_time, invisible, revive_qid,
                                                                       broker_name, addr)
            if run[3] is not None:
                offsets = run[3][run[4]:run[4] + stop - start]
                run[4] += stop - start
                if len(offsets) < stop - start:
                    raise MQClientError(f"pop answer from {addr} has more messages of {run[1]} than msgOffsetInfo "
                                        f"{resp.get_str('msgOffsetInfo')!r} names")
            else:
                if run[2] is None:
                    run[2] = extra_info_prefix(msgs[start].queue_offset, pop_time, invisible, revive_qid, run[0],
                                               broker_name, queue_id)
                offsets = [str(m.queue_offset) for m in msgs[start:stop]]
            prefix = run[2]
            handles[start:stop] = [prefix + o for o in offsets]
            if order_info:
                for m in msgs[start:stop]:
                    count = order_info.get(queue_offset_key(run[0], queue_id, m.queue_offset)) or order_info.get(run[1])
                    if count is not None and int(count) > 0:
                        m.reconsume_times = int(count)
        stamp_popped(msgs, handles, MessageConst.POP_CK, MessageConst.FIRST_POP_TIME, str(pop_time), topic)
        if sub.is_tag and sub.tags_set:
            # the broker filtered by tag hash code, which can collide: re-check the exact string and
            # ack what does not match (RocketMQ's pop consumer does so), or it would come back
            tags = frozenset(sub.tags_set)
            unmatched = [m for m in msgs if m.tags not in tags]
            if unmatched:
                msgs = [m for m in msgs if m.tags in tags]
                self.instance.blocking_executor.submit(self._ack_quietly, unmatched)
        return msgs

    @staticmethod
    def _ck_run(resp, start_info, offset_info, record_topic, queue_id, pop_time, invisible, revive_qid, broker_name,
                addr) -> list:
        """_popped's entry for the messages of one (record topic, queue) of a pop answer."""
        mark = retry_mark(record_topic)
        key = info_key(mark, queue_id)
        if not start_info:  # (each message's check point is its queue's first message in the answer)
            return [mark, key, None, None, 0]
        offsets = offset_info.get(key)
        if key not in start_info or offsets is None:
            raise MQClientError(f"pop answer from {addr} has no check point of {key} (startOffsetInfo "
                                f"{resp.get_str('startOffsetInfo')!r}, msgOffsetInfo {resp.get_str('msgOffsetInfo')!r})")
        return [mark, key, extra_info_prefix(int(start_info[key]), pop_time, invisible, revive_qid, mark, broker_name,
                                             queue_id), offsets, 0]

    def _ack_quietly(self, msgs) -> None:  # (in the client's executor: may connect)
        for m in msgs:
            try:
                self.ack(m)
            except Exception as e:  # noqa: BLE001 - it comes back after its invisible time
                log.warning("ack of %s (tag %r not subscribed) failed: %s", m.msg_id, m.tags, e)

    # --- ack / change invisible duration ---------------------------------------------------------
    # Written on the broker's command channel (MQClientInstance.command_channel) from the caller's
    # thread, the answer read there too (a sync call) or completing a LeanFuture (the async ones):
    # no hop through the client's event loop, whose round trip was most of an ack's time.
    def ack(self, messages) -> None:
        """End a received message, or a list of them: not delivered to this group again.  A list is
        acked with one BATCH_ACK_MESSAGE per broker (one ack record per checkpoint at the broker).
        Raises ReceiptHandleExpiredError for a message whose invisible duration is over (it is
        delivered again) - for a list, after the others were acked, naming the expired ones."""
        self._ack_any(messages, True).result()

    def ack_async(self, messages, defer=None) -> concurrent.futures.Future:
        """ack() as a Future (a LeanFuture: many acks in flight at once; rmq_core.aio awaits it).
        defer: an event loop's call_soon (rmq_core.aio's), for acks made on it: see _gather_ack."""
        return self._ack_any(messages, False, defer)

    def _ack_any(self, messages, wait: bool, defer=None) -> LeanFuture:
        if hasattr(messages, "receipt_handle") or isinstance(messages, str):
            if defer is None:
                return self._ack_call(messages, wait)
            info = self._handle(messages)  # (a bad or expired handle fails here, on the caller's thread, as alone)
            self._require_started()
            return self._gather_ack((messages, info), {info.broker_name: {_checkpoint_key(messages): [
                self._batch_ack_fields(messages, info), [info.queue_offset]]}}, None, defer)
        try:
            messages = list(messages)
        except TypeError:
            raise IllegalArgumentError(f"ack takes a received message or a list of them, not {messages!r}") from None
        if defer is None:
            return self._batch_ack_call(messages, wait)
        by_broker, refusal = self._batch_acks(messages)
        if by_broker:
            self._require_started()
        return self._gather_ack(None, by_broker, refusal, defer)

    def _gather_ack(self, single, by_broker: dict, refusal, defer) -> LeanFuture:
        """An ack made on a deferring loop, checked already (a bad handle raised to its caller; single:
        (the message, its parsed handle) when it is one message, else None), sent at the end of the
        loop's iteration with every other ack the iteration made (_send_gathered_acks): tasks woken
        together (by one pop's answer) ack with one request, answered together, and then receive
        together (one pop: see _pop_here) - a round trip and a broker's ack record per checkpoint
        for them all, not per task."""
        fut = LeanFuture()
        with self._lanes_lock:
            first = not self._acks_gathered
            self._acks_gathered.append((fut, single, by_broker, refusal))
        if first:
            defer(self._send_gathered_acks)
        return fut

    def _send_gathered_acks(self) -> list:
        """The acks _gather_ack gathered, sent: as the one ack would have gone alone, or merged - one
        BATCH_ACK_MESSAGE per broker, the offsets of one checkpoint in one BatchAck (one ack record).
        A merged request refused sends each ack again alone, so each caller learns its own outcome
        (offsets acked meanwhile are acked already, not refused).  The connections written to."""
        with self._lanes_lock:
            gathered, self._acks_gathered = self._acks_gathered, []
        if len(gathered) == 1:
            return self._ack_alone(*gathered[0])
        merged: dict = {}
        for _, _, by_broker, _ in gathered:
            for broker_name, checkpoints in by_broker.items():
                into = merged.setdefault(broker_name, {})
                for key, (fields, offsets) in checkpoints.items():
                    have = into.get(key)
                    into[key] = [fields, offsets if have is None else have[1] + offsets]
        try:
            sent = self._send_batch_acks(merged, None, False)
        except Exception as e:  # noqa: BLE001 - each caller's Future carries it
            for fut, *_ in gathered:
                fut.finish(None, e)
            return []

        def fan_out(done: LeanFuture) -> None:
            error = done._exception  # (done: no wait)
            if isinstance(error, MQBrokerError):
                for item in gathered:
                    self._ack_alone(*item)
                return
            for fut, _, _, refusal in gathered:
                fut.finish(None, error or refusal)

        sent.add_lean_callback(fan_out)
        return [sent.channel] if sent.channel is not None else []

    def _ack_alone(self, fut: LeanFuture, single, by_broker: dict, refusal) -> list:
        """One gathered ack sent as if made alone (a message: ACK_MESSAGE), its outcome to `fut`."""
        try:
            sent = self._call(*single, RequestCode.ACK_MESSAGE, {}, None, False) if single is not None else \
                self._send_batch_acks(by_broker, refusal, False)
        except Exception as e:  # noqa: BLE001 - the caller's Future carries it
            fut.finish(None, e)
            return []
        sent.add_lean_callback(lambda done: fut.finish(None, done._exception))
        return [sent.channel] if sent.channel is not None else []

    def change_invisible_duration(self, message, invisible_duration: float | timedelta) -> None:
        """Keep a received message invisible for `invisible_duration` (s or timedelta) from now; its
        receipt handle is replaced (ack it with the message as it is now)."""
        self._change_call(message, invisible_duration, True).result()

    def change_invisible_duration_async(self, message, invisible_duration: float | timedelta
                                        ) -> concurrent.futures.Future:
        return self._change_call(message, invisible_duration, False)

    def _ack_call(self, message, wait: bool) -> LeanFuture:
        info = self._handle(message)  # (a bad or expired handle fails here, on the caller's thread)
        self._require_started()
        return self._call(message, info, RequestCode.ACK_MESSAGE, {}, None, wait)

    def _change_call(self, message, invisible_duration, wait: bool) -> LeanFuture:
        invisible_ms = round(_seconds(invisible_duration, "invisible_duration") * 1000)
        if invisible_ms < 1:
            raise IllegalArgumentError(f"bad invisible_duration {invisible_duration!r}: under a millisecond")
        info = self._handle(message)
        self._require_started()
        topic = info.real_topic(message.topic, self.group)

        def changed(resp: RemotingCommand) -> None:
            # the new check point is the message alone (MQClientAPIImpl.changeInvisibleTimeAsync)
            message.receipt_handle = build_extra_info(
                info.queue_offset, resp.get_int("popTime", 0), resp.get_int("invisibleTime", invisible_ms),
                resp.get_int("reviveQid", info.revive_qid), topic, info.broker_name, info.queue_id,
                info.queue_offset)

        return self._call(message, info, RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {"invisibleTime": invisible_ms},
                          changed, wait)

    def _batch_ack_call(self, messages: list, wait: bool) -> LeanFuture:
        """BATCH_ACK_MESSAGE of `messages` (RocketMQ's BatchAckMessageRequestBody: per checkpoint a
        BatchAck with the acked offsets as a java.util.BitSet from its start offset), one request per
        broker; the expired ones are not sent but named by the Future's ReceiptHandleExpiredError."""
        return self._send_batch_acks(*self._batch_acks(messages), wait)

    def _batch_acks(self, messages: list):
        """The BatchAcks of `messages` but for their bit sets: ({broker name: {checkpoint: [the
        BatchAck's other fields, the offsets acked]}}, the ReceiptHandleExpiredError naming the
        expired ones, which are left out, or None).  A bad handle raises."""
        # the messages of one check point share their handle but for its last field (the offset): one
        # parse and expiry check per check point, the others only give their offsets
        try:
            handles = [m.receipt_handle for m in messages]
            groups = group_by_checkpoint(handles, [m.topic for m in messages])
        except (AttributeError, TypeError):  # a str, a message without a handle: named by _handle
            for m in messages:
                self._handle(m)
            raise
        except ValueError as e:  # a handle whose last field is not an offset: named by its parse
            bad = handles[e.args[0]]
            ExtraInfo.parse(bad)
            raise IllegalArgumentError(f"bad receipt handle {bad!r}: its offset is not a queue offset") from None
        expired = []
        by_broker: dict = {}
        for key, (first, offsets) in groups.items():
            first = messages[first]
            try:
                info = self._handle(first)
            except ReceiptHandleExpiredError:
                expired += [self._expiry(m) for m in _members(messages, key)]
                continue
            start = info.ck_queue_offset
            if min(offsets) < start:
                raise IllegalArgumentError(f"bad receipt handle offsets {offsets!r} of check point {key[1]!r}: "
                                           f"before its start {start}")
            by_broker.setdefault(info.broker_name, {})[key] = [self._batch_ack_fields(first, info), offsets]
        refusal = ReceiptHandleExpiredError(f"{len(expired)} of {len(messages)} messages not acked: "
                                            f"{'; '.join(expired[:5])}{' ...' if len(expired) > 5 else ''}"
                                            ) if expired else None
        return by_broker, refusal

    def _batch_ack_fields(self, message, info: ExtraInfo) -> dict:
        """A BatchAck's fields but its bit set, of the checkpoint `message` (its parsed handle `info`) is in."""
        return {"c": self.group, "t": message.topic, "r": info.retry, "so": info.ck_queue_offset, "q": info.queue_id,
                "rq": info.revive_qid, "pt": info.pop_time, "it": info.invisible_time}

    def _send_batch_acks(self, by_broker: dict, refusal, wait: bool) -> LeanFuture:
        """One BATCH_ACK_MESSAGE per broker of _batch_acks' BatchAcks: a LeanFuture of them all,
        failing with the first failure, else with `refusal` (None: all acked)."""
        if by_broker:
            self._require_started()

        def then(_resp):
            if refusal is not None:
                raise refusal

        futures = []
        for broker_name, checkpoints in by_broker.items():
            acks = [{**fields, "b": _bit_set(offsets, fields["so"])} for fields, offsets in checkpoints.values()]
            body = fastjson.dumps({"acks": acks, "brokerName": broker_name})
            futures.append(self._send(RemotingCommand.create_request(RequestCode.BATCH_ACK_MESSAGE, {}, body),
                                      broker_name, then, wait and len(by_broker) == 1))
        if len(futures) == 1:
            return futures[0]
        return _all_of(futures, refusal)

    def _expiry(self, message) -> str:
        """Why an expired message is not acked (_handle's refusal)."""
        try:
            self._handle(message)
        except ReceiptHandleExpiredError as e:
            return str(e)
        return f"the receipt handle of message {message.msg_id} expired"

    def _handle(self, message) -> ExtraInfo:
        """The message's receipt handle, parsed; refused when missing or expired."""
        handle = getattr(message, "receipt_handle", None) if not isinstance(message, str) else None
        if handle is None:
            raise IllegalArgumentError(f"{message!r} has no receipt handle: ack and change_invisible_duration take "
                                       "a message this SimpleConsumer received")
        info = ExtraInfo.parse(handle)
        late = now_ms() - info.visible_at
        if late >= 0:
            raise ReceiptHandleExpiredError(
                f"the receipt handle of message {message.msg_id} ({message.topic}, queue {info.queue_id}, offset "
                f"{info.queue_offset}) expired {late / 1000:.3f} s ago (invisible for {info.invisible_time} ms "
                f"from its pop): it is delivered again")
        return info

    def _call(self, message, info: ExtraInfo, code: int, more: dict, then, wait: bool) -> LeanFuture:
        """ACK_MESSAGE / CHANGE_MESSAGE_INVISIBLETIME of `message` to the master of its broker: a
        LeanFuture of then(answer) (None without `then`), answered (wait=True) on this thread."""
        request = RemotingCommand.create_request(code, {
            "consumerGroup": self.group, "topic": info.real_topic(message.topic, self.group),
            "queueId": info.queue_id, "extraInfo": message.receipt_handle, "offset": info.queue_offset, **more})
        return self._send(request, info.broker_name, then, wait)

    def _send(self, request: RemotingCommand, broker_name: str, then, wait: bool) -> LeanFuture:
        """`request` on the command channel of `broker_name`'s master (see _call)."""
        inst = self.instance
        addr = self._master(broker_name)
        if addr is None:
            raise MQClientError(f"the master of broker {broker_name!r} (of a receipt handle) is not in any route "
                                f"known to {self.client_id}")
        request.language = "PYTHON"  # (as MQClientInstance.invoke marks its requests)
        timeout = self.client_config.mq_client_api_timeout
        try:
            channel = inst.command_channel(addr)
        except RemotingError as e:
            inst.note_request_failed(addr, e)
            raise
        fut = LeanFuture(channel)
        context = (fut, addr, then, inst)
        if wait:
            channel.exchange(request.encode(), request.opaque, timeout, _answered, context)
        else:
            channel.send(request.encode(), request.opaque, timeout, _answered, context)
        return fut


def _checkpoint_key(message) -> tuple:
    """(topic, the receipt handle's first 7 fields): the check point a message was popped in, as
    receipt.group_by_checkpoint keys it."""
    return message.topic, message.receipt_handle.rpartition(" ")[0]


def _members(messages: list, key: tuple) -> list:
    """The messages of one check point of SimpleConsumer._batch_acks (its refusals name each)."""
    return [m for m in messages if _checkpoint_key(m) == key]


def _bit_set(offsets: list, start: int = 0) -> str:
    """java.util.BitSet.toByteArray() with bit (offset - start) set for each offset, base64 (how
    fastjson writes a byte[]); ValueError for an offset before `start`."""
    low, high = min(offsets) - start, max(offsets) - start
    if low < 0:
        raise ValueError(f"offset {low + start} before the check point's start {start}")
    if high - low + 1 == len(offsets) and len(set(offsets)) == len(offsets):  # (the usual: a run of offsets)
        value = ((1 << len(offsets)) - 1) << low
    else:
        value = 0
        for i in offsets:
            value |= 1 << (i - start)
    return base64.b64encode(value.to_bytes(high // 8 + 1, "little")).decode("ascii")


def _all_of(futures: list, error: BaseException | None) -> LeanFuture:
    """A LeanFuture done when all `futures` are: the first failure, else `error` (or None)."""
    out = LeanFuture()
    if not futures:
        out.finish(None, error)
        return out
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(f):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            failed = next((x.exception() for x in futures if x.exception() is not None), None)
            out.finish(None, failed or error)

    for f in futures:
        f.add_done_callback(one_done)
    return out


def _resolve(future, result, error) -> None:
    """A receive's future (a LeanFuture of the command channel's route, an asyncio Future of the
    loop's) given its outcome."""
    if type(future) is LeanFuture:
        future.finish(result, error)
    elif error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _popped_here(context, resp, error) -> None:
    """A command channel's completion of a pop of SimpleConsumer._pop_here, on the thread that read
    the answer: its receives given the messages or the error, then the lane's next pop."""
    consumer, key, lane, taken, total, sub, addr, opaque = context
    msgs = None
    try:
        if error is None:
            msgs = consumer._pop_answer(resp, key[0], key[1], sub, addr, lane)
    except Exception as e:  # noqa: BLE001 - the receives carry it
        error = e
    with consumer._lanes_lock:
        consumer._pops_here.pop(opaque, None)
    if isinstance(error, (RemotingError, TimeoutError)):
        consumer.instance.note_request_failed(addr, error)
    try:
        consumer._hand_out(key, lane, taken, total, msgs, error)
    finally:
        consumer._next_pop_here(key, lane, addr)


def _answered(context, resp, error) -> None:
    """A command channel's completion of an ack / change (on the thread that read the answer)."""
    fut, addr, then, inst = context
    result = None
    if error is None:
        if resp.code != ResponseCode.SUCCESS:
            error = MQBrokerError(resp.code, resp.remark, addr)
        elif then is not None:
            try:
                result = then(resp)
            except Exception as e:  # noqa: BLE001 - the caller's Future carries it
                error = e
    if isinstance(error, (RemotingError, TimeoutError)):
        inst.note_request_failed(addr, error)
    fut.finish(result, error)


__all__ = ["SimpleConsumer", "MAX_MESSAGE_NUM"]
