"""Topic routes: what the name server says (TopicRouteData) and what a producer / consumer derives
from it (TopicPublishInfo - rmq_core._native.send_route's - and the readable queue set).  Pure data
and arithmetic; no I/O."""
from __future__ import annotations

import attrs

from rmq_core._native import send_route
from rmq_core._native.send_route import TopicPublishInfo  # (the queue choice's one owner, typed: native)
from rmq_core.errors import MQClientError, RemotingCommandError
from rmq_core.message import MessageQueue, PermName

send_route.use_python_layer(message_queue=MessageQueue, client_error=MQClientError)
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
        write_queue_nums: dict[str, int] = {}
        for qd in self.queue_datas:
            write_queue_nums.setdefault(qd.broker_name, qd.write_queue_nums)
        return TopicPublishInfo(topic, queues, self, order, write_queue_nums)


__all__ = ["QueueData", "BrokerData", "TopicRouteData", "TopicPublishInfo"]
