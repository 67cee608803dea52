"""Queue selectors for ordered sends (MessageQueueSelector) and message / group validation."""
from __future__ import annotations

import random
from typing import Any, Callable, Protocol, Sequence

from rmq_core.errors import IllegalArgumentError
from rmq_core.message import (
    Message, MessageConst, MessageQueue, TopicValidator, check_group, java_string_hash,
)

MAX_MESSAGE_SIZE = 4 * 1024 * 1024


class MessageQueueSelector(Protocol):
    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue: ...


def _java_hash(value: Any) -> int:
    """The hash Java's SelectMessageQueueByHash would see for common key types."""
    if isinstance(value, bool):
        return 1231 if value else 1237
    if isinstance(value, int):
        v = value & 0xFFFFFFFFFFFFFFFF
        if -(1 << 31) <= value < (1 << 31):
            return value  # Integer.hashCode
        h = (v ^ (v >> 32)) & 0xFFFFFFFF  # Long.hashCode
        return h - (1 << 32) if h & 0x80000000 else h
    return java_string_hash(str(value))


class SelectMessageQueueByHash:
    """Same key -> same queue (Java: abs(arg.hashCode() % n)).  With arg=None the message's keys
    are the sharding key, so `send_orderly(msg)` works with just `keys=` set."""

    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        if not mqs:
            raise IllegalArgumentError("no queue to select from")
        key = arg if arg is not None else (msg.keys or msg.tags or "")
        h = _java_hash(key)
        # Java's % truncates toward zero, then abs()
        r = abs(h) % len(mqs)
        return mqs[r]


class SelectMessageQueueByRandom:
    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        if not mqs:
            raise IllegalArgumentError("no queue to select from")
        return random.choice(list(mqs))


def resolve_selector(selector) -> Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]:
    """Accept an object with `select` or a plain function `fn(mqs, msg, arg)`."""
    if selector is None:
        return SelectMessageQueueByHash().select
    if hasattr(selector, "select"):
        return selector.select
    if callable(selector):
        return selector
    raise IllegalArgumentError(f"bad queue selector {selector!r}: expected an object with select() or a function")


# topic names that passed check_message's name checks (which depend on the name alone)
_SENDABLE_TOPICS: set[str] = set()
_SENDABLE_TOPICS_MAX = 4096


def check_message(msg: Message, max_message_size: int = MAX_MESSAGE_SIZE, allow_system_properties: bool = False) -> None:
    """Validators.checkMessage: a valid, non-system topic and a body of 1..max_message_size bytes."""
    if not isinstance(msg, Message):
        raise IllegalArgumentError(f"expected a Message, got {type(msg).__name__}")
    topic = msg.topic
    if topic not in _SENDABLE_TOPICS:  # a producer sends to few topics: check each name once
        TopicValidator.check_topic(topic)
        TopicValidator.check_not_system_topic_for_send(topic)
        if len(_SENDABLE_TOPICS) >= _SENDABLE_TOPICS_MAX:
            _SENDABLE_TOPICS.clear()
        _SENDABLE_TOPICS.add(topic)
    if not msg.body:
        raise IllegalArgumentError(f"message to topic {msg.topic!r} has an empty body")
    if len(msg.body) > max_message_size:
        raise IllegalArgumentError(
            f"message body of {len(msg.body)} bytes to topic {msg.topic!r} exceeds max_message_size "
            f"{max_message_size} bytes"
        )
    if not msg.properties or allow_system_properties:
        reserved = None
    else:
        reserved = sorted(set(msg.properties) & MessageConst.SYSTEM_KEYS - {MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX})
    if reserved:
        raise IllegalArgumentError(
            f"property name {reserved[0]!r} is reserved by RocketMQ; use the Message field instead"
            if reserved[0] in (MessageConst.TAGS, MessageConst.KEYS, MessageConst.DELAY_TIME_LEVEL)
            else f"property name {reserved[0]!r} is reserved by RocketMQ"
        )
    if msg.delay_time_level < 0:
        raise IllegalArgumentError(f"bad delay_time_level {msg.delay_time_level!r}: must be >= 0")


__all__ = [
    "MessageQueueSelector", "SelectMessageQueueByHash", "SelectMessageQueueByRandom",
    "resolve_selector", "check_group", "check_message", "MAX_MESSAGE_SIZE",
]
