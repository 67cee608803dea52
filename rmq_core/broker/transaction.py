"""Transactional messages (RocketMQ's TransactionalMessageService + check service).

Half messages live in RMQ_SYS_TRANS_HALF_TOPIC (invisible to consumers) with the real topic/queue
in properties.  END_TRANSACTION commits (the real message is written, then an op record) or rolls
back (op record only).  Op records in RMQ_SYS_TRANS_OP_HALF_TOPIC carry tag "d" and the half's
queue offset as their body.  The check service walks the half queue in order: a half with an op is
done; a half older than transactionTimeOut without one is checked back with a live producer of its
group (CHECK_TRANSACTION_STATE) and re-appended with TRANSACTION_CHECK_TIMES+1; after
transactionCheckMax checks it is rolled back and logged.  Progress (half offset, op offset) is
stored as consumer offsets of the internal group, so a restart resumes where it was.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time

from rmq_core.loops import cancel_and_wait
from rmq_core._native.record_store import encode_record
from rmq_core.codec import decode_messages
from rmq_core.message import MessageConst, SysFlag, TopicValidator, host_port
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.store import MessageExtBrokerInner, PutMessageStatus

log = logging.getLogger("rmq.broker")

HALF_TOPIC = TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC
OP_TOPIC = TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC
CHECK_MAX_TOPIC = TopicValidator.RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC
SYS_GROUP = "CID_RMQ_SYS_TRANS"
OP_TAG = "d"
OP_ORIGIN = "RMQ_TX_ORIGIN"  # op record property: queue offset of the transaction's first half copy
OP_RESOLVED = "RMQ_TX_RESOLVED"  # op record property: the transaction ended (not just a superseded copy)


def _origin_of(half) -> int:
    """Queue offset of the first copy of this half (re-appended copies carry it)."""
    v = half.properties.get(MessageConst.TRANSACTION_PREPARED_QUEUE_OFFSET)
    try:
        return int(v) if v else half.queue_offset
    except ValueError:
        return half.queue_offset


class TransactionalMessageService:
    def __init__(self, controller):
        self.ctrl = controller
        self._task: asyncio.Task | None = None
        self._done_half_offsets: set[int] = set()  # half queue offsets that have an op record
        self.checks_sent = 0
        self.discarded = 0
        self._wakeup: asyncio.Event | None = None
        self._op_read_to: int | None = None
        self._pending_ops: list[tuple[int, int]] = []
        # Transactions that got an END (or were discarded), by the queue offset of their first
        # half copy: a re-appended copy carries it in TRAN_PREPARED_QUEUE_OFFSET.
        self._resolved_origins: set[int] = set()

    # --- send path ------------------------------------------------------------------------------------
    def prepare_half_message(self, inner: MessageExtBrokerInner, producer_group: str) -> MessageExtBrokerInner:
        props = inner.properties
        props[MessageConst.REAL_TOPIC] = inner.topic
        props[MessageConst.REAL_QUEUE_ID] = str(inner.queue_id)
        props[MessageConst.TRANSACTION_PREPARED] = "true"
        if producer_group and MessageConst.PRODUCER_GROUP not in props:
            props[MessageConst.PRODUCER_GROUP] = producer_group
        inner.properties_bytes = None
        inner.sys_flag = SysFlag.reset_transaction_value(inner.sys_flag, SysFlag.TRANSACTION_NOT_TYPE)
        inner.topic, inner.queue_id = HALF_TOPIC, 0
        inner.tags_code = None
        return inner

    # --- END_TRANSACTION --------------------------------------------------------------------------------
    async def end_transaction(self, ctx, request):
        ctrl = self.ctrl
        try:
            commit_log_offset, half_queue_offset, state = (
                request.get_int(name) for name in ("commitLogOffset", "tranStateTableOffset", "commitOrRollback"))
            from_check = request.get_bool("fromTransactionCheck", False)
            producer_group = request.get_str("producerGroup", "")
        except Exception as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad end-transaction request: {e}")
        if ctrl.is_slave:  # as RocketMQ's EndTransactionProcessor
            return request.make_response(ResponseCode.SLAVE_NOT_AVAILABLE, ctrl.slave_refusal("ending a transaction"))
        fenced = ctrl.fenced_refusal(request)
        if fenced is not None:
            return fenced
        if state == SysFlag.TRANSACTION_NOT_TYPE:
            log.info("end transaction from %s: UNKNOW (fromCheck=%s) for half %s; will check back later",
                     ctx.remote_address, from_check, half_queue_offset)
            return None
        if state not in (SysFlag.TRANSACTION_COMMIT_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE):
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad commitOrRollback value {state!r}")
        half = ctrl.store.look_message_by_offset(commit_log_offset) if commit_log_offset is not None else None
        if half is None or half.topic != HALF_TOPIC:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"find prepared transaction message failed: commitLogOffset {commit_log_offset}")
        pgroup = half.properties.get(MessageConst.PRODUCER_GROUP)
        if producer_group and pgroup and pgroup != producer_group:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"the producer group wrong: {producer_group} != {pgroup}")
        if half_queue_offset is None:
            half_queue_offset = half.queue_offset
        if half.queue_offset != half_queue_offset:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"the transaction state table offset wrong: {half_queue_offset} != {half.queue_offset}")
        origin = _origin_of(half)
        if origin in self._resolved_origins:
            # Resolved already (a repeated END, or a check answered first): never commit twice.
            return request.make_response(ResponseCode.SUCCESS, None)
        # A half the check pass has re-appended is still committed here: the END may simply be late.
        # Its origin is then marked resolved so the re-appended copy is not checked again.
        if state == SysFlag.TRANSACTION_COMMIT_TYPE:
            inner = self._to_real(half, commit_log_offset)
            inner = ctrl.redirect_if_delayed(inner, strict=False)
            res = await ctrl.put_message(inner)
            if res.status != PutMessageStatus.PUT_OK:
                return request.make_response(ResponseCode.SYSTEM_ERROR, f"commit failed: {res.error or res.status.name}")
        await self._put_op(half_queue_offset, origin, resolved=True)
        ctrl.stats.inc_transaction_end(half.properties.get(MessageConst.REAL_TOPIC, ""),
                                       state == SysFlag.TRANSACTION_COMMIT_TYPE)
        return ctrl.fenced_refusal(request) or request.make_response(ResponseCode.SUCCESS, None)

    def _to_real(self, half, commit_log_offset: int) -> MessageExtBrokerInner:
        props = dict(half.properties)
        topic = props.pop(MessageConst.REAL_TOPIC)
        qid = int(props.pop(MessageConst.REAL_QUEUE_ID, "0") or 0)
        props.pop(MessageConst.TRANSACTION_PREPARED, None)
        props.pop(MessageConst.TRANSACTION_CHECK_TIMES, None)
        props.pop(MessageConst.TRANSACTION_PREPARED_QUEUE_OFFSET, None)
        return MessageExtBrokerInner(
            topic=topic, queue_id=qid, body=half.body, flag=half.flag, properties=props,
            sys_flag=SysFlag.reset_transaction_value(half.sys_flag, SysFlag.TRANSACTION_COMMIT_TYPE),
            born_timestamp=half.born_timestamp, born_host=host_port(half.born_host),
            reconsume_times=half.reconsume_times, prepared_transaction_offset=commit_log_offset)

    async def _put_op(self, half_queue_offset: int, origin: int, resolved: bool) -> None:
        """Op record for one half copy (body = its queue offset, tag "d", as RocketMQ).  `resolved`
        marks an END (commit / rollback / discard) of the whole transaction — every copy of the
        half with that origin is done — as opposed to a copy superseded by its re-appended twin."""
        props = {MessageConst.TAGS: OP_TAG, OP_ORIGIN: str(origin)}
        if resolved:
            props[OP_RESOLVED] = "true"
        inner = MessageExtBrokerInner(
            topic=OP_TOPIC, queue_id=0, body=str(half_queue_offset).encode(), properties=props,
            born_host=host_port(self.ctrl.broker_config.broker_addr))
        res = await self.ctrl.put_message(inner)
        if res.status == PutMessageStatus.PUT_OK:
            self._done_half_offsets.add(half_queue_offset)
            if resolved:
                self._resolved_origins.add(origin)
        else:
            log.error("transaction op record for half %d failed: %s", half_queue_offset, res.status)

    # --- check service --------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._check_loop(), name="transaction-check")

    async def stop(self) -> None:
        await cancel_and_wait([self._task])
        self._task = None

    def wakeup(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _check_loop(self) -> None:
        bc = self.ctrl.broker_config
        interval = max(0.05, bc.transaction_check_interval / 1000)
        while True:
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction check failed")
            try:
                await asyncio.wait_for(self._wakeup.wait(), interval)
            except asyncio.TimeoutError:
                pass
            self._wakeup.clear()

    def _read_ops(self) -> None:
        """Read op records past what was read; remember (op offset, half offset) pairs in order."""
        store, om = self.ctrl.store, self.ctrl.offset_manager
        if self._op_read_to is None:
            self._op_read_to = max(0, om.query_offset(SYS_GROUP, OP_TOPIC, 0))
        while True:
            res = store.get_message(SYS_GROUP, OP_TOPIC, 0, self._op_read_to, 256)
            if res.message_count == 0:
                break
            for m in decode_messages(res.buffer):
                try:
                    ref = int(m.body)
                except ValueError:
                    log.warning("bad transaction op body %r", m.body[:32])
                    ref = -1
                self._done_half_offsets.add(ref)
                if m.properties.get(OP_RESOLVED) == "true":
                    try:
                        self._resolved_origins.add(int(m.properties.get(OP_ORIGIN, ref)))
                    except ValueError:
                        self._resolved_origins.add(ref)
                self._pending_ops.append((m.queue_offset, ref))
            self._op_read_to = res.next_begin_offset

    def _committed_op_offset(self, half_offset: int) -> int:
        """The op offset safe to persist: every op before it refers to a half already passed, so a
        restart that re-reads ops from there still knows every pending half's op."""
        while self._pending_ops and self._pending_ops[0][1] < half_offset:
            self._pending_ops.pop(0)
        return self._pending_ops[0][0] if self._pending_ops else self._op_read_to

    async def check_once(self) -> None:
        ctrl = self.ctrl
        store, om, bc = ctrl.store, ctrl.offset_manager, ctrl.broker_config
        self._read_ops()
        half_offset = max(om.query_offset(SYS_GROUP, HALF_TOPIC, 0), store.get_min_offset_in_queue(HALF_TOPIC, 0))
        start_ms = time.time() * 1000
        while True:
            res = store.get_message(SYS_GROUP, HALF_TOPIC, 0, half_offset, 32)
            if res.message_count == 0:
                break
            stop = False
            for half in decode_messages(res.buffer):
                if half.queue_offset in self._done_half_offsets or _origin_of(half) in self._resolved_origins:
                    half_offset = half.queue_offset + 1
                    continue
                if half.store_timestamp >= start_ms:
                    stop = True  # re-appended during this pass: next pass
                    break
                immunity = bc.transaction_time_out
                ci = half.properties.get(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS)
                if ci and ci.isdigit():
                    immunity = max(immunity, int(ci) * 1000)
                # Measured from the copy's store time: a re-appended copy gives the producer a whole
                # transactionTimeOut to answer its check before the next one (the queue is in store
                # order, so every later copy is younger still).
                if time.time() * 1000 - half.store_timestamp < immunity:
                    stop = True  # later halves are younger still
                    break
                checks = int(half.properties.get(MessageConst.TRANSACTION_CHECK_TIMES, "0") or 0)
                if checks >= bc.transaction_check_max:
                    await self._discard(half)
                else:
                    await self._re_append_and_check(half, checks + 1)
                half_offset = half.queue_offset + 1
            om.commit_offset("broker", SYS_GROUP, HALF_TOPIC, 0, half_offset)
            if stop:
                break
        om.commit_offset("broker", SYS_GROUP, OP_TOPIC, 0, self._committed_op_offset(half_offset))
        self._done_half_offsets = {o for o in self._done_half_offsets if o >= half_offset}

    async def _discard(self, half) -> None:
        """Checked too often: roll back, keep a copy in TRANS_CHECK_MAX_TIME_TOPIC, log it."""
        self.discarded += 1
        log.warning("transaction half message %s of group %s checked %s times without an answer: rolled back",
                    half.msg_id, half.properties.get(MessageConst.PRODUCER_GROUP), self.ctrl.broker_config.transaction_check_max)
        self.ctrl.topic_manager.create_topic_in_send_back(CHECK_MAX_TOPIC, 1, 4)
        inner = MessageExtBrokerInner(topic=CHECK_MAX_TOPIC, queue_id=0, body=half.body, flag=half.flag,
                                      properties=dict(half.properties), sys_flag=half.sys_flag,
                                      born_timestamp=half.born_timestamp, born_host=host_port(half.born_host))
        await self.ctrl.put_message(inner)
        await self._put_op(half.queue_offset, _origin_of(half), resolved=True)

    async def _re_append_and_check(self, half, check_times: int) -> None:
        props = dict(half.properties)
        props[MessageConst.TRANSACTION_CHECK_TIMES] = str(check_times)
        props[MessageConst.TRANSACTION_PREPARED_QUEUE_OFFSET] = str(_origin_of(half))
        inner = MessageExtBrokerInner(topic=HALF_TOPIC, queue_id=0, body=half.body, flag=half.flag,
                                      properties=props, sys_flag=half.sys_flag,
                                      born_timestamp=half.born_timestamp, born_host=host_port(half.born_host),
                                      reconsume_times=half.reconsume_times)
        res = await self.ctrl.put_message(inner)
        if res.status != PutMessageStatus.PUT_OK:
            return
        # The op for the old half position is written so only the re-appended copy stays pending.
        await self._put_op(half.queue_offset, _origin_of(half), resolved=False)
        ar = res.append_result
        await self._send_check(half, ar.logics_offset, ar.wrote_offset, props)

    async def _send_check(self, half, half_queue_offset: int, commit_log_offset: int, props: dict) -> None:
        group = props.get(MessageConst.PRODUCER_GROUP)
        channels = self.ctrl.producer_manager.available_channels(group) if group else []
        if not channels:
            log.info("transaction check: no live producer of group %s for %s; will retry", group, half.msg_id)
            return
        channel = random.choice(channels[:3]).channel
        real = dict(props)
        topic = real.get(MessageConst.REAL_TOPIC, half.topic)
        qid = int(real.get(MessageConst.REAL_QUEUE_ID, "0") or 0)
        body = encode_record(
            topic, half.body, queue_id=qid, flag=half.flag, queue_offset=half_queue_offset,
            commit_log_offset=commit_log_offset, sys_flag=half.sys_flag, born_timestamp=half.born_timestamp,
            born_host=half.born_host, store_timestamp=half.store_timestamp,
            store_host=half.store_host, reconsume_times=half.reconsume_times, properties=real)
        uniq = real.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, half.offset_msg_id)
        req = RemotingCommand.create_request(RequestCode.CHECK_TRANSACTION_STATE, {
            "tranStateTableOffset": str(half_queue_offset), "commitLogOffset": str(commit_log_offset),
            "msgId": uniq, "transactionId": uniq, "offsetMsgId": half.offset_msg_id,
        }, body)
        try:
            await channel.invoke_oneway(req)
            self.checks_sent += 1
        except Exception as e:
            log.info("transaction check to %s failed: %s", getattr(channel, "remote_address", "?"), e)
