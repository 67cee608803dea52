"""Subscriptions (SubscriptionData), the heartbeat body, and the client-side tag re-check."""
from __future__ import annotations

import json
import time

import attrs

from rmq_core import plugins
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import (
    ExpressionType, MessageSelector, MixAll, SUB_ALL, TopicValidator, java_string_hash, split_tags,
)


@attrs.define
class SubscriptionData:
    topic: str
    sub_string: str = SUB_ALL
    expression_type: str = ExpressionType.TAG
    tags_set: list = attrs.field(factory=list)
    code_set: list = attrs.field(factory=list)
    sub_version: int = attrs.field(factory=lambda: int(time.time() * 1000))

    @property
    def is_tag(self) -> bool:
        return ExpressionType.is_tag_type(self.expression_type)

    def to_json_dict(self) -> dict:
        return {
            "classFilterMode": False,
            "codeSet": list(self.code_set),
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": list(self.tags_set),
            "topic": self.topic,
        }

    def matches_tag(self, tags: str | None) -> bool:
        """Client-side re-check after a pull: the broker filtered by hash code, which can collide."""
        if not self.is_tag or not self.tags_set:
            return True
        return tags in self._tags_lookup

    @property
    def _tags_lookup(self) -> frozenset:
        return frozenset(self.tags_set)


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
    if ExpressionType.is_tag_type(etype):
        tags = split_tags(selector.expression)
        sub_string = SUB_ALL if not tags else selector.expression.strip()
        return SubscriptionData(topic=topic, sub_string=sub_string, expression_type=ExpressionType.TAG,
                                tags_set=tags, code_set=[java_string_hash(t) for t in tags])
    # SQL92 or a plugin type: validate through the plugin (raises FilterExpressionError / PluginNotFoundError)
    plugins.get_filter_factory(etype)(selector.expression)
    return SubscriptionData(topic=topic, sub_string=selector.expression, expression_type=etype)


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
            "subscriptionDataSet": [s.to_json_dict() for s in c.subscriptions()],
            "unitMode": False,
        }
        for c in consumers
    ]
    pds = [{"groupName": g} for g in producer_groups]
    data["consumerDataSet"] = cds
    data["producerDataSet"] = pds
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


__all__ = ["SubscriptionData", "build_subscription", "retry_subscription", "heartbeat_body"]
