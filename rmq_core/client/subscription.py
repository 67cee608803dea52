"""A consumer's subscriptions from its expressions, and the heartbeat body."""
from __future__ import annotations

import json

from rmq_core import plugins
from rmq_core.common.subscription import SubscriptionData
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import (
    ExpressionType, MessageSelector, MixAll, SUB_ALL, TopicValidator,
)


def build_subscription(topic: str, expression="*") -> SubscriptionData:
    """A SubscriptionData from "TagA || TagB", "*", None, or a MessageSelector (TAG / SQL92 / a
    plugin's type).  Non-TAG expressions are compiled once through the filter plugin so a
    malformed one fails here, naming the position, not later on the broker."""
    TopicValidator.check_topic(topic)
    if expression is None:
        selector = MessageSelector.by_tag(SUB_ALL)
    elif isinstance(expression, MessageSelector):
        selector = expression
    elif isinstance(expression, str):
        selector = MessageSelector.by_tag(expression.strip() or SUB_ALL)
    else:
        raise IllegalArgumentError(
            f"bad subscription expression {expression!r} for topic {topic!r}: expected a tag expression "
            "string or a MessageSelector"
        )
    etype = (selector.expression_type or ExpressionType.TAG).upper()
    if not ExpressionType.is_tag_type(etype):
        # SQL92 or a plugin type: validate through the plugin (raises FilterExpressionError / PluginNotFoundError)
        plugins.get_filter_factory(etype)(selector.expression)
    return SubscriptionData.build(topic, selector.expression, etype)


def retry_subscription(group: str) -> SubscriptionData:
    return SubscriptionData(topic=MixAll.get_retry_topic(group), sub_string=SUB_ALL)


def heartbeat_body(client_id: str, producer_groups, consumers) -> bytes:
    """HeartbeatData JSON as a Java client writes it (enum names as strings).

    consumers: iterable of objects with group, consume_type ("CONSUME_PASSIVELY" / "CONSUME_ACTIVELY"),
    message_model (str), consume_from_where (str), subscriptions() -> list[SubscriptionData].
    """
    data: dict = {"clientID": client_id}
    cds = [
        {
            "groupName": c.group,
            "consumeType": c.consume_type,
            "messageModel": c.message_model_name,
            "consumeFromWhere": c.consume_from_where_name,
            "subscriptionDataSet": [s.to_json() for s in c.subscriptions()],
            "unitMode": False,
        }
        for c in consumers
    ]
    pds = [{"groupName": g} for g in producer_groups]
    data["consumerDataSet"] = cds
    data["producerDataSet"] = pds
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


__all__ = ["build_subscription", "retry_subscription", "heartbeat_body"]
