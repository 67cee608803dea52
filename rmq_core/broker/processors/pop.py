"""POP_MESSAGE (200050), ACK_MESSAGE (200051), CHANGE_MESSAGE_INVISIBLETIME (200053),
BATCH_ACK_MESSAGE (200151): RocketMQ 5's pop consumption over the remoting protocol, with its
header fields (PopMessageRequestHeader, PopMessageResponseHeader, AckMessageRequestHeader,
ChangeInvisibleTimeRequestHeader / ResponseHeader) and BatchAckMessageRequestBody, so RocketMQ 5's
Java remoting clients work.  The semantics are the broker's
PopService (rmq_core.broker.pop.service); this module only reads and writes the wire."""
from __future__ import annotations

from binascii import a2b_base64
import json
import logging

from rmq_core.broker.pop.service import PopError, PopResult
from rmq_core.broker.processors import Processor
from rmq_core.common.pop_extra_info import (
    NORMAL_TOPIC, POP_ORDER_REVIVE_QUEUE, RETRY_TOPIC, RETRY_TOPIC_V2, ExtraInfo, build_info,
    with_queue_offset,
)
from rmq_core.common.subscription import SubscriptionData
from rmq_core.message import ExpressionType
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import new_response

log = logging.getLogger("rmq.broker.pop")

_INIT_MODES = {0: "MIN", 1: "MAX"}  # ConsumeInitMode
_SUCCESS = int(ResponseCode.SUCCESS)


class PopMessageProcessor(Processor):
    CODES = {
        RequestCode.POP_MESSAGE: "pop_message",
        RequestCode.ACK_MESSAGE: "ack_message",
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME: "change_invisible_time",
        RequestCode.BATCH_ACK_MESSAGE: "batch_ack_message",
    }

    def __init__(self, controller):
        super().__init__(controller)
        self._tag_subs: dict = {}  # (topic, expression, type) -> SubscriptionData of a tag expression

    def pop_message(self, ctx, request):
        """Answered at once when the pop needs no wait (messages whose checkpoint needs no
        durability wait, or none without a poll), else a coroutine of the answer."""
        ctrl = self.ctrl
        try:
            group = request.get_str("consumerGroup")
            topic = request.get_str("topic")
            queue_id = request.get_int("queueId", -1)
            max_nums = request.get_int("maxMsgNums", 32)
            invisible = request.get_int("invisibleTime")
            poll = request.get_int("pollTime", 0)
            init_mode = request.get_int("initMode", 0)
            exp_type = request.get_str("expType") or ExpressionType.TAG
            exp = request.get_str("exp") or "*"
            order = request.get_bool("order", False)
            attempt_id = request.get_str("attemptId") or None
        except Exception as e:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"bad pop request: {e}")
        if not group or not topic or invisible is None:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL,
                                         "pop request needs consumerGroup, topic and invisibleTime")
        if init_mode not in _INIT_MODES:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"bad initMode {init_mode} (0 MIN, 1 MAX)")
        try:
            begun = ctrl.pop_service.begin_pop(
                group=group, topic=topic, max_nums=max_nums, invisible_ms=invisible,
                sub=self._subscription(topic, exp, exp_type), poll_ms=max(0, poll), client_id=ctx.remote_address,
                fifo=order, attempt_id=attempt_id, queue_id=queue_id, init_mode=_INIT_MODES[init_mode],
                alive=lambda: not ctx.closed)
        except PopError as e:
            return request.make_response(e.code, str(e))
        if type(begun) is PopResult:
            return self._pop_answer(ctx, request, begun)
        return self._pop_answer_later(ctx, request, begun)

    async def _pop_answer_later(self, ctx, request, begun):
        try:
            result = await begun
        except PopError as e:
            return request.make_response(e.code, str(e))
        return self._pop_answer(ctx, request, result)

    def _pop_answer(self, ctx, request, result: PopResult):
        if ctx.closed:
            return None
        ext = {"popTime": str(result.pop_time), "invisibleTime": str(result.invisible_ms),
               "reviveQid": str(result.revive_qid), "restNum": str(result.rest_num)}
        if not result.batches:
            return request.make_response(ResponseCode.POLLING_TIMEOUT, "no new message", ext)
        # (a pop takes one checkpoint per queue: one startOffsetInfo / msgOffsetInfo entry each)
        marks = [RETRY_TOPIC if b.real_topic != b.topic else NORMAL_TOPIC for b in result.batches]
        ext["startOffsetInfo"] = build_info([(m, b.queue_id, b.ck_offset) for m, b in zip(marks, result.batches)])
        ext["msgOffsetInfo"] = build_info([(m, b.queue_id, b.offsets) for m, b in zip(marks, result.batches)])
        if result.revive_qid == POP_ORDER_REVIVE_QUEUE:
            counts = [(mark, f"qo{b.queue_id}%{o}", a - 1) for mark, b in zip(marks, result.batches)
                      for o, a in zip(b.offsets, b.attempts) if a > 1]
            if counts:
                ext["orderCountInfo"] = build_info(counts)
        body = b"".join(b.buffer for b in result.batches) if len(result.batches) > 1 else result.batches[0].buffer
        body = self.ctrl.recompress_for_request(request, body)
        return new_response(request, _SUCCESS, None, ext, body)  # (ext: a fresh dict of str)

    def _subscription(self, topic: str, exp: str, exp_type: str) -> SubscriptionData:
        """A pop's subscription; a tag expression's is built once (a consumer pops with the same one
        again and again; other types carry their version, made anew each time)."""
        if not ExpressionType.is_tag_type(exp_type):
            return SubscriptionData.build(topic, exp, exp_type)
        key = (topic, exp, exp_type)
        sub = self._tag_subs.get(key)
        if sub is None:
            if len(self._tag_subs) >= 10_000:
                self._tag_subs.clear()
            sub = self._tag_subs[key] = SubscriptionData.build(topic, exp, exp_type)
        return sub

    def _handle_of(self, request):
        """(group, topic, the receipt handle) of an ACK / CHANGE request: its extraInfo with the
        header's offset as the message's (a 7-field extraInfo gets it appended)."""
        group = request.get_str("consumerGroup")
        topic = request.get_str("topic")
        extra = request.get_str("extraInfo")
        offset = request.get_int("offset")
        if not group or not topic or not extra or offset is None:
            raise PopError("BAD_REQUEST", "request needs consumerGroup, topic, extraInfo and offset",
                           ResponseCode.MESSAGE_ILLEGAL)
        return group, topic, with_queue_offset(extra, offset)

    def ack_message(self, ctx, request):
        """Answered at once when its ack record needs no durability wait (as a batch ack is), else
        a coroutine of the answer."""
        try:
            group, topic, handle = self._handle_of(request)
            begun = self.ctrl.pop_service.begin_ack(group=group, topic=topic, receipt_handle=handle)
        except PopError as e:
            return request.make_response(e.code, str(e))
        except ValueError as e:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"bad ack request: {e}")
        if type(begun) is list:
            return self._batch_ack_answer(request, begun)
        return self._batch_ack_answer_later(request, [], [begun])

    def change_invisible_time(self, ctx, request):
        """Answered at once when its records need no durability wait, else a coroutine of the answer."""
        try:
            group, topic, handle = self._handle_of(request)
            invisible = request.get_int("invisibleTime")
            if invisible is None:
                raise PopError("BAD_REQUEST", "change request needs invisibleTime", ResponseCode.MESSAGE_ILLEGAL)
            begun = self.ctrl.pop_service.begin_change_invisible_time(group=group, topic=topic, receipt_handle=handle,
                                                                      invisible_ms=invisible)
        except PopError as e:
            return request.make_response(e.code, str(e))
        except ValueError as e:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"bad change-invisible-time request: {e}")
        if type(begun) is str:
            return self._changed_answer(request, begun)
        return self._changed_answer_later(request, begun)

    async def _changed_answer_later(self, request, begun):
        try:
            new = await begun
        except PopError as e:
            return request.make_response(e.code, str(e))
        return self._changed_answer(request, new)

    @staticmethod
    def _changed_answer(request, new: str):
        h = ExtraInfo.parse(new)
        return request.make_response(ResponseCode.SUCCESS, None, {
            "popTime": str(h.pop_time), "invisibleTime": str(h.invisible_time), "reviveQid": str(h.revive_qid),
            "extraInfo": new})

    def batch_ack_message(self, ctx, request):
        """BatchAckMessageRequestBody: {"brokerName", "acks": [BatchAck]}, a BatchAck naming one
        checkpoint (c group, t topic, r retry flag, so start offset, q queue, rq revive queue, pt pop
        time, it invisible time) and the offsets acked as a java.util.BitSet over offset - so
        (`b`: its toByteArray(), base64 as fastjson writes a byte[]).  Answered at once when its ack
        records need no durability wait, else a coroutine of the answer."""
        try:
            body = json.loads(bytes(request.body or b"{}"))
            broker = body.get("brokerName") or self.ctrl.broker_config.broker_name
            batches = []
            for a in body.get("acks") or ():
                get = lambda short, long: a[short] if short in a else a[long]  # noqa: E731 (fastjson's alternate names)
                group, topic = get("c", "consumerGroup"), get("t", "topic")
                retry, so, q = str(get("r", "retry")), int(get("so", "startOffset")), int(get("q", "queueId"))
                rq, pt, it = int(get("rq", "reviveQueueId")), int(get("pt", "popTime")), int(get("it", "invisibleTime"))
                bits = a.get("b", a.get("bitSet")) or ""
                raw = a2b_base64(bits) if isinstance(bits, str) else bytes(bits)  # (base64.b64decode's C core)
                offsets = _bit_set_offsets(int.from_bytes(raw, "little"), so)  # (toByteArray is little-endian)
                if retry not in (NORMAL_TOPIC, RETRY_TOPIC, RETRY_TOPIC_V2):
                    raise ValueError(f"retry flag {retry!r} is not 0, 1 or 2")
                # (the checkpoint's name; its queue offset field is not used)
                batches.append((group, topic, ExtraInfo(so, pt, it, rq, retry, broker, q, so), offsets))
        except (ValueError, KeyError, TypeError) as e:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"bad batch ack body: {e!r}")
        if not batches:
            return request.make_response(ResponseCode.NO_MESSAGE, "batch ack without acks")
        refused, waits = [], []
        for group, topic, checkpoint, offsets in batches:
            try:
                begun = self.ctrl.pop_service.begin_ack_offsets(group=group, topic=topic, checkpoint=checkpoint,
                                                                offsets=offsets)
            except PopError as e:
                for w in waits:  # (the answer is this refusal: the earlier records' waits are not needed)
                    w.close()
                return request.make_response(e.code, str(e))
            if type(begun) is list:
                refused += begun
            else:
                waits.append(begun)
        if waits:
            return self._batch_ack_answer_later(request, refused, waits)
        return self._batch_ack_answer(request, refused)

    async def _batch_ack_answer_later(self, request, refused, waits):
        try:
            for w in waits:
                refused += await w
        except PopError as e:
            return request.make_response(e.code, str(e))
        return self._batch_ack_answer(request, refused)

    @staticmethod
    def _batch_ack_answer(request, refused):
        if refused:
            return request.make_response(refused[0].code, "; ".join(str(e) for e in refused[:5]))
        return request.make_response(ResponseCode.SUCCESS)


def _bit_set_offsets(bits: int, start: int) -> list[int]:
    """The offsets a BatchAck's BitSet (as an int, bit i = offset start + i) names, in order."""
    if bits <= 0:
        return []
    low = (bits & -bits).bit_length() - 1
    run = bits >> low
    if run & (run + 1) == 0:  # (the usual: one run of set bits, every message of a check point)
        return list(range(start + low, start + low + run.bit_length()))
    return [start + i for i, bit in enumerate(bin(bits)[:1:-1]) if bit == "1"]
