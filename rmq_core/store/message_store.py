"""DefaultMessageStore: the facade over the commit log, consume queues, index, checkpoint and the
background services (flush, consume-queue flush, retention), as RocketMQ's DefaultMessageStore.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import shutil
import struct
import threading
import time
from typing import Callable

from rmq_core import record_layout as layout
from rmq_core._native import record as record_native
from rmq_core._native import record_store
from rmq_core._native.commit_log import body_crc
from rmq_core._native.record import offset_msg_id
from rmq_core._native.record import properties_to_bytes
from rmq_core._native import cq as cq_native
from rmq_core.config import BrokerRole, FlushDiskType, MessageStoreConfig
from rmq_core.errors import DiskFullError, IllegalArgumentError, MessageTooLargeError, StoreError
from rmq_core.message import (MAX_PROPERTIES_LENGTH, MAX_TOPIC_LENGTH, MessageConst, SysFlag, TopicValidator,
                              string_to_properties)
from rmq_core.store.checkpoint import StoreCheckpoint
from rmq_core.common.clock import now_ms
from rmq_core.store.commit_log import CommitLog, EncodedMessages
from rmq_core.store.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue, ConsumeQueueExt
from rmq_core.store.flush_waits import FlushWaits
from rmq_core.store.ha import HAService
from rmq_core.store.lock_file import StoreLock
from rmq_core.store.mapped_file import AllocateMappedFileService, check_room, free_bytes, statvfs_of
from rmq_core.store.service import FlushService, ServiceThread
from rmq_core.store.types import (AppendMessageResult, BatchAppendMessageResult, DispatchRequest, GetMessageResult,
                                  GetMessageStatus, MessageExtBatch, MessageExtBrokerInner, PutMessageResult,
                                  PutMessageStatus, QueryMessageResult, encode_host, record_fields)

log = logging.getLogger("rmq.store")

_PUT_OK = PutMessageStatus.PUT_OK
_tuple_new = tuple.__new__  # builds a result named tuple without a Python frame
_SCHEDULE_TOPIC = TopicValidator.RMQ_SYS_SCHEDULE_TOPIC
# set in a prepared (0x4) and a rolled-back (0xC) transaction record: neither gets a queue entry
_NO_QUEUE_ENTRY_BIT = SysFlag.TRANSACTION_PREPARED_TYPE
# a record's host-address bits, set from the hosts it carries
_BORN_V6, _STORE_V6 = SysFlag.BORNHOST_V6, SysFlag.STOREHOST_V6
_HOST_V6 = _BORN_V6 | _STORE_V6
# a record's length without its hosts, body, topic and properties (docs/protocol.md §5)
_RECORD_FIXED = layout.RECORD_FIXED_NO_HOSTS + 3

# Entries one get_message call may scan (bounded time for a pull with a rare tag).
MAX_SCAN_ENTRIES_PER_GET = 16000
_MATCH = struct.Struct("=qii")
# A pull's records go out as views of the mapped log when they lie in at most this many runs of
# adjacent records per segment; more (scattered matches of a sparse tag) are copied into one body.
_MAX_RUN_VIEWS = 8


def _kept_queue_offsets(matches: bytearray, kept: list, base: int) -> list:
    """The queue offsets of the match ranges get_message kept (GetMessageResult.queue_offsets)."""
    out = []
    for a, b in kept:
        out += cq_native.match_queue_offsets(matches, a, b, base)
    return out


def disk_usage_ratio(path: str) -> float:
    """Used fraction (0..1) of the file system holding `path` (as shutil.disk_usage counts it)."""
    st = statvfs_of(path)
    if st is None or not st.f_blocks:
        return -1.0
    return (st.f_blocks - st.f_bavail) / st.f_blocks


class DefaultMessageStore:
    # while writes are refused for a full disk, a put looks again at most this often (statvfs)
    DISK_RECHECK_INTERVAL = 0.5
    # seconds a waiter of a SYNC_MASTER put gives the replication round's own syncFlushTimeout
    # answer (FLUSH_SLAVE_TIMEOUT) before giving up itself
    REPLICA_GRACE = 1.0

    def __init__(self, config: MessageStoreConfig, store_host: tuple[str, int] = ("127.0.0.1", 10911)):
        self.config = config
        self.store_host = (store_host[0], int(store_host[1]))
        self._store_host_b, self._store_host_v6 = encode_host(self.store_host)
        self._store_host_flag = SysFlag.STOREHOST_V6 if self._store_host_v6 else 0  # of every record
        self._host_cache: dict[tuple, tuple[bytes, bool]] = {self.store_host: (self._store_host_b, self._store_host_v6)}
        self.delay_levels_ms = config.delay_levels_ms
        self.allocator = AllocateMappedFileService(prefault=getattr(config, "warm_mapped_file_enable", False))
        self.commit_log = CommitLog(config, self.allocator, self.delay_levels_ms)
        self.commit_log.on_flushed = self._on_commit_log_flushed
        self.consume_queue_table: dict[str, dict[int, ConsumeQueue]] = {}
        self._cq_lock = threading.Lock()
        self.checkpoint: StoreCheckpoint | None = None
        self.dispatchers: list = []
        self.arriving_listeners: list[Callable] = []
        self.index_service = None
        # Disk usage is a function attribute so tests can simulate a full disk.
        self.disk_usage: Callable[[str], float] = disk_usage_ratio
        self._disk_full_error: str | None = None
        self._no_room_error: str | None = None  # a put found no room for a new file
        self._disk_checked_at = 0.0
        self._loaded = False
        self.store_lock = StoreLock(config.store_path_root_dir)
        self._running = False
        self._shutdown = False
        self.put_message_count = 0
        self._put_tps_base = (time.monotonic(), 0)
        self.flush_consume_queue_service = FlushConsumeQueueService(self)
        self.clean_commit_log_service = CleanCommitLogService(self)
        self._min_phy_offset_cleaned = -1
        self.index_build_service = None
        if config.message_index_enable:
            from rmq_core.store.index import IndexBuildService, IndexService

            self.index_service = IndexService(config)
            self.index_build_service = IndexBuildService(self)
        # what every put reads instead of working it out (kept by _refresh_put_path)
        self._refused = True  # not running, a slave, or the disk full: _check_writable says why
        self._record_dispatch = None  # a record's dispatch beyond its consume queue, or None
        self._listeners: tuple = ()
        self._sync_flush = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.ha_service = HAService(self)
        # SYNC_MASTER: a put's answer waits for a slave's acknowledgement (GroupTransferService)
        self._group_transfer = self.ha_service.group_transfer if config.broker_role is BrokerRole.SYNC_MASTER else None
        self._await_put = self._sync_flush or self._group_transfer is not None  # a put has something to wait for
        self._reput_offset = 0  # a slave: where the next record to dispatch begins (append_to_commit_log)
        self._reput_lock = threading.Lock()
        self._max_record = min(config.max_message_size, self.commit_log.max_record_in_segment)
        self._topic_bytes: dict[str, bytes] = {}  # checked topics, UTF-8
        self._flush_waits: FlushWaits | None = None  # await_durable_async's, for its event loop

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self):
        if not self.load():
            raise StoreError(f"message store under {self.config.store_path_root_dir!r} failed to load")
        self.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def load(self) -> bool:
        """Open the files and recover: a clean stop resumes without scanning; after an unclean
        stop (abort marker present) the log tail is verified record by record and cut at the first
        bad record, and consume queues (and index) are rebuilt from the log past the checkpoint."""
        if self._loaded:
            return True
        cfg = self.config
        os.makedirs(cfg.store_path_root_dir, exist_ok=True)
        self.store_lock.acquire()  # a second process on this directory stops here, naming the holder
        try:
            return self._load()
        except BaseException:
            self.store_lock.release()
            raise

    def _load(self) -> bool:
        cfg = self.config
        unclean = os.path.exists(cfg.abort_file)
        self.checkpoint = StoreCheckpoint(cfg.checkpoint_file)
        self.ha_service.load_epoch_cache()
        self.commit_log.load()
        self._load_consume_queues()
        if self.index_service is not None:
            # torn-put repair only; the re-dispatch below is idempotent for the index
            self.index_service.load(not unclean)
        for qs in self.consume_queue_table.values():
            for cq in qs.values():
                cq.recover()
        if unclean:
            max_phy = self._recover_after_crash()
        else:
            max_phy = self.commit_log.recover_normally(self.checkpoint.clean_shutdown_phys_offset)
            self._truncate_consume_queues(max_phy)
        min_phy = self.commit_log.get_min_offset()
        table = {}
        for topic, qs in self.consume_queue_table.items():
            for qid, cq in qs.items():
                if min_phy > 0:
                    cq.correct_min_offset(min_phy)
                table[(topic, qid)] = cq.get_max_offset_in_queue()
        self.commit_log.topic_queue_table = table
        self.commit_log.visible_offset = max_phy
        # what the consume queues cover: a slave's log may end inside a record (a transfer chunk
        # ends anywhere), whose dispatch waits for its rest
        covered = max((cq.max_physic_offset for qs in self.consume_queue_table.values() for cq in qs.values()),
                      default=-1)
        self._reput_offset = min(max_phy, max(covered, min_phy, 0))
        if self.index_build_service is not None:
            # recovery indexed every record it walked; a clean stop left the index complete
            self.index_build_service.processed_timestamp = self.commit_log.last_store_timestamp
        self._loaded = True
        log.info("message store loaded from %s (%s stop): commit log %d..%d, %d consume queues",
                 cfg.store_path_root_dir, "unclean" if unclean else "clean", self.get_min_phy_offset(),
                 max_phy, sum(len(q) for q in self.consume_queue_table.values()))
        return True

    def _load_consume_queues(self) -> None:
        root = self.config.consume_queue_dir
        if not os.path.isdir(root):
            return
        for topic in sorted(os.listdir(root)):
            tdir = os.path.join(root, topic)
            if not os.path.isdir(tdir):
                continue
            for q in sorted(os.listdir(tdir)):
                if not q.isdigit():
                    continue
                cq = ConsumeQueue(topic, int(q), root, self.config.mapped_file_size_consume_queue)
                cq.load()
                self._attach_ext(cq, load=True)
                self.consume_queue_table.setdefault(topic, {})[int(q)] = cq

    def _attach_ext(self, cq: ConsumeQueue, load: bool = False) -> None:
        if self.config.enable_consume_queue_ext:
            cq.ext = ConsumeQueueExt(cq.topic, cq.queue_id, self.config.consume_queue_ext_dir,
                                     self.config.mapped_file_size_consume_queue,
                                     self.config.bit_map_length_consume_queue_ext)
            if load:
                cq.ext.load()

    def _truncate_consume_queues(self, max_phy: int, live: bool = False) -> None:
        for qs in self.consume_queue_table.values():
            for cq in qs.values():
                if cq.get_last_offset() > max_phy:
                    cq.truncate_dirty_logic_files(max_phy, live)

    def _recover_after_crash(self) -> int:
        """One verified walk of the log from the checkpoint; then consume queues are cut at the
        log's new end and the walked records re-dispatched (consume queues skip the entries they
        already hold; the index skips what it already covers)."""
        pending = []

        def on_runs(mf, runs):
            pending.extend(runs)

        start_ts = self.checkpoint.get_min_timestamp()
        if self.index_service is not None:
            start_ts = min(start_ts, self.checkpoint.index_msg_timestamp)  # RocketMQ getMinTimestampIndex
        max_phy = self.commit_log.recover_abnormally(start_ts, on_runs)
        self._truncate_consume_queues(max_phy)
        if self.index_service is not None:
            self.index_service.truncate_after(max_phy)
        self._dispatch_runs(pending)
        return max_phy

    def _dispatch_runs(self, runs) -> None:
        """Dispatch records found by a walk of the log (record_store.verify_records' runs of one
        queue's consecutive entries) as their puts would have been: consume-queue entries (those
        a queue already holds are skipped), then the index and the extra dispatchers — recovery
        and a slave's appended records (see append_to_commit_log)."""
        builder = self.index_build_service
        for topic, qid, first, count, entries, _max_ts in runs:
            cq = self.find_consume_queue(topic, qid)
            if cq.ext is not None:
                # dispatchers first: they compute the filter bit maps the ext keeps
                for req in self._dispatch_extra_from_entries(topic, qid, first, count, entries):
                    if req.consume_queue_offset >= cq.get_max_offset_in_queue():
                        cq.ext.put(req.consume_queue_offset, req.store_timestamp, req.bit_map)
                cq.put_entries(entries, first, count)
                continue
            cq.put_entries(entries, first, count)
            if not self.dispatchers and builder is not None and builder.accepting:
                builder.submit((topic, bytes(entries), count))  # read back from the log by the builder thread
            elif self.dispatchers or self.index_service is not None:
                self._dispatch_extra_from_entries(topic, qid, first, count, entries)

    # -- replication -------------------------------------------------------------------------------
    def append_to_commit_log(self, start_offset: int, data) -> bool:
        """A slave's append of the master's raw commit-log bytes at start_offset (RocketMQ's
        appendToCommitLog): written unchanged (CommitLog.append_data), then every record they
        complete is dispatched — consume queues, index, extra dispatchers, arriving listeners (a
        pull held on this slave wakes) — by the recovery walk.  False when start_offset is not
        where the log ends."""
        if self._shutdown:
            raise StoreError("message store is shut down")
        if not self.commit_log.append_data(start_offset, data):
            return False
        self.dispatch_appended()
        return True

    def dispatch_appended(self) -> None:
        """Dispatch the whole records between the reput offset and the log end (RocketMQ's
        ReputMessageService on a slave): the native walk of recovery; its runs of one queue's
        consecutive records are joined per queue (producers spread a burst over queues: one
        consume-queue write per queue, not per record); a record cut at the log end waits for
        its rest.  The HA client calls this once per read of frames it appended."""
        with self._reput_lock:
            self._reput()

    def _reput(self) -> None:
        mfq = self.commit_log.mapped_file_queue
        offset = max(self._reput_offset, mfq.get_min_offset())
        runs = []
        last_ts = 0
        while True:
            mf = mfq.find_mapped_file_by_offset(offset)
            if mf is None:
                break
            pos = offset - mf.file_from_offset
            end = mf.wrote_position
            if pos >= end:
                break
            stop, reason, _count, ts, found = record_store.verify_records(
                mf.native, pos, end, mf.file_from_offset, False, True, self.delay_levels_ms)
            runs += found
            if ts > last_ts:
                last_ts = ts
            if reason == record_store.STOP_BLANK:
                offset = mf.end_offset
                continue
            offset = mf.file_from_offset + stop
            break
        if not runs:
            self._reput_offset = offset
            return
        builder = self.index_build_service
        if self.dispatchers or self.config.enable_consume_queue_ext or builder is None or not builder.accepting:
            self._dispatch_runs(runs)  # record by record, in log order
        else:
            for topic, qid, first, count, entries, _ts in _join_runs(runs):
                self.find_consume_queue(topic, qid).put_entries(entries, first, count)
            for run in runs:  # the index is built in log order: it skips what it already covers
                builder.submit((run[0], run[4], run[3]))
        table = self.commit_log.topic_queue_table
        for topic, qid, first, count, _entries, _ts in runs:
            table[(topic, qid)] = first + count
        if last_ts > self.commit_log.last_store_timestamp:
            self.commit_log.last_store_timestamp = last_ts
        self._reput_offset = offset  # (after the queues: what is dispatched is readable)
        self.put_message_count += sum(r[3] for r in runs)
        if self._listeners:
            last = {}  # a queue's last run: its listeners hear of its newest entry once
            for run in runs:
                last[(run[0], run[1])] = run
            for topic, qid, first, count, entries, ts in last.values():
                phys, size, tags = struct.unpack_from(">qiq", entries, (count - 1) * 20)
                self._notify_listeners(topic, qid, first + count, tags, ts, phys, size)

    def truncate_to(self, offset: int) -> None:
        """Cut the log of this running store at `offset` (controller mode: a slave cuts what its
        new master does not hold, DefaultMessageStore's truncateFiles in RocketMQ 5), so that
        afterwards get_max_phy_offset() == offset, no pull serves a record past it and appends
        continue there.  Only on a store that takes no puts (a slave: its HA client thread, the
        only writer, calls this itself); `offset` must be a record boundary (StoreError names it
        otherwise).  An offset below the log's first offset empties the log (a fresh log then,
        max offset 0).

        Order: the index builder's queue is drained first (it reads the records back), then the
        consume queues (and their ext) are cut — pulls stop seeing the entries — then the index,
        then the commit log (its tail zeroed and made durable at once: a crash must not bring the
        cut bytes back), and last every cached end: the visible offset, topic_queue_table, the
        reput offset, the HA progress and the last store timestamp."""
        if not self._loaded or self._shutdown:
            raise StoreError("truncate_to: the message store is not loaded or is shut down")
        cl = self.commit_log
        mfq = cl.mapped_file_queue
        with self._reput_lock, cl.put_lock:
            if cl.accepting_puts:
                raise StoreError(f"truncate_to({offset}): this store takes puts (brokerRole "
                                 f"{self.config.broker_role.value}): only a store that takes none may be cut")
            max_phy = mfq.get_max_offset()
            if offset == max_phy:
                return
            if offset > max_phy:
                raise StoreError(f"truncate_to({offset}): the commit log ends at {max_phy}")
            last_ts = self._check_record_boundary(offset)
            if self.index_build_service is not None:
                self.index_build_service.drain()
            self._truncate_consume_queues(offset, live=True)
            if self.index_service is not None:
                self.index_service.truncate_after(offset)
            mfq.truncate_dirty_files(offset, live=True)
            cl._close_append_fd()  # (its segment may be gone)
            end = mfq.get_max_offset()
            cl.visible_offset = end
            table = {}
            for topic, qs in self.consume_queue_table.items():
                for qid, cq in qs.items():
                    table[(topic, qid)] = cq.get_max_offset_in_queue()
            cl.topic_queue_table = table
            self._reput_offset = min(self._reput_offset, end)
            if last_ts:
                cl.last_store_timestamp = last_ts
            ha = self.ha_service
            ha.push_to_slave_max_offset = min(ha.push_to_slave_max_offset, end)
            ha.transferred_offset = min(ha.transferred_offset, end)
        log.warning("commit log cut at offset %d (it ended at %d)", offset, max_phy)

    def cut_partial_record(self) -> int:
        """A slave becoming master: its log may end inside a record (a transfer chunk ends
        anywhere); what it holds is dispatched and the log cut at the end of its last whole
        record, so its first put does not follow half a record.  Returns the log end."""
        self.dispatch_appended()
        end = self._reput_offset
        if end < self.commit_log.get_max_offset():
            self.truncate_to(max(end, 0))
        return self.commit_log.get_max_offset()

    def _check_record_boundary(self, offset: int) -> int:
        """StoreError unless a record (or a segment) begins at `offset`: the records of its segment
        are walked up to it.  Returns the store time of the last record before it in that
        segment (0: none)."""
        mfq = self.commit_log.mapped_file_queue
        mf = mfq.find_mapped_file_by_offset(offset)
        if mf is None or offset <= mf.file_from_offset:
            return 0  # a segment start, or before the log (it is emptied)
        pos = offset - mf.file_from_offset
        stop, reason, _n, ts, _runs = record_store.verify_records(mf.native, 0, pos, mf.file_from_offset, False,
                                                                   False, self.delay_levels_ms)
        if stop != pos or reason != record_store.STOP_END:
            raise StoreError(f"truncate_to({offset}): not a record boundary (the records of segment {mf.path} "
                             f"{'stop' if reason != record_store.STOP_BLANK else 'end in a blank'} at "
                             f"{mf.file_from_offset + stop})")
        return ts

    def update_ha_master_address(self, addr: str) -> None:
        """A slave: replicate from the master's HA listener at `addr` (host:port) from now on."""
        self.ha_service.update_master_address(addr)

    def ha_runtime_info(self) -> dict:
        """Replication state (RocketMQ's HA runtime fields).  A master: haConnectionNum,
        haConnectionInfo (per slave: addr, slaveAckOffset, diff = bytes behind, transferFromWhere),
        masterPutWhere, haPushToSlaveMaxOffset, haListenPort.  A slave: masterAddr, haConnected,
        haMasterOffset (the furthest offset the master's frames reached), slaveMaxOffset,
        slaveFallBehindBytes, lastReadTimestamp (monotonic seconds)."""
        return self.ha_service.runtime_info()

    def slave_fall_behind_bytes(self) -> int:
        """A master: how far its furthest slave is behind its log end (the whole log with no
        slave); a slave: how far it is behind what its master's frames showed."""
        if self.ha_service.is_master:
            return max(0, self.commit_log.get_max_offset() - self.ha_service.push_to_slave_max_offset)
        return self.ha_service.ha_client.fall_behind_bytes()

    def _dispatch_extra_from_entries(self, topic, qid, first, count, entries) -> list:
        reqs = []
        for i in range(count):
            phys, size, tags = struct.unpack_from(">qiq", entries, i * 20)
            raw = self.commit_log.get_data(phys, size)
            if raw is None:
                continue
            f = record_fields(raw)
            req = DispatchRequest(topic, qid, phys, size, tags, f["store_timestamp"], first + i, f["sys_flag"],
                                  f["prepared_transaction_offset"], f["properties_bytes"])
            self._run_extra_dispatchers(req)
            reqs.append(req)
        return reqs

    def apply_config(self) -> None:
        """Refresh what the store keeps of its config after a run-time update (updateBrokerConfig):
        everything else is read from the config where it acts."""
        cfg = self.config
        self._max_record = min(cfg.max_message_size, self.commit_log.max_record_in_segment)
        self.commit_log.mapped_file_queue.max_used_ratio = cfg.disk_space_warning_level_ratio
        if self._flush_waits is not None:
            self._flush_waits.timeout = cfg.sync_flush_timeout / 1000.0

    def start(self) -> None:
        if self._running:
            return
        if not self._loaded:
            self.load()
        with open(self.config.abort_file, "w") as f:
            f.write(str(os.getpid()))
        self.checkpoint.invalidate_clean_offset()
        self.check_disk_space()
        self.commit_log.start()
        if self.index_build_service is not None:
            self.index_build_service.start()
        self.flush_consume_queue_service.start()
        self.clean_commit_log_service.start()
        self._running = True
        self._shutdown = False
        self._refresh_put_path()
        self.ha_service.start()

    def shutdown(self) -> None:
        """Flush everything, write the checkpoint, remove the abort marker, close the files."""
        if self._shutdown:
            return
        self._shutdown = True
        was_running = self._running
        self._running = False
        self._refresh_put_path()
        self.ha_service.shutdown()  # no append from a master after this; waiting puts are answered
        with self.commit_log.put_lock:
            pass  # a put already under the lock finishes (and queues its index work) first
        self.clean_commit_log_service.shutdown()
        self.commit_log.shutdown()  # final flush
        self.flush_consume_queue_service.shutdown()
        self.allocator.shutdown()
        if self.index_build_service is not None:
            self.index_build_service.shutdown()  # builds what is still queued
        if self._loaded:
            self.commit_log.flush(0)
            self._flush_consume_queues(0)
            if self.index_service is not None:
                self.index_service.shutdown()
            self.checkpoint.flush(clean_shutdown_phys_offset=self.commit_log.get_max_offset())
            self.checkpoint.shutdown()
            if was_running:
                try:
                    os.remove(self.config.abort_file)
                except FileNotFoundError:
                    pass
            for qs in self.consume_queue_table.values():
                for cq in qs.values():
                    cq.shutdown()
            self.commit_log.mapped_file_queue.shutdown()
        self.store_lock.release()

    def destroy(self) -> None:
        """Remove every file of the store (tests, `delete_topics` of everything)."""
        self.shutdown()
        shutil.rmtree(self.config.store_path_root_dir, ignore_errors=True)

    # -- consume queues -------------------------------------------------------------------------
    def find_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        qs = self.consume_queue_table.get(topic)
        if qs is not None:
            cq = qs.get(queue_id)
            if cq is not None:
                return cq
        with self._cq_lock:
            qs = self.consume_queue_table.setdefault(topic, {})
            cq = qs.get(queue_id)
            if cq is None:
                cq = ConsumeQueue(topic, queue_id, self.config.consume_queue_dir,
                                  self.config.mapped_file_size_consume_queue)
                self._attach_ext(cq)
                qs[queue_id] = cq
            return cq

    def _get_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        qs = self.consume_queue_table.get(topic)
        return qs.get(queue_id) if qs is not None else None

    def get_consume_queue_table(self) -> dict[str, dict[int, ConsumeQueue]]:
        return {t: dict(qs) for t, qs in self.consume_queue_table.items()}

    # -- put -------------------------------------------------------------------------------------
    def _host(self, host) -> tuple[bytes, bool]:
        h = self._host_cache.get(host)
        if h is None:
            h = encode_host(host)
            if len(self._host_cache) < 4096:
                self._host_cache[host] = h
        return h

    def _refresh_put_path(self) -> None:
        """Keep what a put reads current: whether writes are refused, what a stored record is
        dispatched to besides its consume queue, the arriving listeners."""
        cfg = self.config
        self._refused = not (self._running and not self._shutdown and self._disk_full_error is None
                             and cfg.broker_role is not BrokerRole.SLAVE
                             and self.ha_service.in_sync_replicas_refusal() is None)
        self.commit_log.accepting_puts = not self._refused
        # (controller mode changes the role at run time)
        group_transfer = self.ha_service.group_transfer if cfg.broker_role is BrokerRole.SYNC_MASTER else None
        if group_transfer is not self._group_transfer:
            self._group_transfer = group_transfer
            self._flush_waits = None  # (its timeout answer depends on it)
        self._await_put = self._sync_flush or group_transfer is not None
        builder = self.index_build_service
        if self.dispatchers or cfg.enable_consume_queue_ext:
            self._record_dispatch = self._dispatch_record
        elif builder is not None and builder.accepting:
            self._record_dispatch = self._index_record  # queued for the builder thread
        elif self.index_service is not None:
            self._record_dispatch = self._dispatch_record  # recovery: built right here
        else:
            self._record_dispatch = None
        self._listeners = tuple(self.arriving_listeners)

    def _check_writable(self) -> PutMessageResult | None:
        if self._disk_full_error is not None and time.monotonic() - self._disk_checked_at >= self.DISK_RECHECK_INTERVAL:
            self.check_disk_space()  # writes resume as soon as space returns, not at the next retention round
        if self._shutdown or not self._running:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None,
                                    error="message store is not running (start() it first)" if not self._shutdown
                                    else "message store is shut down")
        if self.config.broker_role is BrokerRole.SLAVE:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, error="a slave store refuses writes")
        if self._disk_full_error is not None:
            return PutMessageResult(PutMessageStatus.DISK_FULL, None, error=self._disk_full_error)
        refusal = self.ha_service.in_sync_replicas_refusal()
        if refusal is not None:
            return PutMessageResult(PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, None, error=refusal)
        return None

    @staticmethod
    def _check_topic(topic: str) -> tuple[bytes | None, PutMessageResult | None]:
        topic_b = topic.encode("utf-8") if isinstance(topic, str) else b""
        if not topic_b or len(topic_b) > MAX_TOPIC_LENGTH:
            return None, PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None,
                                          error=f"topic {topic!r} is {len(topic_b)} bytes; it must be 1..{MAX_TOPIC_LENGTH}")
        return topic_b, None

    def _encode_batch(self, batch: MessageExtBatch):
        topic_b, err = self._check_topic(batch.topic)
        if err:
            return None, err
        born_b, born6 = self._host(batch.born_host)
        store_b, store6 = self._host(batch.store_host) if batch.store_host is not None else (self._store_host_b, self._store_host_v6)
        sys_flag = (batch.sys_flag & ~_HOST_V6) | (_BORN_V6 if born6 else 0) | (_STORE_V6 if store6 else 0)
        limit = min(self.config.max_message_size, self.commit_log.max_record_in_segment)
        # Through the mapping, a batch is validated and sized here and encoded into its reserved
        # segment space after the put lock; through the descriptor (SYNC_FLUSH) it is encoded here.
        plan = not self.commit_log.write_through_fd
        born_ts = batch.born_timestamp or now_ms()
        extra = batch.extra_properties or b""
        body = batch.body if type(batch.body) is bytes else bytes(batch.body)
        try:
            res = record_store.encode_batch(body, topic_b, batch.queue_id, sys_flag, born_ts, born_b, store_b,
                                      batch.reconsume_times, extra, limit, plan)
        except MessageTooLargeError as e:
            return None, PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None,
                                          error=f"message size {e.size} bytes exceeds maxMessageSize {self.config.max_message_size} bytes")
        except record_native.PropertiesSizeExceededError as e:
            return None, PutMessageResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, None, error=str(e))
        except (IllegalArgumentError, ValueError, TypeError) as e:
            return None, PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, error=str(e))
        if plan:
            _, count, total = res
            return EncodedMessages(None, count, None, batch.topic, batch.queue_id, sys_flag, total=total,
                                   body=body, encode_args=(topic_b, sys_flag, born_ts, born_b, store_b,
                                                           batch.reconsume_times, extra)), None
        records, count, tags = res
        return EncodedMessages(records, count, tags, batch.topic, batch.queue_id, sys_flag), None

    def _dispatch(self, enc: EncodedMessages, first_qoff: int, entries, store_ts: int, uses_queue: bool) -> None:
        """A batch's dispatch, in commit-log order: consume queue first, then the extra
        dispatchers — or, with the consume-queue ext, the dispatchers first (they compute the
        filter bit map the ext keeps)."""
        if uses_queue and self.config.enable_consume_queue_ext:
            cq = self.find_consume_queue(enc.topic, enc.queue_id)
            for req in self._dispatch_extra_from_entries(enc.topic, enc.queue_id, first_qoff, enc.count, entries):
                cq.ext.put(req.consume_queue_offset, req.store_timestamp, req.bit_map)
            cq.put_entries(entries, first_qoff, enc.count)
            return
        if uses_queue:
            self.find_consume_queue(enc.topic, enc.queue_id).put_entries(entries, first_qoff, enc.count)
        builder = self.index_build_service
        if not self.dispatchers and builder is not None and builder.accepting:
            builder.submit((enc.topic, entries, enc.count))  # read back from the log by the builder thread
        elif self.dispatchers or self.index_service is not None:
            self._dispatch_extra_from_entries(enc.topic, enc.queue_id, first_qoff, enc.count, entries)

    def _index_record(self, topic, queue_id, phys, size, tags, store_ts, qoff, sys_flag, props) -> None:
        """A message record's dispatch when the key index is the only one: queued for the builder
        thread (IndexBuildService.submit, inlined: nothing is read back on the put path)."""
        builder = self.index_build_service
        q = builder._queue
        q.append((topic, phys, store_ts, sys_flag, props))
        if builder._idle and len(q) >= builder.WAKE_BACKLOG:
            builder.wake()

    def _dispatch_record(self, topic, queue_id, phys, size, tags, store_ts, qoff, sys_flag, props) -> None:
        """A message record's dispatch to the index and the extra dispatchers (and, with the
        consume-queue ext, its unit from the bit map they computed)."""
        req = DispatchRequest(topic, queue_id, phys, size, tags, store_ts, qoff, sys_flag, 0, props)
        self._run_extra_dispatchers(req)
        if self.config.enable_consume_queue_ext and not sys_flag & _NO_QUEUE_ENTRY_BIT:
            self.find_consume_queue(topic, queue_id).ext.put(qoff, store_ts, req.bit_map)

    def _run_extra_dispatchers(self, req: DispatchRequest) -> None:
        if self.index_service is not None:
            builder = self.index_build_service
            if builder is not None and builder.accepting:
                builder.submit((req.topic, req.commit_log_offset, req.store_timestamp, req.sys_flag,
                                req.properties_bytes))
            else:  # recovery (before start): build right here
                try:
                    self.index_service.build_index(req)
                except Exception:
                    log.exception("index dispatch failed for %r", req)
        for d in self.dispatchers:
            try:
                d.dispatch(req)
            except Exception:
                log.exception("dispatcher %r failed for %r", d, req)

    def _prepare_queue(self, enc: EncodedMessages, first_qoff: int) -> None:
        """Under the put lock, before the commit log is written: the consume-queue file(s) the
        dispatch will write into can be had (else DiskFullError refuses the whole put)."""
        if enc.uses_queue:
            self.find_consume_queue(enc.topic, enc.queue_id).prepare_entries(first_qoff, enc.count)

    def _put_batch(self, batch: MessageExtBatch, wait: bool):
        if self._refused:
            err = self._check_writable()
            if err is not None:
                return err, None
        enc, err = self._encode_batch(batch)
        if err is not None:
            return err, None
        try:
            outcome = self.commit_log.append(enc, self._dispatch, self._prepare_queue)
        except (DiskFullError, OSError) as e:
            return self._put_failed(e, enc.topic, enc.queue_id), None
        if outcome is None:
            return self._not_stored(), None
        if outcome.status is not PutMessageStatus.PUT_OK:
            return PutMessageResult(outcome.status, None, error=outcome.error), None
        count = outcome.count
        result = PutMessageResult(PutMessageStatus.PUT_OK, BatchAppendMessageResult(
            outcome.wrote_offset, outcome.wrote_bytes, outcome.store_timestamp, outcome.logics_offset, count,
            outcome.entries, self._store_host_b))  # per-record ids and offsets are built when first read
        self.put_message_count += count
        self._notify_arriving(enc, outcome)
        if self._await_put:
            return self._flush_for(result, outcome.end_offset, outcome.store_timestamp, wait)
        return result, None

    def _put_failed(self, e: Exception, topic: str, queue_id: int) -> PutMessageResult:
        """The answer to a put the commit log refused (DiskFullError) or failed to write."""
        if isinstance(e, DiskFullError):
            msg = f"{e}: writes are refused"
            if self._disk_full_error is None:
                log.error("put to %s-%d refused: %s", topic, queue_id, msg)
            self._no_room_error = self._disk_full_error = msg
            self._disk_checked_at = time.monotonic()
            self._refresh_put_path()
            return PutMessageResult(PutMessageStatus.DISK_FULL, None, error=msg)
        # e.g. no space left for a new segment: the broker answers with the reason
        log.error("put to %s-%d failed: %s", topic, queue_id, e)
        self.check_disk_space()
        return PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, None, error=f"commit log write failed: {e}")

    def _not_stored(self) -> PutMessageResult:
        """The answer to a put the commit log did not take: writes stopped meanwhile, or no segment."""
        return self._check_writable() or PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, None,
                                                          error="cannot create a commit-log segment")

    def _flush_for(self, result: PutMessageResult, end: int, store_ts: int, wait: bool):
        """What a stored put waits for (RocketMQ's handleDiskFlushAndHA).  SYNC_FLUSH alone: a
        blocking put waits on the group commit's gate here (no Future needed); else the Future of
        the round that covers the put.  SYNC_MASTER: the Future of the replication round that
        covers it (GroupTransferService.request), which under SYNC_FLUSH also waits for the
        flush; a blocking put waits on it here."""
        gt = self._group_transfer
        if gt is None:
            if wait:
                return self._await_durable(result, end), None
            return result, self.commit_log.request_flush(end, store_ts)
        fut = gt.request(end, self.commit_log.request_flush(end, store_ts) if self._sync_flush else None)
        if wait:
            return self._await_durable(result, fut), None
        return result, fut

    def _await_durable(self, put_result: PutMessageResult, fut) -> PutMessageResult:
        """SYNC_FLUSH: wait for the group commit that covers the put (`fut`: the round's Future,
        or the end offset to wait for on the group commit's gate, GIL released)."""
        timeout = self.config.sync_flush_timeout / 1000.0
        if type(fut) is int:
            status = self.commit_log.flush_service.await_flush(fut, timeout,
                                                                put_result.append_result.store_timestamp)
        else:
            try:
                # (a replication round is answered by its own deadline: this is a backstop)
                status = fut.result(timeout=timeout + (self.REPLICA_GRACE if self._group_transfer else 0))
            except concurrent.futures.TimeoutError:
                status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT if self._group_transfer else \
                    PutMessageStatus.FLUSH_DISK_TIMEOUT
        return self._durable_answer(put_result, status)

    # --- event loops (the asyncio broker) -----------------------------------------------------------
    def attach_event_loop(self, loop=None) -> None:
        """SYNC_FLUSH: the running event loop (or `loop`) resolves the group commit's Futures
        from now on, so the commit thread serves fdatasync rounds back to back instead of waiting
        for the GIL between them (GroupCommitService.attach_loop).  Call from the loop's thread and
        detach before the loop closes.  Does nothing under ASYNC_FLUSH."""
        fs = self.commit_log.flush_service
        if hasattr(fs, "attach_loop"):
            try:
                fs.attach_loop(loop if loop is not None else asyncio.get_running_loop())
            except NotImplementedError:  # a loop without add_reader: the commit thread answers
                log.info("event loop %r cannot watch a descriptor; group commits answered by the commit thread",
                         loop)

    def detach_event_loop(self) -> None:
        """From the attached loop's thread: the commit thread resolves the Futures again."""
        fs = self.commit_log.flush_service
        if hasattr(fs, "detach_loop"):
            fs.detach_loop()

    async def put_async(self, msg: MessageExtBrokerInner | MessageExtBatch) -> PutMessageResult:
        """put for a coroutine: under SYNC_FLUSH it awaits the group commit that covers the put
        without blocking the loop (many puts in flight share one fdatasync)."""
        result, fut = self.put_nowait(msg)
        if fut is None:  # refused, or nothing to wait for
            return result
        status = await self._flush_waits_here().wait(fut)
        return result if status is PutMessageStatus.PUT_OK else self._durable_answer(result, status)

    put_message_async = put_messages_async = put_async

    async def await_durable_async(self, put_result: PutMessageResult, fut) -> PutMessageResult:
        """The answer to a put_message(s)_nowait once its group commit (`fut`, None when there is
        nothing to wait for) is done."""
        if fut is None or not put_result.is_ok():
            return put_result
        return self._durable_answer(put_result, await self._flush_waits_here().wait(fut))

    def _flush_waits_here(self) -> FlushWaits:
        """The FlushWaits of the loop running in this thread."""
        waits = self._flush_waits
        # the thread check first: asyncio.get_running_loop() costs a getpid() system call
        if waits is None or waits.thread != threading.get_ident() or not waits.loop.is_running():
            timeout = self.config.sync_flush_timeout / 1000.0
            if self._group_transfer is not None:
                waits = FlushWaits(asyncio.get_running_loop(), timeout + self.REPLICA_GRACE,
                                   PutMessageStatus.FLUSH_SLAVE_TIMEOUT)
            else:
                waits = FlushWaits(asyncio.get_running_loop(), timeout)
            self._flush_waits = waits
        return waits

    def _durable_answer(self, put_result: PutMessageResult, status: PutMessageStatus) -> PutMessageResult:
        if status is PutMessageStatus.PUT_OK:
            return put_result
        if status is PutMessageStatus.FLUSH_DISK_TIMEOUT:
            return PutMessageResult(status, put_result.append_result, error=f"flush to disk did not finish within "
                                    f"syncFlushTimeout {self.config.sync_flush_timeout} ms")
        if status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT:
            ha = self.ha_service
            if ha.controller_mode:
                return PutMessageResult(status, put_result.append_result, error=(
                    f"the sync state set {sorted(ha.sync_state_set)} did not acknowledge the message within "
                    f"syncFlushTimeout {self.config.sync_flush_timeout} ms (allAckInSyncStateSet="
                    f"{str(self.config.all_ack_in_sync_state_set).lower()}, minInSyncReplicas="
                    f"{self.config.min_in_sync_replicas})"))
            return PutMessageResult(status, put_result.append_result, error=f"no slave acknowledged the message "
                                    f"within syncFlushTimeout {self.config.sync_flush_timeout} ms")
        if status is PutMessageStatus.SLAVE_NOT_AVAILABLE:
            return PutMessageResult(status, put_result.append_result, error=(
                f"no slave connected, or the slave more than haSlaveFallbehindMax "
                f"{self.config.ha_slave_fallbehind_max} bytes behind"))
        return PutMessageResult(status, put_result.append_result)

    def _notify_arriving(self, enc: EncodedMessages, outcome) -> None:
        """A batch's arrival: the listeners see its last record (read back for its properties)."""
        if not self._listeners or not enc.uses_queue:
            return
        max_after = outcome.logics_offset + outcome.count
        last = (outcome.count - 1) * 20
        phys, size, tags = struct.unpack_from(">qiq", outcome.entries, last)
        self._notify_listeners(enc.topic, enc.queue_id, max_after, tags, outcome.store_timestamp, phys, size)

    def _notify_listeners(self, topic, queue_id, max_after, tags, store_ts, phys, size) -> None:
        """The listeners hear of a queue's newest entry (its record read back for its properties)."""
        raw = self.commit_log.get_data(phys, size)
        props = record_fields(raw)["properties_bytes"] if raw is not None else b""
        for fn in self._listeners:
            try:
                fn(topic, queue_id, max_after, tags, store_ts, props)
            except Exception:
                log.exception("message arriving listener %r failed", fn)

    # -- put: one path for a message and a batch ---------------------------------------------------
    def put_nowait(self, msg: MessageExtBrokerInner | MessageExtBatch, wait: bool = False):
        """The one put path: store `msg` (a message or a MessageExtBatch) and answer
        (PutMessageResult, what to wait on under SYNC_FLUSH or None).  Here the message is
        checked and sized (a large body's CRC taken before the lock); the commit log places it
        under its put lock (CommitLog.put_message; a batch: CommitLog.append).  With `wait` this
        thread waits on the group commit's gate itself (a blocking put)."""
        if type(msg) is MessageExtBatch:
            return self._put_batch(msg, wait)
        if self._refused:
            err = self._check_writable()
            if err is not None:
                return err, None
        topic = msg.topic
        try:
            topic_b = self._topic_bytes[topic]
        except (KeyError, TypeError):
            topic_b, err = self._check_topic(topic)
            if err is not None:
                return err, None
            if len(self._topic_bytes) < 100_000:
                self._topic_bytes[topic] = topic_b
        props = msg.properties_bytes
        if props is None:
            try:
                props = properties_to_bytes(msg.properties)
            except IllegalArgumentError as e:
                return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, error=str(e)), None
        elif type(props) is not bytes:
            props = bytes(props)
        if len(props) > MAX_PROPERTIES_LENGTH:
            return PutMessageResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, None, error=f"message properties are "
                                    f"{len(props)} bytes, more than {MAX_PROPERTIES_LENGTH}"), None
        body = msg.body
        if type(body) is not bytes:
            body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        try:
            born_b, born6 = self._host_cache[msg.born_host]
        except KeyError:
            born_b, born6 = self._host(msg.born_host)
        if msg.store_host is None:
            store_b = self._store_host_b
            sys_flag = (msg.sys_flag & ~_HOST_V6) | (_BORN_V6 if born6 else 0) | self._store_host_flag
        else:
            store_b, store6 = self._host(msg.store_host)
            sys_flag = (msg.sys_flag & ~_HOST_V6) | (_BORN_V6 if born6 else 0) | (_STORE_V6 if store6 else 0)
        total = _RECORD_FIXED + len(born_b) + len(store_b) + len(body) + len(topic_b) + len(props)
        if total > self._max_record:
            limit = self.config.max_message_size
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, error=(
                f"message size {total} bytes exceeds maxMessageSize {limit} bytes" if total > limit
                else f"message size {total} bytes exceeds the commit-log segment size")), None
        tags = msg.tags_code
        delay = 0
        if tags is None and topic == _SCHEDULE_TOPIC:
            d = (msg.properties or string_to_properties(props)).get(MessageConst.DELAY_TIME_LEVEL)
            delay = int(d) if d and d.isdigit() else 0
        queue_id = msg.queue_id
        if sys_flag & _NO_QUEUE_ENTRY_BIT:
            cq = None
        else:
            try:
                cq = self.consume_queue_table[topic][queue_id]
            except (KeyError, TypeError):
                if type(queue_id) is not int or not -2**31 <= queue_id < 2**31:
                    return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None,
                                            error=f"queue id {queue_id!r} is not a 32-bit integer"), None
                cq = self.find_consume_queue(topic, queue_id)
        try:
            stored = self.commit_log.put_message(
                topic, topic_b, queue_id, msg.flag, body, props, sys_flag, msg.born_timestamp, born_b, store_b,
                msg.reconsume_times, msg.prepared_transaction_offset, body_crc(body) if len(body) > 4096 else -1,
                total, tags, delay, cq, self._record_dispatch)
        except (DiskFullError, OSError) as e:
            return self._put_failed(e, topic, queue_id), None
        except (OverflowError, TypeError, ValueError) as e:  # a field out of range (nothing was written)
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, error=str(e)), None
        if stored is None:
            return self._not_stored(), None
        phys, store_ts, qoff, tags = stored
        result = _tuple_new(PutMessageResult, (_PUT_OK, _tuple_new(AppendMessageResult, (
            phys, total, offset_msg_id(self._store_host_b, phys), store_ts, qoff, 1, None, None)), None))
        self.put_message_count += 1
        if cq is not None:
            for fn in self._listeners:
                try:
                    fn(topic, queue_id, qoff + 1, tags, store_ts, props)
                except Exception:
                    log.exception("message arriving listener %r failed", fn)
        if self._await_put:
            return self._flush_for(result, phys + total, store_ts, wait)
        return result, None

    def put(self, msg: MessageExtBrokerInner | MessageExtBatch) -> PutMessageResult:
        """A blocking put: the answer once the message (or batch) is stored (durable under SYNC_FLUSH)."""
        result, fut = self.put_nowait(msg, True)
        return result if fut is None else self._await_durable(result, fut)

    # RocketMQ's names (putMessage / putMessages), used by the broker and plugins
    put_message = put_messages = put
    put_message_nowait = put_messages_nowait = put_nowait

    def put_message_or_raise(self, msg: MessageExtBrokerInner) -> PutMessageResult:
        """put_message for direct users: raises MessageTooLargeError / DiskFullError /
        IllegalArgumentError / StoreError instead of returning a failed status."""
        r = self.put_message(msg)
        if r.is_ok():
            return r
        if r.status is PutMessageStatus.DISK_FULL:
            raise DiskFullError(r.error)
        if r.status is PutMessageStatus.MESSAGE_ILLEGAL and r.error and "exceeds maxMessageSize" in r.error:
            size = int(r.error.split()[2])
            raise MessageTooLargeError(size, self.config.max_message_size)
        if r.status in (PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED):
            raise IllegalArgumentError(r.error)
        raise StoreError(f"{r.status.value}: {r.error}")

    # -- get -------------------------------------------------------------------------------------
    def _in_disk_batch(self, out, n: int, stop: int, rel: int) -> tuple[int, int]:
        """RocketMQ's isTheBatchFull for messages no longer in memory (further behind the commit
        log's end than accessMessageInMemoryMaxRatio % of the machine's memory): a pull of them stops
        at maxTransferCountOnMessageInDisk messages / maxTransferBytesOnMessageInDisk bytes.  The
        scan's matches cut there: (matches kept, the scan's new stop)."""
        cfg = self.config
        memory = _total_memory() * cfg.access_message_in_memory_max_ratio // 100
        max_phy = self.commit_log.get_max_offset()
        total = 0
        for i in range(n):
            phys, size, idx = _MATCH.unpack_from(out, i * 16)
            if i and max_phy - phys > memory and (total + size > cfg.max_transfer_bytes_on_message_in_disk
                                                  or i >= cfg.max_transfer_count_on_message_in_disk):
                return i, rel + idx * CQ_STORE_UNIT_SIZE
            total += size
        return n, stop

    def get_message(self, group: str, topic: str, queue_id: int, offset: int, max_msgs: int,
                    message_filter=None, max_total_bytes: int | None = None,
                    max_transfer_count: int | None = None) -> GetMessageResult:
        """Up to max_msgs matching messages from `offset`, capped by maxTransferCountOnMessageInMemory
        (or `max_transfer_count`, which replaces that cap) and by bytes."""
        if self._shutdown:
            raise StoreError("message store is shut down")
        cq = self._get_consume_queue(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_off = cq.get_min_offset_in_queue()
        max_off = cq.get_max_offset_in_queue()
        if max_off == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, min_off, max_off)
        if offset < min_off:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if offset == max_off:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
        if offset > max_off:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, max_off, min_off, max_off)
        found = cq.find_file(offset)
        if found is None:
            nxt = (offset * CQ_STORE_UNIT_SIZE // cq.mapped_file_size + 1) * cq.mapped_file_size // CQ_STORE_UNIT_SIZE
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, nxt, min_off, max_off)
        mf, rel, end = found
        scan_end = min(end, rel + MAX_SCAN_ENTRIES_PER_GET * CQ_STORE_UNIT_SIZE)
        cfg = self.config
        cap = cfg.max_transfer_count_on_message_in_memory if max_transfer_count is None else max_transfer_count
        max_count = max(1, min(max_msgs, cap))
        max_bytes = max_total_bytes if max_total_bytes is not None else cfg.max_transfer_bytes_on_message_in_memory
        tags = None
        if message_filter is not None and message_filter.tag_codes is not None:
            tags = _tag_filter(message_filter.tag_codes)
        min_phy = self.commit_log.get_min_offset()
        out = bytearray(max_count * 16)
        ext_args = ()
        if cq.ext is not None and message_filter is not None and message_filter.bloom_bits is not None:
            loc = cq.ext.locate(offset)
            if loc is not None:
                ext_args = (loc[0], loc[1], loc[2], _bloom_test(message_filter))
        try:
            n, stop, removed = cq_native.cq_scan(mf.native, rel, scan_end, tags, max_count, max_bytes,
                                              max(min_phy, 0), out, *ext_args)
        except ValueError:  # the consume-queue file was deleted meanwhile
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, offset, min_off, max_off)
        if n and max_transfer_count is None and max_total_bytes is None:
            n, stop = self._in_disk_batch(out, n, stop, rel)
        next_begin = offset + (stop - rel) // CQ_STORE_UNIT_SIZE
        parts = []
        total = 0
        check_cl = message_filter is not None and message_filter.needs_commit_log_check
        i = 0
        if not check_cl:
            # the matches' records, segment by segment, as byte ranges of the mapped log: adjacent
            # records make one range (a batch-sent queue's are back to back), sent uncopied
            mfq = self.commit_log.mapped_file_queue
            kept = []  # [first, end) match ranges whose records are in parts
            file_runs = []
            while i < n:
                phys = _MATCH.unpack_from(out, i * 16)[0]
                seg = mfq.find_mapped_file_by_offset(phys)
                k = 0
                if seg is not None:
                    try:
                        runs, k = cq_native.segment_runs(out, i, n, seg.native, seg.file_from_offset,
                                                         seg.wrote_position)
                        if len(runs) > 2 * _MAX_RUN_VIEWS:  # scattered records: one copy is cheaper
                            parts.append(cq_native.copy_runs(seg.native, runs))
                        elif k:
                            view = seg.view().toreadonly()
                            parts += [view[runs[j]:runs[j + 1]] for j in range(0, len(runs), 2)]
                    except ValueError:  # deleted by retention meanwhile
                        k = 0
                if k == 0:
                    removed += 1
                    i += 1
                    continue
                total += sum(runs[1::2]) - sum(runs[::2])
                kept.append((i, i + k))
                file_runs.append((seg.path, seg.file_from_offset, runs))
                i += k
            count = sum(b - a for a, b in kept)
            offsets = functools.partial(_kept_queue_offsets, out, kept, offset)
        else:
            file_runs = None
            get_data = self.commit_log.get_data
            offsets = []
            for i in range(n):
                phys, size, idx = _MATCH.unpack_from(out, i * 16)
                data = get_data(phys, size)
                if data is None:
                    removed += 1
                    continue
                if not message_filter.is_matched_by_commit_log(
                        string_to_properties(record_fields(data)["properties_bytes"])):
                    continue
                parts.append(data)
                total += len(data)
                offsets.append(offset + idx)
            count = len(offsets)
        if parts:
            status = GetMessageStatus.FOUND
        else:
            status = GetMessageStatus.MESSAGE_WAS_REMOVING if removed else GetMessageStatus.NO_MATCHED_MESSAGE
        result = GetMessageResult(status, next_begin, min_off, max_off, parts, count, total, offsets=offsets,
                                  file_runs=file_runs if parts else None)
        if parts:
            # RocketMQ suggests the slave when the consumer lags by more than the memory share
            lag = self.commit_log.get_max_offset() - (_MATCH.unpack_from(out, (n - 1) * 16)[0])
            result.suggest_pulling_from_slave = lag > _total_memory() * cfg.access_message_in_memory_max_ratio // 100
        return result

    # -- queries ---------------------------------------------------------------------------------
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._get_consume_queue(topic, queue_id)
        return cq.get_max_offset_in_queue() if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._get_consume_queue(topic, queue_id)
        return cq.get_min_offset_in_queue() if cq is not None else -1

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, consume_queue_offset: int) -> int:
        cq = self._get_consume_queue(topic, queue_id)
        if cq is None:
            return 0
        e = cq.get_entry(consume_queue_offset)
        return e[0] if e is not None else 0

    def get_message_store_timestamp(self, topic: str, queue_id: int, consume_queue_offset: int) -> int:
        cq = self._get_consume_queue(topic, queue_id)
        if cq is None:
            return -1
        e = cq.get_entry(consume_queue_offset)
        if e is None:
            return -1
        return self.commit_log.pickup_store_timestamp(e[0], e[1])

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        cq = self._get_consume_queue(topic, queue_id)
        if cq is None:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, cq.get_min_offset_in_queue())

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Queue offset of the first message stored at or after timestamp_ms (binary search over
        the consume queue, reading store times from the log); max offset if none, min if all are
        later (RocketMQ's getOffsetInQueueByTime)."""
        cq = self._get_consume_queue(topic, queue_id)
        if cq is None:
            return 0
        lo = cq.get_min_offset_in_queue()
        hi = cq.get_max_offset_in_queue()
        if hi <= lo:
            return lo
        min_phy = self.commit_log.get_min_offset()

        def ts_at(off):
            e = cq.get_entry(off)
            if e is None or e[0] < min_phy:
                return -1
            return self.commit_log.pickup_store_timestamp(e[0], e[1])

        # skip entries whose records were deleted
        while lo < hi and ts_at(lo) < 0:
            lo += 1
        a, b = lo, hi
        while a < b:
            mid = (a + b) // 2
            t = ts_at(mid)
            if t < timestamp_ms:
                a = mid + 1
            else:
                b = mid
        return a

    def select_one_message_by_offset(self, phys_offset: int, size: int | None = None) -> bytes | None:
        if size is None:
            size = self.commit_log.record_size_at(phys_offset)
            if size <= 0:
                return None
        return self.commit_log.get_data(phys_offset, size)

    def look_message_by_offset(self, phys_offset: int, size: int | None = None, decompress: bool = True):
        """The message stored at `phys_offset`; decompress=False keeps a compressed body and its
        sysFlag bits as stored (RocketMQ's lookMessageByOffset, for a send-back that stores it again)."""
        raw = self.select_one_message_by_offset(phys_offset, size)
        if raw is None:
            return None
        from rmq_core.codec import decode_messages  # the client-side decoder (codec owns MessageExt)

        msgs = decode_messages(raw, decompress=decompress)
        return msgs[0] if msgs else None

    def query_message(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> QueryMessageResult:
        result = QueryMessageResult()
        if self.index_service is None:
            return result
        if self.index_build_service is not None:
            self.index_build_service.drain()  # a put that returned is found (read-your-writes)
        q = self.index_service.query_offset(topic, key, max_num, begin_ts, end_ts)
        result.index_last_update_timestamp = q.index_last_update_timestamp
        result.index_last_update_phyoffset = q.index_last_update_phyoffset
        parts = []
        for off in q.phy_offsets:
            raw = self.select_one_message_by_offset(off)
            if raw is None:
                continue
            f = record_fields(raw)
            if f["topic"] != topic:
                continue
            parts.append(raw)
            result.phys_offsets.append(off)
        result.buffer = b"".join(parts)
        result.message_count = len(parts)
        return result

    def get_max_phy_offset(self) -> int:
        return self.commit_log.get_max_offset()

    def get_min_phy_offset(self) -> int:
        return self.commit_log.get_min_offset()

    def delete_topics(self, topics: set[str]) -> None:
        with self.commit_log.put_lock:
            for t in topics:
                qs = self.consume_queue_table.pop(t, None)
                if not qs:
                    continue
                for qid, cq in qs.items():
                    cq.destroy()
                    self.commit_log.topic_queue_table.pop((t, qid), None)
                try:
                    os.rmdir(os.path.join(self.config.consume_queue_dir, t))
                except OSError:
                    pass

    def clean_expired_consumer_queue(self) -> list[tuple[str, int]]:
        """RocketMQ's cleanExpiredConsumerQueue (mqadmin cleanExpiredCQ): a consume queue whose
        last entry points below the commit log's first offset (all its messages deleted) is
        destroyed; a topic left without queues leaves the table.  The schedule topic is kept.
        Returns the (topic, queue id)s removed."""
        from rmq_core.message import TopicValidator
        min_phy = self.commit_log.get_min_offset()
        removed = []
        with self.commit_log.put_lock:
            for topic, qs in list(self.consume_queue_table.items()):
                if topic == TopicValidator.RMQ_SYS_SCHEDULE_TOPIC:
                    continue
                for qid, cq in list(qs.items()):
                    last = cq.get_last_offset()
                    if last == -1 or last >= min_phy:
                        continue  # (an empty queue is left alone, as RocketMQ does)
                    log.info("cleanExpiredConsumerQueue: %s %d consumer queue destroyed, minCommitLogOffset: %d "
                             "maxCLOffsetInConsumeQueue: %d", topic, qid, min_phy, last)
                    self.commit_log.topic_queue_table.pop((topic, qid), None)
                    cq.destroy()
                    del qs[qid]
                    removed.append((topic, qid))
                if not qs:
                    del self.consume_queue_table[topic]
                    try:
                        os.rmdir(os.path.join(self.config.consume_queue_dir, topic))
                    except OSError:
                        pass
        return removed

    def clean_unused_topics(self, topics: set[str]) -> list[str]:
        """RocketMQ's cleanUnusedTopic: the consume queues of topics not in `topics` (the broker's
        topic configs) are deleted, except the schedule and transaction op topics'.  Returns the
        topics removed."""
        from rmq_core.message import TopicValidator
        keep = {TopicValidator.RMQ_SYS_SCHEDULE_TOPIC, TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC}
        unused = {t for t in self.consume_queue_table if t not in topics and t not in keep}
        if unused:
            log.info("cleanUnusedTopic: deleting the consume queues of %s", sorted(unused))
            self.delete_topics(unused)
        return sorted(unused)

    def register_message_arriving_listener(self, fn) -> None:
        self.arriving_listeners.append(fn)
        self._refresh_put_path()

    def add_dispatcher(self, dispatcher) -> None:
        self.dispatchers.append(dispatcher)
        self._refresh_put_path()

    # -- flush, retention, disk ------------------------------------------------------------------
    def _on_commit_log_flushed(self, store_ts: int) -> None:
        if self.checkpoint is not None and store_ts:
            self.checkpoint.physic_msg_timestamp = store_ts

    def _flush_consume_queues(self, least_pages: int) -> None:
        ts = self.commit_log.last_store_timestamp
        for qs in list(self.consume_queue_table.values()):
            for cq in list(qs.values()):
                try:
                    cq.flush(least_pages)
                except ValueError:  # deleted meanwhile
                    pass
        if least_pages == 0:
            # The consume queues are written under the put lock, so once flushed they hold every
            # record stored up to `ts` (taken before flushing).  The index is built by its own
            # thread: it is drained here and the checkpoint gets only the time it really covers.
            if self.index_service is not None:
                index_ts = self.index_build_service.drain() if self.index_build_service is not None else ts
                self.index_service.flush()
                if index_ts:
                    self.checkpoint.index_msg_timestamp = index_ts
            if ts:
                self.checkpoint.logics_msg_timestamp = ts
            self.checkpoint.flush()

    def check_disk_space(self) -> float:
        """Refresh the disk-full flag from `self.disk_usage` (and, after a put was refused for
        want of room, from whether a new segment fits again); returns the used ratio."""
        self._disk_checked_at = time.monotonic()
        cfg = self.config
        ratio = self.disk_usage(cfg.commit_log_dir)
        limit = cfg.disk_space_warning_level_ratio
        msg = None
        if ratio >= limit:
            msg = (f"disk holding {cfg.commit_log_dir!r} is {ratio:.1%} full, over "
                   f"diskSpaceWarningLevelRatio {limit:.0%} ({max(free_bytes(cfg.commit_log_dir), 0)} bytes "
                   f"free): writes are refused")
        elif self._no_room_error is not None:
            try:
                check_room(cfg.commit_log_dir, cfg.mapped_file_size_commit_log, limit)
                self._no_room_error = None
            except DiskFullError as e:
                msg = self._no_room_error = f"{e}: writes are refused"
        if msg is not None:
            if self._disk_full_error is None:
                log.error(msg)
                self._disk_full_error = msg
                self._refresh_put_path()
            self._disk_full_error = msg
        else:
            if self._disk_full_error is not None:
                log.info("disk usage back to %.1f%%: writes allowed again", ratio * 100)
                self._disk_full_error = None
                self._refresh_put_path()
        return ratio

    def clean_expired_files(self, now: float | None = None, force_time_up: bool = False) -> int:
        """One retention round (CleanCommitLogService + CleanConsumeQueueService): delete whole
        commit-log segments older than fileReservedTime when it is deleteWhen o'clock, or early
        when the disk is over diskMaxUsedSpaceRatio (regardless of age over
        diskSpaceCleanForciblyRatio), then trim consume queues and the index."""
        cfg = self.config
        now = time.time() if now is None else now
        ratio = self.check_disk_space()
        hour = time.localtime(now).tm_hour
        time_up = force_time_up or any(h.strip() and int(h) == hour for h in cfg.delete_when.split(";"))
        space_full = ratio > cfg.disk_max_used_space_ratio / 100.0
        clean_immediately = ratio > cfg.disk_space_clean_forcibly_ratio or ratio >= cfg.disk_space_warning_level_ratio
        deleted = 0
        if time_up or space_full:
            deleted = self.commit_log.mapped_file_queue.delete_expired_files_by_time(
                cfg.file_reserved_time * 3600 * 1000, clean_immediately, now=now)
            if deleted:
                log.info("retention: deleted %d commit-log segment(s); disk %.1f%% used", deleted, ratio * 100)
        self.clean_consume_queues()
        if deleted:
            self.check_disk_space()
        return deleted

    def clean_consume_queues(self) -> None:
        min_phy = self.commit_log.get_min_offset()
        if min_phy <= self._min_phy_offset_cleaned:
            return
        for qs in list(self.consume_queue_table.values()):
            for cq in list(qs.values()):
                cq.delete_expired_file(min_phy)
        if self.index_service is not None:
            self.index_service.delete_expired_file(min_phy)
        self._min_phy_offset_cleaned = min_phy

    # -- stats -----------------------------------------------------------------------------------
    def dispatch_behind_bytes(self) -> int:
        """Commit-log bytes not yet dispatched to every dispatcher (RocketMQ's dispatchBehindBytes):
        a master's put writes the consume queues itself and the index follows in the background
        (from the oldest record still waiting for it to the log's end); a slave also dispatches
        what it appended after the append (from its reput offset)."""
        builder = self.index_build_service
        oldest = builder.oldest_pending_offset() if builder is not None else None
        end = self.get_max_phy_offset()
        behind = max(0, end - oldest) if oldest is not None else 0
        if not self.ha_service.is_master:
            behind = max(behind, end - max(self._reput_offset, self.commit_log.get_min_offset()))
        return behind

    def commit_log_disk_ratio(self) -> float:
        return self.disk_usage(self.config.commit_log_dir)

    def runtime_info(self) -> dict[str, str]:
        t0, n0 = self._put_tps_base
        t1 = time.monotonic()
        tps = (self.put_message_count - n0) / (t1 - t0) if t1 > t0 else 0.0
        self._put_tps_base = (t1, self.put_message_count)
        return {
            "commitLogDiskRatio": f"{self.commit_log_disk_ratio():.4f}",
            "commitLogMinOffset": str(self.get_min_phy_offset()),
            "commitLogMaxOffset": str(self.get_max_phy_offset()),
            "putMessageTimesTotal": str(self.put_message_count),
            "putTps": f"{tps:.1f}",
            "dispatchBehindBytes": str(self.dispatch_behind_bytes()),
            "pageCacheLockTimeMills": str(self.commit_log.lock_time_mills()),
            "diskFull": "true" if self._disk_full_error else "false",
            "consumeQueueCount": str(sum(len(q) for q in self.consume_queue_table.values())),
        }


def _join_runs(runs: list) -> list:
    """verify_records' runs with each queue's runs of consecutive queue offsets joined into one,
    in the order of their first records."""
    by_queue: dict = {}
    out = []
    for run in runs:
        key = (run[0], run[1])
        cur = by_queue.get(key)
        if cur is not None and cur[2] + cur[3] == run[2]:
            cur[3] += run[3]
            cur[4].append(run[4])
            if run[5] > cur[5]:
                cur[5] = run[5]
            continue
        cur = by_queue[key] = [run[0], run[1], run[2], run[3], [run[4]], run[5]]
        out.append(cur)
    return [(t, q, first, count, parts[0] if len(parts) == 1 else b"".join(parts), ts)
            for t, q, first, count, parts, ts in out]


_TAG_FILTER_CACHE: dict[frozenset, cq_native.TagFilter] = {}


def _tag_filter(codes) -> cq_native.TagFilter:
    f = _TAG_FILTER_CACHE.get(codes)
    if f is None:
        f = cq_native.TagFilter(codes)
        if len(_TAG_FILTER_CACHE) > 10000:
            _TAG_FILTER_CACHE.clear()
        _TAG_FILTER_CACHE[frozenset(codes)] = f
    return f


_BLOOM_CACHE: dict[tuple, cq_native.BloomTest] = {}


def _bloom_test(message_filter) -> cq_native.BloomTest:
    key = (tuple(message_filter.bloom_bits), int(getattr(message_filter, "bloom_bit_num", 0) or 0),
           int(getattr(message_filter, "bloom_born_time", -1)))
    b = _BLOOM_CACHE.get(key)
    if b is None:
        b = cq_native.BloomTest(*key)
        if len(_BLOOM_CACHE) > 10000:
            _BLOOM_CACHE.clear()
        _BLOOM_CACHE[key] = b
    return b


_MEM = [0]


def _total_memory() -> int:
    if not _MEM[0]:
        try:
            _MEM[0] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            _MEM[0] = 1 << 34
    return _MEM[0]


class FlushConsumeQueueService(FlushService):
    """Every flushIntervalConsumeQueue ms the consume queues with at least
    flushConsumeQueueLeastPages dirty pages, all of them every 10 s (only such a thorough round
    may advance the checkpoint's logics time)."""

    name = "FlushConsumeQueueService"
    interval_key, least_pages_key = "flush_interval_consume_queue", "flush_consume_queue_least_pages"

    def __init__(self, store: DefaultMessageStore):
        super().__init__(store.config, store._flush_consume_queues)
        self.store = store


class CleanCommitLogService(ServiceThread):
    name = "CleanCommitLogService"

    def __init__(self, store: DefaultMessageStore):
        super().__init__()
        self.store = store

    def interval(self) -> float:
        return self.store.config.clean_resource_interval / 1000.0

    def run_once(self) -> None:
        self.store.clean_expired_files()
