"""POP_MESSAGE (200050), ACK_MESSAGE (200051), CHANGE_MESSAGE_INVISIBLETIME (200053): RocketMQ 5's
pop consumption over the remoting protocol, with its header fields (PopMessageRequestHeader,
PopMessageResponseHeader, AckMessageRequestHeader, ChangeInvisibleTimeRequestHeader /
ResponseHeader), so RocketMQ 5's Java remoting clients work.  The semantics are the broker's
PopService (rmq_core.broker.pop.service); this module only reads and writes the wire."""
from __future__ import annotations

import logging

from rmq_core.broker.pop.receipt import ReceiptHandle
from rmq_core.broker.pop.service import PopError
from rmq_core.broker.processors import Processor
from rmq_core.common.subscription import SubscriptionData
from rmq_core.message import ExpressionType
from rmq_core.remoting.codes import RequestCode, ResponseCode

log = logging.getLogger("rmq.broker.pop")

_INIT_MODES = {0: "MIN", 1: "MAX"}  # ConsumeInitMode


class PopMessageProcessor(Processor):
    CODES = {
        RequestCode.POP_MESSAGE: "pop_message",
        RequestCode.ACK_MESSAGE: "ack_message",
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME: "change_invisible_time",
    }

    async def pop_message(self, ctx, request):
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
            result = await ctrl.pop_service.pop(
                group=group, topic=topic, max_nums=max_nums, invisible_ms=invisible,
                sub=SubscriptionData.build(topic, exp, exp_type), poll_ms=max(0, poll), client_id=ctx.remote_address,
                fifo=order, attempt_id=attempt_id, queue_id=queue_id, init_mode=_INIT_MODES[init_mode])
        except PopError as e:
            return request.make_response(e.code, str(e))
        if ctx.closed:
            return None
        ext = {"popTime": str(result.pop_time), "invisibleTime": str(result.invisible_ms),
               "reviveQid": str(result.revive_qid), "restNum": str(result.rest_num)}
        if not result.messages:
            return request.make_response(ResponseCode.POLLING_TIMEOUT, "no new message", ext)
        starts, offsets, counts = {}, {}, []
        for m in result.messages:
            key = ("1" if m.real_topic != m.topic else "0", m.queue_id)
            starts.setdefault(key, m.ck_offset)
            offsets.setdefault(key, []).append(m.queue_offset)
            if m.delivery_attempt > 1 and result.revive_qid == 999:
                counts.append(f"{key[0]} qo{m.queue_id}%{m.queue_offset} {m.delivery_attempt - 1}")
        ext["startOffsetInfo"] = ";".join(f"{r} {q} {o}" for (r, q), o in starts.items())
        ext["msgOffsetInfo"] = ";".join(f"{r} {q} {','.join(map(str, offs))}" for (r, q), offs in offsets.items())
        if counts:
            ext["orderCountInfo"] = ";".join(counts)
        body = ctrl.recompress_for_request(request, b"".join(m.record for m in result.messages))
        ctrl.stats.inc_get(group, topic, len(result.messages), len(body))
        return request.make_response(ResponseCode.SUCCESS, None, ext, body)

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
        parts = extra.split(" ")
        if len(parts) >= 7:
            extra = " ".join(parts[:7] + [str(offset)])
        return group, topic, extra

    async def ack_message(self, ctx, request):
        try:
            group, topic, handle = self._handle_of(request)
            await self.ctrl.pop_service.ack(group=group, topic=topic, receipt_handle=handle)
        except PopError as e:
            return request.make_response(e.code, str(e))
        except ValueError as e:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"bad ack request: {e}")
        return request.make_response(ResponseCode.SUCCESS)

    async def change_invisible_time(self, ctx, request):
        try:
            group, topic, handle = self._handle_of(request)
            invisible = request.get_int("invisibleTime")
            if invisible is None:
                raise PopError("BAD_REQUEST", "change request needs invisibleTime", ResponseCode.MESSAGE_ILLEGAL)
            new = await self.ctrl.pop_service.change_invisible_time(group=group, topic=topic, receipt_handle=handle,
                                                                    invisible_ms=invisible)
        except PopError as e:
            return request.make_response(e.code, str(e))
        except ValueError as e:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"bad change-invisible-time request: {e}")
        h = ReceiptHandle.decode(new)
        return request.make_response(ResponseCode.SUCCESS, None, {
            "popTime": str(h.pop_time), "invisibleTime": str(h.invisible_ms), "reviveQid": str(h.revive_qid),
            "extraInfo": new})
