"""Pop consumption over the remoting codes, as RocketMQ 5's Java remoting client does it: a POP_MESSAGE
answer's records decoded, each message's receipt handle (POP_CK extraInfo) built from the answer's
header fields (startOffsetInfo / msgOffsetInfo / popTime / invisibleTime / reviveQid) with
rmq_core.common.pop_extra_info, acks and changes of invisible time with the header fields its
AckMessageRequestHeader / ChangeInvisibleTimeRequestHeader send."""
from __future__ import annotations

import attrs

from rmq_core.codec import decode_messages
from rmq_core.common.pop_extra_info import (
    ExtraInfo, build_extra_info, info_key, parse_info, queue_offset_key, retry_mark,
)
from rmq_core.remoting.codes import RequestCode, ResponseCode


@attrs.define
class Popped:
    msg: object  # MessageExt
    handle: str  # extraInfo
    attempt: int  # reconsume times + 1 (FIFO: from orderCountInfo)

    @property
    def body(self) -> bytes:
        return self.msg.body

    @property
    def real_topic(self) -> str:
        return self.msg.topic


def pop(raw, addr, group, topic, *, max_nums=32, invisible_ms=10_000, poll_ms=0, queue_id=-1, exp="*",
        exp_type="TAG", order=False, attempt_id=None, init_mode=0, broker_name="broker-a", timeout=None):
    """(response, [Popped]) of one POP_MESSAGE."""
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "maxMsgNums": str(max_nums),
           "invisibleTime": str(invisible_ms), "pollTime": str(poll_ms), "bornTime": "0", "initMode": str(init_mode),
           "expType": exp_type, "exp": exp, "order": "true" if order else "false"}
    if attempt_id:
        ext["attemptId"] = attempt_id
    r = raw.invoke(addr, RequestCode.POP_MESSAGE, ext, timeout=timeout or (poll_ms / 1000 + 10))
    if r.code != ResponseCode.SUCCESS:
        return r, []
    f = r.ext_fields
    starts = parse_info(f.get("startOffsetInfo"), "startOffsetInfo")
    offsets = {k: [int(x) for x in v.split(",")]
               for k, v in parse_info(f.get("msgOffsetInfo"), "msgOffsetInfo").items()}
    counts = parse_info(f.get("orderCountInfo"), "orderCountInfo")
    out = []
    for m in decode_messages(r.body):
        retry = retry_mark(m.topic)
        key = info_key(retry, m.queue_id)
        assert m.queue_offset in offsets[key], (m.queue_offset, offsets)
        handle = build_extra_info(int(starts[key]), int(f["popTime"]), int(f["invisibleTime"]), int(f["reviveQid"]),
                                  retry, broker_name, m.queue_id, m.queue_offset)
        attempt = m.reconsume_times + 1
        c = counts.get(queue_offset_key(retry, m.queue_id, m.queue_offset))
        if c is not None and int(c) > 0:
            attempt = int(c) + 1
        out.append(Popped(m, handle, attempt))
    return r, out


def ack(raw, addr, group, p: Popped, topic=None):
    h = ExtraInfo.parse(p.handle)
    return raw.invoke(addr, RequestCode.ACK_MESSAGE, {
        "consumerGroup": group, "topic": topic or p.real_topic, "queueId": str(h.queue_id), "extraInfo": p.handle,
        "offset": str(h.queue_offset)})


def change(raw, addr, group, p: Popped, invisible_ms, topic=None):
    h = ExtraInfo.parse(p.handle)
    return raw.invoke(addr, RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {
        "consumerGroup": group, "topic": topic or p.real_topic, "queueId": str(h.queue_id), "extraInfo": p.handle,
        "offset": str(h.queue_offset), "invisibleTime": str(invisible_ms)})


def create_topic(raw, addr, topic, queues=4):
    r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                   {"topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues), "perm": "6",
                    "topicFilterType": "SINGLE_TAG"})
    assert r.code == ResponseCode.SUCCESS, r.remark


def create_group(raw, addr, group, **fields):
    import json
    body = {"groupName": group, **fields}
    r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(body).encode())
    assert r.code == ResponseCode.SUCCESS, r.remark
