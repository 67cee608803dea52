"""Topic routes: what the name server says (TopicRouteData) and what a producer / consumer derives
from it (TopicPublishInfo - rmq_core._native.send_route's - and the readable queue set).  Pure data
and arithmetic; no I/O."""
from __future__ import annotations

from rmq_core._native import send_route
from rmq_core._native.send_route import TopicPublishInfo  # (the queue choice's one owner, typed: native)
from rmq_core.errors import MQClientError, RemotingCommandError
from rmq_core.message import MessageQueue

send_route.use_python_layer(message_queue=MessageQueue, client_error=MQClientError)
from rmq_core.remoting.body import TopicRouteData  # noqa: E402


def decode_route(body: bytes | str) -> TopicRouteData:
    """The name server's answer to GET_ROUTEINFO_BY_TOPIC; MQClientError quoting it when malformed."""
    try:
        return TopicRouteData.decode(body)
    except (RemotingCommandError, ValueError, TypeError, AttributeError) as e:
        text = body if isinstance(body, str) else bytes(body).decode("utf-8", "replace")
        raise MQClientError(f"malformed topic route from the name server: {e}: {text[:200]!r}") from None


def publish_info(route: TopicRouteData, topic: str) -> TopicPublishInfo:
    """What a producer may write to of a topic's route (topicRouteData2TopicPublishInfo)."""
    queues, order = route.publish_queues(topic)
    write_queue_nums: dict[str, int] = {}
    for qd in route.queue_datas:
        write_queue_nums.setdefault(qd.broker_name, qd.write_queue_nums)
    return TopicPublishInfo(topic, queues, route, order, write_queue_nums)


__all__ = ["TopicPublishInfo", "decode_route", "publish_info"]
