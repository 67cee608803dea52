"""Receipt handles and checkpoint/ack records of pop consumption.

A receipt handle is RocketMQ 5's extraInfo (ExtraInfoUtil, the POP_CK property a 4.x/5.x remoting
client builds from a pop answer), eight fields joined by one space:

    ckStartOffset popTime invisibleTime reviveQid retryFlag brokerName queueId queueOffset

retryFlag is "0" for the subscribed topic and "1" for the group's pop retry topic
(`%RETRY%<group>_<topic>`); reviveQid is 999 for a FIFO group's message (what Java clients test
to tell an orderly ack).  The pair (popTime, ckStartOffset) with group, real topic and queue names
the checkpoint the message was handed out under.

Checkpoint (tag "ck") and ack (tag "ack") records are JSON bodies of messages in the revive topic
`rmq_sys_REVIVE_LOG_<cluster>`; see docs/pop.md.
"""
from __future__ import annotations

import json

import attrs

from rmq_core.message import MixAll

POP_ORDER_REVIVE_QUEUE = 999  # RocketMQ's KeyBuilder.POP_ORDER_REVIVE_QUEUE
REVIVE_QUEUE_NUM = 8
REVIVE_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"
REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"  # its consumer offsets are the revive progress
CK_TAG = "ck"
ACK_TAG = "ack"
_RETRY_FLAG_NORMAL, _RETRY_FLAG_V1 = "0", "1"


def revive_topic(cluster: str) -> str:
    return REVIVE_TOPIC_PREFIX + cluster


def pop_retry_topic(group: str, topic: str) -> str:
    """The group's pop retry topic for `topic` (RocketMQ 5's KeyBuilder.buildPopRetryTopic, V1)."""
    return f"{MixAll.RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


def is_pop_retry_topic(topic: str, group: str) -> bool:
    return topic.startswith(f"{MixAll.RETRY_GROUP_TOPIC_PREFIX}{group}_")


class InvalidReceiptHandle(ValueError):
    """A receipt handle that cannot be parsed (its text is in the message)."""


@attrs.frozen
class ReceiptHandle:
    ck_offset: int
    pop_time: int
    invisible_ms: int
    revive_qid: int
    retry: bool
    broker_name: str
    queue_id: int
    offset: int

    def encode(self) -> str:
        return " ".join((str(self.ck_offset), str(self.pop_time), str(self.invisible_ms), str(self.revive_qid),
                         _RETRY_FLAG_V1 if self.retry else _RETRY_FLAG_NORMAL, self.broker_name,
                         str(self.queue_id), str(self.offset)))

    @classmethod
    def decode(cls, text: str, offset: int | None = None) -> "ReceiptHandle":
        """Parse an extraInfo; `offset` (the ack header's) is used when the text has only seven fields."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidReceiptHandle(f"receipt handle {text!r} is empty")
        parts = text.split(" ")
        if len(parts) == 7 and offset is not None:
            parts.append(str(offset))
        if len(parts) < 8:
            raise InvalidReceiptHandle(f"receipt handle {text!r} has {len(parts)} fields, expected 8 "
                                       "(ckOffset popTime invisibleTime reviveQid retry brokerName queueId offset)")
        try:
            h = cls(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), _retry_flag(parts[4], text),
                    parts[5], int(parts[6]), int(parts[7]))
        except ValueError as e:
            if isinstance(e, InvalidReceiptHandle):
                raise
            raise InvalidReceiptHandle(f"receipt handle {text!r} is malformed: {e}") from None
        if h.ck_offset < 0 or h.offset < h.ck_offset or h.queue_id < 0 or h.pop_time <= 0 or h.invisible_ms <= 0:
            raise InvalidReceiptHandle(f"receipt handle {text!r} has out-of-range fields")
        return h

    def real_topic(self, group: str, topic: str) -> str:
        """The topic the message is stored in: `topic`, or the group's pop retry topic of it."""
        if not self.retry or is_pop_retry_topic(topic, group):
            return topic
        return pop_retry_topic(group, topic)


def _retry_flag(value: str, text: str) -> bool:
    if value == _RETRY_FLAG_NORMAL:
        return False
    if value == _RETRY_FLAG_V1:
        return True
    raise InvalidReceiptHandle(f"receipt handle {text!r} has retry flag {value!r}, expected 0 or 1")


# --- records -----------------------------------------------------------------------------------------
def encode_ck(*, group, topic, queue_id, start_offset, offsets, pop_time, invisible_ms, broker_name,
              fifo=False, attempts=None, end_offset=None) -> bytes:
    """A checkpoint: the offsets handed out of (topic, queue) at pop_time, invisible for
    invisible_ms.  FIFO checkpoints carry each offset's delivery attempt; a pop's checkpoint the
    group's pop offset after it (`e`: what a restart recovers a stale pop offset to)."""
    rec = {"c": group, "t": topic, "q": queue_id, "so": start_offset, "d": [o - start_offset for o in offsets],
           "pt": pop_time, "it": invisible_ms, "bn": broker_name}
    if fifo:
        rec["o"] = 1
        rec["a"] = list(attempts)
    if end_offset is not None:
        rec["e"] = end_offset
    return json.dumps(rec, separators=(",", ":")).encode()


def encode_ack(*, group, topic, queue_id, start_offset, pop_time, offsets, broker_name, revived=False) -> bytes:
    """An ack of offsets of one checkpoint (revived=True: resolved by the revive service, which put
    them to the retry topic or the DLQ)."""
    rec = {"c": group, "t": topic, "q": queue_id, "so": start_offset, "pt": pop_time, "ao": list(offsets),
           "bn": broker_name}
    if revived:
        rec["r"] = 1
    return json.dumps(rec, separators=(",", ":")).encode()
