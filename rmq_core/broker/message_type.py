"""RocketMQ 5's message types: a topic's `message.type` attribute (NORMAL, FIFO, DELAY, TRANSACTION,
MIXED) and the type of a message from its properties (TopicMessageType).  A topic without the
attribute (every 4.x topic) accepts every type; one with it accepts that type only (MIXED: all).
`refusal` is the one check, used by the remoting send (processors/send.py) and the gRPC send
(rmq_core/proxy), which both reach it through SendMessageProcessor.send_message."""
from __future__ import annotations

from typing import Mapping

from rmq_core.errors import IllegalArgumentError
from rmq_core.message import MessageConst, SysFlag

MESSAGE_TYPE_ATTRIBUTE = "message.type"
NORMAL, FIFO, DELAY, TRANSACTION, MIXED = "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"
TYPES = (NORMAL, FIFO, DELAY, TRANSACTION, MIXED)
# RocketMQ 5's MessageConst.PROPERTY_SHARDING_KEY: a 5.x message's message group
SHARDING_KEY = "__SHARDINGKEY"
_TIMER_KEYS = (MessageConst.TIMER_DELIVER_MS, MessageConst.TIMER_DELAY_SEC, "TIMER_DELAY_MS")


def check_topic_attributes(attributes: Mapping[str, str]) -> None:
    """A topic's attributes as the broker accepts them: message.type must name a type."""
    value = attributes.get(MESSAGE_TYPE_ATTRIBUTE)
    if value is not None and value not in TYPES:
        raise IllegalArgumentError(f"bad topic attribute message.type={value!r}: expected one of {', '.join(TYPES)}")


def parse_attributes(text: str | None, current: Mapping[str, str] | None = None) -> dict[str, str]:
    """RocketMQ 5's attribute string (`+message.type=FIFO,+k=v,-k`: + sets, - removes) applied to
    `current`; a bad item is named."""
    out = dict(current or {})
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        if item[0] == "+" and "=" in item and item.index("=") > 1:
            key, _, value = item[1:].partition("=")
            out[key] = value
        elif item[0] == "-" and len(item) > 1 and "=" not in item:
            out.pop(item[1:], None)
        else:
            raise IllegalArgumentError(f"bad topic attribute {item!r}: expected +name=value or -name "
                                       f"(e.g. +message.type=FIFO)")
    check_topic_attributes(out)
    return out


def topic_message_type(attributes: Mapping[str, str] | None) -> str:
    """The types a topic accepts: its message.type, MIXED when it has none."""
    return (attributes or {}).get(MESSAGE_TYPE_ATTRIBUTE) or MIXED


def message_type(properties: Mapping[str, str], sys_flag: int = 0) -> str:
    """A message's type (TopicMessageType.parseFromMessageProperty): a half message is TRANSACTION,
    one with a delay level or timer DELAY, one with a message group FIFO, else NORMAL."""
    if (properties.get(MessageConst.TRANSACTION_PREPARED) == "true"
            or SysFlag.transaction_value(sys_flag) == SysFlag.TRANSACTION_PREPARED_TYPE):
        return TRANSACTION
    if properties.get(MessageConst.DELAY_TIME_LEVEL, "0") not in ("", "0") or any(k in properties for k in _TIMER_KEYS):
        return DELAY
    if properties.get(SHARDING_KEY):
        return FIFO
    return NORMAL


def refusal(topic: str, attributes: Mapping[str, str] | None, properties: Mapping[str, str],
            sys_flag: int = 0) -> str | None:
    """None when the topic accepts the message, else RocketMQ 5's refusal naming both types."""
    accepted = topic_message_type(attributes)
    if accepted == MIXED:
        return None
    actual = message_type(properties, sys_flag)
    if actual == accepted:
        return None
    return (f"The message type ({actual}) is not the same as the topic {topic}'s message type ({accepted}): "
            f"its attribute message.type={accepted} accepts {accepted} messages only")
