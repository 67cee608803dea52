"""Arbitrary-time delayed messages (RocketMQ 5's timer): a timing wheel over a system topic.

Send side (`TimerMessageService.redirect_if_timer`, called for every stored send, committed
transaction and send-back before the delay-level redirect):

* a message carrying TIMER_DELAY_SEC (relative seconds; wins, as in RocketMQ 5), TIMER_DELIVER_MS
  or DELIVER_TIME_MS (absolute epoch milliseconds) gets its due time in TIMER_OUT_MS and loses
  the request keys;
* due more than timerPrecisionMs from now: it is stored in `rmq_sys_wheel_timer` queue 0 with its
  real topic/queue in REAL_TOPIC/REAL_QID and the due time as the consume-queue tag code;
  sooner or past due: it is stored in its own topic at once (no detour);
* a message that also has a DELAY level is a delay-level message and the timer keys are dropped
  (RocketMQ 5's HookUtils.checkIfTimerMessage: the level wins);
* a non-integer value, a delay beyond timerMaxDelaySec, or any timer key while timerWheelEnable
  is false is refused at send with an error naming the property and the value.

Delivery side: one asyncio task reads the timer queue's 20-byte consume-queue units (not the
records) into an in-memory `TimingWheel` of timerPrecisionMs slots, loads a record only when it is
due, re-puts it to its real topic/queue (in due-time order, queue order among equal times), and
sleeps until the next due time, a new arrival or the window's half-life — never a busy poll.
Only entries due within timerRollWindowSlot slots ("the window") are held in memory; later ones
stay in the log and are picked up by a re-scan of the queue when the window has moved half its
length.

Restart guarantees (`<store>/config/timerCheckpoint.json`, written after each delivered batch):

* `oldestPendingOffset` L: every entry below it is delivered; the wheel is rebuilt from there;
* `delivered`, a list of [R, due, queue offset] bounds: an entry at queue offset q < R whose
  (due, q) sorts before (due, queue offset) is delivered.  After each batch the bound is the
  wheel's next (due, q) capped at (now + 1, -1), and R the read position: delivery goes in
  (due, q) order, so "everything read that sorts before the bound" is exactly what went out.
  A later bound replaces the ones it dominates (larger R and bound); only a wall clock that steps
  back leaves more than one (at most 32; dropping one could only cause re-deliveries).
Rebuilding reads [L, end) and skips exactly those entries, so a restart loses nothing and
re-delivers only what was not yet checkpointed when the broker died (at-least-once): the batch in
flight and at most one batch whose checkpoint write (done off the event loop) had not finished —
two batches of 256 at most.

After an unclean stop the store rebuilds consume queues from the log and computes an ordinary tag
hash for our entries; a Java string hash fits in 32 bits while an epoch-ms due time never does,
so such entries are recognised and their due time is read from the record's TIMER_OUT_MS.
"""
from __future__ import annotations

import asyncio
import bisect
import heapq
import json
import logging
import os
import re
import struct

from rmq_core.common.clock import now_ms
from rmq_core.loops import cancel_and_wait
from rmq_core.codec import MessageDecodeError, decode_batch_body, decode_messages
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import MessageConst, SysFlag, TopicValidator, host_port, string_to_properties
from rmq_core.store import MessageExtBrokerInner, PutMessageStatus
from rmq_core.broker.topic_config_manager import TopicConfig
from rmq_core.common.files import atomic_write
from rmq_core.store.consume_queue import CQ_STORE_UNIT_SIZE
from rmq_core.store.types import record_fields

log = logging.getLogger("rmq.broker")

TIMER_TOPIC = TopicValidator.RMQ_SYS_WHEEL_TIMER
TIMER_OUT_MS = "TIMER_OUT_MS"  # RocketMQ 5's property: the time the timer releases the message
# Request keys, in the order RocketMQ 5 consults them (relative seconds win over absolute times).
TIMER_REQUEST_KEYS = (MessageConst.TIMER_DELAY_SEC, MessageConst.TIMER_DELIVER_MS, MessageConst.DELIVER_TIME_MS)

DELIVERY_BATCH = 256  # entries re-put per delivery round (one checkpoint write per round)
_READ_CHUNK = 8192  # consume-queue units read per step before yielding to the event loop
_UNIT = struct.Struct(">qiq")
_INTEGER = re.compile(r"-?[0-9]{1,18}")
_MIN_DUE = -(1 << 63)
# A REAL_TOPIC / REAL_QID pair in a stored properties string (name \x01 value \x02).
_REAL_PAIR = re.compile(rb"(?:(?<=\x02)|^)(REAL_TOPIC|REAL_QID)\x01([^\x02]*)\x02")
_MAX_DELIVERED_BOUNDS = 32
_TIMER_KEY_MARKS = tuple(k.encode() + b"\x01" for k in TIMER_REQUEST_KEYS)
# A Java string hash (what the store computes for a rebuilt entry) fits in 32 bits; a due time in
# epoch milliseconds is far above.
_HASH_CODE_LIMIT = 1 << 32


class TimerMessageError(IllegalArgumentError):
    """A timer message the broker refuses (bad property value, too far ahead, timer disabled)."""



def parse_due_ms(props: dict, now_ms: int, topic: str = "?") -> int | None:
    """Absolute due time (epoch ms) asked for by the timer keys in `props`, or None without any.

    Every timer key present must hold an integer; TIMER_DELAY_SEC (seconds from now) is used when
    present, else TIMER_DELIVER_MS, else DELIVER_TIME_MS."""
    due = None
    for key in TIMER_REQUEST_KEYS:
        value = props.get(key)
        if value is None:
            continue
        if not _INTEGER.fullmatch(value):
            unit = "seconds from now" if key == MessageConst.TIMER_DELAY_SEC else "epoch milliseconds"
            raise TimerMessageError(
                f"bad {key} value {value!r} on a message to topic {topic!r}: it must be an integer ({unit})")
        if due is None:
            due = now_ms + int(value) * 1000 if key == MessageConst.TIMER_DELAY_SEC else int(value)
    return due


def _delay_level(props: dict) -> int:
    level = props.get(MessageConst.DELAY_TIME_LEVEL)
    try:
        return int(level) if level else 0
    except ValueError:
        return 0  # the schedule service ignores a malformed level too


class TimingWheel:
    """Pending timer entries in slots of `precision_ms`.

    Slots are keyed by their absolute number (due // precision), so a slot is never shared by two
    laps; a min-heap of occupied slot numbers finds the next one to fire.  Entries are tuples
    (due_ms, queue_offset, phys_offset, size), which sort in delivery order.  A second, lazily
    pruned min-heap of queue offsets answers "oldest pending queue offset" (the restart point)."""

    __slots__ = ("precision_ms", "_slots", "_slot_heap", "_offsets", "_pending", "_count")

    def __init__(self, precision_ms: int):
        if precision_ms <= 0:
            raise IllegalArgumentError(f"timer precision must be > 0 ms, got {precision_ms!r}")
        self.precision_ms = precision_ms
        self._slots: dict[int, list] = {}
        self._slot_heap: list[int] = []
        self._offsets: list[int] = []
        self._pending: dict[int, int] = {}  # queue offset -> copies pending (1, or more after a re-add)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, due_ms: int, queue_offset: int, phys_offset: int, size: int) -> None:
        slot = due_ms // self.precision_ms
        entries = self._slots.get(slot)
        if entries is None:
            self._slots[slot] = entries = []
            heapq.heappush(self._slot_heap, slot)
        entries.append((due_ms, queue_offset, phys_offset, size))
        n = self._pending.get(queue_offset, 0)
        if n == 0:
            heapq.heappush(self._offsets, queue_offset)
        self._pending[queue_offset] = n + 1
        self._count += 1

    def next_due_ms(self) -> int | None:
        """Due time of the earliest entry, None when empty."""
        key = self.next_key()
        return None if key is None else key[0]

    def next_key(self) -> tuple[int, int] | None:
        """(due, queue offset) of the entry delivered next, None when empty."""
        if not self._slot_heap:
            return None
        return min(self._slots[self._slot_heap[0]])[:2]

    def pop_due(self, now_ms: int, limit: int) -> list:
        """Remove and return up to `limit` entries due at or before now_ms, earliest first."""
        out: list = []
        heap = self._slot_heap
        while heap and len(out) < limit:
            slot = heap[0]
            if slot * self.precision_ms > now_ms:
                break
            entries = self._slots[slot]
            entries.sort()
            due_n = bisect.bisect_right(entries, now_ms, key=_due_of)
            take = min(due_n, limit - len(out))
            out.extend(entries[:take])
            del entries[:take]
            if entries:
                break  # the rest of this slot is not due yet, or the batch is full
            del self._slots[slot]
            heapq.heappop(heap)
        pending = self._pending
        for e in out:
            n = pending[e[1]] - 1
            if n:
                pending[e[1]] = n
            else:
                del pending[e[1]]
        self._count -= len(out)
        return out

    def oldest_pending_offset(self) -> int | None:
        offsets = self._offsets
        while offsets and offsets[0] not in self._pending:
            heapq.heappop(offsets)
        return offsets[0] if offsets else None

    def clear(self) -> None:
        self._slots.clear()
        self._slot_heap.clear()
        self._offsets.clear()
        self._pending.clear()
        self._count = 0


def _due_of(entry) -> int:
    return entry[0]


def _covered(delivered: list, qoff: int, due: int) -> bool:
    """Whether a checkpoint's delivered bounds say the entry went out before the restart."""
    for below, bound_due, bound_qoff in delivered:
        if qoff < below and (due < bound_due or (due == bound_due and qoff < bound_qoff)):
            return True
    return False


class TimerMessageService:
    def __init__(self, controller):
        self.ctrl = controller
        self.config = controller.store_config
        self.precision_ms: int = self.config.timer_precision_ms
        self.path = os.path.join(self.config.config_dir, "timerCheckpoint.json")
        self.wheel = TimingWheel(self.precision_ms)
        self._scan_offset = 0  # next timer-queue offset to read
        self._horizon_ms = 0  # read entries due before it are in the wheel (or delivered)
        self._far_low: int | None = None  # lowest queue offset of a read entry due at/after the horizon
        self._far_min_due: int | None = None
        self._delivered: list[tuple[int, int, int]] = []  # (R, due, queue offset), see the docstring
        self._start_offset = 0  # L as loaded from the checkpoint
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._pending_checkpoint: dict | None = None  # taken after a batch, not yet on disk
        self._checkpoint_writer: asyncio.Task | None = None
        self.enqueued = 0  # messages parked in the timer topic since start
        self.delivered = 0  # messages re-put to their real topic since start
        self.rescans = 0
        self.rounds = 0  # delivery-loop wake-ups (a sleeping wheel wakes for due times and arrivals only)
        self.lost = 0  # due entries whose record had already been deleted by retention

    @property
    def window_ms(self) -> int:
        return self.precision_ms * self.config.timer_roll_window_slot

    # --- send path ----------------------------------------------------------------------------------
    def check_properties(self, props: dict, topic: str = "?") -> None:
        """Refuse bad timer keys up front (a prepared transaction half is checked at send time,
        although it is only redirected when committed)."""
        if not props or _delay_level(props) > 0 or not any(k in props for k in TIMER_REQUEST_KEYS):
            return
        self._enabled_or_raise(props, topic)
        now = now_ms()
        due = parse_due_ms(props, now, topic)
        self._not_too_far_or_raise(props, due, now, topic)

    @staticmethod
    def check_batch(body: bytes, extra_properties: dict) -> str | None:
        """Why a SEND_BATCH_MESSAGE cannot be stored (an item asks for timer delivery, which a
        batch — one append to one queue — cannot honour), or None.  Only the items' properties
        are searched (split natively, joined, one substring test per key): the bodies, most of
        the bytes, are never scanned, and no item is parsed unless a key shows up."""
        for key in TIMER_REQUEST_KEYS:
            if key in extra_properties:
                return (f"batch messages do not support timer delivery: the batch carries "
                        f"{key}={extra_properties[key]!r}; send timer messages one by one")
        if not body:
            return None
        try:
            items = decode_batch_body(body)
        except MessageDecodeError:
            return None  # the store's append refuses it, naming the bad item
        # every item's properties end with \x02: joined, no key can straddle two of them
        props_only = b"".join([item[2] for item in items])
        if not any(k in props_only for k in _TIMER_KEY_MARKS):
            return None
        for index, (_flag, _body, props) in enumerate(items):
            item = string_to_properties(props)
            for key in TIMER_REQUEST_KEYS:
                if key in item:
                    return (f"batch messages do not support timer delivery: item {index} carries "
                            f"{key}={item[key]!r}; send timer messages one by one")
        return None

    def redirect_if_timer(self, inner: MessageExtBrokerInner, strict: bool = True) -> MessageExtBrokerInner:
        """Park a timer message in the timer topic (or stamp it for direct delivery).

        strict: raise TimerMessageError for a bad request (a producer's send); otherwise (commit of
        a transaction, consumer send-back) log it and store the message at once without the keys."""
        if inner.topic == TIMER_TOPIC and strict:
            raise TimerMessageError(f"sending to the timer system topic {TIMER_TOPIC!r} is forbidden")
        props = inner.properties
        if not props:
            return inner
        keys = [k for k in TIMER_REQUEST_KEYS if k in props]
        if not keys:
            return inner
        tx = SysFlag.transaction_value(inner.sys_flag)
        if tx not in (SysFlag.TRANSACTION_NOT_TYPE, SysFlag.TRANSACTION_COMMIT_TYPE):
            return inner
        if _delay_level(props) > 0:  # RocketMQ 5: a delay level wins over the timer keys
            self._strip(inner, keys)
            return inner
        now = now_ms()
        try:
            self._enabled_or_raise(props, inner.topic)
            due = parse_due_ms(props, now, inner.topic)
            if strict:
                self._not_too_far_or_raise(props, due, now, inner.topic)
            elif due - now > self.config.timer_max_delay_sec * 1000:
                log.warning("timer: %s=%s on a message to %s is beyond timerMaxDelaySec; delivered at that limit",
                            keys[0], props[keys[0]], inner.topic)
                due = now + self.config.timer_max_delay_sec * 1000
        except TimerMessageError as e:
            if strict:
                raise
            log.warning("timer: %s; stored without delay", e)
            self._strip(inner, keys)
            return inner
        self._strip(inner, keys)
        props[TIMER_OUT_MS] = str(due)
        if due <= now + self.precision_ms:
            return inner  # due (or past due) within one slot: no detour
        props[MessageConst.REAL_TOPIC] = inner.topic
        props[MessageConst.REAL_QUEUE_ID] = str(inner.queue_id)
        inner.topic = TIMER_TOPIC
        inner.queue_id = 0
        inner.tags_code = due
        self.enqueued += 1
        return inner

    def _enabled_or_raise(self, props: dict, topic: str) -> None:
        if not self.config.timer_wheel_enable:
            key = next(k for k in TIMER_REQUEST_KEYS if k in props)
            raise TimerMessageError(
                f"timer message refused: {key}={props[key]!r} on a message to topic {topic!r}, but "
                f"timerWheelEnable=false on broker {self.ctrl.broker_config.broker_name}")

    def _not_too_far_or_raise(self, props: dict, due: int, now: int, topic: str) -> None:
        limit_s = self.config.timer_max_delay_sec
        if due - now > limit_s * 1000:
            key = next(k for k in TIMER_REQUEST_KEYS if k in props)
            raise TimerMessageError(
                f"bad {key} value {props[key]!r} on a message to topic {topic!r}: delivery "
                f"{(due - now) / 1000:.0f} s ahead is beyond timerMaxDelaySec={limit_s}")

    @staticmethod
    def _strip(inner: MessageExtBrokerInner, keys) -> None:
        for k in keys:
            inner.properties.pop(k, None)
        inner.properties_bytes = None

    # --- lifecycle --------------------------------------------------------------------------------------
    def load(self) -> None:
        """Create the timer topic's config (a system topic like the schedule topic) and read the
        checkpoint; call after the topic table is loaded, before the store takes puts."""
        tm = self.ctrl.topic_manager
        if tm.select(TIMER_TOPIC) is None:
            tm.create_or_update(TopicConfig(topic_name=TIMER_TOPIC, read_queue_nums=1, write_queue_nums=1, perm=6),
                                notify=False)
        try:
            with open(self.path, encoding="utf-8") as f:
                self.restore(json.load(f))
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, AttributeError, OSError) as e:
            # Starting over from the queue's minimum re-delivers what was delivered (never loses).
            log.error("cannot read %s (%s); timer delivery restarts from the queue minimum", self.path, e)
            self.restore({})

    def restore(self, cp: dict) -> None:
        """Take the progress of a checkpoint (as `checkpoint()` returns it)."""
        delivered = [(int(r), int(d), int(q)) for r, d, q in cp.get("delivered", ())]
        self._start_offset = int(cp.get("oldestPendingOffset", 0))
        self._delivered = sorted(delivered)

    def checkpoint(self) -> dict:
        return {"oldestPendingOffset": self.oldest_pending_offset(),
                "delivered": [list(b) for b in self._delivered]}

    def persist(self) -> None:
        self._write_checkpoint(self.checkpoint())

    def _write_checkpoint(self, cp: dict) -> None:
        atomic_write(self.path, json.dumps(cp, indent=2).encode("utf-8"))

    def _persist_soon(self) -> None:
        """Snapshot the progress now and write it off the event loop (fsync takes milliseconds);
        one writer at a time, each writing the latest snapshot."""
        self._pending_checkpoint = self.checkpoint()
        if self._checkpoint_writer is None or self._checkpoint_writer.done():
            self._checkpoint_writer = asyncio.create_task(self._checkpoint_writes(), name="timer-checkpoint")

    async def _checkpoint_writes(self) -> None:
        while self._pending_checkpoint is not None:
            cp, self._pending_checkpoint = self._pending_checkpoint, None
            try:
                await asyncio.to_thread(self._write_checkpoint, cp)
            except OSError as e:
                log.error("cannot write %s: %s", self.path, e)

    def oldest_pending_offset(self) -> int:
        """Queue offset below which every timer entry is delivered."""
        candidates = [self._scan_offset]
        wheel_low = self.wheel.oldest_pending_offset()
        if wheel_low is not None:
            candidates.append(wheel_low)
        if self._far_low is not None:
            candidates.append(self._far_low)
        return min(candidates)

    async def start(self) -> None:
        self.recover(now_ms())
        self._event = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="timer-wheel")

    def recover(self, now: int) -> None:
        """Position the reader at the checkpoint's oldest pending offset; the wheel fills from
        there on the first round (entries delivered before the restart are skipped)."""
        store = self.ctrl.store
        max_off = store.get_max_offset_in_queue(TIMER_TOPIC, 0)
        if self._start_offset > max_off or any(r > max_off for r, _, _ in self._delivered):
            # The queue is shorter than the checkpoint remembers (its tail was cut on recovery): new
            # entries at those offsets were never seen, so they must not count as delivered.
            log.warning("timer checkpoint is past the timer queue end %d; clamped", max_off)
            self._delivered = [(min(r, max_off), d, q) for r, d, q in self._delivered]
            self._start_offset = min(self._start_offset, max_off)
        self._scan_offset = max(self._start_offset, store.get_min_offset_in_queue(TIMER_TOPIC, 0), 0)
        self._horizon_ms = now + self.window_ms

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
            if self._checkpoint_writer is not None:
                await asyncio.gather(self._checkpoint_writer, return_exceptions=True)
            self.persist()

    def on_arrival(self) -> None:
        """A message arrived in the timer topic (called in the loop thread)."""
        if self._event is not None:
            self._event.set()

    def runtime_info(self) -> dict[str, str]:
        max_off = self.ctrl.store.get_max_offset_in_queue(TIMER_TOPIC, 0)
        return {"timerReadBehind": str(max(0, max_off - self._scan_offset)),
                "timerOffsetBehind": str(max(0, max_off - self.oldest_pending_offset())),
                "timerCongestNum": str(len(self.wheel)),
                "timerEnqueueCount": str(self.enqueued),
                "timerDequeueCount": str(self.delivered)}

    # --- reading the timer queue ----------------------------------------------------------------------
    def _consume_queue(self):
        qs = self.ctrl.store.consume_queue_table.get(TIMER_TOPIC)
        return qs.get(0) if qs else None

    def _read_units(self, start: int, end: int, limit: int):
        """(first queue offset, units bytes, count) chunks of the timer queue in [start, end), up
        to `limit` units in all.  Units removed by retention come as (first, b"", count) so the
        reader moves past them."""
        cq = self._consume_queue()
        if cq is None:
            return
        off = start
        while off < end and limit > 0:
            found = cq.find_file(off)
            if found is None:
                low = cq.get_min_offset_in_queue()
                if off < low:
                    nxt = low
                else:  # a hole inside the queue: resume at the next file
                    per_file = cq.mapped_file_size // CQ_STORE_UNIT_SIZE
                    nxt = (off // per_file + 1) * per_file
                    log.warning("timer: queue offsets %d.. are unreadable; resuming at %d", off, nxt)
                nxt = min(max(nxt, off + 1), end)
                yield off, b"", nxt - off
                off = nxt
                continue
            mf, rel, wrote = found
            n = min((wrote - rel) // CQ_STORE_UNIT_SIZE, end - off, limit)
            try:
                buf = mf.native.read(rel, n * CQ_STORE_UNIT_SIZE)
            except ValueError:  # the file was deleted by retention meanwhile
                nxt = min(max(off + 1, cq.get_min_offset_in_queue()), end)
                yield off, b"", nxt - off
                off = nxt
                continue
            yield off, buf, n
            off += n
            limit -= n

    def _due_of(self, phys: int, size: int, tag: int) -> int | None:
        if tag >= _HASH_CODE_LIMIT:
            return tag
        # A rebuilt (hash) tag code: the record's TIMER_OUT_MS holds the due time.
        raw = self.ctrl.store.select_one_message_by_offset(phys, size)
        if raw is None:
            self.lost += 1
            log.error("timer: record at commit-log offset %d is gone (retention); not delivered", phys)
            return None
        value = string_to_properties(record_fields(raw)["properties_bytes"]).get(TIMER_OUT_MS)
        if value is None or not _INTEGER.fullmatch(value):
            log.error("timer: record at commit-log offset %d has no valid %s (%r); skipped", phys, TIMER_OUT_MS, value)
            return None
        return int(value)

    def _load(self, first: int, units: bytes, low_due: int, far: tuple) -> tuple:
        """Classify consume-queue units starting at queue offset `first`: entries due in
        [low_due, horizon) go into the wheel, later ones count as far.  Entries delivered before
        a restart are skipped.  `far` and the result: (far_low, far_min_due)."""
        far_low, far_min = far
        delivered = self._delivered
        horizon = self._horizon_ms
        wheel_add = self.wheel.add
        qoff = first
        for phys, size, tag in _UNIT.iter_unpack(units):
            if size != 0x7FFFFFFF:  # not a blank filler
                due = self._due_of(phys, size, tag)
                if due is not None and due >= low_due and not (delivered and _covered(delivered, qoff, due)):
                    if due < horizon:
                        wheel_add(due, qoff, phys, size)
                    else:
                        if far_low is None:
                            far_low = qoff
                        if far_min is None or due < far_min:
                            far_min = due
            qoff += 1
        return far_low, far_min

    def _drain(self) -> bool:
        """Read new timer-queue units into the wheel (or count them far); True if more remain."""
        end = self.ctrl.store.get_max_offset_in_queue(TIMER_TOPIC, 0)
        read_to = self._scan_offset
        far = (self._far_low, self._far_min_due)
        for first, units, n in self._read_units(read_to, end, _READ_CHUNK):
            far = self._load(first, units, _MIN_DUE, far)
            read_to = first + n
        self._far_low, self._far_min_due = far
        if read_to == self._scan_offset:
            return False
        self._scan_offset = read_to
        return read_to < end

    async def _advance_horizon(self, now: int) -> None:
        """Keep the window at least half ahead of now.  When it moves, the far entries that
        entered it are read again from the log (they were never held in memory)."""
        window = self.window_ms
        if now + window // 2 < self._horizon_ms:
            return
        if self._far_low is None:
            self._horizon_ms = now + window
            return
        old_horizon, self._horizon_ms = self._horizon_ms, now + window
        # Until the re-scan is done, the old far bookkeeping stays (a checkpoint taken meanwhile
        # must still count those entries as pending).
        off, end = self._far_low, self._scan_offset
        far = (None, None)
        while off < end:
            start = off
            for first, units, n in self._read_units(off, end, _READ_CHUNK):
                far = self._load(first, units, old_horizon, far)
                off = first + n
            if off == start:
                break  # the queue is gone (deleted topic): nothing far is left to find
            await asyncio.sleep(0)  # a long re-scan shares the loop
        self._far_low, self._far_min_due = far
        self.rescans += 1

    # --- delivery -------------------------------------------------------------------------------------------
    async def collect_due(self, now: int, limit: int = DELIVERY_BATCH) -> list:
        """One round's reading: move the window, read new units, and take up to `limit` entries
        due at `now` off the wheel, earliest first.  After re-putting them, the caller calls
        `delivered_through(now)`."""
        await self._advance_horizon(now)
        while self._drain():
            await asyncio.sleep(0)  # a long backlog (restart) is read in steps
        writer = self._checkpoint_writer
        if writer is not None and not writer.done() and self._pending_checkpoint is not None:
            # two batches are not on disk yet: let the checkpoint catch up, so a crash
            # re-delivers at most the batch being written and the one in flight
            await asyncio.gather(writer, return_exceptions=True)
        return self.wheel.pop_due(now, limit)

    async def _run(self) -> None:
        event = self._event
        while True:
            try:
                self.rounds += 1
                now = now_ms()
                due = await self.collect_due(now)
                if due:
                    ok = await self._deliver(due)
                    self.delivered_through(now)
                    self._persist_soon()
                    if not ok:
                        await asyncio.sleep(1)
                    continue
                waits = []
                nxt = self.wheel.next_due_ms()
                if nxt is not None:
                    waits.append(nxt - now)
                if self._far_low is not None:
                    waits.append(self._horizon_ms - self.window_ms // 2 - now)
                timeout = max(0, min(waits)) / 1000 if waits else None
                event.clear()
                if self.ctrl.store.get_max_offset_in_queue(TIMER_TOPIC, 0) > self._scan_offset or timeout == 0:
                    continue
                try:
                    await asyncio.wait_for(event.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer wheel delivery failed; retrying in 1s")
                await asyncio.sleep(1)

    def delivered_through(self, now: int) -> None:
        """Record a delivered round: every entry read so far that sorts before the wheel's next
        (due, queue offset), and is due at or before `now`, went out."""
        bound = (now + 1, -1)
        nxt = self.wheel.next_key()
        if nxt is not None and nxt < bound:
            bound = nxt
        r = self._scan_offset
        kept = [b for b in self._delivered if not (b[0] <= r and b[1:] <= bound)]
        if not any(b[0] >= r and b[1:] >= bound for b in kept):
            kept.append((r, *bound))
            kept.sort()
            del kept[:-_MAX_DELIVERED_BOUNDS]
        self._delivered = kept

    async def _deliver(self, entries: list) -> bool:
        """Re-put due entries in order; a failed put puts it and the rest back in the wheel."""
        store = self.ctrl.store
        flushes = []
        ok = True
        for i, (due, qoff, phys, size) in enumerate(entries):
            raw = store.select_one_message_by_offset(phys, size)
            if raw is None:
                self.lost += 1
                log.error("timer: record of queue offset %d (commit-log %d) is gone (retention); not delivered",
                          qoff, phys)
                continue
            inner = self._to_real(raw)
            if inner is None:
                continue
            result, fut = store.put_message_nowait(inner)
            if not result.is_ok():
                log.warning("timer: re-put to %s failed (%s: %s); retrying", inner.topic, result.status.name,
                            result.error)
                for e in entries[i:]:
                    self.wheel.add(*e)
                ok = False
                break
            self.delivered += 1
            if fut is not None:
                flushes.append(fut)
        for fut in flushes:  # group commit: the batch becomes durable together
            status = await asyncio.wrap_future(fut)
            if status is not PutMessageStatus.PUT_OK:
                log.warning("timer: re-put flush ended with %s", status)
        return ok

    @staticmethod
    def _to_real(raw: bytes) -> MessageExtBrokerInner | None:
        """The message to re-put: the parked record's fields, its properties as stored minus
        REAL_TOPIC / REAL_QID (edited as bytes; no properties dict on this path)."""
        msg = decode_messages(raw, decompress=False)[0]
        props = msg.raw_properties
        real = _REAL_PAIR.findall(props)
        real_topic = next((v for k, v in real if k == b"REAL_TOPIC"), None)
        if not real_topic:
            log.error("timer: message %s has no REAL_TOPIC; dropped", msg.msg_id)
            return None
        real_qid = next((v for k, v in real if k == b"REAL_QID"), b"0")
        return MessageExtBrokerInner(
            topic=real_topic.decode("utf-8"), queue_id=int(real_qid) if real_qid.isdigit() else 0, body=msg.body,
            flag=msg.flag, properties_bytes=_REAL_PAIR.sub(b"", props), sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp, born_host=host_port(msg.born_host), reconsume_times=msg.reconsume_times)
