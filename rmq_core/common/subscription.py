"""SubscriptionData (RocketMQ's common/protocol/heartbeat/SubscriptionData): a consumer's
subscription to one topic, as the client sends it in a heartbeat or a pull and the broker keeps it."""
from __future__ import annotations


import attrs

from rmq_core.common.clock import now_ms
from rmq_core.message import ExpressionType, SUB_ALL, java_string_hash, split_tags



@attrs.define
class SubscriptionData:
    topic: str
    sub_string: str = SUB_ALL
    expression_type: str = ExpressionType.TAG
    tags_set: list = attrs.field(factory=list)
    code_set: list = attrs.field(factory=list)
    sub_version: int = attrs.field(factory=now_ms)

    @classmethod
    def build(cls, topic: str, sub_string: str | None, expression_type: str | None = None,
              sub_version: int | None = None) -> "SubscriptionData":
        """From the wire's strings: a tag expression gets its tags and their hash codes, any other
        type keeps its expression as it is (its filter plugin compiles it)."""
        etype = (expression_type or ExpressionType.TAG).upper()
        sub = (sub_string or SUB_ALL).strip() or SUB_ALL
        data = cls(topic=topic, sub_string=sub, expression_type=etype,
                   sub_version=int(sub_version) if sub_version not in (None, "") else now_ms())
        if ExpressionType.is_tag_type(etype):
            data.tags_set = split_tags(sub)
            if not data.tags_set:
                data.sub_string = SUB_ALL
            # recomputed, never read from the wire: the C++ client's codeSet is bogus (docs/protocol.md §4.2)
            data.code_set = [java_string_hash(t) for t in data.tags_set]
        return data

    @classmethod
    def from_json(cls, d: dict) -> "SubscriptionData":
        return cls.build(d.get("topic", ""), d.get("subString"), d.get("expressionType"), d.get("subVersion"))

    def to_json(self) -> dict:
        """The JSON object a Java client writes (keys in fastjson's sorted order)."""
        return {
            "classFilterMode": False,
            "codeSet": list(self.code_set),
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": list(self.tags_set),
            "topic": self.topic,
        }

    @property
    def is_tag(self) -> bool:
        return ExpressionType.is_tag_type(self.expression_type)

    def matches_tag(self, tags: str | None) -> bool:
        """Client-side re-check after a pull: the broker filtered by hash code, which can collide."""
        if not self.is_tag or not self.tags_set:
            return True
        return tags in self.tags_set


__all__ = ["SubscriptionData"]
