"""Topic routes: what the name server says (TopicRouteData) and what a producer / consumer derives
from it (TopicPublishInfo, the readable queue set).  Pure data and arithmetic; no I/O."""
from __future__ import annotations

import random
import threading

import attrs

from rmq_core.errors import MQClientError, RemotingCommandError
from rmq_core.message import MessageQueue, PermName
from rmq_core.remoting.body import BrokerData, QueueData
from rmq_core.remoting.body import TopicRouteData as WireTopicRouteData


@attrs.define
class TopicRouteData(WireTopicRouteData):
    """The name server's route of a topic (remoting.body's, one type for every side), with what
    a producer and a consumer derive from it."""

    @classmethod
    def from_json(cls, body: bytes | str) -> "TopicRouteData":
        try:
            return cls.decode(body)
        except (RemotingCommandError, ValueError, TypeError, AttributeError) as e:
            text = body if isinstance(body, str) else bytes(body).decode("utf-8", "replace")
            raise MQClientError(f"malformed topic route from the name server: {e}: {text[:200]!r}") from None

    def broker_data(self, broker_name: str) -> BrokerData | None:
        for bd in self.broker_datas:
            if bd.broker_name == broker_name:
                return bd
        return None

    def with_default_topic_queue_nums(self, queue_nums: int) -> "TopicRouteData":
        """TBW102 fallback: use the default topic's brokers, capping queue counts (Java does the same
        before a broker has auto-created the new topic)."""
        qds = [
            attrs.evolve(q, read_queue_nums=min(queue_nums, q.read_queue_nums),
                         write_queue_nums=min(queue_nums, q.read_queue_nums))
            for q in self.queue_datas
        ]
        return attrs.evolve(self, queue_datas=qds)

    def no_master(self) -> str | None:
        """Why a producer finds no queue to write to when the topic has writable queues whose broker
        groups have no master right now (only slaves registered), else None."""
        names = sorted({q.broker_name for q in self.queue_datas if PermName.is_writeable(q.perm)})
        groups = [self.broker_data(n) for n in names]
        if not groups or any(bd is not None and bd.master_addr is not None for bd in groups):
            return None
        slaves = sorted(a for bd in groups if bd is not None for a in bd.broker_addrs.values())
        which = ", ".join(names)
        text = (f"broker group {which} has no master" if len(names) == 1 else
                f"none of the broker groups {which} has a master")
        text += f" (only slaves registered: {', '.join(slaves)})" if slaves else ""
        if all(bd is not None and bd.enable_controller_mode for bd in groups):
            return text + "; a new master is being elected (controller mode): retry in a few seconds"
        return text + "; start the master again (a slave is read-only)"

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues (topicRouteData2TopicSubscribeInfo)."""
        out = []
        for qd in self.queue_datas:
            if PermName.is_readable(qd.perm):
                out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        return sorted(out)

    def publish_info(self, topic: str) -> "TopicPublishInfo":
        """Writable queues on brokers with a master (topicRouteData2TopicPublishInfo)."""
        queues: list[MessageQueue] = []
        order = False
        if self.order_topic_conf:
            # "brokerA:8;brokerB:8": ordered topics list their queues explicitly
            for item in self.order_topic_conf.split(";"):
                name, _, n = item.partition(":")
                if name and n.strip().isdigit():
                    queues.extend(MessageQueue(topic, name, i) for i in range(int(n)))
            order = True
        else:
            for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
                if not PermName.is_writeable(qd.perm):
                    continue
                bd = self.broker_data(qd.broker_name)
                if bd is None or bd.master_addr is None:
                    continue
                queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
        return TopicPublishInfo(topic=topic, queues=queues, route=self, order_topic=order)


class TopicPublishInfo:
    """The queues a producer may write to, with the round-robin cursor (sendWhichQueue)."""

    __slots__ = ("topic", "queues", "route", "order_topic", "index", "_lock", "have_route")

    def __init__(self, topic: str, queues: list, route: TopicRouteData | None, order_topic: bool = False):
        self.topic = topic
        self.queues = list(queues)
        self.route = route
        self.order_topic = order_topic
        self.have_route = route is not None
        # the round robin's cursor (public: the native sender advances it too, send_pipeline.PipelinedSender)
        # Java's ThreadLocalIndex starts at a random value so producers do not all hit queue 0
        self.index = random.randrange(1 << 16)
        self._lock = threading.Lock()

    @property
    def ok(self) -> bool:
        return bool(self.queues)

    def next_index(self) -> int:
        with self._lock:
            self.index = (self.index + 1) & 0x7FFFFFFF
            return self.index

    def select_one(self, last_broker_name: str | None = None) -> MessageQueue:
        """Round robin; when retrying, prefer a queue on another broker than the one that failed."""
        if not self.queues:
            raise MQClientError(f"no writable queue for topic {self.topic!r}")
        n = len(self.queues)
        if last_broker_name is not None:
            for _ in range(n):
                mq = self.queues[self.next_index() % n]
                if mq.broker_name != last_broker_name:
                    return mq
        return self.queues[self.next_index() % n]

    def write_queue_nums_of(self, broker_name: str) -> int:
        if self.route is None:
            return -1
        for qd in self.route.queue_datas:
            if qd.broker_name == broker_name:
                return qd.write_queue_nums
        return -1


__all__ = ["QueueData", "BrokerData", "TopicRouteData", "TopicPublishInfo"]
