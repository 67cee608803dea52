"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320), CONSUMER_SEND_MSG_BACK (36)."""
from __future__ import annotations

import logging
import os
import random
import time
import zlib

from rmq_core.broker import message_type as message_types
from rmq_core.broker.processors import Handler, Processor, born_host_of
from rmq_core.errors import IllegalArgumentError
from rmq_core.codec import string_to_properties
from rmq_core.message import MessageConst, MixAll, PermName, SysFlag, TopicValidator, properties_to_bytes, host_port
from rmq_core.remoting.codes import MQVersion, RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand, SerializeType
from rmq_core.remoting.steps import LaneStep
from rmq_core.store import MessageExtBatch, MessageExtBrokerInner, PutMessageStatus

from rmq_core._native.frame import header_ints as _header_ints
from rmq_core.remoting.command import new_response as _new_response
from rmq_core._native.send_lane import (LaneCheck, LaneChecks, PlainSend, PyLaneCheck, SendLane, SendLaneState, WriteFence,
                                        checked_queues, plain_send_queues, special_properties)

log = logging.getLogger("rmq.broker")

# RMQ_NATIVE_SEND=0 turns the native send lane off: every send then takes process_send, which
# makes the same checks through the same kernel functions (tests compare the two answers).
NATIVE_SEND = os.environ.get("RMQ_NATIVE_SEND", "1").strip().lower() not in ("0", "false", "no", "off")

# Java's MQVersion.Version.V3_4_9 ordinal: from this client version on, the send-back header's
# maxReconsumeTimes wins over the subscription group's retryMaxTimes.
V3_4_9 = 165

# a put's status -> the send answer's code: the code of the same name where there is one
# (FLUSH_DISK_TIMEOUT, MESSAGE_ILLEGAL, SERVICE_NOT_AVAILABLE, ...), else the one RocketMQ answers
_PUT_STATUS_TO_CODE = {s: ResponseCode[s.name] for s in PutMessageStatus if s.name in ResponseCode.__members__} | {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS, PutMessageStatus.OS_PAGECACHE_BUSY: ResponseCode.SYSTEM_BUSY,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.DISK_FULL: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH: ResponseCode.SYSTEM_ERROR,  # (RocketMQ 5's code; the remark says why)
    PutMessageStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR}


_SUCCESS = int(ResponseCode.SUCCESS)


class SendHeader:
    __slots__ = ("producer_group", "topic", "default_topic", "default_topic_queue_nums", "queue_id",
                 "sys_flag", "born_timestamp", "flag", "properties", "reconsume_times", "unit_mode",
                 "max_reconsume_times", "batch")

    @classmethod
    def parse(cls, request) -> "SendHeader":
        """Read a send header in its long (SEND_MESSAGE) or one-letter (SEND_MESSAGE_V2) names.

        On the hot path: fields are read straight from the dict (values are strings after
        decoding); only a bad value takes the slow route that names the field."""
        ext = request.ext_fields
        names = _V2_FIELDS if "b" in ext and "topic" not in ext else _V1_FIELDS
        get = ext.get
        h = cls()
        topic = get(names[0])
        if not topic:
            raise IllegalArgumentError("send request without a topic")
        h.topic = topic
        h.producer_group = get(names[1]) or ""
        h.default_topic = get(names[2]) or TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC
        h.properties = get(names[8]) or ""
        try:
            h.default_topic_queue_nums = _int_or(get(names[3]), 4)
            h.queue_id = _int_or(get(names[4]), -1)
            h.sys_flag = _int_or(get(names[5]), 0)
            h.born_timestamp = _int_or(get(names[6]), 0) or int(time.time() * 1000)
            h.flag = _int_or(get(names[7]), 0)
            h.reconsume_times = _int_or(get(names[9]), 0)
            h.max_reconsume_times = _int_or(get(names[11]), None)
        except ValueError:
            for i in (3, 4, 5, 6, 7, 9, 11):  # name the bad field (get_int raises with it)
                request.get_int(names[i])
            raise
        h.unit_mode = _bool(get(names[10]))
        h.batch = _bool(get(names[12])) or request.code == RequestCode.SEND_BATCH_MESSAGE
        return h


_V1_FIELDS = ("topic", "producerGroup", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
              "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch")
_V2_FIELDS = ("b", "a", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m")
# The integer fields the fast path reads natively, in SendHeader.parse's order and defaults:
# defaultTopicQueueNums, queueId, sysFlag, bornTimestamp, flag, reconsumeTimes, maxReconsumeTimes.
_INT_SLOTS = (3, 4, 5, 6, 7, 9, 11)
_V1_INT_KEYS = tuple(_V1_FIELDS[i] for i in _INT_SLOTS)
_V2_INT_KEYS = tuple(_V2_FIELDS[i] for i in _INT_SLOTS)
_INT_DEFAULTS = (4, -1, 0, 0, 0, 0, None)


def _int_or(value, default):
    if value is None or value == "":
        return default
    return value if type(value) is int else int(value)


def _bool(value) -> bool:
    return value is not None and (value is True or str(value).strip().lower() in ("1", "true"))


class SendMessageProcessor(Processor):
    CODES = {
        RequestCode.SEND_MESSAGE: "send_message",
        RequestCode.SEND_MESSAGE_V2: "send_message",
        RequestCode.SEND_BATCH_MESSAGE: "send_message",
        RequestCode.CONSUMER_SEND_MSG_BACK: "consumer_send_msg_back",
    }

    def __init__(self, controller):
        super().__init__(controller)
        self._sendable_topics: set[str] = set()  # valid, non-system topic names seen before
        # topic -> (topic table DataVersion, its counter, write queue nums, queue id bound) of a
        # topic every check of _check passed for, under that version of the topic table: while the
        # version is unchanged, a plain send to it needs none of those checks again.
        self._send_topics: dict[str, tuple] = {}
        self._state = None  # process_send's SendLaneState (see _new_state)
        self._plain = PlainSend()  # put_plain's message
        # batch header properties -> (them as a dict, a timer refusal or None, the extra
        # properties every item of the batch gets, encoded): see _process_batch
        self._batch_extras: dict[str, tuple] = {}

    def register(self, server) -> None:
        if NATIVE_SEND and SendLane is not None and hasattr(server, "register_fast_lane"):
            server.register_fast_lane(self.fast_lane)
        for code, name in self.CODES.items():
            if name == "send_message":
                # process_send answers most sends without suspending: no coroutine of its own.
                server.register_processor(int(code), Handler(self.process_send))
            else:
                server.register_processor(int(code), Handler(getattr(self, name)))

    # --- send -----------------------------------------------------------------------------------
    def fast_lane(self, ctx):
        """The native send lane of one connection: it answers the sends process_send would answer
        at once (same checks, same cache, same store put, byte-identical answers) straight from
        the read chunk, and hands every other frame back in order (_native/send_lane.pyx)."""
        if self.ctrl.store is None:
            return None
        try:
            born_host = ctx.attributes["_born_host"]
        except (AttributeError, KeyError):
            born_host = _remember_born_host(ctx)

        table = ctx.processor_table
        steps = table.steps  # the broker's request steps run in the lane (steps.LaneStep)

        def finish_later(frame, result, fut, topic, queue_id):
            # a put to wait for (SYNC_FLUSH) or one that failed: answered as process_send does
            request = RemotingCommand.decode(frame)
            answer = self._finish_put(request, result, fut, topic, queue_id)
            if steps is not None and steps.after:  # (their before ran in the lane)
                answer = table.finish_steps(ctx, request, answer, steps)
            ctx.answer_later(request, answer)

        def failed(frame, exc):
            # a send whose put raised (a failed write): SYSTEM_ERROR naming it, as dispatch answers
            request = RemotingCommand.decode(frame)
            ctx.answer_failure(request, exc)

        def json_peer():
            ctx.peer_serialize_type = SerializeType.JSON

        state = self._new_state(table)
        if steps is not None:
            state.check, state.decode = _lane_check(ctx, steps.before), LaneStep.decode
            state.after = LaneStep(ctx, steps.after).after if steps.after else None
        return SendLane(state, born_host, ctx.tasks, ctx.max_inflight, finish_later,
                        call_soon_threadsafe=self.ctrl.loop.call_soon_threadsafe,
                        write_frames=getattr(ctx.channel, "write_frames", None), on_error=failed,
                        on_json_peer=json_peer)

    def _new_state(self, table=None):
        """A SendLaneState over this processor's checked-topics cache: what the send_lane kernel
        checks a send against, for a connection's lane (`table`: its processor table) or for
        process_send (no table: it never uses the lane's put)."""
        ctrl = self.ctrl
        store, topic_manager, broker_config = ctrl.store, ctrl.topic_manager, ctrl.broker_config
        fence = ctrl.write_fence  # (one per broker: the lanes check it again when they answer)

        def refresh(state):
            # what a lane may do now (its request steps run in it: see fast_lane)
            state.put = store.put_nowait if table is not None else None
            dv = topic_manager.table.data_version
            state.data_version, state.counter = dv, dv.counter
            # a slave, or a master whose write fence lapsed, takes no writes: every send goes to
            # send_message, which refuses it before any put
            state.writable = (bool(broker_config.broker_permission & PermName.PERM_WRITE) and not ctrl.is_slave
                              and not fence.lapsed())

        return SendLaneState(self._send_topics, self._cluster_property(), int(MQVersion.CURRENT),
                             PutMessageStatus.PUT_OK, self.ctrl.stats.inc_put, put_outcome, refresh, fence)

    def process_send(self, ctx, request):
        """A send request's response, or an awaitable of it.

        The plain send the lane answers — a message without transaction, delay or timer, or a
        batch, to a topic whose checks passed under the topic table's current data version — is
        recognised by the lane's own kernel check (send_lane.plain_send_queues / checked_queues)
        and put and answered right here; every other request, and any field the native reader
        declines, takes send_message, which does the whole check and names a bad value."""
        ext = request.ext_fields
        if "b" in ext and "topic" not in ext:
            names, int_keys = _V2_FIELDS, _V2_INT_KEYS
        else:
            names, int_keys = _V1_FIELDS, _V1_INT_KEYS
        topic = ext.get(names[0])
        ints = _header_ints(ext, int_keys, _INT_DEFAULTS)
        if ints is None:
            return self.send_message(ctx, request)
        state = self._state
        if state is None:
            state = self._state = self._new_state()
        state.refresh(state)
        queue_id, sys_flag = ints[1], ints[2]
        props = ext.get(names[8]) or ""
        batch = ext.get(names[12])
        if request.code == RequestCode.SEND_BATCH_MESSAGE or (batch is not None and batch != "false" and _bool(batch)):
            try:
                queues = checked_queues(state, topic, queue_id)
            except OverflowError:
                queues = 0
            if not queues:
                return self.send_message(ctx, request)
            return self._process_batch(ctx, request, queues, ints, topic, props)
        try:
            props_bytes = props.encode("utf-8")
        except (AttributeError, UnicodeEncodeError):
            return self.send_message(ctx, request)
        try:
            born_host = ctx.attributes["_born_host"]
        except (AttributeError, KeyError):
            born_host = _remember_born_host(ctx)
        put = self._put_plain(state, topic, queue_id, request.body or b"", ints[4], props_bytes, born_host,
                              ints[3], sys_flag, ints[5])
        if put is None:
            return self.send_message(ctx, request)  # it checks everything and names what is wrong
        result, fut, queue_id = put
        if fut is not None:  # SYNC_FLUSH (or a slave to wait for): answer once it is durable
            return self._finish_put(request, result, fut, topic, queue_id)
        return self._send_response(request, result, topic, queue_id)

    def put_plain(self, topic: str, queue_id: int, body: bytes, flag: int, properties: bytes,
                  born_host: tuple[str, int], born_timestamp: int, sys_flag: int, reconsume_times: int = 0):
        """The send lane's put of one message given as plain values (a RocketMQ 5 SendMessage's):
        None when it is not a send the lane takes - a topic not checked under the topic table's
        current version (or one with a message.type attribute), a broker that takes no writes, a
        queue id out of range, a transaction flag, a delay / timer / transaction property - and the
        caller's general path must check it; else the store's put as (result, flush Future or None,
        queue id).  `properties`: the encoded properties string (record's properties writer),
        without CLUSTER (added here, as for every send); queue_id < 0: any write queue;
        born_timestamp 0: now.  Answer it with `put_answer`."""
        state = self._state
        if state is None:
            state = self._state = self._new_state()
        state.refresh(state)
        return self._put_plain(state, topic, queue_id, body, flag, properties, born_host, born_timestamp,
                               sys_flag, reconsume_times)

    def _put_plain(self, state, topic, queue_id, body, flag, properties, born_host, born_timestamp, sys_flag,
                   reconsume_times):
        try:
            queues = plain_send_queues(state, topic, queue_id, sys_flag, properties)
        except OverflowError:
            queues = 0
        if not queues:
            return None
        if queue_id < 0:
            queue_id = random.randrange(queues)
        msg = self._plain  # (the lane's message: refilled per send, the put keeps none of it)
        msg.topic, msg.queue_id, msg.body, msg.flag = topic, queue_id, body, flag
        msg.properties_bytes = properties + state.cluster_prop
        msg.sys_flag, msg.born_timestamp = sys_flag, born_timestamp or int(time.time() * 1000)
        msg.born_host, msg.reconsume_times = born_host, reconsume_times
        try:
            result, fut = self.ctrl.store.put_nowait(msg)
        finally:
            msg.body = msg.properties_bytes = None
        return result, fut, queue_id

    def _process_batch(self, ctx, request, queues, ints, topic, props):
        """process_send's answer to a batch to a checked topic (`queues`: its write queues):
        _send_batch's work without a coroutine (the properties every item gets are prepared once
        per distinct header value); a compressed batch takes send_message."""
        queue_id, sys_flag = ints[1], ints[2]
        if sys_flag & SysFlag.COMPRESSED:
            return self.send_message(ctx, request)
        if queue_id < 0:
            queue_id = random.randrange(queues)
        prepared = self._batch_extras.get(props)
        if prepared is None:
            header_props = string_to_properties(props)
            refused = self.ctrl.timer_service.check_batch(b"", header_props)
            extra = dict(header_props)
            extra.pop(MessageConst.WAIT_STORE_MSG_OK, None)  # every item carries its own
            extra[MessageConst.CLUSTER] = self.ctrl.broker_config.broker_cluster_name
            prepared = (header_props, refused, properties_to_bytes(extra))
            if len(self._batch_extras) > 1024:
                self._batch_extras.clear()
            self._batch_extras[props] = prepared
        extra, refused, extra_bytes = prepared
        body = request.body or b""
        if refused is None:
            refused = self.ctrl.timer_service.check_batch(body, extra)
        if refused:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, refused)
        try:
            born_host = ctx.attributes["_born_host"]
        except (AttributeError, KeyError):
            born_host = _remember_born_host(ctx)
        batch = MessageExtBatch(topic=topic, queue_id=queue_id, body=body, sys_flag=sys_flag,
                                born_timestamp=ints[3] or int(time.time() * 1000), born_host=born_host,
                                reconsume_times=ints[5], extra_properties=extra_bytes)
        result, fut = self.ctrl.store.put_nowait(batch)
        if fut is not None:
            return self._finish_put(request, result, fut, topic, queue_id)
        return self._send_response(request, result, topic, queue_id)

    async def _finish_put(self, request, result, fut, topic, queue_id):
        result = await self.ctrl.store.await_durable_async(result, fut)
        return self._send_response(request, result, topic, queue_id)

    async def send_message(self, ctx, request):
        ctrl = self.ctrl
        try:
            h = SendHeader.parse(request)
        except Exception as e:  # bad header types: name the field, keep the connection
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"bad send request: {e}")
        resp = self._check(ctx, request, h)
        if resp is not None:
            return resp
        tc = ctrl.topic_manager.select(h.topic)
        if tc.attributes:  # a RocketMQ 5 topic that accepts one message type only (never on the lane)
            why = message_types.refusal(h.topic, tc.attributes, string_to_properties(h.properties), h.sys_flag)
            if why is not None:
                return request.make_response(ResponseCode.MESSAGE_ILLEGAL, why)
        queue_id = h.queue_id if h.queue_id is not None and h.queue_id >= 0 else random.randrange(tc.write_queue_nums)
        if queue_id >= max(tc.write_queue_nums, tc.read_queue_nums):
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic {h.topic} has {tc.write_queue_nums} write queues "
                f"(producer {born_host_of(ctx)[0]})")
        body = request.body or b""
        born_host = born_host_of(ctx)
        if h.batch:
            return await self._send_batch(ctx, request, h, queue_id, body, born_host)

        topic, props_str = h.topic, h.properties
        sys_flag = h.sys_flag
        props_bytes = props_str.encode("utf-8")
        if (not SysFlag.transaction_value(sys_flag) and not MixAll.is_retry_topic(topic)
                and not special_properties(props_bytes)):
            # Plain message (no delay, timer, transaction): hand the client's properties through
            # as bytes, plus CLUSTER, without building a dict (the common case, on the hot path).
            inner = MessageExtBrokerInner(
                topic=topic, queue_id=queue_id, body=body, flag=h.flag,
                properties_bytes=props_bytes + self._cluster_property(),
                sys_flag=sys_flag, born_timestamp=h.born_timestamp, born_host=born_host,
                reconsume_times=h.reconsume_times)
            result = await ctrl.put_message(inner)
            return self._send_response(request, result, topic, queue_id)
        props = string_to_properties(props_str)
        reconsume_times = h.reconsume_times
        # Retry topic sends that ran out of attempts go to the dead-letter queue.
        if MixAll.is_retry_topic(topic):
            redirected = self._handle_retry_and_dlq(h, props)
            if isinstance(redirected, tuple):
                topic, queue_id = redirected
            elif redirected is not None:
                return request.make_response(ResponseCode.SYSTEM_ERROR, redirected)
        props[MessageConst.CLUSTER] = ctrl.broker_config.broker_cluster_name
        tx_type = SysFlag.transaction_value(sys_flag)
        message_type = message_type_of(props, tx_type)
        if message_type == "transaction":
            if ctrl.broker_config.reject_transaction_message:
                return request.make_response(ResponseCode.NO_PERMISSION,
                                             f"the broker[{ctrl.broker_config.broker_name}] sending transaction message is forbidden")
            try:  # a bad timer request is refused now, though the half is redirected only on commit
                ctrl.timer_service.check_properties(props, topic)
            except IllegalArgumentError as e:
                return request.make_response(ResponseCode.MESSAGE_ILLEGAL, str(e))
            inner = MessageExtBrokerInner(
                topic=topic, queue_id=queue_id, body=body, flag=h.flag, properties=props,
                sys_flag=sys_flag, born_timestamp=h.born_timestamp, born_host=born_host,
                reconsume_times=reconsume_times)
            inner = ctrl.transaction_service.prepare_half_message(inner, h.producer_group)
        else:
            inner = MessageExtBrokerInner(
                topic=topic, queue_id=queue_id, body=body, flag=h.flag, properties=props,
                sys_flag=sys_flag, born_timestamp=h.born_timestamp, born_host=born_host,
                reconsume_times=reconsume_times)
            try:
                inner = ctrl.redirect_if_delayed(inner)
            except IllegalArgumentError as e:  # a bad timer request: name the property and value
                return request.make_response(ResponseCode.MESSAGE_ILLEGAL, str(e))
        result = await ctrl.put_message(inner)
        return self._send_response(request, result, h.topic, queue_id, message_type)

    async def _send_batch(self, ctx, request, h, queue_id, body, born_host):
        ctrl = self.ctrl
        if MixAll.is_retry_topic(h.topic):
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"batch request does not support retry group {h.topic}")
        sys_flag = h.sys_flag
        if sys_flag & SysFlag.COMPRESSED:
            # The C++ client compresses a whole batch with zlib (docs/protocol.md §4.4); store items plain.
            try:
                body = zlib.decompress(body)
            except zlib.error as e:
                return request.make_response(ResponseCode.MESSAGE_ILLEGAL, f"compressed batch body does not inflate: {e}")
            sys_flag &= ~(SysFlag.COMPRESSED | SysFlag.COMPRESSION_TYPE_MASK)
        extra = string_to_properties(h.properties)
        refused = ctrl.timer_service.check_batch(body, extra)
        if refused:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, refused)
        extra.pop(MessageConst.WAIT_STORE_MSG_OK, None)  # every item carries its own
        extra[MessageConst.CLUSTER] = ctrl.broker_config.broker_cluster_name
        batch = MessageExtBatch(topic=h.topic, queue_id=queue_id, body=body, sys_flag=sys_flag,
                                born_timestamp=h.born_timestamp, born_host=born_host,
                                reconsume_times=h.reconsume_times,
                                extra_properties=properties_to_bytes(extra))
        result = await ctrl.put_messages(batch)
        return self._send_response(request, result, h.topic, queue_id)

    def _cluster_property(self) -> bytes:
        cached = self.__dict__.get("_cluster_prop")
        if cached is None:
            cached = self._cluster_prop = f"{MessageConst.CLUSTER}\x01{self.ctrl.broker_config.broker_cluster_name}\x02".encode()
        return cached

    def _send_response(self, request, result, topic, queue_id, message_type=None):
        """A send's answer from its put's result (the native lane writes the same bytes).
        message_type: the metrics' label for a message that is not "normal" (see message_type_of)."""
        code, remark, fields = self.put_answer(result, topic, message_type)
        if not fields:
            return request.make_response(code, remark)
        ar = result.append_result
        ext = {"msgId": ar.msg_id, "queueId": str(queue_id), "queueOffset": str(ar.logics_offset),
               "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        return _new_response(request, code, None, ext, None)  # the dict is fresh and all str

    def put_answer(self, result, topic: str, message_type=None) -> tuple[int, str | None, bool]:
        """A send's answer from its put's result as put_outcome gives it - the write fence checked
        as the answer is made (docs/failover.md), and an acknowledged put counted in the broker's
        stats; message_type: the metrics' label for a message that is not "normal"."""
        status = result.status
        if status is PutMessageStatus.PUT_OK:  # (the common case, without the mapping's lookups)
            code, remark, fields = _SUCCESS, None, True
        else:
            code, remark, fields = put_outcome(status, result.error)
        if fields and self.ctrl.write_fence.lapsed():
            code, remark, fields = put_outcome(self.ctrl.write_fence)
        if fields:
            ar = result.append_result
            self.ctrl.stats.inc_put(topic, ar.msg_num, ar.wrote_bytes, message_type)
        return code, remark, fields

    def _check(self, ctx, request, h):
        """msgCheck: broker permission, topic name, topic existence / auto-creation, queue id."""
        ctrl = self.ctrl
        bc = ctrl.broker_config
        dv = ctrl.topic_manager.table.data_version
        counter = dv.counter
        if ctrl.is_slave:  # before auto-creation: a slave's topics are its master's
            return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, ctrl.slave_refusal("sending message"))
        fenced = ctrl.fenced_refusal(request)
        if fenced is not None:
            return fenced
        if not PermName.is_writeable(bc.broker_permission):
            return request.make_response(ResponseCode.NO_PERMISSION,
                                         f"the broker[{bc.broker_ip1}] sending message is forbidden")
        if h.topic not in self._sendable_topics:  # names already checked skip the regex
            try:
                TopicValidator.check_topic(h.topic)
            except IllegalArgumentError as e:
                return request.make_response(ResponseCode.MESSAGE_ILLEGAL, str(e))
            if TopicValidator.is_system_topic(h.topic) and h.topic not in (
                    TopicValidator.RMQ_SYS_TRACE_TOPIC, TopicValidator.RMQ_SYS_SELF_TEST_TOPIC,
                    TopicValidator.RMQ_SYS_BENCHMARK_TOPIC):
                return request.make_response(ResponseCode.NO_PERMISSION,
                                             f"sending message to system topic {h.topic!r} is forbidden")
            if len(self._sendable_topics) > 100_000:
                self._sendable_topics.clear()
            self._sendable_topics.add(h.topic)
        tc = ctrl.topic_manager.select(h.topic)
        if tc is None:
            sys_flag = 1 if h.unit_mode else 0
            if MixAll.is_retry_topic(h.topic):
                tc = ctrl.topic_manager.create_topic_in_send_back(h.topic, 1, 6, sys_flag)
            else:
                tc = ctrl.topic_manager.create_topic_in_send_message_method(
                    h.topic, h.default_topic, getattr(ctx, "remote_address", "?"), h.default_topic_queue_nums, sys_flag)
            if tc is None:
                return request.make_response(
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"topic[{h.topic}] not exist, apply first please! (autoCreateTopicEnable=false on broker "
                    f"{bc.broker_name}; create it with `rmq admin updateTopic -t {h.topic}`)")
        if not PermName.is_writeable(tc.perm):
            return request.make_response(ResponseCode.NO_PERMISSION,
                                         f"the topic[{h.topic}] sending message is forbidden")
        if tc.write_queue_nums > 0 and not MixAll.is_retry_topic(h.topic) and \
                message_types.topic_message_type(tc.attributes) == message_types.MIXED:
            # Keyed by the version read before the checks: a change made meanwhile invalidates it.
            if len(self._send_topics) > 100_000:
                self._send_topics.clear()
            self._send_topics[h.topic] = (dv, counter, tc.write_queue_nums,
                                          max(tc.write_queue_nums, tc.read_queue_nums))
        return None

    def _handle_retry_and_dlq(self, h, props):
        """Returns (dlq_topic, queue) when the retry budget is spent, an error string, or None."""
        ctrl = self.ctrl
        group = h.topic[len(MixAll.RETRY_GROUP_TOPIC_PREFIX):]
        sg = ctrl.subscription_manager.find(group)
        if sg is None:
            return f"subscription group not exist, {group}"
        max_times = sg.retry_max_times
        if h.max_reconsume_times is not None:
            max_times = h.max_reconsume_times
        if h.reconsume_times > max_times:
            ctrl.topic_manager.dlq_topic(group)
            ctrl.stats.inc_dlq(props.get(MessageConst.RETRY_TOPIC) or h.topic, group)
            log.info("send message to DLQ %s: reconsume times %d > max %d", MixAll.get_dlq_topic(group),
                     h.reconsume_times, max_times)
            return MixAll.get_dlq_topic(group), 0
        return None

    # --- send back ------------------------------------------------------------------------------
    async def consumer_send_msg_back(self, ctx, request):
        ctrl = self.ctrl
        try:
            group = request.get_str("group")
            offset = request.get_int("offset")
            delay_level = request.get_int("delayLevel", 0) or 0
            origin_msg_id = request.get_str("originMsgId")
            max_header = request.get_int("maxReconsumeTimes", None)
        except Exception as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad send-back request: {e}")
        if not group or offset is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "send-back request needs group and offset")
        if ctrl.is_slave:
            return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, ctrl.slave_refusal("sending a message back"))
        fenced = ctrl.fenced_refusal(request)
        if fenced is not None:
            return fenced
        sg = ctrl.subscription_manager.find_or_create(group)
        if sg is None:
            return request.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                         f"subscription group not exist, {group}")
        if not PermName.is_writeable(ctrl.broker_config.broker_permission):
            return request.make_response(ResponseCode.NO_PERMISSION, "the broker sending message is forbidden")
        if sg.retry_queue_nums <= 0:
            return request.make_response(ResponseCode.SUCCESS, None)
        msg = ctrl.store.look_message_by_offset(offset, decompress=False)  # stored again as it is
        if msg is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        props = dict(msg.properties)
        if MessageConst.RETRY_TOPIC not in props:
            props[MessageConst.RETRY_TOPIC] = msg.topic
        max_times = sg.retry_max_times
        if max_header is not None and request.version >= V3_4_9:
            max_times = max_header
        topic, queue_id, dead = send_back_target(ctrl, group, sg, msg.reconsume_times, max_times, delay_level)
        if dead:
            props.pop(MessageConst.DELAY_TIME_LEVEL, None)
        else:
            if delay_level == 0:
                delay_level = 3 + msg.reconsume_times
            props[MessageConst.DELAY_TIME_LEVEL] = str(delay_level)
        props[MessageConst.ORIGIN_MESSAGE_ID] = origin_msg_id or props.get(MessageConst.ORIGIN_MESSAGE_ID) or msg.msg_id
        inner = MessageExtBrokerInner(
            topic=topic, queue_id=queue_id, body=msg.body, flag=msg.flag, properties=props,
            sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=host_port(msg.born_host),
            reconsume_times=msg.reconsume_times + 1)
        inner = ctrl.redirect_if_delayed(inner, strict=False)
        result = await ctrl.put_message(inner)
        if result.status != PutMessageStatus.PUT_OK:
            return request.make_response(ResponseCode.SYSTEM_ERROR, result.error or result.status.name)
        if MixAll.is_dlq_topic(topic):
            ctrl.stats.inc_dlq(props[MessageConst.RETRY_TOPIC], group)
        return ctrl.fenced_refusal(request) or request.make_response(ResponseCode.SUCCESS, None)


def send_back_target(ctrl, group: str, sg, reconsume_times: int, max_times: int, delay_level: int = 0,
                     retry_topic: str | None = None) -> tuple[str, int, bool]:
    """Where a message a consumer of `group` gives back goes (RocketMQ's send-back decision, also
    the pop revive's): the group's dead-letter topic %DLQ%<group> once the message's reconsume
    times reached `max_times` (or when delay_level < 0 asks for it), else its retry topic -
    %RETRY%<group> on one of its retryQueueNums queues, or `retry_topic` (a pop retry topic, one
    queue).  Creates the topic when missing.  Returns (topic, queue id, dead-lettered)."""
    if reconsume_times >= max_times or delay_level < 0:
        ctrl.topic_manager.dlq_topic(group)
        return MixAll.get_dlq_topic(group), 0, True
    if retry_topic is not None:
        ctrl.topic_manager.create_topic_in_send_back(retry_topic, 1, PermName.PERM_READ | PermName.PERM_WRITE)
        return retry_topic, 0, False
    n = max(1, sg.retry_queue_nums)
    ctrl.topic_manager.retry_topic(group, n)
    return MixAll.get_retry_topic(group), random.randrange(n), False


def message_type_of(props: dict, tx_type: int) -> str:
    """The message_type label of RocketMQ 5's metrics for a message with these properties:
    transaction (a half message), delay (a delay level or a timer), else normal."""
    if props.get(MessageConst.TRANSACTION_PREPARED) == "true" or tx_type == SysFlag.TRANSACTION_PREPARED_TYPE:
        return "transaction"
    if (props.get(MessageConst.DELAY_TIME_LEVEL, "0") not in ("", "0") or MessageConst.TIMER_DELIVER_MS in props
            or MessageConst.TIMER_DELAY_SEC in props or "TIMER_DELAY_MS" in props):
        return "delay"
    return "normal"


def put_outcome(status, error: str | None = None) -> tuple[int, str | None, bool]:
    """The one mapping of a put's outcome to a send's answer (the general path's, and the native
    lane's for its SYNC_FLUSH groups): (response code, remark, whether the answer keeps
    msgId/queueId/queueOffset and counts in the stats).  `status`: a PutMessageStatus, the
    exception of a flush Future that failed or was cancelled, or the broker's WriteFence when it
    lapsed before the answer (SERVICE_NOT_AVAILABLE: clients retry another broker; the remark
    [FENCED]... names the broker); `error`: the store's reason."""
    if type(status) is WriteFence:
        return int(ResponseCode.SERVICE_NOT_AVAILABLE), status.remark, False
    if not isinstance(status, PutMessageStatus):
        return int(ResponseCode.SYSTEM_ERROR), f"flush failed: {type(status).__name__}", False
    code = _PUT_STATUS_TO_CODE.get(status, ResponseCode.SYSTEM_ERROR)
    if code in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT,
                ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE):
        return int(code), None, True
    return int(code), error or f"put message failed: {status.name}", False


def _lane_check(ctx, before: list):
    """A connection's broker steps as the lane runs them (send_lane.LaneCheck): a step whose owner
    offers a native check (LaneStep.native_check: the ACL validator's) as that check, falling back
    to the step itself; the others in runs, each a PyLaneCheck."""
    checks, run = [], []
    for fn in before:
        make = LaneStep.native_check(fn)
        if make is None:
            run.append(fn)
            continue
        if run:
            checks.append(PyLaneCheck(run, ctx))
            run = []
        checks.append(make(ctx, PyLaneCheck([fn], ctx)))
    if run:
        checks.append(PyLaneCheck(run, ctx))
    if not checks:  # (after() steps only: the request is made for them, nothing checks it)
        return LaneCheck()
    return checks[0] if len(checks) == 1 else LaneChecks(checks)


def _remember_born_host(ctx) -> tuple[str, int]:
    """born_host_of(ctx), kept in the connection's attributes (its address does not change)."""
    born_host = born_host_of(ctx)
    attributes = getattr(ctx, "attributes", None)
    if type(attributes) is dict:
        attributes["_born_host"] = born_host
    return born_host
