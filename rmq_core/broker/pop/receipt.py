"""Checkpoint and ack records of pop consumption, and the revive topic they go to.

Checkpoint (tag "ck") and ack (tag "ack") records are JSON bodies of messages in the revive topic
`rmq_sys_REVIVE_LOG_<cluster>`; see docs/pop.md.  A checkpoint is named by (group, real topic,
queue, start offset, pop time): what a receipt handle (rmq_core.common.pop_extra_info.ExtraInfo,
RocketMQ 5's extraInfo, the one owner of that text) carries.
"""
from __future__ import annotations

from rmq_core.common import fastjson
from rmq_core.common.pop_extra_info import POP_ORDER_REVIVE_QUEUE, is_pop_retry_topic
from rmq_core.common.pop_extra_info import pop_retry_topic as _pop_retry_topic

REVIVE_QUEUE_NUM = 8
REVIVE_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"
REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"  # its consumer offsets are the revive progress
CK_TAG = "ck"
ACK_TAG = "ack"


def revive_topic(cluster: str) -> str:
    return REVIVE_TOPIC_PREFIX + cluster


def pop_retry_topic(group: str, topic: str) -> str:
    """The group's pop retry topic for `topic` (RocketMQ 5's KeyBuilder.buildPopRetryTopic, V1: the
    one this broker writes)."""
    return _pop_retry_topic(topic, group)


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
    return fastjson.dumps(rec)


def encode_ack(*, group, topic, queue_id, start_offset, pop_time, offsets, broker_name, revived=False) -> bytes:
    """An ack of offsets of one checkpoint (revived=True: resolved by the revive service, which put
    them to the retry topic or the DLQ)."""
    rec = {"c": group, "t": topic, "q": queue_id, "so": start_offset, "pt": pop_time, "ao": list(offsets),
           "bn": broker_name}
    if revived:
        rec["r"] = 1
    return fastjson.dumps(rec)


__all__ = ["ACK_TAG", "CK_TAG", "POP_ORDER_REVIVE_QUEUE", "REVIVE_GROUP", "REVIVE_QUEUE_NUM", "encode_ack",
           "encode_ck", "is_pop_retry_topic", "pop_retry_topic", "revive_topic"]
