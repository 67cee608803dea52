"""Message trace as RocketMQ 4.x records it (client/trace: TraceDataEncoder, AsyncTraceDispatcher,
SendMessageTraceHookImpl, ConsumeMessageTraceHookImpl).

A traced client notes each send and each listener call on its `TraceDispatcher`: a note is a
tuple appended to a bounded buffer (nothing else on the caller's path; a full buffer drops the
note and counts it).  The dispatcher's worker turns notes into `TraceContext`s, encodes them in
RocketMQ's text format and sends them in batches (at most every 0.5 s, or once ~118 KB gather)
through the client instance's own producer (CLIENT_INNER_PRODUCER) to RMQ_SYS_TRACE_TOPIC or
the customised trace topic.  Each trace message carries the traced messages' ids and keys as
its keys, so the broker's index finds a message's traces by its id (queryMsgTraceById).

The format (TraceDataEncoder): records separated by \\x02, fields by \\x01, a null Java string
written "null":

  Pub        Pub, timestamp, region, group, topic, msgId, tags, keys, storeHost, bodyLength,
             costTime, msgType ordinal, offsetMsgId, success
  SubBefore  SubBefore, timestamp, region, group, requestId, msgId, retryTimes, keys
  SubAfter   SubAfter, requestId, msgId, costTime, success, keys, contextCode, timestamp, group
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Iterable

import attrs

from rmq_core._native.trace import TraceBuffer, pub_record
from rmq_core.common.delegate import delegate
from rmq_core.errors import ConfigError, IllegalArgumentError
from rmq_core.message import (Message, MessageClientIDSetter, MessageConst, SendStatus, TopicValidator,
                              decode_offset_msg_id)

log = logging.getLogger("rmq.client.trace")

CONTENT_SPLITOR = "\x01"
FIELD_SPLITOR = "\x02"
# AsyncTraceDispatcher's sizes: the context buffer, a trace message's most, a batch's wait; and
# how many written trace messages may wait for the worker (Java queues up to 2048 send tasks)
QUEUE_SIZE = 2048
READY_SEGMENTS = 16
MAX_MSG_SIZE = 128_000
BATCH_BYTES = MAX_MSG_SIZE - 10_000
POLLING_TIME = 0.1
WAIT_TIME_THRESHOLD = 0.5
KEYS_BYTES = 24_000
DEFAULT_TRACE_REGION_ID = "DefaultRegion"  # MixAll.DEFAULT_TRACE_REGION_ID: an EndTransaction's without MSG_REGION


class TraceType(enum.Enum):
    Pub = "Pub"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class MessageType(enum.IntEnum):
    """RocketMQ's MessageType; a Pub record carries its ordinal."""
    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3


class ConsumeReturnType(enum.IntEnum):
    """A SubAfter record's contextCode (RocketMQ's ConsumeReturnType ordinal)."""
    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


@attrs.define
class TraceBean:
    topic: str = ""
    msg_id: str = ""
    offset_msg_id: str = ""
    tags: str | None = ""
    keys: str | None = ""
    store_host: str = ""
    body_length: int = 0
    msg_type: MessageType = MessageType.Normal_Msg
    retry_times: int = 0
    transaction_id: str | None = None
    transaction_state: str = ""  # LocalTransactionState's name (EndTransaction)
    from_transaction_check: bool = False


@attrs.define
class TraceContext:
    trace_type: TraceType
    timestamp: int = 0  # ms since the epoch
    region_id: str = ""
    group_name: str = ""
    cost_time: int = 0  # ms
    success: bool = True
    request_id: str = ""
    context_code: int = 0
    beans: list = attrs.field(factory=list)


def _j(value) -> str:
    """A string or bool as Java's StringBuilder.append writes it (null -> "null")."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return value


# The one writer of each record kind (the worker calls them with a note's values, encode() with a
# TraceContext's): fields in TraceDataEncoder's order; _j writes what Java's append would.  Pub
# records, one per traced send, are written natively (rmq_core._native.trace.pub_record).
def sub_before_record(timestamp: int, region: str, group: str, request_id: str, msg_id: str, retry_times: int,
                      keys) -> str:
    return (f"SubBefore\x01{timestamp}\x01{region}\x01{group}\x01{request_id}\x01{msg_id}\x01{retry_times}\x01"
            f"{_j(keys)}\x02")


def sub_after_record(request_id: str, msg_id: str, cost: int, success: bool, keys, context_code: int,
                     timestamp: int, group: str) -> str:
    return (f"SubAfter\x01{request_id}\x01{msg_id}\x01{cost}\x01{_j(success)}\x01{_j(keys)}\x01{context_code}\x01"
            f"{timestamp}\x01{group}\x02")


def end_transaction_record(timestamp: int, region: str, group: str, topic: str, msg_id: str, tags, keys,
                           store_host: str, transaction_id, state: str, from_check: bool) -> str:
    return (f"EndTransaction\x01{timestamp}\x01{region}\x01{group}\x01{topic}\x01{msg_id}\x01{_j(tags)}\x01"
            f"{_j(keys)}\x01{store_host}\x01{MessageType.Trans_msg_Commit.value}\x01{_j(transaction_id)}\x01{state}\x01"
            f"{_j(from_check)}\x02")


def index_keys(msg_id: str, keys: str | None, into: list) -> None:
    """The keys a trace record is found by: the message's id and its own keys."""
    into.append(msg_id)
    if keys:
        into.extend(k for k in keys.split(MessageConst.KEY_SEPARATOR) if k)


def encode(ctx: TraceContext) -> tuple[str, list[str]]:
    """TraceDataEncoder.encoderFromContextBean: (the record text, the keys that index it - each
    bean's msgId and its message keys)."""
    t = ctx.trace_type
    if t is TraceType.Pub:
        b = ctx.beans[0]
        data = pub_record(ctx.timestamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id, b.tags, b.keys,
                          b.store_host, b.body_length, ctx.cost_time, int(b.msg_type), b.offset_msg_id, ctx.success)
    elif t is TraceType.SubBefore:
        data = "".join(sub_before_record(ctx.timestamp, ctx.region_id, ctx.group_name, ctx.request_id, b.msg_id,
                                         b.retry_times, b.keys) for b in ctx.beans)
    elif t is TraceType.EndTransaction:
        b = ctx.beans[0]
        data = end_transaction_record(ctx.timestamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id, b.tags, b.keys,
                                      b.store_host, b.transaction_id, b.transaction_state, b.from_transaction_check)
    elif t is TraceType.SubAfter:
        data = "".join(sub_after_record(ctx.request_id, b.msg_id, ctx.cost_time, ctx.success, b.keys,
                                        int(ctx.context_code), ctx.timestamp, ctx.group_name) for b in ctx.beans)
    keys: list[str] = []
    for b in ctx.beans:
        index_keys(b.msg_id, b.keys, keys)
    return data, keys


def _text(value: str) -> str:
    return "" if value == "null" else value


def decode(data: str) -> list[TraceContext]:
    """TraceDataEncoder.decoderFromTraceDataString: every Pub, SubBefore and SubAfter record of
    a trace message's body (older and newer field counts as RocketMQ reads them)."""
    out = []
    for record in data.split(FIELD_SPLITOR):
        line = record.split(CONTENT_SPLITOR)
        kind = line[0]
        try:
            if kind == "Pub":
                b = TraceBean(topic=line[4], msg_id=line[5], tags=_text(line[6]), keys=_text(line[7]),
                              store_host=line[8], body_length=int(line[9]), msg_type=MessageType(int(line[11])))
                ctx = TraceContext(TraceType.Pub, int(line[1]), line[2], line[3], cost_time=int(line[10]), beans=[b])
                if len(line) == 13:
                    ctx.success = line[12] == "true"
                elif len(line) >= 14:
                    b.offset_msg_id = line[12]
                    ctx.success = line[13] == "true"
            elif kind == "SubBefore":
                b = TraceBean(msg_id=line[5], retry_times=int(line[6]), keys=_text(line[7]) if len(line) > 7 else "")
                ctx = TraceContext(TraceType.SubBefore, int(line[1]), line[2], line[3], request_id=line[4], beans=[b])
            elif kind == "SubAfter":
                b = TraceBean(msg_id=line[2], keys=_text(line[5]))
                ctx = TraceContext(TraceType.SubAfter, request_id=line[1], cost_time=int(line[3]),
                                   success=line[4] == "true", beans=[b])
                if len(line) >= 7:
                    ctx.context_code = int(line[6])
                if len(line) >= 9:
                    ctx.timestamp, ctx.group_name = int(line[7]), line[8]
            elif kind == "EndTransaction":
                b = TraceBean(topic=line[4], msg_id=line[5], tags=_text(line[6]), keys=_text(line[7]),
                              store_host=line[8], msg_type=MessageType(int(line[9])), transaction_id=_text(line[10]),
                              transaction_state=line[11], from_transaction_check=line[12] == "true")
                ctx = TraceContext(TraceType.EndTransaction, int(line[1]), line[2], line[3], beans=[b])
            else:  # the empty tail after the last \x02
                continue
        except (IndexError, ValueError) as e:
            log.warning("skipping a malformed %s trace record: %s", kind, e)
            continue
        out.append(ctx)
    return out


@attrs.frozen
class TraceView:
    """One trace record of one message, as queryMsgTraceById and the console show it
    (RocketMQ's TraceView): client_host is the trace message's born host."""
    msg_id: str
    type: str
    group: str
    topic: str
    tags: str
    keys: str
    timestamp: int
    cost_time: int
    status: str
    store_host: str
    client_host: str
    offset_msg_id: str
    request_id: str
    retry_times: int
    transaction_state: str = ""  # EndTransaction: COMMIT_MESSAGE / ROLLBACK_MESSAGE / UNKNOW
    from_transaction_check: bool = False
    born_time: int = 0  # when the trace message carrying the record was sent (its born timestamp)

    def to_json(self) -> dict:
        """The record under RocketMQ's TraceView names (msgType is the trace type, timeStamp the
        record's time, costTime integer ms), then rmq's further fields: what queryMsgTraceById
        --json and the console give."""
        return {"msgId": self.msg_id, "offsetMsgId": self.offset_msg_id, "tags": self.tags, "keys": self.keys,
                "storeHost": self.store_host, "clientHost": self.client_host, "costTime": self.cost_time,
                "msgType": self.type, "timeStamp": self.timestamp, "bornTime": self.born_time, "topic": self.topic,
                "groupName": self.group, "status": self.status, "requestId": self.request_id,
                "retryTimes": self.retry_times, "transactionState": self.transaction_state,
                "fromTransactionCheck": self.from_transaction_check}

    @classmethod
    def from_trace_message(cls, msg_id: str, message) -> list["TraceView"]:
        """The records about `msg_id` in one trace message (a MessageExt of the trace topic)."""
        body = message.body or b""
        views = []
        for ctx in decode(body.decode("utf-8", "replace")):
            b = ctx.beans[0]
            if b.msg_id != msg_id:
                continue
            views.append(cls(msg_id=b.msg_id, type=ctx.trace_type.value, group=ctx.group_name, topic=b.topic,
                             tags=b.tags or "", keys=b.keys or "", timestamp=ctx.timestamp, cost_time=ctx.cost_time,
                             status=(b.transaction_state if ctx.trace_type is TraceType.EndTransaction else
                                     "success" if ctx.success else "failed"), store_host=b.store_host,
                             client_host=message.born_host, offset_msg_id=b.offset_msg_id,
                             request_id=ctx.request_id, retry_times=b.retry_times,
                             transaction_state=b.transaction_state, from_transaction_check=b.from_transaction_check,
                             born_time=message.born_timestamp))
        return views


def sort_views(views: Iterable[TraceView]) -> list[TraceView]:
    """Records in the order they happened: by time, then Pub, EndTransaction, SubBefore, SubAfter."""
    order = {"Pub": 0, "EndTransaction": 1, "SubBefore": 2, "SubAfter": 3}
    return sorted(views, key=lambda v: (v.timestamp, order.get(v.type, 4)))


def message_type_of(msg) -> int:
    """SendMessageContext.msgType as sendKernelImpl sets it (its ordinal)."""
    props = msg.properties
    if props and props.get(MessageConst.TRANSACTION_PREPARED) == "true":
        return MessageType.Trans_Msg_Half.value
    if msg.delay_time_level > 0:
        return MessageType.Delay_Msg.value
    return MessageType.Normal_Msg.value


# the notes the worker writes (kind first; Pub records are written at once by the buffer)
_SUB_BEFORE, _SUB_AFTER, _END_TRANSACTION = 1, 2, 3


class TraceDispatcher:
    """RocketMQ's AsyncTraceDispatcher for one traced producer or consumer.

    The hooks (`on_send`, `on_send_batch`, `on_end_transaction`, `on_consume_before`,
    `on_consume_after`) write into a bounded buffer and return: a send's Pub record at once, the
    others as a note; the worker thread, woken when a trace message's worth is ready (else it
    polls), writes the notes' records and sends the trace messages.  `discarded` counts what a
    full buffer dropped; `sent` / `send_failed` count trace messages."""

    def __init__(self, group: str, kind: str, trace_topic: str | None = None, capacity: int = QUEUE_SIZE):
        topic = trace_topic or TopicValidator.RMQ_SYS_TRACE_TOPIC
        TopicValidator.check_topic(topic)
        if capacity <= 0:
            raise ConfigError(f"bad trace buffer capacity {capacity!r}: must be > 0")
        self.group, self.kind, self.trace_topic = group, kind, topic
        self.sent = 0
        self.send_failed = 0
        self._wake = threading.Event()
        # wall clock = monotonic + this (notes carry monotonic times; records carry epoch ms)
        self._epoch_offset = time.time() - time.monotonic()
        # the hooks' records and notes (the send hook's offered natively by the producer's PipelinedCompletion)
        self.buffer = TraceBuffer(capacity, self._wake.set, group, topic, self._epoch_offset, SendStatus.SEND_OK,
                                  message_type_of, BATCH_BYTES, KEYS_BYTES, READY_SEGMENTS)
        self._instance = None
        self._stopped = False
        self._worker: threading.Thread | None = None
        self._holding = False  # the worker holds records not yet handed to the inner producer
        self._in_flight = 0
        self._idle = threading.Condition()
        self._flushing = 0  # flush() callers waiting: the current segment is sent without its time threshold

    capacity = delegate("buffer.capacity", """How many records and notes the buffer holds outside full
        trace messages (besides up to READY_SEGMENTS of those); more are dropped (counted in `discarded`).""",
                        writable=True)
    discarded = delegate("buffer.discarded", "Records and notes a full buffer dropped.")

    @staticmethod
    def create(group: str, kind: str, enable: bool, trace_topic: str | None) -> "TraceDispatcher | None":
        """The dispatcher of a client made with enable_msg_trace / customized_trace_topic."""
        if not enable:
            if trace_topic is not None:
                raise ConfigError(f"customized_trace_topic {trace_topic!r} given without enable_msg_trace=True")
            return None
        return TraceDispatcher(group, kind, trace_topic)

    # --- the hooks: on the caller's path, a record or a tuple written and nothing else --------------
    def on_send(self, context: tuple, result) -> None:
        """A send answered: its context tuple (message, uniq, mode, queue, store host, timeout,
        begin, ...) and SendResult (the producer's PipelinedCompletion offers its own natively)."""
        self.buffer.offer_pub(context, result)

    def on_send_batch(self, msgs: list, msg_ids: list, offset_ids: str | None, region: str | None, status,
                      begin: float, store_host: str | None = None) -> None:
        """A batch answered (send_batch, auto_batch): a Pub record per message, each found by its
        own id (msg_ids, in the batch's order) and offset id (the answer's comma-joined ones).
        (RocketMQ 4.9 writes one record for the whole batch under the comma-joined ids, which no
        lookup by one message's id finds.)  store_host: where it went (default: the broker the
        first offset id names)."""
        offsets = offset_ids.split(",") if offset_ids else []
        if store_host is None:
            store_host = _store_host_of(offsets[0]) if offsets else ""
        self.buffer.offer_batch(msgs, msg_ids, offsets, region or "", store_host, begin, status is SendStatus.SEND_OK)

    def on_end_transaction(self, msg, msg_id: str, store_host: str, transaction_id: str | None, state: str,
                           from_check: bool) -> None:
        """EndTransactionTraceHookImpl: a half message committed, rolled back or left unknown
        (state: LocalTransactionState's name), by the producer or answering the broker's check."""
        self.buffer.offer((_END_TRANSACTION, time.monotonic(), msg, msg_id, store_host, transaction_id, state,
                           from_check))

    def on_consume_before(self, msgs: list) -> tuple:
        """A listener call starts: its SubBefore note; returns what on_consume_after needs."""
        token = (MessageClientIDSetter.create_uniq_id(), time.monotonic(), msgs)
        self.buffer.offer((_SUB_BEFORE,) + token)
        return token

    def on_consume_after(self, token: tuple, success: bool, code: ConsumeReturnType) -> None:
        self.buffer.offer((_SUB_AFTER,) + token + (time.monotonic(), success, int(code)))

    # --- life cycle --------------------------------------------------------------------------------
    def start(self, instance) -> None:
        self._instance = instance
        self._stopped = False
        self._worker = threading.Thread(target=self._run, name=f"rmq-trace-{self.group}", daemon=True)
        self._worker.start()

    def flush(self, timeout: float = 5.0) -> None:
        """Send what is buffered and wait (up to `timeout`) until the trace messages are answered."""
        self._wake.set()
        deadline = time.monotonic() + timeout
        with self._idle:
            self._flushing += 1
            try:
                while (len(self.buffer) or self._in_flight or self._holding) and time.monotonic() < deadline:
                    self._wake.set()
                    self._idle.wait(0.05)
            finally:
                self._flushing -= 1

    def shutdown(self) -> None:
        if self._worker is None:
            return
        self.flush()
        self._stopped = True
        self._wake.set()
        self._worker.join(10)
        self._worker = None

    # --- the worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        buf = self.buffer
        while True:
            self._wake.wait(POLLING_TIME)
            self._wake.clear()
            stopping = self._stopped
            if len(buf):
                self._holding = True  # (before anything leaves the buffer: flush() keeps waiting)
            while buf.notes:
                try:
                    self._write(buf.take_note())
                except Exception:  # noqa: BLE001 - one bad note must not stop tracing
                    log.exception("cannot encode a trace note of group %s", self.group)
            for segment in buf.take(WAIT_TIME_THRESHOLD, bool(self._flushing) or stopping):
                self._send(segment)
            self._holding = False
            with self._idle:
                self._idle.notify_all()
            if stopping:
                return

    def _write(self, note: tuple) -> None:
        """A note's records (ConsumeMessageTraceHookImpl's and EndTransactionTraceHookImpl's
        contexts) into the buffer's segment, written straight from the note's values."""
        kind = note[0]
        add = self.buffer.add
        group = self.group
        if kind == _END_TRANSACTION:
            _, at, msg, msg_id, store_host, transaction_id, state, from_check = note
            region = msg.properties.get(MessageConst.MSG_REGION) or DEFAULT_TRACE_REGION_ID
            add(end_transaction_record(int((at + self._epoch_offset) * 1000), region, group, msg.topic, msg_id,
                                       msg.tags, msg.keys, store_host, transaction_id, state, from_check),
                msg_id, msg.keys)
            return
        traced = [m for m in note[3] if m.properties.get(MessageConst.TRACE_SWITCH) != "false"]
        if not traced:
            return
        _, request_id, begin, msgs = note[:4]
        timestamp = int((begin + self._epoch_offset) * 1000)
        if kind == _SUB_BEFORE:
            region = next((r for r in (m.properties.get(MessageConst.MSG_REGION) for m in traced) if r), "")
            for m in traced:
                add(sub_before_record(timestamp, region, group, request_id, m.msg_id, m.reconsume_times, m.keys),
                    m.msg_id, m.keys)
            return
        end, success, code = note[4:]
        cost = int((end - begin) * 1000 / len(msgs))
        for m in traced:  # (RocketMQ's SubAfter keeps its SubBefore's timestamp and request id)
            add(sub_after_record(request_id, m.msg_id, cost, success, m.keys, code, timestamp, group), m.msg_id, m.keys)

    def _send(self, segment) -> None:
        msg = Message(self.trace_topic, segment.data, keys=segment.keys)
        try:
            producer = self._instance.inner_producer()
            with self._idle:
                self._in_flight += 1
            producer.send_async(msg, self._sent)
        except Exception as e:  # noqa: BLE001 - tracing never fails the traced client
            self.send_failed += 1
            log.warning("sending trace data of group %s to %s failed: %s", self.group, self.trace_topic, e)
            with self._idle:
                self._in_flight = max(0, self._in_flight - 1)
                self._idle.notify_all()

    def _sent(self, result, error) -> None:
        if error is None:
            self.sent += 1
        else:
            self.send_failed += 1
            log.warning("sending trace data of group %s to %s failed: %s", self.group, self.trace_topic, error)
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()


def _store_host_of(offset_msg_id: str) -> str:
    try:
        host, port, _ = decode_offset_msg_id(offset_msg_id)
    except IllegalArgumentError:
        return ""
    return f"{host}:{port}"
