"""Topic routes: what the name server says (TopicRouteData) and what a producer / consumer derives
from it (TopicPublishInfo, the readable queue set).  Pure data and arithmetic; no I/O."""
from __future__ import annotations

import random
import threading


from rmq_core.errors import MQClientError, RemotingCommandError
from rmq_core.message import MessageQueue
from rmq_core.remoting.body import TopicRouteData


def decode_route(body: bytes | str) -> TopicRouteData:
    """The name server's answer to GET_ROUTEINFO_BY_TOPIC; MQClientError quoting it when malformed."""
    try:
        return TopicRouteData.decode(body)
    except (RemotingCommandError, ValueError, TypeError, AttributeError) as e:
        text = body if isinstance(body, str) else bytes(body).decode("utf-8", "replace")
        raise MQClientError(f"malformed topic route from the name server: {e}: {text[:200]!r}") from None


def publish_info(route: TopicRouteData, topic: str) -> "TopicPublishInfo":
    """What a producer may write to of a topic's route (topicRouteData2TopicPublishInfo)."""
    queues, order = route.publish_queues(topic)
    return TopicPublishInfo(topic=topic, queues=queues, route=route, order_topic=order)


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


__all__ = ["TopicPublishInfo", "decode_route", "publish_info"]
