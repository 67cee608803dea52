"""CommitLog: the one append-only log of every message record, its flush services and recovery.

The store's one put path (DefaultMessageStore.put_nowait) ends here; this layer owns every
position and decision, the native kernels (`_native/commit_log.pyx`) only write bytes where they
are told, from plain values.

* A message (`put_message`), checked and sized by the store before the lock: under the put lock
  its queue offset and store time are assigned, the segment rolls when the record does not fit
  (and the consume-queue file when its entry does not), and `put_record` encodes the record
  straight into the segment - with SYNC_FLUSH into a scratch buffer then pwritten - and writes its
  consume-queue entry; positions move after the bytes are written.
* A batch (`append`) is validated and sized before the lock; under it only its space is reserved
  (possibly over several segments); after the lock the items are encoded straight into that
  space in one pass (`encode_batch_into`: read item, write record, CRC).  With SYNC_FLUSH it is
  encoded before the lock and copied through the descriptor (`append_records` with the segment's fd).
* Puts are published - consume-queue entries, index work, extra dispatchers - in commit-log
  order: a batch encoded outside the lock holds a ticket, and a put taken meanwhile writes its
  queue entry only once the batch is published, so no reader sees a record before it is complete
  and no queue sees a later put before an earlier one.
* With SYNC_FLUSH, records reach the page cache with pwrite and become durable by fdatasync in
  the group commit (much cheaper than msync of mmap-dirtied pages on ext4).

A record never straddles segments: when it does not fit, the rest of the segment becomes a blank
record (int32 length, int32 0xCBD43194) and the put continues in the next segment.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import struct
import threading
import time

from rmq_core import record_layout as layout
from rmq_core.common.clock import now_ms
from rmq_core._native import commit_log as commit_log_native
from rmq_core._native import record_store

from rmq_core._native import group_commit as group_commit_native
from rmq_core.config import FlushDiskType
from rmq_core.message import SysFlag
from rmq_core.store.mapped_file import AllocateMappedFileService, MappedFileQueue
from rmq_core.store.service import FlushService, ServiceThread
from rmq_core.errors import StoreError
from rmq_core.store.types import PutMessageStatus

log = logging.getLogger("rmq.store")
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024  # buffers per pwritev
progress_log = logging.getLogger("rmq.progress")  # shown by the CLI even without -v

_CQ_ENTRY = struct.Struct(">qiq")
_time_ns = time.time_ns
put_record = commit_log_native.put_record



class EncodedMessages:
    """A batch ready for `CommitLog.append`, all for one queue."""

    __slots__ = ("records", "count", "tags", "topic", "queue_id", "sys_flag", "total", "body", "encode_args")

    def __init__(self, records, count, tags, topic, queue_id, sys_flag, total=0, body=None, encode_args=None):
        # Either `records` (encoded bytes, their tag codes in `tags`) or a plan: the records'
        # `total` bytes, the validated batch `body` and `encode_args` for encoding straight into
        # the reserved segment space.
        # (fields set in groups of at most three: as fast as one by one, CPython builds no tuple for those)
        self.total = total if records is None else len(records)
        self.body, self.encode_args = body, encode_args
        self.records, self.count, self.tags = records, count, tags
        self.topic, self.queue_id, self.sys_flag = topic, queue_id, sys_flag

    @property
    def uses_queue(self) -> bool:
        """Prepared and rolled-back transaction records get no consume-queue entry (RocketMQ)."""
        t = self.sys_flag & SysFlag.TRANSACTION_MASK
        return t not in (SysFlag.TRANSACTION_PREPARED_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE)


class AppendOutcome:
    __slots__ = ("status", "wrote_offset", "wrote_bytes", "store_timestamp", "logics_offset", "count",
                 "entries", "error", "end_offset")

    def __init__(self, status, wrote_offset=0, wrote_bytes=0, store_timestamp=0, logics_offset=0, count=0,
                 entries=None, error=None):
        # (in groups of at most three, as PutBatch's)
        self.status, self.error, self.store_timestamp = status, error, store_timestamp
        self.wrote_offset, self.wrote_bytes, self.end_offset = wrote_offset, wrote_bytes, wrote_offset + wrote_bytes
        self.logics_offset, self.count, self.entries = logics_offset, count, entries


class _TimedPutLock:
    """A CommitLog's put_lock, held with the holder's start noted (begin_time_in_lock)."""
    __slots__ = ("log",)

    def __init__(self, log: "CommitLog"):
        self.log = log

    def __enter__(self):
        log = self.log
        log._put_lock_acquire()
        log.begin_time_in_lock = _time_ns()

    def __exit__(self, *exc):
        log = self.log
        log.begin_time_in_lock = 0
        log._put_lock_release()


class CommitLog:
    def lock_time_mills(self) -> int:
        """How long the put holding put_lock has held it, in ms (0: none does)."""
        begin = self.begin_time_in_lock
        return max(0, (_time_ns() - begin) // 1_000_000) if begin else 0

    def __init__(self, config, allocator: AllocateMappedFileService | None = None, delay_levels_ms=None):
        self.config = config
        # SYNC_FLUSH appends through pwrite (durable by fdatasync at a fraction of msync's cost on
        # mmap-dirtied pages); ASYNC_FLUSH copies straight into the mapping.
        self.write_through_fd = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        if allocator is not None:
            allocator.write_through_fd = self.write_through_fd
        self.mapped_file_queue = MappedFileQueue(config.commit_log_dir, config.mapped_file_size_commit_log, allocator,
                                                 write_through_fd=self.write_through_fd)
        self.mapped_file_queue.max_used_ratio = config.disk_space_warning_level_ratio
        self.put_lock = threading.Lock()
        self._put_lock_acquire = self.put_lock.acquire
        self._put_lock_release = self.put_lock.release
        # when the put holding put_lock took it (time_ns; 0: none holds it) - RocketMQ's
        # beginTimeInLock, behind pageCacheLockTimeMills (mqadmin's PCWait)
        self.begin_time_in_lock = 0
        self._timed_put_lock = _TimedPutLock(self)
        self.accepting_puts = False  # the store's word: False makes a put that got here take nothing
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.last_store_timestamp = 0
        self.delay_levels_ms = list(delay_levels_ms or [])
        # largest record that fits an empty segment next to the 8-byte blank
        self.max_record_in_segment = config.mapped_file_size_commit_log - layout.MIN_BLANK
        if config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            self.flush_service: ServiceThread = GroupCommitService(self)
        else:
            self.flush_service = FlushRealTimeService(self)
        self.on_flushed = None  # callback(store_timestamp) -> checkpoint
        # Appends get tickets under the put lock and are published (dispatched to the consume
        # queues) in ticket order, so a batch encoded outside the lock into reserved space becomes
        # visible only once complete, and queues never see a later put before an earlier one.
        self._next_ticket = 1
        self._published = 0
        self._publish_cond = threading.Condition(threading.Lock())
        # SYNC_FLUSH: a single record is encoded here, then pwritten (put_record)
        self._scratch = bytearray(4096) if self.write_through_fd else None
        # Every byte below this offset is a whole, published record (or blank): what replication
        # may send.  A batch's space is reserved before it is encoded, so wrote_position can run
        # ahead of it; this moves in publication (commit-log) order.
        self.visible_offset = 0
        self._append_fd = None  # a slave's (segment, descriptor) append_data writes through

    # -- load ------------------------------------------------------------------------------------
    def load(self) -> bool:
        return self.mapped_file_queue.load()

    def start(self) -> None:
        self.flush_service.start()

    def shutdown(self) -> None:
        self.flush_service.shutdown()
        with self.put_lock:
            self._close_append_fd()

    # -- offsets ---------------------------------------------------------------------------------
    def get_min_offset(self) -> int:
        mf = self.mapped_file_queue.get_first_mapped_file()
        return mf.file_from_offset if mf is not None else -1

    def get_max_offset(self) -> int:
        return self.mapped_file_queue.get_max_offset()

    # -- put: one message ------------------------------------------------------------------------
    def put_message(self, topic, topic_b, queue_id, flag, body, props, sys_flag, born_ts, born_host, store_host,
                    reconsume_times, prepared, body_crc, total, tags, delay_level, cq, dispatch):
        """Store one message record of `total` bytes, checked and sized by the caller (born_ts 0:
        now; body_crc < 0: taken by the kernel; tags None: from the TAGS property).  Under the
        put lock its queue offset (`cq`: its consume queue, None for a record without a queue
        entry) and store time are assigned, the segment rolls when the record does not fit, and
        `_native/commit_log.pyx: put_record` writes the record and its consume-queue entry where
        this says; then `dispatch(topic, queue_id, phys, size, tags, store_ts, queue_offset,
        sys_flag, props)` (None: nothing beyond the queue).  Entry and dispatch follow commit-log
        order: a batch still being published goes first (see `append`).
        Returns (physical offset, store timestamp, queue offset, tag code), or None when the
        store stopped taking puts or no segment can be created; DiskFullError refuses the put
        before anything is written."""
        now = _time_ns() // 1_000_000
        if not born_ts:
            born_ts = now
        key = (topic, queue_id)
        self._put_lock_acquire()  # (a with block costs twice as much per put)
        self.begin_time_in_lock = _time_ns()
        try:
            if not self.accepting_puts:
                return None
            try:
                mf = self.mapped_file_queue.mapped_files[-1]
            except IndexError:
                mf = None
            if mf is None or mf.wrote_position + total + 8 > mf.file_size:
                mf = self._segment_for(total, cq, key)
                if mf is None:
                    return None
            wp = mf.wrote_position
            phys = mf.file_from_offset + wp
            store_ts = self.last_store_timestamp
            if now > store_ts:  # store time stays monotonic along the log
                store_ts = now
            if delay_level:  # a scheduled message's tag code is its delivery time
                levels = self.delay_levels_ms
                tags = store_ts + levels[min(delay_level, len(levels)) - 1]
            in_order = self._published == self._next_ticket - 1  # no batch being published
            cmap = None
            cpos = qoff = 0
            if cq is not None:
                qoff = self.topic_queue_table.get(key, 0)
                if in_order:
                    cfiles = cq.mapped_file_queue.mapped_files
                    cmf = cfiles[-1] if cfiles else None
                    if cmf is None or (cpos := cmf.wrote_position) + 20 > cmf.file_size \
                            or cmf.file_from_offset + cpos != qoff * 20:
                        cmf = cq.file_for_entry(qoff)
                        cpos = cmf.wrote_position
                    cmap = cmf.native
                else:
                    cq.prepare_entries(qoff, 1)
            fd = mf.fd
            if fd is None:
                fd = -1
            elif len(self._scratch) < total:
                self._scratch = bytearray(total * 2)
            tags = put_record(mf.native, wp, fd, self._scratch, cmap, cpos, topic_b, queue_id, flag, body, props,
                              sys_flag, born_ts, born_host, store_host, reconsume_times, prepared, body_crc, qoff,
                              phys, store_ts, tags)
            mf.wrote_position = wp + total
            self.last_store_timestamp = store_ts
            if cq is not None:
                self.topic_queue_table[key] = qoff + 1
            if in_order:
                self.visible_offset = phys + total
                if cmap is not None:
                    cmf.wrote_position = cpos + 20
                    cq.max_physic_offset = phys + total
                if dispatch is not None:
                    dispatch(topic, queue_id, phys, total, tags, store_ts, qoff, sys_flag, props)
                return phys, store_ts, qoff, tags
            ticket = self._next_ticket
            self._next_ticket = ticket + 1
        finally:
            self.begin_time_in_lock = 0
            self._put_lock_release()
        # a batch taken earlier is still being encoded: its queue entries (and dispatch) go first
        # (no closure here: it would turn this function's locals into cells on the put path)
        self._publish_in_order(ticket, phys + total, self._publish_put, cq, dispatch, topic, queue_id, phys, total,
                               tags, store_ts, qoff, sys_flag, props)
        return phys, store_ts, qoff, tags

    @staticmethod
    def _publish_put(cq, dispatch, topic, queue_id, phys, total, tags, store_ts, qoff, sys_flag, props) -> None:
        """A single put's publication, when it waited for its turn: its queue entry, then dispatch."""
        if cq is not None:
            cq.put_entries(_CQ_ENTRY.pack(phys, total, tags), qoff, 1)
        if dispatch is not None:
            dispatch(topic, queue_id, phys, total, tags, store_ts, qoff, sys_flag, props)

    def _publish_in_order(self, ticket: int, end: int, publish, *args) -> None:
        """Publication in commit-log order, the one place it is decided: wait until every put
        with an earlier ticket is published, run `publish(*args)` (its consume-queue entries and
        dispatch; None: nothing to publish), then make the log visible up to `end` and hand the
        turn to the next ticket - also when `publish` raised, so no later put waits forever."""
        with self._publish_cond:
            while self._published != ticket - 1:
                self._publish_cond.wait()
            try:
                if publish is not None:
                    publish(*args)
            finally:
                self.visible_offset = end
                self._published = ticket
                self._publish_cond.notify_all()

    def _segment_for(self, total, cq, key):
        """Under the put lock: the segment a record of `total` bytes goes into.  When the last one
        cannot take it (with room for the blank), the next segment is checked for first and the
        record's queue file readied (either may refuse the put with DiskFullError before anything
        is written), then the rest of the last one becomes the blank record."""
        mfq = self.mapped_file_queue
        mf = mfq.get_last_mapped_file(0, need_create=True)
        if mf is None or mf.wrote_position + total + layout.MIN_BLANK <= mf.file_size:
            return mf
        mfq.check_room_for_next()
        if cq is not None:
            cq.prepare_entries(self.topic_queue_table.get(key, 0), 1)
        commit_log_native.write_blank(mf.native, mf.wrote_position, -1 if mf.fd is None else mf.fd)
        mf.wrote_position = mf.file_size
        return mfq.get_last_mapped_file(0, need_create=True)

    # -- append ----------------------------------------------------------------------------------
    def append(self, enc: EncodedMessages, dispatch, prepare=None) -> AppendOutcome | None:
        """Append one batch.  Under the put lock: queue offset, store timestamp, and
        either the copy of pre-encoded records (fields filled in) or — for a planned batch — the
        reservation of its space; then `dispatch(enc, first_queue_offset, entries, store_ts,
        uses_queue)` in commit-log order (publication by ticket).  `prepare(enc, first_queue_offset)`
        runs under the lock before anything is written: it may refuse (raise DiskFullError) when
        the files the dispatch will need cannot be had.  So does a new segment: nothing of the
        put is written then.  None: the store stopped taking puts meanwhile."""
        direct = enc.records is None
        if not direct and enc.total > self.max_record_in_segment and enc.count == 1:
            return AppendOutcome(PutMessageStatus.MESSAGE_ILLEGAL,
                                 error=f"message of {enc.total} bytes does not fit a commit-log segment of "
                                       f"{self.config.mapped_file_size_commit_log} bytes")
        count = enc.count
        entries = bytearray(count * 20)
        mfq = self.mapped_file_queue
        uses_queue = enc.uses_queue
        chunks = None
        published = False
        with self._timed_put_lock:
            if not self.accepting_puts:
                return None
            key = (enc.topic, enc.queue_id)
            qoff = self.topic_queue_table.get(key, 0) if uses_queue else 0
            store_ts = now_ms()
            if store_ts < self.last_store_timestamp:
                store_ts = self.last_store_timestamp  # keep store time monotonic across records
            tags = enc.tags
            mf = mfq.get_last_mapped_file(0, need_create=True)
            if mf is None:
                return AppendOutcome(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, error="cannot create a commit-log segment")
            if mf.wrote_position + enc.total + layout.MIN_BLANK > mf.file_size:
                mfq.check_room_for_next()  # the put spills into the next segment: refuse it whole, now
            if prepare is not None:
                prepare(enc, qoff)
            wrote_offset = mf.file_from_offset + mf.wrote_position
            done = 0
            src_pos = 0
            first_offset = None
            if direct:
                chunks = []
                left = enc.total  # bytes of the records not placed yet
            while done < count:
                if direct:
                    wp = mf.wrote_position
                    if wp + left + layout.MIN_BLANK <= mf.file_size:
                        n, nbytes, eof = count - done, left, False  # the rest fits: no walk
                    else:  # split at the segment end (src_pos: the body position of item `done`)
                        topic_b, sys_flag, _, born_b, store_b, _, extra = enc.encode_args
                        n, nbytes, next_pos = record_store.fit_batch(enc.body, src_pos, count - done, topic_b, sys_flag,
                                                               born_b, store_b, extra, wp, mf.file_size)
                        eof = True
                        src_pos = next_pos
                    if n:
                        chunks.append((mf, wp, nbytes, done, n))
                    left -= nbytes
                else:  # (SYNC_FLUSH segments are written through their descriptor)
                    n, nbytes, eof = commit_log_native.append_records(
                        mf.native, mf.wrote_position, enc.records, src_pos, count - done, mf.file_from_offset,
                        qoff + done, store_ts, tags, done, entries, done * 20, -1 if mf.fd is None else mf.fd)
                if first_offset is None and n:
                    first_offset = mf.file_from_offset + mf.wrote_position
                mf.wrote_position += nbytes
                done += n
                if not direct:
                    src_pos += nbytes
                if eof:
                    if direct:
                        commit_log_native.write_blank(mf.native, mf.wrote_position)
                    mf.wrote_position = mf.file_size
                    mf = mfq.get_last_mapped_file(0, need_create=True)
                    if mf is None:
                        return AppendOutcome(PutMessageStatus.CREATE_MAPPED_FILE_FAILED,
                                             error="cannot create a commit-log segment")
            end = mf.file_from_offset + mf.wrote_position
            if first_offset is None:
                first_offset = wrote_offset
            if uses_queue:
                self.topic_queue_table[key] = qoff + count
            self.last_store_timestamp = store_ts
            ticket = self._next_ticket
            self._next_ticket = ticket + 1
            if not direct and self._published == ticket - 1:
                # nothing in flight before us: dispatch right here, under the put lock
                self._publish_in_order(ticket, end, dispatch, enc, qoff, entries, store_ts, uses_queue)
                published = True
        if not published:
            encoded = not direct
            try:
                if direct:
                    # encode outside the lock, straight into the reserved space
                    topic_b, sys_flag, born_ts, born_b, store_b, reconsume, extra = enc.encode_args
                    body_pos = 0
                    for cmf, pos, nbytes, first, n in chunks:
                        body_pos = commit_log_native.encode_batch_into(
                            cmf.native, pos, nbytes, enc.body, body_pos, n, topic_b, enc.queue_id, sys_flag, born_ts,
                            born_b, store_b, reconsume, extra, cmf.file_from_offset, qoff + first, store_ts,
                            entries, first * 20)
                    encoded = True
            finally:
                # a failed encode leaves a hole no queue points into
                self._publish_in_order(ticket, end, dispatch if encoded else None, enc, qoff, entries, store_ts,
                                       uses_queue)
        out = AppendOutcome(PutMessageStatus.PUT_OK, first_offset, enc.total, store_ts, qoff, count, entries)
        out.end_offset = end
        return out

    # -- replication -----------------------------------------------------------------------------
    def append_data(self, start_offset: int, data) -> bool:
        """A slave's append (RocketMQ's appendData): raw commit-log bytes of the master, unchanged,
        at `start_offset` — records, the end-of-segment blank, possibly a record cut at the end of
        a transfer chunk (its rest comes with the next).  `data`: a buffer, or a list of buffers
        that follow each other (the frames of one read: one call, one pwritev per segment).  A
        new segment is created where the bytes go (an empty slave starts at the master's last
        segment; a log whose only segment is empty starts over there too).  False when
        start_offset is not where this log ends (nothing is written).  The caller dispatches the
        whole records (DefaultMessageStore.append_to_commit_log)."""
        views = [memoryview(d).cast("B") for d in (data if isinstance(data, list) else (data,))]
        views.reverse()  # taken from the end
        mfq = self.mapped_file_queue
        with self.put_lock:
            if mfq.mapped_files and start_offset != mfq.get_max_offset():
                if not mfq.holds_no_bytes():
                    return False
                # an empty log starts where the master's bytes do (RocketMQ's empty slave has no
                # segment at all): its empty segment, left by an earlier start, is dropped
                log.info("slave log holds nothing: starting it at the master's offset %d", start_offset)
                self._close_append_fd()
                mfq.drop_empty()
            while views:
                if not views[-1]:
                    views.pop()
                    continue
                mf = mfq.get_last_mapped_file(start_offset, need_create=True)
                if mf is None:
                    raise OSError(f"cannot create a commit-log segment for offset {start_offset}")
                wp = mf.wrote_position
                if mf.file_from_offset + wp != start_offset:
                    raise StoreError(f"slave append at {start_offset} but segment {mf.path} ends at "
                                     f"{mf.file_from_offset + wp}")
                room = mf.file_size - wp
                parts, n = [], 0  # what goes into this segment (a buffer crossing its end is split)
                while views and n < room and len(parts) < _IOV_MAX:
                    v = views.pop()
                    if n + len(v) > room:
                        views.append(v[room - n:])
                        v = v[:room - n]
                    parts.append(v)
                    n += len(v)
                # through a descriptor (pwrite copies into the page cache the mapping reads: about
                # 4x a memcpy into fresh mapped pages, which fault one by one)
                fd = self._append_fd_for(mf)
                done = os.pwritev(fd, parts, wp)
                while done < n:  # a short write (rare on a file): the rest piece by piece
                    skip = done
                    for v in parts:
                        if skip < len(v):
                            done += os.pwrite(fd, v[skip:], wp + done)
                            break
                        skip -= len(v)
                mf.wrote_position = wp + n
                start_offset += n
            self.visible_offset = start_offset
        return True

    def _append_fd_for(self, mf) -> int:
        if mf.fd is not None:  # SYNC_FLUSH segments keep theirs
            return mf.fd
        held = self._append_fd
        if held is not None and held[0] is mf:
            return held[1]
        fd = os.open(mf.path, os.O_RDWR)
        self._close_append_fd()
        self._append_fd = (mf, fd)
        return fd

    def _close_append_fd(self) -> None:
        held, self._append_fd = self._append_fd, None
        if held is not None:
            os.close(held[1])

    def transfer_view(self, offset: int, max_size: int):
        """What a master sends its slave from `offset`: (memoryview of at most max_size published
        bytes of the segment holding it, straight from the mapping — release it soon: a mapping
        with a view exported cannot be closed), or None when nothing is there yet.  Never crosses
        a segment end: the next call starts in the next segment."""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        n = min(mf.wrote_position, self.visible_offset - mf.file_from_offset) - pos
        if n <= 0:
            return None
        try:
            return mf.view()[pos:pos + min(n, max_size)]
        except ValueError:  # closed by retention meanwhile
            return None

    # -- flush -----------------------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        ts = self.last_store_timestamp
        flushed = self.mapped_file_queue.flush(least_pages)
        if flushed:
            self.mapped_file_queue.store_timestamp = ts
            if self.on_flushed is not None:
                self.on_flushed(ts)
        return flushed

    def request_flush(self, next_offset: int, store_timestamp: int = 0) -> concurrent.futures.Future | None:
        """SYNC_FLUSH: a Future resolved with PUT_OK once bytes up to next_offset are durable
        (store_timestamp: of the record ending there, for the checkpoint)."""
        if isinstance(self.flush_service, GroupCommitService):
            return self.flush_service.put_request(next_offset, store_timestamp)
        self.flush_service.wakeup()
        return None

    # -- reading ---------------------------------------------------------------------------------
    def get_data(self, offset: int, size: int) -> bytes | None:
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos + size > mf.wrote_position or size <= 0:
            return None
        try:
            return mf.read(pos, size)
        except ValueError:  # the segment was closed by retention meanwhile
            return None

    def record_size_at(self, offset: int) -> int:
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return -1
        pos = offset - mf.file_from_offset
        if pos + 8 > mf.wrote_position:
            return -1
        head = mf.read(pos, 8)
        size, magic = struct.unpack(">iI", head)
        if magic != layout.MESSAGE_MAGIC_CODE or size < layout.RECORD_FIXED_V4 or pos + size > mf.wrote_position:
            return -1
        return size

    def pickup_store_timestamp(self, offset: int, size: int = 0) -> int:
        mf = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return -1
        try:
            ts = commit_log_native.record_store_timestamp(mf.native, offset - mf.file_from_offset)
        except ValueError:
            return -1
        return ts if ts else -1

    # -- recovery --------------------------------------------------------------------------------
    def recover_normally(self, clean_offset: int) -> int:
        """After a clean stop: trust the offset written at shutdown (no scan); without one, walk
        the last three segments without CRC checks (RocketMQ's recoverNormally)."""
        mfq = self.mapped_file_queue
        files = mfq.mapped_files
        if not files:
            return 0
        if 0 <= clean_offset <= files[-1].end_offset and clean_offset >= files[0].file_from_offset:
            keep = []
            for mf in files:
                if mf.end_offset <= clean_offset:
                    mf.set_positions(mf.file_size)
                    keep.append(mf)
                elif mf.file_from_offset <= clean_offset:
                    mf.set_positions(clean_offset - mf.file_from_offset)
                    keep.append(mf)
                else:
                    mf.destroy()
            mfq.mapped_files = keep
            mfq.flushed_where = clean_offset
            return clean_offset
        start = max(0, len(files) - 3)
        end = self._walk(start, check_crc=False, on_runs=None)
        mfq.truncate_dirty_files(end)
        mfq.flushed_where = end
        return end

    def recover_abnormally(self, min_timestamp: int, on_runs) -> int:
        """After a crash: start at the last segment whose first record is older than the
        checkpoint, verify every record (magic, size, physical offset, structure, CRC), cut the log
        at the first bad one, and feed the good records' consume-queue runs to on_runs(mf, runs)."""
        mfq = self.mapped_file_queue
        files = mfq.mapped_files
        if not files:
            return 0
        start = 0
        for i in range(len(files) - 1, -1, -1):
            ts = commit_log_native.record_store_timestamp(files[i].native, 0)
            if ts and ts <= min_timestamp:
                start = i
                break
        end = self._walk(start, check_crc=self.config.check_crc_on_recover, on_runs=on_runs)
        log.info("commit log recovered after an unclean stop: log ends at %d (walked from segment %s)",
                 end, os.path.basename(files[start].path))
        mfq.truncate_dirty_files(end)
        mfq.flushed_where = end
        return end

    def _walk(self, start_index: int, check_crc: bool, on_runs) -> int:
        files = self.mapped_file_queue.mapped_files
        end = files[start_index].file_from_offset
        last_ts = 0
        began = last_report = time.monotonic()
        for i in range(start_index, len(files)):
            mf = files[i]
            now = time.monotonic()
            if now - last_report >= 2.0:  # a big log takes a while: say how far it got
                last_report = now
                done = mf.file_from_offset - files[start_index].file_from_offset
                progress_log.info("recovering commit log: segment %d of %d, %.0f MiB verified (%.0f MiB/s)",
                                  i - start_index + 1, len(files) - start_index, done / 2**20,
                                  done / 2**20 / max(now - began, 1e-9))
            pos, reason, count, ts, runs = record_store.verify_records(
                mf.native, 0, mf.file_size, mf.file_from_offset, check_crc, on_runs is not None, self.delay_levels_ms)
            if ts:
                last_ts = max(last_ts, ts)
            if on_runs is not None and runs:
                on_runs(mf, runs)
            end = mf.file_from_offset + pos
            if reason == record_store.STOP_BLANK:
                continue
            if reason == record_store.STOP_CORRUPT:
                log.warning("commit log: bad record at offset %d in %s; the log is cut there", end, mf.path)
            break
        if last_ts:
            self.last_store_timestamp = last_ts
        return end


class FlushRealTimeService(FlushService):
    """ASYNC_FLUSH: every flushIntervalCommitLog ms flush if at least flushCommitLogLeastPages dirty
    pages (all of them every flushCommitLogThoroughInterval ms); a final full flush at stop."""

    name = "FlushRealTimeService"
    interval_key, least_pages_key = "flush_interval_commit_log", "flush_commit_log_least_pages"

    def __init__(self, commit_log: CommitLog):
        super().__init__(commit_log.config, commit_log.flush)
        self.commit_log = commit_log

    def thorough_ms(self) -> float:
        return self.config.flush_commit_log_thorough_interval

    def on_stop(self) -> None:
        self.commit_log.flush(0)


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH group commit (RocketMQ's GroupCommitService).

    Rounds are served natively (`_native/group_commit.pyx: GroupCommitGate`): a blocking put waits on the gate
    with the GIL released until the durable offset passes its record's end; this thread waits
    there for requests, fdatasyncs the current segment once for every put that asked before the
    round began, and wakes them one at a time, each woken writer waking the next when it waits
    again (the GIL is free then) — neither side needs the GIL between rounds, and a put costs one
    wake-up, not a herd of threads queueing on the GIL.  Puts that arrive during a round are
    covered by the next one.  Python takes over for what the gate cannot do alone: a round that
    spans segments (after a roll), Futures of `put_message_nowait` (one per batch of requests,
    resolved after the round that covers them), and bookkeeping (the checkpoint's timestamp).

    With an event loop attached (`attach_loop`, the asyncio broker), that loop resolves the
    Futures itself: the gate pings a descriptor the loop reads after each round that covers a
    Future, and this thread keeps serving rounds back to back — it never waits for the GIL (held
    by the loop while it puts) between two fdatasyncs."""

    name = "GroupCommitService"
    # How long the thread serves natively before it looks at the checkpoint timestamp again.
    SERVE_BUDGET_MS = 20

    def __init__(self, commit_log: CommitLog):
        super().__init__()
        self.commit_log = commit_log
        self.gate = group_commit_native.GroupCommitGate()
        commit_log.mapped_file_queue.durable_gate = self.gate
        self._serve_natively = True
        # put_request's Futures (native; the GIL is their lock)
        self.futures = group_commit_native.GroupCommitFutures(self.gate, concurrent.futures.Future)
        self._python_rounds = 0
        self._checkpoint_ts = 0
        self._attached = None  # (loop, read fd, write fd) while an event loop resolves the Futures

    @property
    def serve_natively(self) -> bool:
        """False: every round goes through commit_log.flush (tests simulate slow disks that way)."""
        return self._serve_natively

    @serve_natively.setter
    def serve_natively(self, value: bool) -> None:
        self._serve_natively = bool(value)
        self.gate.kick()  # a serve already running returns and the loop picks the new mode

    @property
    def rounds(self) -> int:
        """Flushes done (for tests and stats: puts per flush)."""
        return self.gate.rounds + self._python_rounds

    def put_request(self, next_offset: int, store_timestamp: int = 0) -> concurrent.futures.Future:
        """A Future resolved with PUT_OK once bytes below next_offset are durable (one Future is
        shared by every request made until a round covers them)."""
        return self.futures.request(next_offset, store_timestamp)

    def attach_loop(self, loop) -> None:
        """From `loop`'s thread: that loop resolves put_request's Futures from now on (their
        done-callbacks then run in the loop's thread).  Detach before the loop closes."""
        if self._attached is not None:
            raise RuntimeError("an event loop is already attached to the group commit")
        rfd, wfd = _notify_descriptors()
        try:
            loop.add_reader(rfd, self._on_ping, rfd)
        except BaseException:
            _close_descriptors(rfd, wfd)
            raise
        self._attached = (loop, rfd, wfd)
        self.futures.notify = True
        self.gate.set_notify_fd(wfd)
        self.gate.kick()  # a serve returning after each round for Futures stops doing so

    def detach_loop(self) -> None:
        """From the attached loop's thread: this thread resolves the Futures again."""
        att = self._unhook_loop()
        if att is None:
            return
        _forget_reader(att)
        self._resolve_futures()
        self.gate.kick()  # the serving thread looks at the Futures left (covered by a later round)

    def _unhook_loop(self):
        """Stop pinging the attached loop: returns its (loop, read fd, write fd), or None."""
        att, self._attached = self._attached, None
        if att is not None:
            self.futures.notify = False
            self.gate.set_notify_fd(-1)  # no write to the descriptor is under way once this returns
        return att

    def _on_ping(self, rfd: int) -> None:
        try:
            os.read(rfd, 4096)
        except (BlockingIOError, InterruptedError):
            pass  # drained by an earlier call: the Futures are looked at anyway
        self._resolve_futures()

    def await_flush(self, next_offset: int, timeout: float, store_timestamp: int = 0) -> PutMessageStatus:
        """Block (GIL released) until bytes below next_offset are durable."""
        r = self.gate.await_flushed(next_offset, store_timestamp, int(timeout * 1000))
        if r == group_commit_native.GC_OK:
            return PutMessageStatus.PUT_OK
        if r == group_commit_native.GC_TIMEOUT:
            return PutMessageStatus.FLUSH_DISK_TIMEOUT
        return PutMessageStatus.SERVICE_NOT_AVAILABLE

    def wakeup(self) -> None:
        self.gate.request(self.commit_log.mapped_file_queue.get_max_offset(), 0)

    def shutdown(self, timeout: float = 30.0) -> None:
        refused: concurrent.futures.Future = concurrent.futures.Future()
        refused.set_result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        self.futures.refuse(refused)
        att = self._unhook_loop()
        if att is not None:  # not detached by its loop: this thread answers the Futures left
            try:
                att[0].call_soon_threadsafe(_forget_reader, att)
            except RuntimeError:  # that loop is closed: its reader went with it
                _close_descriptors(att[1], att[2])
        self._stopped.set()
        self.gate.halt()
        super().shutdown(timeout)
        self.gate.stop()  # also when the thread never ran: later waiters are refused

    def _seal(self) -> bool:
        """Requests made so far are in the gate: the round after this covers their Future."""
        return self.futures.seal()

    def _loop(self) -> None:
        gate = self.gate
        mfq = self.commit_log.mapped_file_queue
        while not self._stopped.is_set():
            try:
                if self._attached is not None:
                    pending = False  # the loop resolves the Futures: serve without returning
                else:
                    if self._seal():
                        self._after_rounds()  # a round may already cover the requests just sealed
                    pending = self._seal()
                files = mfq.mapped_files
                mf = files[-1] if files else None
                fd = mf.fd if mf is not None and mf.fd is not None and self._serve_natively else -1
                if mf is None:
                    code, _ = gate.serve(-1, 0, 0, self.SERVE_BUDGET_MS, pending)
                else:
                    code, _ = gate.serve(fd, mf.file_from_offset, mf.end_offset, self.SERVE_BUDGET_MS, pending)
                if code == group_commit_native.GC_NEED_FLUSH:
                    self._seal()
                    self._flush_through_python()
                elif code == group_commit_native.GC_IO_ERROR:
                    log.error("group commit fdatasync failed: %s", os.strerror(gate.last_errno))
                    self._flush_through_python()  # retries, logs, and fails the Futures it cannot cover
                    time.sleep(0.01)
                self._after_rounds()
            except Exception:
                log.exception("%s: round failed", self.name)
        self.on_stop()

    def _flush_through_python(self) -> bool:
        ts = self.commit_log.last_store_timestamp
        mfq = self.commit_log.mapped_file_queue
        ok = True
        try:
            self.commit_log.flush(0)
        except OSError as e:
            log.error("group commit flush failed: %s", e)
            ok = False
        self._python_rounds += 1
        self.gate.complete(mfq.flushed_where, ts if ok else 0)
        if not ok:
            self._after_rounds(fail=True)
        return ok

    def _resolve_futures(self, fail: bool = False) -> None:
        """Resolve the Futures the durable offset covers; `fail`: the sealed ones not covered
        fail too (their round did)."""
        flushed = self.gate.flushed
        for fut, upto in self.futures.take_covered(flushed, fail):
            fut.set_result(PutMessageStatus.PUT_OK if flushed >= upto else PutMessageStatus.FLUSH_DISK_TIMEOUT)

    def _after_rounds(self, fail: bool = False) -> None:
        # With a loop attached the loop resolves the Futures (the gate pings it after the round):
        # resolving them here too would run their done-callbacks in this thread whenever a serve
        # returns before the loop has read its ping (a busy machine).  A failed round is answered
        # here at once.
        if fail or self._attached is None:
            self._resolve_futures(fail)
        ts = self.gate.flushed_timestamp
        if ts > self._checkpoint_ts:
            self._checkpoint_ts = ts
            self.commit_log.mapped_file_queue.store_timestamp = ts
            if self.commit_log.on_flushed is not None:
                self.commit_log.on_flushed(ts)

    def run_once(self) -> None:
        """One round through Python: flush what was asked and resolve the Futures it covers."""
        self._seal()
        if self.gate.requested > self.gate.flushed:
            self._flush_through_python()
        self._after_rounds()

    def on_stop(self) -> None:
        self._seal()
        self._flush_through_python()
        self._after_rounds(fail=True)  # a Future not covered by the final flush is answered too


def _notify_descriptors() -> tuple[int, int]:
    """(read, write) descriptors, non-blocking, for the gate to ping an event loop: one eventfd
    where there is one, else a pipe."""
    if hasattr(os, "eventfd"):
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    return rfd, wfd


def _close_descriptors(rfd: int, wfd: int) -> None:
    os.close(rfd)
    if wfd != rfd:
        os.close(wfd)


def _forget_reader(att) -> None:
    loop, rfd, wfd = att
    try:
        loop.remove_reader(rfd)
    finally:
        _close_descriptors(rfd, wfd)
