"""Checkpoint and ack records of pop consumption, and the revive topic they go to.

Checkpoint (tag "ck") and ack (tag "ack") records are JSON bodies of messages in the revive topic
`rmq_sys_REVIVE_LOG_<cluster>`; see docs/pop.md.  A checkpoint is named by (group, real topic,
queue, start offset, pop time): what a receipt handle (rmq_core.common.pop_extra_info.ExtraInfo,
RocketMQ 5's extraInfo, the one owner of that text) carries.
"""
from __future__ import annotations

from json.encoder import encode_basestring as _string  # (a JSON string, as json.dumps(ensure_ascii=False))

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
# Written as text here (a record per pop and per ack: a JSON encoder's per-call walk costs more
# than the record), the same bytes fastjson.dumps writes of the record's dict: keys sorted, compact,
# UTF-8 (tests/broker/pop/test_receipt.py holds the two together).  Read back with json.loads.
_RUNS: list = []  # _RUNS[n]: "[0,1,...,n-1]", a checkpoint's "d" when it took n messages in a row


def _run(n: int) -> str:
    while len(_RUNS) <= n:
        _RUNS.append(_ints(range(len(_RUNS))))
    return _RUNS[n]


def _ints(values) -> str:
    """A JSON array of ints ("[1,2,3]"; a list's repr is made in C, a join of str()s is not)."""
    return repr(list(values)).replace(" ", "")


def encode_ck(*, group, topic, queue_id, start_offset, offsets, pop_time, invisible_ms, broker_name,
              fifo=False, attempts=None, end_offset=None) -> bytes:
    """A checkpoint: the offsets handed out of (topic, queue) at pop_time, invisible for
    invisible_ms.  FIFO checkpoints carry each offset's delivery attempt; a pop's checkpoint the
    group's pop offset after it (`e`: what a restart recovers a stale pop offset to)."""
    n = len(offsets)
    if n and offsets[0] == start_offset and offsets[-1] - start_offset == n - 1 and n <= 4096:
        d = _run(n)  # (offsets ascend: first and last at the ends of a run means all of it)
    else:
        d = _ints([o - start_offset for o in offsets])
    a = f'"a":{_ints(attempts)},' if fifo else ""
    e = "" if end_offset is None else f'"e":{int(end_offset)},'
    o = '"o":1,' if fifo else ""
    return (f'{{{a}"bn":{_string(broker_name)},"c":{_string(group)},"d":{d},{e}"it":{int(invisible_ms)},{o}'
            f'"pt":{int(pop_time)},"q":{int(queue_id)},"so":{int(start_offset)},"t":{_string(topic)}}}'
            ).encode("utf-8")


def encode_ack(*, group, topic, queue_id, start_offset, pop_time, offsets, broker_name, revived=False) -> bytes:
    """An ack of offsets of one checkpoint (revived=True: resolved by the revive service, which put
    them to the retry topic or the DLQ)."""
    r = '"r":1,' if revived else ""
    return (f'{{"ao":{_ints(offsets)},"bn":{_string(broker_name)},"c":{_string(group)},'
            f'"pt":{int(pop_time)},"q":{int(queue_id)},{r}"so":{int(start_offset)},'
            f'"t":{_string(topic)}}}').encode("utf-8")


__all__ = ["ACK_TAG", "CK_TAG", "POP_ORDER_REVIVE_QUEUE", "REVIVE_GROUP", "REVIVE_QUEUE_NUM", "encode_ack",
           "encode_ck", "is_pop_retry_topic", "pop_retry_topic", "revive_topic"]
