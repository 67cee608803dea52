"""PopService: the broker's one owner of pop consumption (see the package docstring and docs/pop.md).

Everything that decides (what a pop hands out, whether an ack or a change of invisible time is
valid, what the revive re-puts) runs synchronously on the broker's event loop, puts included
(`store.put_nowait`): a decision and the record that makes it durable are never split by an
await, so a concurrent ack and revive of one message cannot both win.  Only the wait for a put's
durability (SYNC_FLUSH, a slave's ack) is awaited, before the answer.
"""
from __future__ import annotations

import asyncio
import collections
import heapq
import json
import logging
import random
import types
import zlib

import attrs

from rmq_core.broker.topic_config_manager import TopicConfig
from rmq_core.broker.consumer_filter_manager import PropertyFilterDisabledError
from rmq_core.broker.pop.receipt import (
    ACK_TAG, CK_TAG, POP_ORDER_REVIVE_QUEUE, REVIVE_GROUP, REVIVE_QUEUE_NUM, encode_ack, encode_ck, is_pop_retry_topic,
    pop_retry_topic, revive_topic,
)
from rmq_core.broker.processors.send import send_back_target
from rmq_core.codec import decode_messages, properties_to_bytes
from rmq_core.common.clock import now_ms
from rmq_core.common.pop_extra_info import NORMAL_TOPIC, RETRY_TOPIC, ExtraInfo, build_extra_info, extra_info_prefix
from rmq_core.common.subscription import SubscriptionData
from rmq_core.errors import FilterExpressionError, IllegalArgumentError, PluginNotFoundError
from rmq_core.loops import cancel_and_wait
from rmq_core.message import MessageConst, MixAll, PermName, host_port
from rmq_core.remoting.codes import ResponseCode
from rmq_core.store import GetMessageStatus, MessageExtBrokerInner, PutMessageStatus

log = logging.getLogger("rmq.broker.pop")

MIN_INVISIBLE_MS = 1_000  # the broker's bound; RocketMQ 5's proxy asks 10 s of its gRPC clients
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_POP_NUMS = 1024
_MAX_POP_BYTES = 4 * 1024 * 1024
_RETRY_EVERY = 5  # every 5th pop looks at the retry topic first (RocketMQ: popFromRetryProbability 20%)
_RECENT_DONE_MAX = 100_000
_ATTEMPTS_MAX = 10_000  # receives with an attempt id remembered (their handles)
_NO_ATTEMPTS = types.MappingProxyType({})
# a checkpoint's / an ack's record properties (its tag), encoded once
_RECORD_PROPERTIES = {tag: properties_to_bytes({MessageConst.TAGS: tag}) for tag in (CK_TAG, ACK_TAG)}


class PopError(Exception):
    """A refused pop / ack / change: `kind` for the gRPC front end, `code` for a remoting answer."""

    def __init__(self, kind: str, message: str, code: int = ResponseCode.SYSTEM_ERROR):
        super().__init__(message)
        self.kind, self.code = kind, int(code)


# kinds
BAD_REQUEST = "BAD_REQUEST"
INVALID_RECEIPT_HANDLE = "INVALID_RECEIPT_HANDLE"
ILLEGAL_INVISIBLE_TIME = "ILLEGAL_INVISIBLE_TIME"
GROUP_NOT_FOUND = "GROUP_NOT_FOUND"
TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
FORBIDDEN = "FORBIDDEN"
NOT_MASTER = "NOT_MASTER"
ILLEGAL_FILTER = "ILLEGAL_FILTER"
INTERNAL = "INTERNAL"


@attrs.define(slots=True)
class PoppedMessage:
    record: bytes  # the stored record as it lies in the commit log (a pull answer's body is these)
    topic: str  # the topic the consumer subscribed to (a retry message reports its original topic)
    real_topic: str  # where it is stored: `topic` or the group's pop retry topic
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    receipt_handle: str
    delivery_attempt: int
    ck_offset: int  # the start offset of the checkpoint it was handed out under
    msg: object = None  # the record decoded without its body (MessageExt): properties, keys, tags...


class PoppedBatch:
    """What one checkpoint handed out of one queue: the records as stored, in one buffer (what a
    pull answer's body is), and their queue offsets.  The remoting answer sends the buffer as it
    is; per-message objects (PoppedMessage) are made only when asked for (`messages()`)."""

    __slots__ = ("topic", "real_topic", "queue_id", "ck_offset", "offsets", "buffer", "attempts", "_prefix")

    def __init__(self, topic, real_topic, queue_id, ck_offset, offsets, buffer, attempts, handle_prefix):
        self.topic = topic  # the topic the consumer subscribed to
        self.real_topic = real_topic  # where the records are stored: `topic` or the group's pop retry topic
        self.queue_id, self.ck_offset, self.offsets, self.buffer = queue_id, ck_offset, offsets, buffer
        self.attempts = attempts  # each offset's delivery attempt, or None: its record's reconsume times + 1
        self._prefix = handle_prefix  # the str, or extra_info_prefix's arguments (made when first asked for)

    @property
    def handle_prefix(self) -> str:
        """A message's receipt handle is this + str(its offset) (the remoting answer sends the
        checkpoint's fields in its header instead: made only for who asks)."""
        prefix = self._prefix
        if type(prefix) is tuple:
            prefix = self._prefix = extra_info_prefix(*prefix)
        return prefix

    def messages(self) -> list:
        records = _split(self.buffer)
        msgs = decode_messages(self.buffer, decompress=False, read_body=False)
        attempts = self.attempts or [m.reconsume_times + 1 for m in msgs]
        prefix = self.handle_prefix
        return [PoppedMessage(rec, self.topic, self.real_topic, self.queue_id, m.queue_offset, m.commit_log_offset,
                              prefix + str(m.queue_offset), attempt, self.ck_offset, m)
                for m, rec, attempt in zip(msgs, records, attempts)]


class PopResult:
    """A pop's answer: the batches it handed out (one per checkpoint); `messages` makes them into
    PoppedMessages once, when asked for."""

    __slots__ = ("status", "batches", "pop_time", "invisible_ms", "revive_qid", "rest_num", "polled", "_messages")

    def __init__(self, status, batches, pop_time, invisible_ms, revive_qid, rest_num=0, polled=False):
        self.status = status  # "FOUND" or "POLLING_NOT_FOUND"
        self.batches = batches
        self.pop_time, self.invisible_ms, self.revive_qid, self.rest_num = pop_time, invisible_ms, revive_qid, rest_num
        self.polled = polled  # the pop waited (long polling) before its empty answer
        self._messages = None

    @property
    def messages(self) -> list:
        if self._messages is None:
            self._messages = [m for b in self.batches for m in b.messages()]
        return self._messages

    @property
    def message_count(self) -> int:
        return sum(len(b.offsets) for b in self.batches)


@attrs.define(slots=True)
class AckOutcome:
    status: str  # "OK", or "ALREADY_ACKED" for a repeated ack of the same handle
    topic: str
    queue_id: int
    offset: int


class _Ck:
    """An open checkpoint: offsets of one (group, real topic, queue) handed out at pop_time."""

    __slots__ = ("group", "topic", "origin", "queue_id", "start", "offsets", "pending", "acked", "pop_time",
                 "invisible_ms", "rqid", "rec_offset", "fifo", "attempts", "key")

    def __init__(self, group, topic, origin, queue_id, start, offsets, pop_time, invisible_ms, rqid, fifo, attempts):
        self.group, self.topic, self.origin, self.queue_id = group, topic, origin, queue_id
        self.start, self.offsets = start, list(offsets)
        self.pending, self.acked = set(offsets), set()
        self.pop_time, self.invisible_ms, self.rqid = pop_time, invisible_ms, rqid
        self.rec_offset = -1
        self.fifo = fifo
        self.attempts = dict(attempts) if attempts else _NO_ATTEMPTS  # (read only: a normal checkpoint has none)
        self.key = (group, topic, queue_id, start, pop_time)  # its name (the _cks key)

    @property
    def revive_time(self) -> int:
        return self.pop_time + self.invisible_ms


class PopService:
    def __init__(self, ctrl):
        self.ctrl = ctrl
        self.revive_topic = revive_topic(ctrl.broker_config.broker_cluster_name)
        self._cks: dict = {}  # key -> _Ck
        self._record_inner: dict = {}  # tag -> the MessageExtBrokerInner its records are put as
        self._fifo: dict = {}  # (group, real topic, queue id) -> [open FIFO _Ck]
        self._heap: list = []  # (revive time, seq, key) of normal checkpoints
        self._seq = 0
        self._inflight = collections.Counter()  # (group, subscribed topic) -> messages in flight
        self._inflight_q = collections.Counter()  # (group, real topic, queue id) -> messages in flight
        self._recent_done = collections.OrderedDict()  # key -> offsets acked, of closed checkpoints
        self._attempts = collections.OrderedDict()  # (group, topic, attempt id) -> (PopResult, its messages)
        self._last_pop_time = 0
        self._pops = 0
        self._cursor = collections.Counter()  # (group, topic) -> next queue to start at
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self.running = False
        # metrics: (topic, group) -> count
        self.received = collections.Counter()
        self.acked = collections.Counter()
        self.revived = collections.Counter()

    # --- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """A master's start (or a slave becoming master): rebuild the open checkpoints from the
        revive log and start reviving."""
        if self.running:
            return
        self._reset()
        tm = self.ctrl.topic_manager
        if tm.select(self.revive_topic) is None:  # (registered by the broker's next full registration)
            tm.create_or_update(TopicConfig(topic_name=self.revive_topic, read_queue_nums=REVIVE_QUEUE_NUM,
                                            write_queue_nums=REVIVE_QUEUE_NUM,
                                            perm=PermName.PERM_READ | PermName.PERM_WRITE), notify=False)
        self.recover()
        self._wake = asyncio.Event()
        self.running = True
        self._task = asyncio.create_task(self._revive_loop(), name="pop-revive")

    async def stop(self) -> None:
        self.running = False
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        if self.ctrl.store is not None and not self.ctrl.is_slave:
            self._commit_revive_offsets()

    def _reset(self) -> None:
        self._cks.clear()
        self._fifo.clear()
        self._heap.clear()
        self._inflight.clear()
        self._inflight_q.clear()
        self._recent_done.clear()
        self._attempts.clear()

    # --- checks ---------------------------------------------------------------------------------------
    def _check_writable(self) -> None:
        ctrl = self.ctrl
        bc = ctrl.broker_config
        if ctrl.is_slave or not self.running:
            raise PopError(NOT_MASTER, ctrl.slave_refusal("pop consumption (it writes checkpoints)") if ctrl.is_slave
                           else f"broker[{bc.broker_name}] is not serving pop consumption (starting or stopping)",
                           ResponseCode.SERVICE_NOT_AVAILABLE)
        if ctrl.write_fence.lapsed():
            raise PopError(NOT_MASTER, ctrl.write_fence.remark, ResponseCode.SERVICE_NOT_AVAILABLE)

    @staticmethod
    def _check_invisible(invisible_ms) -> int:
        if isinstance(invisible_ms, bool) or not isinstance(invisible_ms, int) or \
                not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise PopError(ILLEGAL_INVISIBLE_TIME,
                           f"invisible time {invisible_ms!r} ms is out of range "
                           f"[{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}] ms",
                           ResponseCode.MESSAGE_ILLEGAL)
        return invisible_ms

    def _group(self, group: str):
        if not group or not isinstance(group, str):
            raise PopError(BAD_REQUEST, f"consumer group {group!r} is empty", ResponseCode.MESSAGE_ILLEGAL)
        sg = self.ctrl.subscription_manager.find_or_create(group)
        if sg is None:
            raise PopError(GROUP_NOT_FOUND, f"subscription group [{group}] does not exist",
                           ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)
        if not sg.consume_enable:
            raise PopError(FORBIDDEN, f"subscription group [{group}] may not consume (consumeEnable=false)",
                           ResponseCode.NO_PERMISSION)
        return sg

    def _topic(self, topic: str):
        tc = self.ctrl.topic_manager.select(topic) if topic else None
        if tc is None:
            raise PopError(TOPIC_NOT_FOUND, f"topic[{topic}] not exist, apply first please!",
                           ResponseCode.TOPIC_NOT_EXIST)
        if not PermName.is_readable(tc.perm) or not PermName.is_readable(self.ctrl.broker_config.broker_permission):
            raise PopError(FORBIDDEN, f"the topic[{topic}] pulling message is forbidden", ResponseCode.NO_PERMISSION)
        return tc

    def _next_pop_time(self) -> int:
        # strictly increasing: a checkpoint is named by (group, topic, queue, start, pop time)
        t = max(now_ms(), self._last_pop_time + 1)
        self._last_pop_time = t
        return t

    # --- records --------------------------------------------------------------------------------------
    def _put_record(self, rqid: int, tag: str, body: bytes):
        """Append a checkpoint / ack record to revive queue `rqid` now; returns the put's result
        and what to wait on for durability (None)."""
        # (one message per tag, its queue and body set for each put: the store reads it during
        # put_nowait and keeps nothing of it; born time 0 is the store's now)
        inner = self._record_inner.get(tag)
        if inner is None:
            bc = self.ctrl.broker_config
            inner = self._record_inner[tag] = MessageExtBrokerInner(
                topic=self.revive_topic, queue_id=0, body=b"", properties_bytes=_RECORD_PROPERTIES[tag],
                born_host=(bc.broker_ip1, bc.listen_port))
        inner.queue_id, inner.body = rqid, body
        result, fut = self.ctrl.store.put_nowait(inner)
        if result.status is not PutMessageStatus.PUT_OK:
            raise PopError(INTERNAL, f"storing a pop {tag} record failed: {result.error or result.status.name}",
                           ResponseCode.SYSTEM_ERROR)
        return result, fut

    async def _durable(self, waits) -> None:
        store = self.ctrl.store
        for result, fut in waits:
            if fut is None:
                continue
            answer = await store.await_durable_async(result, fut)
            if answer.status is not PutMessageStatus.PUT_OK:
                raise PopError(INTERNAL, f"a pop record was written but not made durable: {answer.status.name}",
                               ResponseCode.FLUSH_DISK_TIMEOUT)

    def _register(self, ck: _Ck) -> None:
        if not ck.pending:
            return
        self._cks[ck.key] = ck
        self._inflight[(ck.group, ck.origin)] += len(ck.pending)
        self._inflight_q[(ck.group, ck.topic, ck.queue_id)] += len(ck.pending)
        if ck.fifo:
            self._fifo.setdefault((ck.group, ck.topic, ck.queue_id), []).append(ck)
        else:
            self._seq += 1
            heapq.heappush(self._heap, (ck.revive_time, self._seq, ck.key))
            if self._heap[0][2] == ck.key and self._wake is not None:
                self._wake.set()

    def _resolve(self, ck: _Ck, offsets, acked: bool) -> None:
        """Offsets of ck are done (acked, revived or superseded); closes ck when none is left."""
        hit = ck.pending.intersection(offsets)
        n = len(hit)
        if n:
            ck.pending -= hit
            if acked:
                ck.acked |= hit
            _count_down(self._inflight, (ck.group, ck.origin), n)
            _count_down(self._inflight_q, (ck.group, ck.topic, ck.queue_id), n)
        if not ck.pending and self._cks.get(ck.key) is ck:
            del self._cks[ck.key]
            if ck.fifo:
                lst = self._fifo.get((ck.group, ck.topic, ck.queue_id))
                if lst is not None:
                    lst[:] = [c for c in lst if c is not ck]
                    if not lst:
                        del self._fifo[(ck.group, ck.topic, ck.queue_id)]
            if ck.acked:
                acked = ck.acked
                first, n = ck.offsets[0], len(ck.offsets)
                # (the usual: a run of offsets, all acked: kept as a range, not a set of them)
                self._recent_done[ck.key] = range(first, first + n) if len(acked) == n and \
                    ck.offsets[-1] - first == n - 1 else frozenset(acked)
                if len(self._recent_done) > _RECENT_DONE_MAX:
                    self._recent_done.popitem(last=False)

    def _new_ck(self, group, topic, origin, queue_id, start, offsets, pop_time, invisible_ms, rqid, fifo,
                attempts=None, end_offset=None):
        """Write a checkpoint record and register it: (ck, put result, durability future)."""
        ck = _Ck(group, topic, origin, queue_id, start, offsets, pop_time, invisible_ms, rqid, fifo, attempts)
        body = encode_ck(group=group, topic=topic, queue_id=queue_id, start_offset=start, offsets=offsets,
                         pop_time=pop_time, invisible_ms=invisible_ms, broker_name=self.ctrl.broker_config.broker_name,
                         fifo=fifo, attempts=[ck.attempts.get(o, 1) for o in offsets] if fifo else None,
                         end_offset=end_offset)
        result, fut = self._put_record(rqid, CK_TAG, body)
        ck.rec_offset = result.append_result.logics_offset
        if fifo:
            self._supersede(ck)
        self._register(ck)
        return ck, (result, fut)

    def _supersede(self, ck: _Ck) -> None:
        """A FIFO checkpoint takes its offsets over from older ones of the same queue (a message
        handed out again, or its invisible time changed); the newer by pop time wins."""
        for old in list(self._fifo.get((ck.group, ck.topic, ck.queue_id), ())):
            common = [o for o in ck.offsets if o in old.pending] if old is not ck else ()
            if not common:
                continue
            if old.pop_time < ck.pop_time:
                self._resolve(old, common, acked=False)
            else:
                ck.pending.difference_update(common)

    @staticmethod
    def _fifo_rqid(group: str, topic: str, queue_id: int) -> int:
        """A FIFO queue's checkpoints all go to one revive queue: replayed in the order written."""
        return zlib.crc32(f"{group}@{topic}@{queue_id}".encode()) % REVIVE_QUEUE_NUM

    def _ack_record(self, ck: _Ck, offsets, revived=False):
        body = encode_ack(group=ck.group, topic=ck.topic, queue_id=ck.queue_id, start_offset=ck.start,
                          pop_time=ck.pop_time, offsets=offsets, broker_name=self.ctrl.broker_config.broker_name,
                          revived=revived)
        return self._put_record(ck.rqid, ACK_TAG, body)

    # --- pop ------------------------------------------------------------------------------------------
    async def pop(self, *, group: str, topic: str, max_nums: int = 32, invisible_ms: int = 30_000,
                  sub: SubscriptionData | None = None, poll_ms: int = 0, client_id: str = "",
                  fifo: bool | None = None, attempt_id: str | None = None, queue_id: int = -1,
                  init_mode: str = "MIN", alive=None) -> PopResult:
        """Hand out up to max_nums messages of `topic` (and of the group's pop retry topic),
        invisible for invisible_ms; wait up to poll_ms for one when there is none.  init_mode:
        where a group without a pop offset in a queue starts, "MIN" (the queue's first message)
        or "MAX" (its end).  alive: a callable telling whether the asker is still there; a long
        poll whose asker left hands nothing out when it wakes (its messages would be invisible
        for nothing)."""
        begun = self.begin_pop(group=group, topic=topic, max_nums=max_nums, invisible_ms=invisible_ms, sub=sub,
                               poll_ms=poll_ms, client_id=client_id, fifo=fifo, attempt_id=attempt_id,
                               queue_id=queue_id, init_mode=init_mode, alive=alive)
        return begun if type(begun) is PopResult else await begun

    def begin_pop(self, *, group: str, topic: str, max_nums: int = 32, invisible_ms: int = 30_000,
                  sub: SubscriptionData | None = None, poll_ms: int = 0, client_id: str = "",
                  fifo: bool | None = None, attempt_id: str | None = None, queue_id: int = -1,
                  init_mode: str = "MIN", alive=None):
        """pop() up to where it would wait: its PopResult when it has its answer now (messages
        whose checkpoint needs no durability wait, or none and no poll), else an awaitable of it
        (a front end answers without a coroutine of its own in the usual case)."""
        self._check_writable()
        if isinstance(max_nums, bool) or not isinstance(max_nums, int) or not 1 <= max_nums <= MAX_POP_NUMS:
            raise PopError(BAD_REQUEST, f"max messages {max_nums!r} is out of range [1, {MAX_POP_NUMS}]",
                           ResponseCode.MESSAGE_ILLEGAL)
        self._check_invisible(invisible_ms)
        if isinstance(poll_ms, bool) or not isinstance(poll_ms, int) or poll_ms < 0:
            raise PopError(BAD_REQUEST, f"poll time {poll_ms!r} ms must be an int >= 0", ResponseCode.MESSAGE_ILLEGAL)
        if init_mode not in ("MIN", "MAX"):
            raise PopError(BAD_REQUEST, f"init mode {init_mode!r} is not MIN or MAX", ResponseCode.MESSAGE_ILLEGAL)
        sg = self._group(group)
        tc = self._topic(topic)
        if MixAll.is_retry_topic(topic) or MixAll.is_dlq_topic(topic):
            raise PopError(BAD_REQUEST, f"topic[{topic}] is a retry / dead-letter topic; pop its original topic",
                           ResponseCode.MESSAGE_ILLEGAL)
        if not isinstance(queue_id, int) or queue_id < -1 or queue_id >= tc.read_queue_nums:
            raise PopError(BAD_REQUEST, f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                           f"topicConfig.readQueueNums:[{tc.read_queue_nums}]", ResponseCode.MESSAGE_ILLEGAL)
        if sub is None:
            sub = SubscriptionData.build(topic, "*")
        try:
            mf = self.ctrl.build_message_filter(group, sub)
        except (FilterExpressionError, PluginNotFoundError) as e:
            raise PopError(ILLEGAL_FILTER, str(e), ResponseCode.SUBSCRIPTION_PARSE_FAILED) from None
        except PropertyFilterDisabledError as e:
            raise PopError(ILLEGAL_FILTER, str(e), ResponseCode.NO_PERMISSION) from None
        fifo = bool(fifo) or bool(getattr(sg, "consume_message_orderly", False))
        akey = (group, topic, attempt_id) if attempt_id else None
        if akey is not None:
            again = self._same_attempt(akey)
            if again is not None:
                return again  # a client retrying the same receive gets the same messages
        args = (group, topic, tc, sg, mf, max_nums, invisible_ms, fifo, queue_id, init_mode)
        result, waits, holds, wake_at = self._pop_once(*args)
        if result.batches:
            if any(fut is not None for _, fut in waits):
                return self._handed_out_when_durable(result, waits, group, topic, akey)
            return self._handed_out(result, group, topic, akey)
        if poll_ms <= 0:
            return result
        return self._long_poll(args, akey, alive, asyncio.get_running_loop().time() + poll_ms / 1000, holds,
                               wake_at, result)

    async def _long_poll(self, args, akey, alive, deadline, holds, wake_at, result) -> PopResult:
        """A pop that found nothing, held until an arrival (then it pops again) or its deadline."""
        group, mf, invisible_ms = args[0], args[4], args[6]
        loop = asyncio.get_running_loop()
        polled = False
        while True:
            timeout = deadline - loop.time()
            if timeout <= 0:
                result.polled = polled
                return result
            if wake_at is not None:  # a FIFO queue's in-flight messages become visible again then
                timeout = min(timeout, max(0.0, (wake_at - now_ms()) / 1000) + 0.005)
            polled = True
            woken = await self._hold(group, holds, mf, timeout)
            self._check_writable()
            if alive is not None and not alive():
                self._pass_on(woken)
                return PopResult("POLLING_NOT_FOUND", [], now_ms(), invisible_ms, 0, 0, True)
            result, waits, holds, wake_at = self._pop_once(*args)
            if result.batches:
                return await self._handed_out_when_durable(result, waits, group, args[1], akey)

    async def _handed_out_when_durable(self, result: PopResult, waits, group, topic, akey) -> PopResult:
        # (a failed wait raises: the checkpoints stay, the messages come back after their invisible time)
        await self._durable(waits)
        return self._handed_out(result, group, topic, akey)

    def _handed_out(self, result: PopResult, group, topic, akey) -> PopResult:
        """A pop's messages go out: counted, and remembered under their attempt id."""
        b = result.batches
        n, size = (len(b[0].offsets), len(b[0].buffer)) if len(b) == 1 else \
            (result.message_count, sum(len(x.buffer) for x in b))
        self.received[(topic, group)] += n
        self.ctrl.stats.inc_get(group, topic, n, size)
        if akey is not None:
            self._remember_attempt(akey, result)
        return result

    def _remember_attempt(self, akey, result: PopResult) -> None:
        """What a receive with an attempt id got: its batches without their records (read again on a retry)."""
        now = now_ms()
        while self._attempts:  # (oldest first: drop the ones no retry can use any more)
            first = next(iter(self._attempts.values()))
            if first[0].pop_time + first[0].invisible_ms > now and len(self._attempts) < _ATTEMPTS_MAX:
                break
            self._attempts.popitem(last=False)
        shell = PopResult(result.status, [], result.pop_time, result.invisible_ms, result.revive_qid, result.rest_num)
        self._attempts[akey] = (shell, [(b.topic, b.real_topic, b.queue_id, b.ck_offset, list(b.offsets), b.attempts,
                                         b.handle_prefix) for b in result.batches])

    def _same_attempt(self, akey) -> PopResult | None:
        """The messages a receive with this attempt id got, while all of them are still in flight under it."""
        entry = self._attempts.get(akey)
        if entry is None:
            return None
        shell, items = entry
        group = akey[0]
        batches = []
        for origin, real, q, ck_offset, offsets, attempts, prefix in items:
            records = []
            for off in offsets:
                ck = self._find_ck(group, real, q, ck_offset, shell.pop_time, shell.revive_qid, off)
                if ck is None or off not in ck.pending or ck.revive_time <= now_ms():
                    return None
                found = self._read_one(real, q, off, ck.pop_time, read_body=False)
                if found is None:
                    return None
                records.append(found[1])
            batches.append(PoppedBatch(origin, real, q, ck_offset, offsets, b"".join(records), attempts, prefix))
        return PopResult(shell.status, batches, shell.pop_time, shell.invisible_ms, shell.revive_qid, shell.rest_num)

    async def _hold(self, group: str, holds, mf, timeout: float) -> list:
        """Long polling on the broker's PullRequestHoldService, as one of `group`'s held pops: woken
        by an arrival in any of the queues (or a FIFO queue's ack), or by the timeout.  The queues
        whose arrival woke it."""
        hold = self.ctrl.pull_hold_service
        futs = [(t, q, hold.hold(t, q, off, mf, group)) for t, q, off in holds]
        try:
            if futs:
                await asyncio.wait([f for _, _, f in futs], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(timeout)
        finally:
            for t, q, f in futs:
                hold.release(t, q, f)
        return [(t, q) for t, q, f in futs if f.done() and not f.cancelled() and f.result()]

    def _pass_on(self, woken) -> None:
        """A woken pop whose caller is gone takes nothing: the wake goes to the group's next held pop
        (an arrival wakes only as many as it can feed)."""
        store, hold = self.ctrl.store, self.ctrl.pull_hold_service
        for t, q in woken:
            hold.notify_message_arriving(t, q, store.get_max_offset_in_queue(t, q))

    def _pop_once(self, group, topic, tc, sg, mf, max_nums, invisible_ms, fifo, queue_id, init_mode):
        """One synchronous pass over the queues: (PopResult, puts to wait for, queues to hold on,
        when a blocked FIFO queue opens again or None)."""
        pop_time = self._next_pop_time()
        rqid = random.randrange(REVIVE_QUEUE_NUM)
        self._pops += 1
        n = tc.read_queue_nums
        if queue_id >= 0:
            queues = [queue_id]
        else:
            start = self._cursor[(group, topic)] % max(1, n)
            self._cursor[(group, topic)] = start + 1
            queues = [(start + i) % n for i in range(n)]
        sources = [(topic, q) for q in queues]
        if not fifo:
            retry = (pop_retry_topic(group, topic), 0)
            sources = [retry] + sources if self._pops % _RETRY_EVERY == 0 else sources + [retry]
        batches, waits, holds = [], [], []
        wake_at = None
        rest = taken = 0
        for i, (real_topic, q) in enumerate(sources):
            left = max_nums - taken
            if left <= 0:
                rest = self._rest(group, sources[i:])
                break
            if fifo:
                got, opens = self._pop_fifo_queue(group, topic, real_topic, q, left, mf, sg, pop_time, invisible_ms,
                                                  init_mode, waits)
                if opens is not None:
                    wake_at = opens if wake_at is None else min(wake_at, opens)
            else:
                got = self._pop_queue(group, topic, real_topic, q, left, mf, pop_time, invisible_ms, rqid,
                                      init_mode, waits)
            if got is not None:
                batches.append(got)
                taken += len(got.offsets)
            else:
                mx = self.ctrl.store.get_max_offset_in_queue(real_topic, q)
                # (a blocked FIFO queue waits one below its end: its ack's wake-up passes that)
                holds.append((real_topic, q, mx - 1 if fifo and mx > 0 else mx))
        status = "FOUND" if batches else "POLLING_NOT_FOUND"
        return (PopResult(status, batches, pop_time, invisible_ms, POP_ORDER_REVIVE_QUEUE if fifo else rqid, rest),
                waits, holds, wake_at)

    def _rest(self, group, sources) -> int:
        """Messages of the sources (real topic, queue) not yet handed out to the group (restNum)."""
        store, om = self.ctrl.store, self.ctrl.offset_manager
        rest, offsets, offsets_of = 0, None, None
        for real_topic, q in sources:
            if real_topic != offsets_of:
                offsets, offsets_of = om.query_offsets(group, real_topic), real_topic
            rest += max(0, store.get_max_offset_in_queue(real_topic, q) - max(0, offsets.get(q, -1)))
        return rest

    def _pop_offset(self, group, topic, q, init_mode) -> int:
        store = self.ctrl.store
        off = self.ctrl.offset_manager.query_offset(group, topic, q)
        if off < 0:
            if init_mode == "MAX" and not MixAll.is_retry_topic(topic):
                off = store.get_max_offset_in_queue(topic, q)
            else:
                off = max(0, store.get_min_offset_in_queue(topic, q))
        return off

    def _read_at_pop_offset(self, group, real_topic, q, n, mf, init_mode):
        """_read from the group's pop offset (stored, start, next, result); with nothing to hand out,
        the pop offset is moved past what the read skipped (non-matching entries)."""
        om = self.ctrl.offset_manager
        stored = self._pop_offset(group, real_topic, q, init_mode)
        start, nxt, r = self._read(group, real_topic, q, stored, n, mf, init_mode)
        if r is None and nxt != om.query_offset(group, real_topic, q):
            om.commit_offset(None, group, real_topic, q, nxt)
        return stored, start, nxt, r

    def _read(self, group, topic, q, offset, n, mf, init_mode):
        """Matching records of (topic, q) from `offset` on: (offset read from, next offset,
        GetMessageResult or None).  Skips non-matching stretches (a bounded number of scans)."""
        store = self.ctrl.store
        for _ in range(16):
            r = store.get_message(group, topic, q, offset, n, mf, max_total_bytes=_MAX_POP_BYTES,
                                  max_transfer_count=n)
            st = r.status
            if st is GetMessageStatus.FOUND:
                return offset, r.next_begin_offset, r
            if st in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING,
                      GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_TOO_SMALL,
                      GetMessageStatus.OFFSET_OVERFLOW_BADLY):
                if r.next_begin_offset == offset:
                    break
                offset = r.next_begin_offset
                continue
            break
        return offset, offset, None

    def _pop_queue(self, group, topic, real_topic, q, n, mf, pop_time, invisible_ms, rqid, init_mode, waits):
        om = self.ctrl.offset_manager
        stored, start, nxt, r = self._read_at_pop_offset(group, real_topic, q, n, mf, init_mode)
        if r is None:
            return None
        offsets = r.queue_offsets
        # the pop offset moves first: the checkpoint records where it went (its "e")
        om.commit_offset(None, group, real_topic, q, nxt)
        try:
            ck, put = self._new_ck(group, real_topic, topic, q, start, offsets, pop_time, invisible_ms, rqid, False,
                                   end_offset=nxt)
        except PopError:
            om.commit_offset(None, group, real_topic, q, stored)
            raise
        waits.append(put)
        return self._batch(ck, offsets, r.buffer, None)

    def _batch(self, ck: _Ck, offsets, buffer: bytes, attempts) -> PoppedBatch:
        prefix = (ck.start, ck.pop_time, ck.invisible_ms, POP_ORDER_REVIVE_QUEUE if ck.fifo else ck.rqid,
                  RETRY_TOPIC if ck.topic != ck.origin else NORMAL_TOPIC, self.ctrl.broker_config.broker_name, ck.queue_id)
        return PoppedBatch(ck.origin, ck.topic, ck.queue_id, ck.start, offsets, buffer, attempts, prefix)

    def _pop_fifo_queue(self, group, topic, real_topic, q, n, mf, sg, pop_time, invisible_ms, init_mode, waits):
        """A FIFO group's queue: nothing while a message handed out of it is in flight; once all
        in flight are past their invisible time they are handed out again, in order, their
        delivery attempt raised (past the group's retryMaxTimes: to %DLQ%<group>).  Returns
        (its PoppedBatch or None, when the queue opens again or None)."""
        now = now_ms()
        rqid = self._fifo_rqid(group, real_topic, q)
        open_cks = [c for c in self._fifo.get((group, real_topic, q), ()) if c.pending]
        if open_cks:
            still = [c.revive_time for c in open_cks if c.revive_time > now]
            if still:
                return None, max(still)
            pending = sorted(set().union(*(c.pending for c in open_cks)))
            attempts = {}
            for c in open_cks:
                for o in c.pending:
                    attempts[o] = c.attempts.get(o, 1)
            popped_at = {o: c.pop_time for c in open_cks for o in c.pending}
            again, dead = [], []
            for o in pending:
                if len(again) >= n:
                    break
                found = self._read_one(real_topic, q, o, popped_at[o])
                if found is None:
                    dead.append((o, None))  # gone: nothing to hand out
                    continue
                m, rec = found
                if attempts[o] - 1 >= sg.retry_max_times:
                    dead.append((o, m))
                    continue
                again.append((o, m, rec))
            for o, m in dead:
                if m is not None:
                    waits.append(self._put_dead(group, topic, m, attempts[o]))
                for c in open_cks:
                    if o in c.pending:
                        waits.append(self._ack_record(c, [o], revived=True))
                        self._resolve(c, [o], acked=False)
            if again:
                offs = [o for o, _, _ in again]
                ck, put = self._new_ck(group, real_topic, topic, q, offs[0], offs, pop_time, invisible_ms, rqid, True,
                                       attempts={o: attempts[o] + 1 for o in offs})
                waits.append(put)
                self.revived[(topic, group)] += len(offs)
                records = b"".join(rec for _, _, rec in again)
                return self._batch(ck, offs, records, [attempts[o] + 1 for o in offs]), None
            if any(c.pending for c in self._fifo.get((group, real_topic, q), ())):
                return None, None
        om = self.ctrl.offset_manager
        stored, start, nxt, r = self._read_at_pop_offset(group, real_topic, q, n, mf, init_mode)
        if r is None:
            return None, None
        msgs = decode_messages(r.buffer, decompress=False, read_body=False)
        offsets = r.queue_offsets
        om.commit_offset(None, group, real_topic, q, nxt)
        try:
            ck, put = self._new_ck(group, real_topic, topic, q, start, offsets, pop_time, invisible_ms, rqid, True,
                                   attempts={m.queue_offset: m.reconsume_times + 1 for m in msgs}, end_offset=nxt)
        except PopError:
            om.commit_offset(None, group, real_topic, q, stored)
            raise
        waits.append(put)
        return self._batch(ck, offsets, r.buffer, [m.reconsume_times + 1 for m in msgs]), None

    def _read_one(self, topic: str, queue_id: int, offset: int, pop_time: int, read_body: bool = True):
        """(message, record) at `offset`, when it is still the message a checkpoint of pop_time
        handed out: gone (retention), or a newer one at the offset of a deleted and recreated topic
        (stored after the pop: apache/rocketmq#8479), gives None."""
        r = self.ctrl.store.get_message("", topic, queue_id, offset, 1, None)
        if r.status is not GetMessageStatus.FOUND or r.queue_offsets[:1] != [offset]:
            return None
        m = decode_messages(r.buffer, decompress=False, read_body=read_body)[0]
        if m.store_timestamp > pop_time:
            return None
        return m, _split(r.buffer)[0]

    def _put_dead(self, group, origin, m, attempt):
        """Put a FIFO message that used up its attempts to %DLQ%<group> (now)."""
        sg = self.ctrl.subscription_manager.find(group)
        inner, dead = self._give_back(group, sg, origin, m, attempt - 1, force_dead=True)
        result, fut = self.ctrl.store.put_nowait(inner)
        if result.status is not PutMessageStatus.PUT_OK:
            raise PopError(INTERNAL, f"putting message {m.msg_id} to {inner.topic} failed: "
                           f"{result.error or result.status.name}")
        self.ctrl.stats.inc_dlq(origin, group)
        return result, fut

    def _give_back(self, group, sg, origin, m, reconsume_times, force_dead=False):
        """The copy of message m the revive puts back: to the group's pop retry topic of `origin`
        with reconsume times + 1, or to %DLQ%<group> (send.py's send_back_target decides)."""
        max_times = sg.retry_max_times if sg is not None else 16
        topic, queue_id, dead = send_back_target(self.ctrl, group, sg, reconsume_times, max_times,
                                                 -1 if force_dead else 0, retry_topic=pop_retry_topic(group, origin))
        props = dict(m.properties)
        props.setdefault(MessageConst.RETRY_TOPIC, origin)
        props.setdefault(MessageConst.ORIGIN_MESSAGE_ID, m.msg_id)
        props.pop(MessageConst.DELAY_TIME_LEVEL, None)
        inner = MessageExtBrokerInner(topic=topic, queue_id=queue_id, body=m.body, flag=m.flag, properties=props,
                                      sys_flag=m.sys_flag, born_timestamp=m.born_timestamp,
                                      born_host=host_port(m.born_host), reconsume_times=reconsume_times + 1)
        return inner, dead

    # --- ack / change / DLQ -----------------------------------------------------------------------------
    def _check_ack(self, group, topic) -> None:
        self._check_writable()
        self._group(group)
        if not topic:
            raise PopError(BAD_REQUEST, "topic is empty", ResponseCode.MESSAGE_ILLEGAL)

    @staticmethod
    def _parse(receipt_handle) -> ExtraInfo:
        try:
            return ExtraInfo.parse(receipt_handle)
        except IllegalArgumentError as e:
            raise PopError(INVALID_RECEIPT_HANDLE, str(e), ResponseCode.MESSAGE_ILLEGAL) from None

    def _other_broker(self, h: ExtraInfo, text: str | None = None) -> PopError | None:
        mine = self.ctrl.broker_config.broker_name
        if h.broker_name == mine:
            return None
        if text is None:
            text = build_extra_info(*h)
        return PopError(INVALID_RECEIPT_HANDLE, f"receipt handle {text!r} is of broker {h.broker_name}, "
                        f"not of this broker {mine}", ResponseCode.MESSAGE_ILLEGAL)

    def _handle(self, group, topic, receipt_handle):
        """(ExtraInfo, the topic its message is stored in) of one handle; raises naming it when bad."""
        self._check_ack(group, topic)
        h = self._parse(receipt_handle)
        refused = self._other_broker(h, receipt_handle)
        if refused is not None:
            raise refused
        return h, h.real_topic(topic, group)

    def _find_ck(self, group, real_topic, queue_id, ck_offset, pop_time, revive_qid, offset):
        if revive_qid == POP_ORDER_REVIVE_QUEUE:
            for c in self._fifo.get((group, real_topic, queue_id), ()):
                if c.pop_time == pop_time and offset in c.offsets:
                    return c
            return None
        return self._cks.get((group, real_topic, queue_id, ck_offset, pop_time))

    def _open(self, group, real_topic, h: ExtraInfo, offset: int, what: str):
        """The checkpoint the message at `offset` of h's checkpoint is in flight under, or None when
        it was acked already; raises naming its handle when it is unknown, expired or handed out again."""
        ck = self._find_ck(group, real_topic, h.queue_id, h.ck_queue_offset, h.pop_time, h.revive_qid, offset)
        if ck is not None:
            if offset in ck.pending:
                return ck
            if offset in ck.acked:
                return None
        done = self._recent_done.get((group, real_topic, h.queue_id, h.ck_queue_offset, h.pop_time))
        if done is not None and offset in done:
            return None
        text = build_extra_info(h.ck_queue_offset, h.pop_time, h.invisible_time, h.revive_qid, h.retry, h.broker_name,
                                h.queue_id, offset)
        raise PopError(INVALID_RECEIPT_HANDLE,
                       f"cannot {what}: receipt handle {text!r} of {real_topic}@{group} queue {h.queue_id} "
                       f"offset {offset} is expired or unknown (its invisible time ran out and the message was "
                       f"or will be delivered again, or it was never handed out)", ResponseCode.NO_MESSAGE)

    async def ack(self, *, group: str, topic: str, receipt_handle: str) -> AckOutcome:
        """End a message: answered once its ack record is stored."""
        outcome = (await self.ack_batch(group=group, topic=topic, receipt_handles=[receipt_handle]))[0]
        if isinstance(outcome, PopError):
            raise outcome
        return outcome

    def begin_ack(self, *, group: str, topic: str, receipt_handle: str):
        """ack() up to the wait for its record's durability (ACK_MESSAGE's way: no coroutine when
        none is needed): its refusals ([] or [PopError]) when there is no wait, else an awaitable of
        them; a handle that is not one raises PopError."""
        self._check_ack(group, topic)
        h = self._parse(receipt_handle)
        return self.begin_ack_offsets(group=group, topic=topic, checkpoint=h, offsets=[h.queue_offset])

    async def ack_batch(self, *, group: str, topic: str, receipt_handles) -> list:
        """End several messages (gRPC's AckMessage entries): one ack record per checkpoint they are
        in.  Returns, per handle in order, an AckOutcome or the PopError that refused it (one bad
        handle does not refuse the others); answered once the records are stored."""
        self._check_ack(group, topic)
        out = [None] * len(receipt_handles)
        by_ck: dict = {}  # the handle's first 7 fields (its checkpoint) -> (ExtraInfo, offsets, indexes)
        for i, text in enumerate(receipt_handles):
            try:
                h = self._parse(text)
            except PopError as e:
                out[i] = e
                continue
            entry = by_ck.get(h[:7])
            if entry is None:
                entry = by_ck[h[:7]] = (h, [], [])
            entry[1].append(h.queue_offset)
            entry[2].append(i)
        items = [(h, offs) for h, offs, _ in by_ck.values()]
        statuses, puts = self._ack_now(group, topic, items)
        await self._durable(puts)
        statuses = iter(statuses)
        for h, offsets, indexes in by_ck.values():
            real = h.real_topic(topic, group)
            for i, off in zip(indexes, offsets):
                st = next(statuses)
                out[i] = st if isinstance(st, PopError) else AckOutcome(st, real, h.queue_id, off)
        return out

    async def ack_offsets(self, *, group: str, topic: str, checkpoint: ExtraInfo, offsets) -> list:
        """End the messages at `offsets` of one checkpoint (named by `checkpoint`, an ExtraInfo whose
        queue offset is not used: BATCH_ACK_MESSAGE's BatchAck).  Returns the PopErrors refusing
        some of them ([]: all acked, or acked before); answered once the ack record is stored."""
        begun = self.begin_ack_offsets(group=group, topic=topic, checkpoint=checkpoint, offsets=offsets)
        return begun if type(begun) is list else await begun

    def begin_ack_offsets(self, *, group: str, topic: str, checkpoint: ExtraInfo, offsets):
        """ack_offsets() up to the wait for its record's durability: its refusals (a list) when there
        is none to wait for, else an awaitable of them."""
        self._check_ack(group, topic)
        statuses, puts = self._ack_now(group, topic, [(checkpoint, offsets)])
        if statuses.count("OK") + statuses.count("ALREADY_ACKED") == len(statuses):  # (the usual: no refusal)
            refusals = []
        else:
            refusals = [st for st in statuses if isinstance(st, PopError)]
        return self._when_durable(puts, refusals)

    def _when_durable(self, puts, answer):
        """`answer` now when no put needs a durability wait, else an awaitable of it after the wait."""
        for _, fut in puts:
            if fut is not None:
                return self._after_durable(puts, answer)
        return answer

    async def _after_durable(self, puts, answer):
        await self._durable(puts)
        return answer

    def _ack_now(self, group, topic, items):
        """items: (ExtraInfo naming a checkpoint, its offsets acked).  Decides and writes the ack
        records now: (per offset in that order "OK", "ALREADY_ACKED" or the PopError refusing it,
        the puts to wait on for durability before answering)."""
        out, by_ck = [], {}  # id(ck) -> (ck, {offset: None}, indexes in out)
        for h, offsets in items:
            refused = self._other_broker(h)
            if refused is not None:
                out += [refused] * len(offsets)
                continue
            real = h.real_topic(topic, group)
            # (a normal checkpoint is found once; the offsets not in flight under it are looked at one by one)
            ck0 = None if h.revive_qid == POP_ORDER_REVIVE_QUEUE else \
                self._cks.get((group, real, h.queue_id, h.ck_queue_offset, h.pop_time))
            pending = ck0.pending if ck0 is not None else ()
            if pending and pending.issuperset(offsets):  # (the usual batch: all in flight under it)
                entry = by_ck.get(id(ck0))
                if entry is None:
                    entry = by_ck[id(ck0)] = (ck0, {}, [])
                entry[1].update(dict.fromkeys(offsets))
                entry[2].extend(range(len(out), len(out) + len(offsets)))
                out += ["OK"] * len(offsets)
                continue
            for off in offsets:
                if off in pending:
                    ck = ck0
                else:
                    try:
                        ck = self._open(group, real, h, off, "ack")
                    except PopError as e:
                        out.append(e)
                        continue
                    if ck is None:
                        out.append("ALREADY_ACKED")
                        continue
                entry = by_ck.get(id(ck))
                if entry is None:
                    entry = by_ck[id(ck)] = (ck, {}, [])
                entry[1][off] = None
                entry[2].append(len(out))
                out.append("OK")
        puts = []
        try:
            for ck, offs, _ in by_ck.values():
                offs = list(offs)
                puts.append(self._ack_record(ck, offs))
                self._resolve(ck, offs, acked=True)
                self.acked[(ck.origin, group)] += len(offs)
                if ck.fifo:
                    self._wake_fifo(ck)
        except PopError as e:  # (a store refusing writes: what was not written is not acked)
            for _, _, indexes in list(by_ck.values())[len(puts):]:
                for i in indexes:
                    out[i] = e
        return out, puts

    def _wake_fifo(self, ck: _Ck) -> None:
        """A FIFO queue may be open again: wake the pops held on it (they hold one below its end)."""
        if not any(c.pending for c in self._fifo.get((ck.group, ck.topic, ck.queue_id), ())):
            mx = self.ctrl.store.get_max_offset_in_queue(ck.topic, ck.queue_id)
            self.ctrl.pull_hold_service.notify_message_arriving(ck.topic, ck.queue_id, mx)

    async def change_invisible_time(self, *, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        """Make an in-flight message invisible for invisible_ms from now: a new checkpoint for it,
        and (not FIFO) an ack of the old handle; answered when both are stored.  Returns the new
        receipt handle (the old one is no longer valid)."""
        begun = self.begin_change_invisible_time(group=group, topic=topic, receipt_handle=receipt_handle,
                                                 invisible_ms=invisible_ms)
        return begun if type(begun) is str else await begun

    def begin_change_invisible_time(self, *, group: str, topic: str, receipt_handle: str, invisible_ms: int):
        """change_invisible_time() up to the wait for its records' durability: the new handle when
        there is none to wait for, else an awaitable of it."""
        self._check_invisible(invisible_ms)
        h, real = self._handle(group, topic, receipt_handle)
        ck = self._open(group, real, h, h.queue_offset, "change the invisible time")
        if ck is None:
            raise PopError(INVALID_RECEIPT_HANDLE, f"cannot change the invisible time: the message of receipt handle "
                           f"{receipt_handle!r} was acked already", ResponseCode.NO_MESSAGE)
        pop_time = self._next_pop_time()
        rqid = ck.rqid if ck.fifo else random.randrange(REVIVE_QUEUE_NUM)
        off = h.queue_offset
        attempts = {off: ck.attempts.get(off, 1)} if ck.fifo else None
        new, put = self._new_ck(group, real, ck.origin, h.queue_id, off, [off], pop_time, invisible_ms,
                                rqid, ck.fifo, attempts=attempts)
        waits = [put]
        if not ck.fifo:  # (a FIFO checkpoint supersedes the old one's offset by itself)
            try:
                waits.append(self._ack_record(ck, [off]))
            except PopError:
                self._resolve(new, [off], acked=False)  # (both open after a crash: delivered again)
                raise
            self._resolve(ck, [off], acked=False)
        return self._when_durable(waits, build_extra_info(
            off, pop_time, invisible_ms, POP_ORDER_REVIVE_QUEUE if ck.fifo else rqid, h.retry, h.broker_name,
            h.queue_id, off))

    async def forward_to_dead_letter(self, *, group: str, topic: str, receipt_handle: str) -> AckOutcome:
        """Put an in-flight message to %DLQ%<group> now and end it (gRPC's ForwardMessageToDeadLetterQueue)."""
        h, real = self._handle(group, topic, receipt_handle)
        off = h.queue_offset
        ck = self._open(group, real, h, off, "forward to the dead-letter queue")
        if ck is None:
            return AckOutcome("ALREADY_ACKED", real, h.queue_id, off)
        found = self._read_one(real, h.queue_id, off, ck.pop_time)
        waits = []
        if found is not None:
            m = found[0]
            waits.append(self._put_dead(group, ck.origin, m, ck.attempts.get(off, m.reconsume_times + 1)))
        waits.append(self._ack_record(ck, [off]))
        self._resolve(ck, [off], acked=True)
        if ck.fifo:
            self._wake_fifo(ck)
        await self._durable(waits)
        return AckOutcome("OK", real, h.queue_id, off)

    def inflight(self, group: str, topic: str) -> int:
        """Messages of `topic` (its retry messages included) handed out to `group` and neither acked nor revived."""
        return self._inflight.get((group, topic), 0)

    def inflight_in_queue(self, group: str, real_topic: str, queue_id: int) -> int:
        """Messages of one queue (of a topic or a pop retry topic) in flight to `group`."""
        return self._inflight_q.get((group, real_topic, queue_id), 0)

    def inflight_table(self) -> dict:
        """(group, topic) -> messages in flight."""
        return dict(self._inflight)

    # --- revive ---------------------------------------------------------------------------------------
    async def _revive_loop(self) -> None:
        last_commit = 0
        while True:
            try:
                now = now_ms()
                waits = []
                while self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    ck = self._cks.get(key)
                    if ck is not None and ck.pending:
                        waits += self._revive(ck)
                if now - last_commit >= 1000:
                    self._commit_revive_offsets()
                    last_commit = now
                if waits:
                    await self._durable(waits)
                delay = 1.0
                if self._heap:
                    delay = min(delay, max(0.0, (self._heap[0][0] - now_ms()) / 1000))
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), delay + 0.001)
                except asyncio.TimeoutError:
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pop revive failed; retrying in 1 s")
                await asyncio.sleep(1)

    def _revive(self, ck: _Ck) -> list:
        """Past its invisible time: every unacked offset of ck goes back - a copy to the group's
        pop retry topic with reconsume times + 1, or to %DLQ%<group> - then an ack record
        (revived) closes ck.  All now, on the loop: an ack racing it finds the offsets gone."""
        store = self.ctrl.store
        sg = self.ctrl.subscription_manager.find(ck.group)
        waits = []
        done = []
        for o in sorted(ck.pending):
            found = self._read_one(ck.topic, ck.queue_id, o, ck.pop_time)
            if found is not None:
                m = found[0]
                inner, dead = self._give_back(ck.group, sg, ck.origin, m, m.reconsume_times)
                result, fut = store.put_nowait(inner)
                if result.status is not PutMessageStatus.PUT_OK:
                    log.warning("pop revive of %s@%s queue %d offset %d failed (%s); retrying in 1 s", ck.topic,
                                ck.group, ck.queue_id, o, result.error or result.status.name)
                    break
                waits.append((result, fut))
                if dead:
                    self.ctrl.stats.inc_dlq(ck.origin, ck.group)
            else:
                log.warning("pop revive: %s queue %d offset %d of %s is gone from the store (or is a newer "
                            "message of a recreated topic); dropped", ck.topic, ck.queue_id, o, ck.group)
            done.append(o)
        if done:
            waits.append(self._ack_record(ck, done, revived=True))
            self.revived[(ck.origin, ck.group)] += len(done)
            self._resolve(ck, done, acked=False)
        if ck.pending:  # (a put failed: the rest later)
            self._seq += 1
            heapq.heappush(self._heap, (now_ms() + 1000, self._seq, ck.key))
        return waits

    def _commit_revive_offsets(self) -> None:
        """The revive progress: per revive queue, the record offset of its oldest open checkpoint
        (everything before it is resolved), else its end.  A restart rescans from there."""
        store, om = self.ctrl.store, self.ctrl.offset_manager
        low = {}
        for ck in self._cks.values():
            if ck.rec_offset >= 0 and (ck.rqid not in low or ck.rec_offset < low[ck.rqid]):
                low[ck.rqid] = ck.rec_offset
        for q in range(REVIVE_QUEUE_NUM):
            off = low.get(q, store.get_max_offset_in_queue(self.revive_topic, q))
            if off != om.query_offset(REVIVE_GROUP, self.revive_topic, q):
                om.commit_offset(None, REVIVE_GROUP, self.revive_topic, q, off)

    # --- recovery -------------------------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild the open checkpoints from the revive log, from each queue's revive offset on;
        a group's pop offset that the last persist left behind a checkpoint's end is moved up to
        it (a restart never hands out again what was handed out before)."""
        store, om = self.ctrl.store, self.ctrl.offset_manager
        t = self.revive_topic
        cks = records = 0
        for q in range(REVIVE_QUEUE_NUM):
            off = om.query_offset(REVIVE_GROUP, t, q)
            if off < 0:
                off = max(0, store.get_min_offset_in_queue(t, q))
            end = store.get_max_offset_in_queue(t, q)
            while off < end:
                r = store.get_message(REVIVE_GROUP, t, q, off, 1024, None, max_total_bytes=16 << 20,
                                      max_transfer_count=1024)
                if r.status is GetMessageStatus.FOUND:
                    for m in decode_messages(r.buffer, decompress=False):
                        records += 1
                        cks += self._apply_record(q, m)
                elif r.next_begin_offset <= off:
                    break
                off = r.next_begin_offset
        if records:
            log.info("pop: recovered %d open checkpoints from %d revive records (%d messages in flight)",
                     len(self._cks), records, sum(self._inflight.values()))

    def _apply_record(self, rqid: int, m) -> int:
        try:
            rec = json.loads(m.body)
            tag = m.properties.get(MessageConst.TAGS)
            group, topic, q, start, pop_time = rec["c"], rec["t"], int(rec["q"]), int(rec["so"]), int(rec["pt"])
        except (ValueError, KeyError, TypeError) as e:
            log.error("pop: revive record at %s queue %d offset %d is malformed (%s); skipped", m.topic, rqid,
                      m.queue_offset, e)
            return 0
        self._last_pop_time = max(self._last_pop_time, pop_time)
        if tag == CK_TAG:
            offsets = [start + d for d in rec.get("d", ())]
            fifo = bool(rec.get("o"))
            attempts = dict(zip(offsets, rec.get("a", ()))) if fifo else None
            origin = _origin_topic(topic, group)
            ck = _Ck(group, topic, origin, q, start, offsets, pop_time, int(rec["it"]), rqid, fifo, attempts)
            ck.rec_offset = m.queue_offset
            if fifo:
                self._supersede(ck)
            self._register(ck)
            end = rec.get("e")
            if end is not None and int(end) > self.ctrl.offset_manager.query_offset(group, topic, q):
                self.ctrl.offset_manager.commit_offset(None, group, topic, q, int(end))
            return 1
        if tag == ACK_TAG:
            ck = self._cks.get((group, topic, q, start, pop_time))
            if ck is not None:
                self._resolve(ck, [int(o) for o in rec.get("ao", ())], acked=not rec.get("r"))
        return 0


def _count_down(table, key, n: int) -> None:
    left = table.get(key, 0) - n
    if left > 0:
        table[key] = left
    else:
        table.pop(key, None)


def _origin_topic(topic: str, group: str) -> str:
    prefix = f"{MixAll.RETRY_GROUP_TOPIC_PREFIX}{group}_"
    return topic[len(prefix):] if is_pop_retry_topic(topic, group) else topic


def _split(buf: bytes) -> list[bytes]:
    """The records of a get_message buffer, one bytes each (each starts with its total size)."""
    out, pos, n = [], 0, len(buf)
    while pos + 4 <= n:
        size = int.from_bytes(buf[pos:pos + 4], "big")
        if size <= 0:
            break
        out.append(bytes(buf[pos:pos + size]))
        pos += size
    return out
