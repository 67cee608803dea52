"""ConsumerBase: what PushConsumer and PullConsumer share - their settings, the client instance
they join (`join_client`, also the SimpleConsumer's), subscriptions, the offset store and the
rebalance plumbing - and the offset store's read modes (READ_FROM_MEMORY / READ_FROM_STORE)."""
from __future__ import annotations

import inspect
import logging
import threading
import time
from typing import Any, Callable, Mapping

from rmq_core import plugins
from rmq_core.client.config import make_client_config
from rmq_core.client.instance import MQClientInstance, MQClientManager
from rmq_core.client.process_queue import ProcessQueue
from rmq_core.client.producer import Producer
from rmq_core.client.pull_api import BrokerOffsetApi, PullChain, PullRequests, max_offset, search_offset
from rmq_core.client.rebalance import RebalanceImpl
from rmq_core.client.subscription import build_subscription
from rmq_core.client.trace import TraceDispatcher
from rmq_core.common.delegate import delegate
from rmq_core.common.subscription import SubscriptionData
from rmq_core.errors import ConfigError, MQBrokerError, MQClientError, NamesrvUnreachableError, RemotingError
from rmq_core.message import ConsumeFromWhere, MessageModel, MessageQueue, MixAll, check_group
from rmq_core.remoting.body import TopicRouteData

log = logging.getLogger("rmq.client.consumer")

READ_FROM_MEMORY = "READ_FROM_MEMORY"
READ_FROM_STORE = "READ_FROM_STORE"
MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


_SHORT_NAMES = {"LAST": "CONSUME_FROM_LAST_OFFSET", "FIRST": "CONSUME_FROM_FIRST_OFFSET",
                "TIMESTAMP": "CONSUME_FROM_TIMESTAMP"}


def enum_setting(cls, value, what: str):
    """A consumer setting's enum member from the member, its value or (consume_from_where) short
    name; ConfigError naming the setting, the value and the accepted ones otherwise."""
    if isinstance(value, cls):
        return value
    try:
        text = str(value).upper()
        if cls is ConsumeFromWhere:
            text = _SHORT_NAMES.get(text, text)
        return cls(text)
    except ValueError:
        raise ConfigError(f"bad {what} {value!r}; expected one of: {', '.join(m.value for m in cls)}") from None


def join_client(consumer, prepare: Callable[[MQClientInstance], None] | None = None) -> MQClientInstance:
    """A consumer's start, with its client: the instance of its client id (objects with one
    instance name share it) registered and started, `prepare(instance)` (the consumer's own parts),
    the routes of its topics (`subscription_inner`) asked for - each known route handed to
    consumer.on_route_changed, no name server answering fails the start -, a heartbeat to every
    broker (a refusal, e.g. a duplicate client id, fails the start) and CHECK_CLIENT_CONFIG for its
    non-tag subscriptions (a broker that cannot filter them fails the start, saying why).  On
    failure the consumer is unregistered again."""
    inst = consumer.instance = MQClientManager.get_instance(consumer.client_config, Producer)
    inst.register_consumer(consumer.group, consumer)
    try:
        inst.start()
        if prepare is not None:
            prepare(inst)
        topics = list(consumer.subscription_inner)

        async def routes():
            for t in topics:
                await inst.update_topic_route(t)

        inst.run(routes(), timeout=30)
        for t in topics:
            route = inst.topic_route_table.get(t)
            if route is not None:
                consumer.on_route_changed(t, route)
            elif isinstance(inst.route_errors.get(t), NamesrvUnreachableError):
                # no name server answers: starting would wait for routes that never come
                raise inst.route_error(t)
        inst.heartbeat_now(raise_errors=True)
        inst.run(inst.check_client_in_broker(consumer.group, list(consumer.subscription_inner.values())), timeout=30)
    except BaseException:
        inst.unregister_consumer(consumer.group)
        raise
    return inst


class ConsumerBase:
    """Shared by PushConsumer and PullConsumer: client instance, offsets, rebalance plumbing."""

    consume_type = "CONSUME_PASSIVELY"

    # the settings both consumers take, as keywords besides their own, with their defaults
    SHARED_SETTINGS: dict[str, Any] = {
        "message_model": "CLUSTERING", "consume_from_where": "CONSUME_FROM_LAST_OFFSET", "consume_timestamp": None,
        "allocate_strategy": "averagely", "offset_store": None, "offset_dir": None, "instance_name": None,
        "rebalance_interval": 20.0,
        # the pulls' timing (seconds; a subclass may change the defaults)
        "pull_time_delay_when_exception": 3.0, "pull_time_delay_when_flow_control": 0.05,
        "broker_suspend_max_time": 15.0, "consumer_timeout_when_suspend": 30.0}

    def __init_subclass__(cls, **kwargs):
        """A consumer's signature as help() and inspect show it: its own parameters, then
        SHARED_SETTINGS' as keyword-only ones with their defaults, then **client_options."""
        super().__init_subclass__(**kwargs)
        own = inspect.signature(cls.__init__)
        params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        rest = [p for p in own.parameters.values() if p.kind is p.VAR_KEYWORD]
        shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
                  for name, default in cls.SHARED_SETTINGS.items() if name not in own.parameters]
        cls.__init__.__signature__ = own.replace(parameters=params + shared + rest)

    def __init__(self, group: str, namesrv, options: Mapping[str, Any]):
        """`options`: the consumer's keyword arguments beyond its own settings: SHARED_SETTINGS
        (message_model, consume_from_where, consume_timestamp (epoch ms), allocate_strategy,
        offset_store, offset_dir, instance_name, rebalance_interval (s), the pulls' timing) and the
        client's (ClientConfig's: access_key, unit_name, ...)."""
        self.group = check_group(group)
        opts = dict(options)
        settings = {name: opts.pop(name, default) for name, default in self.SHARED_SETTINGS.items()}
        # message trace (RocketMQ's enableMsgTrace): each listener call noted, sent in the background
        self.trace = TraceDispatcher.create(self.group, "CONSUME", opts.pop("enable_msg_trace", False),
                                            opts.pop("customized_trace_topic", None))
        if settings["instance_name"] is not None:
            opts["instance_name"] = settings["instance_name"]
        self.client_config = make_client_config(type(self).__name__, namesrv, opts, own=type(self).__init__,
                                                also=settings)
        self.message_model = enum_setting(MessageModel, settings["message_model"], "message_model")
        self.consume_from_where = enum_setting(ConsumeFromWhere, settings["consume_from_where"], "consume_from_where")
        # Java default: half an hour before the consumer starts
        consume_timestamp, rebalance_interval = settings["consume_timestamp"], settings["rebalance_interval"]
        self.consume_timestamp = int(consume_timestamp if consume_timestamp is not None
                                     else (time.time() - 1800) * 1000)
        self.allocate_strategy_name = settings["allocate_strategy"]
        self.offset_store_name = settings["offset_store"] or (
            "remote" if self.message_model is MessageModel.CLUSTERING else "local_file")
        self.offset_dir = settings["offset_dir"]
        if rebalance_interval <= 0:
            raise ConfigError(f"bad rebalance_interval {rebalance_interval!r}: must be > 0")
        self.rebalance_interval = rebalance_interval
        self.pull_time_delay_when_exception = settings["pull_time_delay_when_exception"]
        self.pull_time_delay_when_flow_control = settings["pull_time_delay_when_flow_control"]
        suspend, timeout = settings["broker_suspend_max_time"], settings["consumer_timeout_when_suspend"]
        for name, value in (("broker_suspend_max_time", suspend), ("consumer_timeout_when_suspend", timeout)):
            if value <= 0:
                raise ConfigError(f"bad {name} {value!r}: must be > 0")
        if suspend >= timeout:
            raise ConfigError(f"broker_suspend_max_time ({suspend}) must be shorter than "
                              f"consumer_timeout_when_suspend ({timeout})")
        self.broker_suspend_max_time, self.consumer_timeout_when_suspend = suspend, timeout
        self.subscription_inner: dict[str, SubscriptionData] = {}
        self.instance: MQClientInstance | None = None
        self.offset_store = None
        self.rebalance: RebalanceImpl | None = None
        self.start_timestamp = 0  # epoch ms of the last start
        self._started = False
        self._state_lock = threading.Lock()

    # heartbeat fields
    message_model_name = delegate("message_model.value")
    consume_from_where_name = delegate("consume_from_where.value")
    client_id = delegate("client_config.client_id")

    def subscriptions(self) -> list[SubscriptionData]:
        return list(self.subscription_inner.values())

    def subscribe(self, topic: str, expression="*") -> None:
        """expression: "TagA || TagB", "*", or a MessageSelector (MessageSelector.by_sql("a > 5"))."""
        sub = build_subscription(topic, expression)
        self.subscription_inner[topic] = sub
        if self._started:
            self.instance.run(self.instance.update_topic_route(topic), timeout=30)
            route = self.instance.topic_route_table.get(topic)
            if route is not None:
                self.rebalance.topic_subscribe_info[topic] = route.subscribe_queues(topic)
            self.instance.heartbeat_now()
            self.instance.rebalance_immediately()

    def unsubscribe(self, topic: str) -> None:
        self.subscription_inner.pop(topic, None)
        if self._started:
            self.instance.heartbeat_now()
            self.instance.rebalance_immediately()

    def subscribed_topics(self) -> set[str]:
        return set(self.subscription_inner)

    def _pull_chain(self, mq: MessageQueue, pq: ProcessQueue, make_request, may_pull_ahead):
        """A queue's pull loop's PullChain and its `stopped()`: the queue dropped or this consumer
        shut down."""
        def stopped() -> bool:
            return pq.dropped or not self._started

        chain = PullChain(self.instance, self.group, mq, self.consumer_timeout_when_suspend, make_request,
                          may_pull_ahead)
        return chain, stopped

    def _pull_requests_of(self, mq: MessageQueue) -> Callable[[], PullRequests]:
        """For a queue's pull loop: its PullRequests for the current subscription and batch size
        (made anew when a subscribe() or a new batch size changes either)."""
        requests = None

        def current() -> PullRequests:
            nonlocal requests
            sub = self.subscription_inner[mq.topic]
            if requests is None or requests.sub is not sub or requests.max_nums != self.pull_batch_size:
                requests = PullRequests(group=self.group, mq=mq, sub=sub, max_nums=self.pull_batch_size,
                                        suspend_timeout_ms=int(self.broker_suspend_max_time * 1000))
            return requests

        return current

    def on_route_changed(self, topic: str, route: TopicRouteData) -> None:
        if topic in self.subscription_inner and self.rebalance is not None:
            self.rebalance.topic_subscribe_info[topic] = route.subscribe_queues(topic)

    def _resolve_plugins(self):
        strategy = plugins.get_allocate_strategy(self.allocate_strategy_name)
        factory = plugins.get_offset_store_factory(self.offset_store_name)
        return strategy, factory

    def _make_offset_store(self, factory, instance):
        return factory(self.group, broker_api=BrokerOffsetApi(instance, self.group), offset_dir=self.offset_dir,
                       client_id=instance.client_id)

    def _start_common(self, orderly: bool) -> None:
        """Resolve plugins (unknown name -> error listing the available ones), then join the client
        (join_client) with the offsets loaded and the rebalance made."""
        strategy, factory = self._resolve_plugins()
        self.start_timestamp = int(time.time() * 1000)  # (the running info's PROP_CONSUMER_START_TIMESTAMP)

        def prepare(inst: MQClientInstance) -> None:
            self.offset_store = self._make_offset_store(factory, inst)
            self.offset_store.load()
            self.rebalance = RebalanceImpl(self, inst, self.group, self.message_model, strategy,
                                           orderly=orderly, lock_max_live_time=getattr(self, "lock_max_live_time", 30.0),
                                           check_pull_expired=self.consume_type == "CONSUME_PASSIVELY")
            self.rebalance.subscriptions = self.subscription_inner

        join_client(self, prepare)
        if self.trace is not None:
            self.trace.start(self.instance)

    def _stop_trace(self) -> None:
        """The trace's last records leave (through the client's inner producer) before the
        consumer unregisters, which may stop the client."""
        if self.trace is not None:
            self.trace.shutdown()

    def persist_consumer_offset(self) -> None:
        if self.offset_store is None or self.rebalance is None:
            return
        mqs = set(self.rebalance.process_queue_table)
        if mqs:
            self.offset_store.persist_all(mqs)

    def commit_offsets_sync(self, mqs) -> None:
        """Store the in-memory offsets of `mqs` and wait for the broker to confirm (clustering), so the
        next owner of a released queue, or this group after a restart, starts exactly there."""
        for mq in mqs:
            offset = self.offset_store.read_offset(mq, READ_FROM_MEMORY)
            if offset < 0:
                continue
            if self.message_model is MessageModel.CLUSTERING:
                try:
                    self.offset_store.update_consume_offset_to_broker(mq, offset, False)
                except (MQClientError, MQBrokerError, RemotingError) as e:
                    log.warning("commit offset %d of %s failed: %s", offset, mq, e)
            else:
                self.offset_store.persist(mq)

    def remove_dirty_offset(self, mq: MessageQueue) -> None:
        self.offset_store.remove_offset(mq)

    def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """Where a newly owned queue starts: the stored offset, else per consume_from_where."""
        last = self.offset_store.read_offset(mq, READ_FROM_STORE)
        if last >= 0:
            return last
        if last < -1:
            return -1
        inst = self.instance
        where = self.consume_from_where
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        if where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            if MixAll.is_retry_topic(mq.topic):
                return 0
            return inst.run(max_offset(inst, mq), timeout=inst.config.mq_client_api_timeout + 5)
        if MixAll.is_retry_topic(mq.topic):
            return inst.run(max_offset(inst, mq), timeout=inst.config.mq_client_api_timeout + 5)
        return inst.run(search_offset(inst, mq, self.consume_timestamp), timeout=inst.config.mq_client_api_timeout + 5)

    def do_rebalance(self) -> None:
        if self._started and self.rebalance is not None:
            self.rebalance.do_rebalance()

    def running_info(self) -> dict:
        """GET_CONSUMER_RUNNING_INFO's answer (RocketMQ's ConsumerRunningInfo): properties (with
        Java's PROP_* keys), subscriptions, each queue's process-queue state (times in epoch ms)
        and, for a push consumer, statusTable: its consumption per topic (ConsumeStatus)."""
        orderly = bool(getattr(self, "_orderly", False))
        info = {
            "properties": {"consumeType": self.consume_type, "messageModel": self.message_model.value,
                           "consumeFromWhere": self.consume_from_where.value, "clientId": self.client_id,
                           "PROP_CONSUME_TYPE": self.consume_type, "PROP_CONSUMEORDERLY": str(orderly).lower(),
                           "PROP_CONSUMER_START_TIMESTAMP": str(self.start_timestamp)},
            "subscriptionSet": [s.to_json() for s in self.subscriptions()],
            "mqTable": [],
        }
        epoch = time.time() - time.monotonic()  # (process queues keep monotonic times)
        if self.rebalance is not None:
            for mq, pq in list(self.rebalance.process_queue_table.items()):
                info["mqTable"].append({
                    "topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id,
                    "commitOffset": self.offset_store.read_offset(mq, READ_FROM_MEMORY),
                    "cachedMsgCount": pq.msg_count, "cachedMsgSize": pq.msg_size, "locked": pq.locked,
                    "droped": pq.dropped, "tryUnlockTimes": pq.try_unlock_times,
                    "lastLockTimestamp": int((pq.last_lock_timestamp + epoch) * 1000),
                    "lastPullTimestamp": int((pq.last_pull_timestamp + epoch) * 1000),
                    "lastConsumeTimestamp": int((pq.last_consume_timestamp + epoch) * 1000),
                })
        service = getattr(self, "consume_service", None)
        if service is not None:
            info["statusTable"] = service.consume_stats.status_table()
        return info

    def reset_offset(self, topic: str, table: dict) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: drop the queues, store the new offsets, rebalance."""
        if self.rebalance is None:
            return
        for mq, pq in list(self.rebalance.process_queue_table.items()):
            if mq.topic == topic and mq in table:
                pq.dropped = True
                pq.clear()
        time.sleep(0.01)
        for mq, offset in table.items():
            self.offset_store.update_offset(mq, offset, False)
        self.commit_offsets_sync(list(table))  # stored before the queues are rebuilt from it
        for mq in table:
            self.rebalance.process_queue_table.pop(mq, None)
        self.instance.rebalance_immediately()


__all__ = ["ConsumerBase", "join_client", "enum_setting", "READ_FROM_MEMORY", "READ_FROM_STORE", "MEMORY_FIRST_THEN_STORE"]
