"""A popped message's check-point info (RocketMQ 5's ExtraInfoUtil): the POP_CK property a remoting
client gives each message of a POP_MESSAGE answer, and sends back as `extraInfo` to ACK_MESSAGE and
CHANGE_MESSAGE_INVISIBLETIME.  The wire contract: space-separated

    ckQueueOffset popTime invisibleTime reviveQid retryMark brokerName queueId [queueOffset]

retryMark: "0" the topic itself, "1" its pop retry topic %RETRY%<group>_<topic>, "2" the v2 one
%RETRY%<group>+<topic>.  A POP_MESSAGE answer's startOffsetInfo / msgOffsetInfo / orderCountInfo
headers are `;`-separated "retryMark queueId value" entries (orderCountInfo's queueId may be
"qo<queueId>%<queueOffset>", one message's count).
"""
from __future__ import annotations

from typing import NamedTuple

from rmq_core.errors import IllegalArgumentError
from rmq_core.message import MixAll

NORMAL_TOPIC, RETRY_TOPIC, RETRY_TOPIC_V2 = "0", "1", "2"
POP_ORDER_REVIVE_QUEUE = 999  # the reviveQid of a FIFO (order) pop's messages (how Java clients tell an orderly ack)
_SEP = " "


def pop_retry_topic(topic: str, group: str, v2: bool = False) -> str:
    """The pop retry topic of `topic` for `group` (KeyBuilder.buildPopRetryTopicV1 / V2)."""
    return f"{MixAll.RETRY_GROUP_TOPIC_PREFIX}{group}{'+' if v2 else '_'}{topic}"


def is_pop_retry_topic(topic: str, group: str) -> bool:
    """Whether `topic` is a pop retry topic of `group` (V1 or V2)."""
    return topic.startswith(f"{MixAll.RETRY_GROUP_TOPIC_PREFIX}{group}_") or \
        topic.startswith(f"{MixAll.RETRY_GROUP_TOPIC_PREFIX}{group}+")


def retry_mark(topic: str) -> str:
    if topic.startswith(MixAll.RETRY_GROUP_TOPIC_PREFIX):
        return RETRY_TOPIC_V2 if "+" in topic else RETRY_TOPIC
    return NORMAL_TOPIC


class ExtraInfo(NamedTuple):
    ck_queue_offset: int
    pop_time: int  # epoch ms, the broker's clock
    invisible_time: int  # ms
    revive_qid: int
    retry: str  # NORMAL_TOPIC / RETRY_TOPIC / RETRY_TOPIC_V2
    broker_name: str
    queue_id: int
    queue_offset: int

    @classmethod
    def parse(cls, text) -> "ExtraInfo":
        """An 8-field extra info (a message's POP_CK); IllegalArgumentError naming it otherwise."""
        parts = text.split(_SEP) if isinstance(text, str) else None
        if parts is None or len(parts) != 8 or parts[4] not in (NORMAL_TOPIC, RETRY_TOPIC, RETRY_TOPIC_V2):
            raise IllegalArgumentError(f"bad receipt handle {text!r}: expected a pop check point "
                                       "'ckOffset popTime invisibleTime reviveQid retry brokerName queueId offset'")
        try:
            info = cls(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4], parts[5],
                       int(parts[6]), int(parts[7]))
        except ValueError:
            raise IllegalArgumentError(f"bad receipt handle {text!r}: a number field is not a number") from None
        if info.ck_queue_offset < 0 or info.queue_offset < info.ck_queue_offset or info.queue_id < 0 \
                or info.pop_time <= 0 or info.invisible_time <= 0:
            raise IllegalArgumentError(f"bad receipt handle {text!r}: a field is out of range")
        return info

    def real_topic(self, topic: str, group: str) -> str:
        """The topic the check point was taken on: `topic` or its pop retry topic (`topic` when it
        is that already: a remoting client may name the retry topic a message came from)."""
        if self.retry == NORMAL_TOPIC or is_pop_retry_topic(topic, group):
            return topic
        return pop_retry_topic(topic, group, self.retry == RETRY_TOPIC_V2)

    @property
    def visible_at(self) -> int:
        """Epoch ms (broker clock) when the message becomes visible again."""
        return self.pop_time + self.invisible_time

    @property
    def is_order(self) -> bool:
        return self.revive_qid == POP_ORDER_REVIVE_QUEUE

    def __str__(self) -> str:
        return build_extra_info(self.ck_queue_offset, self.pop_time, self.invisible_time, self.revive_qid,
                                self.retry, self.broker_name, self.queue_id, self.queue_offset)


def build_extra_info(ck_queue_offset: int, pop_time: int, invisible_time: int, revive_qid: int, retry: str,
                     broker_name: str, queue_id: int, queue_offset: int | None = None) -> str:
    """`retry`: a retry mark ("0"/"1"/"2") or the topic the check point is on (its mark taken).
    Without queue_offset: the 7 fields a check point's messages share (extra_info_prefix)."""
    if retry not in (NORMAL_TOPIC, RETRY_TOPIC, RETRY_TOPIC_V2):
        retry = retry_mark(retry)
    text = f"{ck_queue_offset} {pop_time} {invisible_time} {revive_qid} {retry} {broker_name} {queue_id}"
    return text if queue_offset is None else f"{text} {queue_offset}"


def extra_info_prefix(ck_queue_offset: int, pop_time: int, invisible_time: int, revive_qid: int, retry: str,
                      broker_name: str, queue_id: int) -> str:
    """What every extra info of one check point starts with: a message's is this + str(its queue offset)
    (many messages of one pop are one check point: their handles are made without a call each)."""
    return build_extra_info(ck_queue_offset, pop_time, invisible_time, revive_qid, retry, broker_name, queue_id) + _SEP


def with_queue_offset(text: str, queue_offset: int) -> str:
    """The extra info of the message at `queue_offset` of text's check point (text: 7 or 8 fields;
    an ACK_MESSAGE's header offset names the message, as RocketMQ's broker reads it)."""
    parts = text.split(_SEP)
    return _SEP.join(parts[:7] + [str(queue_offset)]) if len(parts) in (7, 8) else text


def info_key(retry: str, queue_id) -> str:
    """The key of a startOffsetInfo / msgOffsetInfo / orderCountInfo entry: "<retryMark>@<queueId>"."""
    return f"{retry}@{queue_id}"


def queue_offset_key(retry: str, queue_id: int, queue_offset: int) -> str:
    """An orderCountInfo entry of one message: "<retryMark>@qo<queueId>%<queueOffset>"."""
    return f"{retry}@qo{queue_id}%{queue_offset}"


def parse_info(text: str | None, what: str) -> dict[str, str]:
    """"mark qid value;mark qid value" -> {"mark@qid": "value"}; {} for None/""."""
    out: dict[str, str] = {}
    if not text:
        return out
    for entry in text.split(";"):
        parts = entry.split(_SEP)
        if len(parts) != 3 or not all(parts):
            raise IllegalArgumentError(f"bad {what} entry {entry!r} in {text!r}")
        key = info_key(parts[0], parts[1])
        if key in out:
            raise IllegalArgumentError(f"duplicate {what} entry {key!r} in {text!r}")
        out[key] = parts[2]
    return out


def build_info(entries) -> str:
    """`(retry mark or topic, queue id or 'qo..' key, value)` entries -> a header value; a list
    value is written comma-separated (msgOffsetInfo)."""
    parts = []
    for retry, qid, value in entries:
        if retry not in (NORMAL_TOPIC, RETRY_TOPIC, RETRY_TOPIC_V2):
            retry = retry_mark(retry)
        if isinstance(value, (list, tuple)):  # (ints: a list's repr is made in C, a join of str()s is not)
            value = repr(list(value))[1:-1].replace(" ", "")
        parts.append(f"{retry}{_SEP}{qid}{_SEP}{value}")
    return ";".join(parts)


__all__ = ["ExtraInfo", "POP_ORDER_REVIVE_QUEUE", "NORMAL_TOPIC", "RETRY_TOPIC", "RETRY_TOPIC_V2",
           "build_extra_info", "build_info", "extra_info_prefix", "info_key", "is_pop_retry_topic", "parse_info",
           "pop_retry_topic", "queue_offset_key", "retry_mark", "with_queue_offset"]
