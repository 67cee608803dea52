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

import collections
import enum
import logging
import threading
import time
from typing import Iterable

import attrs

from rmq_core.errors import ConfigError
from rmq_core.message import Message, MessageClientIDSetter, MessageConst, SendStatus, TopicValidator

log = logging.getLogger("rmq.client.trace")

CONTENT_SPLITOR = "\x01"
FIELD_SPLITOR = "\x02"
KEY_SEPARATOR = " "
# AsyncTraceDispatcher's sizes: the context buffer, a trace message's most, a batch's wait
QUEUE_SIZE = 1024
MAX_MSG_SIZE = 128_000
BATCH_BYTES = MAX_MSG_SIZE - 10_000
POLLING_TIME = 0.1
WAIT_TIME_THRESHOLD = 0.5


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
    """A value as Java's StringBuilder.append writes it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def encode(ctx: TraceContext) -> tuple[str, list[str]]:
    """TraceDataEncoder.encoderFromContextBean: (the record text, the keys that index it - each
    bean's msgId and its message keys)."""
    parts = []
    t = ctx.trace_type
    if t is TraceType.Pub:
        b = ctx.beans[0]
        fields = (t.value, ctx.timestamp, ctx.region_id, ctx.group_name, b.topic, b.msg_id, b.tags, b.keys,
                  b.store_host, b.body_length, ctx.cost_time, int(b.msg_type), b.offset_msg_id, ctx.success)
        parts.append(CONTENT_SPLITOR.join(map(_j, fields)) + FIELD_SPLITOR)
    elif t is TraceType.SubBefore:
        for b in ctx.beans:
            fields = (t.value, ctx.timestamp, ctx.region_id, ctx.group_name, ctx.request_id, b.msg_id, b.retry_times,
                      b.keys)
            parts.append(CONTENT_SPLITOR.join(map(_j, fields)) + FIELD_SPLITOR)
    elif t is TraceType.SubAfter:
        for b in ctx.beans:
            fields = (t.value, ctx.request_id, b.msg_id, ctx.cost_time, ctx.success, b.keys, ctx.context_code,
                      ctx.timestamp, ctx.group_name)
            parts.append(CONTENT_SPLITOR.join(map(_j, fields)) + FIELD_SPLITOR)
    else:
        raise ValueError(f"cannot encode a {t.value} trace context")
    keys = []
    for b in ctx.beans:
        keys.append(b.msg_id)
        if b.keys:
            keys.extend(k for k in b.keys.split(KEY_SEPARATOR) if k)
    return "".join(parts), keys


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
            else:  # EndTransaction and the empty tail after the last \x02
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
                             status="success" if ctx.success else "failed", store_host=b.store_host,
                             client_host=message.born_host, offset_msg_id=b.offset_msg_id,
                             request_id=ctx.request_id, retry_times=b.retry_times))
        return views


def sort_views(views: Iterable[TraceView]) -> list[TraceView]:
    """Records in the order they happened: by time, then Pub before SubBefore before SubAfter."""
    order = {"Pub": 0, "SubBefore": 1, "SubAfter": 2}
    return sorted(views, key=lambda v: (v.timestamp, order.get(v.type, 3)))


def message_type_of(msg) -> MessageType:
    """SendMessageContext.msgType as sendKernelImpl sets it."""
    props = msg.properties
    if props and props.get(MessageConst.TRANSACTION_PREPARED) == "true":
        return MessageType.Trans_Msg_Half
    if msg.delay_time_level > 0:
        return MessageType.Delay_Msg
    return MessageType.Normal_Msg


# the notes the hooks append (kind first); turned into TraceContexts by the worker
_PUB, _SUB_BEFORE, _SUB_AFTER = 0, 1, 2


class TraceDispatcher:
    """RocketMQ's AsyncTraceDispatcher for one traced producer or consumer.

    The hooks (`on_send`, `on_consume_before`, `on_consume_after`) append a note to a bounded
    buffer and return; the worker thread encodes and sends.  `discarded` counts notes a full
    buffer dropped; `sent` / `send_failed` count trace messages."""

    def __init__(self, group: str, kind: str, trace_topic: str | None = None, capacity: int = QUEUE_SIZE):
        topic = trace_topic or TopicValidator.RMQ_SYS_TRACE_TOPIC
        TopicValidator.check_topic(topic)
        if capacity <= 0:
            raise ConfigError(f"bad trace buffer capacity {capacity!r}: must be > 0")
        self.group, self.kind, self.trace_topic, self.capacity = group, kind, topic, capacity
        self.discarded = 0
        self.sent = 0
        self.send_failed = 0
        self._notes: collections.deque = collections.deque()
        self._instance = None
        self._wake = threading.Event()
        self._stopped = False
        self._worker: threading.Thread | None = None
        self._holding = False  # the worker holds an unsent batch
        self._in_flight = 0
        self._idle = threading.Condition()
        self._flushing = 0  # flush() callers waiting: a batch is sent without its time threshold
        # wall clock = monotonic + this (notes carry monotonic times; records carry epoch ms)
        self._epoch_offset = time.time() - time.monotonic()

    @staticmethod
    def create(group: str, kind: str, enable: bool, trace_topic: str | None) -> "TraceDispatcher | None":
        """The dispatcher of a client made with enable_msg_trace / customized_trace_topic."""
        if not enable:
            if trace_topic is not None:
                raise ConfigError(f"customized_trace_topic {trace_topic!r} given without enable_msg_trace=True")
            return None
        return TraceDispatcher(group, kind, trace_topic)

    # --- the hooks: on the caller's path, a tuple appended and nothing else -----------------------
    def on_send(self, context: tuple, result) -> None:
        """A send answered (PipelinedCompletion's context tuple (message, uniq, mode, queue,
        address, timeout, begin, future), or SendAttempts.trace_context()) with its SendResult."""
        notes = self._notes
        if len(notes) >= self.capacity:
            self.discarded += 1
            return
        notes.append((_PUB, context[0], result, context[4], context[6], time.monotonic()))

    def on_consume_before(self, msgs: list) -> tuple | None:
        """A listener call starts: its SubBefore note; returns what on_consume_after needs."""
        notes = self._notes
        token = (MessageClientIDSetter.create_uniq_id(), time.monotonic(), msgs)
        if len(notes) >= self.capacity:
            self.discarded += 1
        else:
            notes.append((_SUB_BEFORE,) + token)
        return token

    def on_consume_after(self, token: tuple, success: bool, code: ConsumeReturnType) -> None:
        notes = self._notes
        if len(notes) >= self.capacity:
            self.discarded += 1
            return
        notes.append((_SUB_AFTER,) + token + (time.monotonic(), success, int(code)))

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
                while (self._notes or self._in_flight or self._holding) and time.monotonic() < deadline:
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
        batch: list[tuple[str, list[str]]] = []
        size = 0
        first = 0.0
        while True:
            self._wake.wait(POLLING_TIME)
            self._wake.clear()
            stopping = self._stopped
            notes = self._notes
            if notes:
                self._holding = True  # (before a note leaves the buffer: flush() keeps waiting)
            while notes:
                try:
                    ctx = self._context_of(notes.popleft())
                    if ctx is None:
                        continue
                    data, keys = encode(ctx)
                except Exception:  # noqa: BLE001 - one bad note must not stop tracing
                    log.exception("cannot encode a trace note of group %s", self.group)
                    continue
                if not batch:
                    first = time.monotonic()
                batch.append((data, keys))
                size += len(data)
                if size >= BATCH_BYTES:
                    self._send(batch)
                    batch, size = [], 0
            if batch and (time.monotonic() - first >= WAIT_TIME_THRESHOLD or self._flushing or self._stopped):
                self._send(batch)
                batch, size = [], 0
            self._holding = bool(batch)
            with self._idle:
                self._idle.notify_all()
            if stopping:
                return

    def _context_of(self, note: tuple) -> TraceContext | None:
        kind = note[0]
        to_ms = self._epoch_offset
        if kind == _PUB:
            _, msg, result, addr, begin, end = note
            if msg.topic.startswith(self.trace_topic):
                return None
            cost = int((end - begin) * 1000)
            bean = TraceBean(topic=msg.topic, msg_id=result.msg_id, offset_msg_id=result.offset_msg_id,
                             tags=msg.tags, keys=msg.keys, store_host=addr, body_length=len(msg.body),
                             msg_type=message_type_of(msg))
            return TraceContext(TraceType.Pub, int((begin + to_ms) * 1000), result.region_id or "", self.group,
                                cost_time=cost, success=result.status is SendStatus.SEND_OK, beans=[bean])
        if kind == _SUB_BEFORE:
            _, request_id, begin, msgs = note
            beans, region = self._consumed_beans(msgs)
            if not beans:
                return None
            return TraceContext(TraceType.SubBefore, int((begin + to_ms) * 1000), region, self.group,
                                request_id=request_id, beans=beans)
        _, request_id, begin, msgs, end, success, code = note
        beans, region = self._consumed_beans(msgs)
        if not beans:
            return None
        cost = int((end - begin) * 1000 / len(msgs))
        # (RocketMQ's SubAfter keeps the SubBefore's timestamp)
        return TraceContext(TraceType.SubAfter, int((begin + to_ms) * 1000), region, self.group, cost_time=cost,
                            success=success, request_id=request_id, context_code=code, beans=beans)

    @staticmethod
    def _consumed_beans(msgs) -> tuple[list, str]:
        beans, region = [], ""
        for m in msgs:
            props = m.properties
            if props.get(MessageConst.TRACE_SWITCH) == "false":
                continue
            region = props.get(MessageConst.MSG_REGION, region) or region
            beans.append(TraceBean(topic=m.topic, msg_id=m.msg_id, tags=m.tags, keys=m.keys,
                                   body_length=m.store_size, retry_times=m.reconsume_times))
        return beans, region

    def _send(self, batch: list[tuple[str, list[str]]]) -> None:
        keys: dict[str, None] = {}
        for _, ks in batch:
            for k in ks:
                keys[k] = None
        body = "".join(data for data, _ in batch).encode("utf-8")
        msg = Message(self.trace_topic, body, keys=list(keys))
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
