"""The IndexFile: a hash index from message key to commit-log offset, queryable by time range.

On-disk layout (RocketMQ's, big-endian), one file per `<store>/index/<yyyyMMddHHmmssSSS>`:

    header   40 bytes  beginTimestamp i64, endTimestamp i64, beginPhyOffset i64, endPhyOffset i64,
                       hashSlotCount i32 (RocketMQ counts puts here), indexCount i32 (starts at 1)
    slots    maxHashSlotNum × 4 bytes: i32 position of the newest entry whose hash lands in the slot
    entries  maxIndexNum × 20 bytes: keyHash i32, phyOffset i64, timeDiff i32 (seconds after
             beginTimestamp), prevIndex i32 (older entry of the same slot; 0 = end of chain)

Entry 0 is never used (0 means "no entry"), so a file holds maxIndexNum - 1 keys and then a new
file is started.  The indexed key is `topic#key` for each space-separated key in KEYS and for the
UNIQ_KEY; keyHash = abs(Java String.hashCode).  Only hashes are stored: a query returns every
offset whose key *hash* matches ("Aa" and "BB" collide), and the caller checks the message's
real keys, as RocketMQ's query-by-key does.

Crash safety and recovery (the store drives it):

* A put writes the entry, then the slot, then the header, all through the mmap, so a killed
  process leaves at most one put half done; `load(last_exit_ok=False)` repairs it in O(1) (a
  slot that points at the uncounted entry is rolled back to that entry's predecessor).
* `truncate_after(phy_offset)`: after the commit log was cut back at recovery, entries at or past
  `phy_offset` are removed (suffix of the newest file(s); slot chains are rolled back entry by
  entry) and files that only held such entries are deleted.
* Re-dispatch is idempotent: `build_index` skips a record whose offset is below what the index
  already covers (`indexed_phy_offset`), and for the newest record only adds keys not yet there,
  so the store may re-dispatch from its checkpoint without duplicating entries.
* RocketMQ's own scheme is available too: `load(False, checkpoint_index_timestamp=t)` drops the
  files whose endTimestamp is past the checkpoint's index timestamp (they are rebuilt by
  re-dispatch); `flush()` returns the timestamp up to which the index is durable, for the store
  to save in its checkpoint.

Transaction rollback records are never indexed (as RocketMQ); prepared ones are not either: a
4.x broker rewrites half messages to RMQ_SYS_TRANS_HALF_TOPIC without the prepared flag, so a
record that still carries it is an uncommitted message that must not be found by key.
"""
from __future__ import annotations

import logging
import mmap
import os
import re
import struct
import threading
import time

from typing import TYPE_CHECKING

import attrs

from rmq_core import record_layout as layout
from rmq_core.config import MessageStoreConfig
from rmq_core.errors import StoreError
from rmq_core.message import MessageConst, SysFlag
from rmq_core.store.mapped_file import allocate_file
from rmq_core.store.types import DispatchRequest

# The put/select kernels; tests/store_index/index_oracle.py is their pure-Python reference.
from rmq_core._native import index as _native

log = logging.getLogger("rmq.store")

if TYPE_CHECKING:  # the store owns the index service and its builder
    from rmq_core.store.message_store import DefaultMessageStore

INDEX_HEADER_SIZE = 40
HASH_SLOT_SIZE = 4
INDEX_SIZE = 20
INVALID_INDEX = 0

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")
_I64 = struct.Struct(">q")
_TIMES = struct.Struct(">qq")
_FILE_NAME = re.compile(r"^\d{17}$")


def _header_field(field: struct.Struct, offset: int) -> property:
    """A read-only property: the header field `field` at `offset` of the mapped file."""
    unpack_from = field.unpack_from
    return property(lambda self: unpack_from(self._mm, offset)[0])


def index_key_hash(key: str) -> int:
    """RocketMQ's indexKeyHashMethod: abs(String.hashCode), with abs(MIN_VALUE) mapped to 0."""
    return _native.index_key_hash(key)


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


@attrs.frozen
class QueryOffsetResult:
    phy_offsets: list
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


class IndexFile:
    """One memory-mapped index file.  Not thread-safe by itself; IndexService serialises access.

    The header in the mapped file is the only copy of the header (no Python-side mirror), so the
    native and the pure-Python put paths can be mixed freely and a killed process leaves nothing
    unwritten but the put in progress."""

    def __init__(self, path: str, hash_slot_num: int, index_num: int, end_phy_offset: int = 0,
                 end_timestamp: int = 0):
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE
        self._entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        exists = os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if exists and size == 0:
                exists = False  # created by a process killed before it could size the file
            if exists and size != self.file_size:
                raise StoreError(
                    f"index file {path} is {size} bytes, but maxHashSlotNum={hash_slot_num} and "
                    f"maxIndexNum={index_num} give {self.file_size}; was the store configured differently?")
            if not exists:
                # real blocks (not sparse): a full disk is an error here, never a SIGBUS at a put
                allocate_file(fd, path, self.file_size, 0)
            self._mm = mmap.mmap(fd, self.file_size)
        except BaseException:
            if not exists:
                try:
                    os.remove(path)
                except OSError:
                    pass
            raise
        finally:
            os.close(fd)
        self._native = _native.IndexMap(self._mm, hash_slot_num, index_num)
        self._dirty = not exists
        if not exists:
            end_timestamp, end_phy_offset = max(end_timestamp, 0), max(end_phy_offset, 0)
            _HEADER.pack_into(self._mm, 0, end_timestamp, end_timestamp, end_phy_offset, end_phy_offset, 0, 1)

    # -- header (read from the mapped file): _HEADER's fields at their offsets --
    begin_timestamp = _header_field(_I64, 0)
    end_timestamp = _header_field(_I64, 8)
    begin_phy_offset = _header_field(_I64, 16)
    end_phy_offset = _header_field(_I64, 24)
    hash_slot_count = _header_field(_SLOT, 32)

    @property
    def index_count(self) -> int:
        count = _SLOT.unpack_from(self._mm, 36)[0]
        return 1 if count <= 0 else count

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def entry_count(self) -> int:
        return self.index_count - 1

    def is_write_full(self) -> bool:
        return self.index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """Does [begin, end] overlap [beginTimestamp, endTimestamp]?"""
        b, e = _TIMES.unpack_from(self._mm, 0)
        return (begin < b and end > e) or b <= begin <= e or b <= end <= e

    # -- entries --
    def _slot_pos(self, key_hash: int) -> int:
        return INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE

    def _entry_pos(self, index: int) -> int:
        return self._entries_at + index * INDEX_SIZE

    def read_entry(self, index: int) -> tuple[int, int, int, int]:
        """(keyHash, phyOffset, timeDiff, prevIndex) of entry `index`."""
        return _ENTRY.unpack_from(self._mm, self._entry_pos(index))

    def _slot_head(self, slot_pos: int, count: int) -> int:
        head = _SLOT.unpack_from(self._mm, slot_pos)[0]
        return INVALID_INDEX if head <= INVALID_INDEX or head >= count else head

    def put_key(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """Append one entry; False when the file is full."""
        self._dirty = True
        return self._native.put_key(key_hash, phy_offset, store_timestamp)

    def put_records(self, records, run, i: int, indexed: int) -> tuple[int, int]:
        """Index records[i:] (a KeyRun when `run` is one) until one needs a decision the caller
        makes: a file roll, or a record already partly indexed.  Returns (next i, indexed offset)."""
        if run is not None:
            j, indexed = self._native.put_run(run, i, indexed)
        else:
            j, indexed = self._native.put_hashed(records, i, indexed)
        if j > i:
            self._dirty = True
        return j, indexed

    def has_key_at(self, key_hash: int, phy_offset: int) -> bool:
        """Is there an entry (key_hash, phy_offset) among the newest entries of its slot chain?
        Used to make re-dispatch of the newest record idempotent."""
        index = self._slot_head(self._slot_pos(key_hash), self.index_count)
        while index > INVALID_INDEX:
            h, off, _diff, prev = self.read_entry(index)
            if off != phy_offset:
                return False  # chains are newest first; older records cannot be this one
            if h == key_hash:
                return True
            if prev >= index:
                return False
            index = prev
        return False

    def select_phy_offsets(self, out: list, seen: set, key_hash: int, max_num: int, begin: int, end: int) -> None:
        """Walk the key's slot chain newest first, appending matching offsets to `out`."""
        self._native.select_phy_offsets(out, seen, key_hash, max_num, begin, end)

    # -- recovery --
    def repair_torn_put(self) -> bool:
        """Undo a put that a killed process left half done (slot written, header not)."""
        count = self.index_count
        if count >= self.index_num:
            return False
        h, _off, _diff, prev = self.read_entry(count)
        if h < 0:
            return False
        slot_pos = self._slot_pos(h)
        if _SLOT.unpack_from(self._mm, slot_pos)[0] != count:
            return False
        _SLOT.pack_into(self._mm, slot_pos, prev if INVALID_INDEX < prev < count else INVALID_INDEX)
        _ENTRY.pack_into(self._mm, self._entry_pos(count), 0, 0, 0, 0)
        self._dirty = True
        log.warning("index file %s: rolled back a half-written entry at %d", self.path, count)
        return True

    def truncate_after(self, phy_offset: int) -> int:
        """Remove entries whose phyOffset >= phy_offset (always a suffix: puts come in log order).
        Returns the number removed."""
        begin_ts, _end_ts, begin_phy, _end_phy, slot_count, count = _HEADER.unpack_from(self._mm, 0)
        count = max(count, 1)
        keep = count
        while keep > 1 and self.read_entry(keep - 1)[1] >= phy_offset:
            keep -= 1
        if keep == count:
            return 0
        # Newest first: each removed entry hands its slot back to its predecessor, so after the
        # loop every slot points at its newest surviving entry.
        for index in range(count - 1, keep - 1, -1):
            h, _off, _diff, prev = self.read_entry(index)
            _SLOT.pack_into(self._mm, self._slot_pos(h), prev if INVALID_INDEX < prev < keep else INVALID_INDEX)
            _ENTRY.pack_into(self._mm, self._entry_pos(index), 0, 0, 0, 0)
        removed = count - keep
        if keep > 1:
            _h, end_phy, last_diff, _prev = self.read_entry(keep - 1)
            # Only whole seconds are stored: end at the last second's upper edge so time-range
            # queries still include the surviving entries.
            end_ts = begin_ts + last_diff * 1000 + 999
        else:
            begin_phy = end_phy = min(begin_phy, phy_offset)
            end_ts = begin_ts
        _HEADER.pack_into(self._mm, 0, begin_ts, end_ts, begin_phy, end_phy, max(slot_count - removed, 0), keep)
        self._dirty = True
        return removed

    # -- lifecycle --
    def flush(self) -> None:
        if self._dirty and not self._mm.closed:
            self._native.sync()  # with the GIL released
            self._dirty = False

    def _unmap(self) -> None:
        if self._native is not None:
            self._native.release()  # the held buffer view must go before the mmap can close
            self._native = None
        if not self._mm.closed:
            self._mm.close()

    def close(self) -> None:
        if not self._mm.closed:
            self.flush()
        self._unmap()

    def destroy(self) -> None:
        self._unmap()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        log.info("index file %s deleted", self.path)

    def __repr__(self) -> str:
        if self._mm.closed:
            return f"<IndexFile {self.name} closed>"
        return (f"<IndexFile {self.name} entries={self.entry_count} phy=[{self.begin_phy_offset}, "
                f"{self.end_phy_offset}] ts=[{self.begin_timestamp}, {self.end_timestamp}]>")


def _file_name_for(ms: int) -> str:
    """yyyyMMddHHmmssSSS in local time (RocketMQ's UtilAll.timeMillisToHumanString)."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


class IndexService:
    """All index files of a store (RocketMQ IndexService).  Thread-safe: the dispatcher builds
    while request threads query."""

    def __init__(self, config: MessageStoreConfig, *, checkpoint=None):
        self.config = config
        self.store_path = config.index_dir
        self.hash_slot_num = config.max_hash_slot_num
        self.index_num = config.max_index_num
        if self.index_num < 2:
            raise StoreError(f"maxIndexNum must be at least 2 (entry 0 is reserved), got {self.index_num}")
        self.checkpoint = checkpoint  # optional: an object with an `index_msg_timestamp` attribute
        self.files: list[IndexFile] = []
        self._indexed = -1  # cached indexed_phy_offset: build_index reads it for every record
        self._lock = threading.RLock()

    # -- lifecycle --
    def load(self, last_exit_ok: bool, *, checkpoint_index_timestamp: int | None = None) -> bool:
        """Open the existing index files (oldest first).  After an unclean exit, repair a torn
        last put; with `checkpoint_index_timestamp`, also drop files newer than it (RocketMQ)."""
        if checkpoint_index_timestamp is None and self.checkpoint is not None and not last_exit_ok:
            checkpoint_index_timestamp = getattr(self.checkpoint, "index_msg_timestamp", None)
        try:
            names = sorted(os.listdir(self.store_path))
        except FileNotFoundError:
            names = []
        with self._lock:
            for name in names:
                path = os.path.join(self.store_path, name)
                if not _FILE_NAME.match(name) or not os.path.isfile(path):
                    log.warning("ignoring %s in the index directory (not an index file name)", path)
                    continue
                try:
                    f = IndexFile(path, self.hash_slot_num, self.index_num)
                except (StoreError, OSError) as e:
                    log.error("load index file %s failed: %s", path, e)
                    return False
                if not last_exit_ok and checkpoint_index_timestamp is not None \
                        and f.end_timestamp > checkpoint_index_timestamp:
                    log.warning("index file %s ends after the checkpoint (%d > %d): deleted, it will be rebuilt",
                                path, f.end_timestamp, checkpoint_index_timestamp)
                    f.destroy()
                    continue
                self.files.append(f)
                log.info("load index file OK, %s", path)
            if not last_exit_ok and self.files:
                self.files[-1].repair_torn_put()
            self._recompute_indexed()
        return True

    def flush(self) -> int:
        """msync every index file; returns the timestamp up to which the index is durable (and
        stores it in the checkpoint's `index_msg_timestamp` when a checkpoint was given)."""
        with self._lock:
            for f in self.files:
                f.flush()
            durable = self.files[-1].end_timestamp if self.files else 0
        if self.checkpoint is not None and durable > 0:
            self.checkpoint.index_msg_timestamp = durable
        return durable

    def shutdown(self) -> None:
        with self._lock:
            for f in self.files:
                try:
                    f.close()
                except (OSError, ValueError) as e:
                    log.error("shutdown index file %s: %s", f.path, e)
            self.files.clear()
            self._indexed = -1

    def destroy(self) -> None:
        """Delete every index file (the store is being wiped)."""
        with self._lock:
            for f in self.files:
                f.destroy()
            self.files.clear()
            self._indexed = -1

    def delete_expired_file(self, min_phy_offset: int) -> None:
        """Delete the oldest files whose entries all point below `min_phy_offset` (the commit log
        no longer has those records).  The newest file is always kept."""
        with self._lock:
            while len(self.files) > 1 and self.files[0].end_phy_offset < min_phy_offset:
                self.files.pop(0).destroy()
            self._recompute_indexed()

    # -- recovery --
    @property
    def indexed_phy_offset(self) -> int:
        """The commit-log offset of the newest indexed record, -1 when nothing is indexed; the store
        re-dispatches from at most here after a crash."""
        with self._lock:
            return self._indexed

    def _recompute_indexed(self) -> None:
        self._indexed = next((f.end_phy_offset for f in reversed(self.files) if f.entry_count > 0), -1)

    def truncate_after(self, phy_offset: int) -> int:
        """Forget every entry for records at or past `phy_offset` (the commit log was truncated
        there); files left without entries are deleted.  Returns the number of entries removed."""
        removed = 0
        with self._lock:
            while self.files:
                f = self.files[-1]
                if f.entry_count > 0 and f.begin_phy_offset >= phy_offset:
                    removed += f.entry_count
                    self.files.pop().destroy()
                    continue
                removed += f.truncate_after(phy_offset)
                if f.entry_count == 0 and len(self.files) > 1:
                    self.files.pop().destroy()  # a rolled-over file left empty
                    continue
                break
            self._recompute_indexed()
        if removed:
            log.warning("index truncated at commit-log offset %d: %d entries removed", phy_offset, removed)
        return removed

    # -- build and query --
    def _last_writable_file(self) -> IndexFile:
        if self.files and not self.files[-1].is_write_full():
            return self.files[-1]
        return self._new_file()

    def _new_file(self) -> IndexFile:
        prev = self.files[-1] if self.files else None
        os.makedirs(self.store_path, exist_ok=True)
        name = _file_name_for(int(time.time() * 1000))
        if prev is not None and name <= prev.name:
            # The clock stepped back (or two files in one ms): continue right after the previous
            # name so file names keep sorting in creation order.
            base = time.mktime(time.strptime(prev.name[:14], "%Y%m%d%H%M%S"))
            ms = int(base) * 1000 + int(prev.name[14:]) + 1
            name = _file_name_for(ms)
            while name <= prev.name:  # only across a DST change
                ms += 1000
                name = _file_name_for(ms)
        path = os.path.join(self.store_path, name)
        if os.path.exists(path):
            raise StoreError(f"cannot create index file {path}: it already exists")
        f = IndexFile(path, self.hash_slot_num, self.index_num,
                      prev.end_phy_offset if prev else 0, prev.end_timestamp if prev else 0)
        self.files.append(f)
        if prev is not None:
            log.info("index file %s is full, created %s", prev.path, path)
            prev.flush()
        return f

    def build_index(self, req) -> None:
        """Index one dispatched record: `req` has topic, keys, uniq_key, commit_log_offset,
        store_timestamp and sys_flag (the store's DispatchRequest)."""
        if not self.config.message_index_enable:
            return
        tx = SysFlag.transaction_value(req.sys_flag or 0)
        if tx in (SysFlag.TRANSACTION_ROLLBACK_TYPE, SysFlag.TRANSACTION_PREPARED_TYPE):
            return
        keys = []
        if req.uniq_key:
            keys.append(req.uniq_key)
        if req.keys:
            keys += [k for k in req.keys.split(MessageConst.KEY_SEPARATOR) if k]
        if not keys:
            return
        prefix = req.topic + "#"
        self.build_hashed(((req.commit_log_offset, req.store_timestamp,
                            [index_key_hash(prefix + key) for key in keys]),))

    def build_hashed(self, records) -> None:
        """Index records whose key hashes are already computed: `records` is an iterable of
        (commit_log_offset, store_timestamp, key_hashes) in commit-log order, or a native KeyRun
        (the store's index builder hashes a whole queue of records, or a batch's commit-log span,
        natively, then takes the lock once; a KeyRun is written with the GIL released)."""
        run = records if type(records) is _native.KeyRun else None
        if run is None and type(records) is not list:
            records = list(records)
        with self._lock:
            i, n = 0, len(records)
            while i < n:
                f = self._last_writable_file()
                i, self._indexed = f.put_records(records, run, i, self._indexed)
                if i >= n:
                    break
                offset, ts, hashes = records[i]
                i += 1
                last = self._indexed
                if offset < last or not hashes:
                    continue  # re-dispatched record, already indexed (or nothing to index)
                for key_hash in hashes:
                    if offset == last and self._has_key_at(key_hash, offset):
                        continue  # re-dispatch of the newest record: only the missing keys
                    while not f.put_key(key_hash, offset, ts):
                        f = self._last_writable_file()
                self._indexed = offset

    def _has_key_at(self, key_hash: int, offset: int) -> bool:
        # The newest record's keys can straddle a roll-over: look in the last two files.
        return any(f.has_key_at(key_hash, offset) for f in self.files[-2:])

    def query_offset(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> QueryOffsetResult:
        """Commit-log offsets of records whose `topic#key` hash matches and whose store time is in
        [begin_ts, end_ts] (ms, second precision), newest first, at most `max_num`, no duplicates."""
        out: list[int] = []
        seen: set[int] = set()
        last_ts = last_off = 0
        key_hash = index_key_hash(build_key(topic, key))
        with self._lock:
            if self.files:
                last_ts, last_off = self.files[-1].end_timestamp, self.files[-1].end_phy_offset
            if max_num > 0 and begin_ts <= end_ts:
                for f in reversed(self.files):
                    if f.is_time_matched(begin_ts, end_ts):
                        f.select_phy_offsets(out, seen, key_hash, max_num, begin_ts, end_ts)
                    if f.begin_timestamp < begin_ts or len(out) >= max_num:
                        break
        return QueryOffsetResult(out, last_ts, last_off)


# --- building the index off the put path ---------------------------------------------------------
_CQ_ENTRY = struct.Struct(">qi")  # a consume-queue entry's commit-log offset and size
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")


def _index_item(topic: str, phys: int, data, pos: int) -> tuple:
    """The index work item of the record at data[pos:]: (topic, commit-log offset, store
    timestamp, sys flag, properties bytes) — what a single put queues (docs/protocol.md §5)."""
    (sys_flag,) = _I32.unpack_from(data, pos + layout.SYS_FLAG_AT)
    (store_ts,) = _I64.unpack_from(data, pos + layout.store_timestamp_at(sys_flag))
    p = pos + layout.body_length_at(sys_flag)
    (body_len,) = _I32.unpack_from(data, p)
    p += 4 + body_len
    p += 1 + data[p]
    (props_len,) = _I16.unpack_from(data, p)
    return topic, phys, store_ts, sys_flag, bytes(data[p + 2:p + 2 + props_len])


class IndexBuildService:
    """Builds the key index off the put path, as RocketMQ builds it in its ReputMessageService.

    The put path only appends a small item to a deque (a lock-free operation under the GIL); this
    thread takes items in commit-log order, hashes their keys natively into a KeyRun (the batches'
    records parsed straight from the commit log, with the GIL released) and has
    `IndexService.build_hashed` write each round's run; keys that are not plain ASCII go through
    `IndexService.build_index`, in order.  Anyone who needs
    the index current — `query_message` (read-your-writes), the checkpoint, shutdown — calls
    `drain()`, which builds whatever is queued in the calling thread.  `processed_timestamp` is the
    store time of the newest record the index has seen (indexed, or skipped for having no key):
    the checkpoint's indexMsgTimestamp never runs ahead of it, so recovery re-dispatches from there.

    Items: (topic, commit_log_offset, store_timestamp, sys_flag, properties_bytes) for one record
    whose properties are at hand, or (topic, entries, count) for consume-queue entries whose
    records are read back from the commit log when built (a batch)."""

    name = "IndexBuildService"
    # The builder polls (RocketMQ's reput loop does too) instead of being woken by every put — a
    # wake-up per put would cost more than the put; a backlog this long wakes it early.
    POLL_INTERVAL = 0.005
    WAKE_BACKLOG = 2048

    def __init__(self, store: "DefaultMessageStore"):
        from collections import deque

        self.store = store
        self.index_service = store.index_service
        self._queue: deque = deque()
        self._build_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._idle = False
        self._thread: threading.Thread | None = None
        self.processed_timestamp = 0
        self._seeds: dict[str, int] = {}  # topic -> Java hash of "topic#" (_native.topic_prefix_hash)
        self._run = _native.KeyRun()  # reused by every round (under _build_lock)
        # True from start() to shutdown(): puts queue their index work (before start — recovery —
        # the store builds it synchronously)
        self.accepting = False

    def submit(self, item: tuple) -> None:
        q = self._queue
        q.append(item)
        # The worker sets _idle before its last look at the queue, so either it sees this backlog
        # or we see _idle and wake it: no lost wake-up without a lock on the put path.
        if self._idle and len(q) >= self.WAKE_BACKLOG:
            self.wake()

    def wake(self) -> None:
        self._idle = False
        self._wake.set()

    def pending(self) -> int:
        return len(self._queue)

    def oldest_pending_offset(self) -> int | None:
        """The commit-log offset of the oldest record waiting for the index (None: none waits)."""
        try:
            item = self._queue[0]
        except IndexError:  # (empty, or drained meanwhile)
            return None
        if len(item) == 5:
            return item[1]
        return int.from_bytes(bytes(memoryview(item[1])[:8]), "big")  # the first consume-queue entry's offset

    def start(self) -> None:
        if self._thread is not None:
            return
        self.accepting = True
        self._stopped.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        q = self._queue
        while not self._stopped.is_set():
            self._idle = True
            if len(q) < self.WAKE_BACKLOG:
                self._wake.wait(self.POLL_INTERVAL if q else self.POLL_INTERVAL * 4)
            self._idle = False
            self._wake.clear()
            if self._stopped.is_set():
                break
            try:
                self.drain()
            except Exception:  # the index must not stop the store; recovery re-dispatches
                log.exception("%s: round failed", self.name)

    def drain(self) -> int:
        """Build everything queued so far (in order); returns `processed_timestamp`."""
        q = self._queue
        with self._build_lock:
            while q:
                self._build_some(q)
            return self.processed_timestamp

    RUN_RECORDS = 4096  # records hashed per round before they are written (one lock per round)

    def _build_some(self, q) -> None:
        # Queued single records and batches' records read from the commit log are hashed natively
        # into one KeyRun, written under one lock per round (with the GIL released); only keys
        # that are not plain ASCII stop the run, for the general path, in order.
        run = self._run
        run.clear()
        odd_ts = 0
        try:
            while True:
                other = _native.collect_items(q, self.RUN_RECORDS, self._seeds, run)
                if other is None:
                    break
                if len(other) == 5:
                    odd_ts = self._build_odd(*other)
                else:
                    odd_ts = self._collect_entries(*other) or odd_ts
                if len(run) >= self.RUN_RECORDS:
                    break
            if len(run):
                self.index_service.build_hashed(run)
        except Exception:
            # the checkpoint does not move past this round: a crash re-dispatches from before it
            log.exception("index build failed")
            return
        # the run is cleared at every odd record, so what it saw came after the last odd one
        ts = run.last_timestamp or odd_ts
        if ts:
            self.processed_timestamp = ts

    def _build_odd(self, topic: str, phys: int, ts: int, sys_flag: int, props: bytes) -> int:
        """Index one record through build_index, after what the run holds (commit-log order);
        returns its store time."""
        if len(self._run):
            self.index_service.build_hashed(self._run)
        self._run.clear()
        self.index_service.build_index(DispatchRequest(topic, 0, phys, 0, 0, ts, 0, sys_flag, 0, props))
        return ts

    def _build_entries(self, topic: str, entries, count: int) -> int:
        """Index one batch on its own (what a round does for each batch item, then written);
        returns the store time of the last record seen, 0 when none was."""
        self._run.clear()
        odd_ts = self._collect_entries(topic, entries, count)
        if len(self._run):
            self.index_service.build_hashed(self._run)
        return self._run.last_timestamp or odd_ts

    def _collect_entries(self, topic: str, entries, count: int) -> int:
        """Hash a batch's records into the run straight from the commit log: each run of adjacent
        records is read in one piece and parsed natively with the GIL released (no Python object
        per record: a per-record Python build held the GIL long enough to stall the broker's
        event loop).  A record with keys that are not plain ASCII takes the general path, in
        order.  Returns the store time of the last such record, 0 when there was none."""
        get_data = self.store.commit_log.get_data
        seed = self._seeds.get(topic)
        if seed is None:
            seed = self._seeds[topic] = _native.topic_prefix_hash(topic)
        ts = i = 0
        while i < count:
            j, phys, length = _native.adjacent_entries(entries, i, count)
            span = get_data(phys, length)
            if span is not None:
                ts = self._collect_span(topic, seed, span, entries, i, j) or ts
            else:  # a segment end inside the run, or deleted by retention: one by one
                for k in range(i, j):
                    kphys, ksize = _CQ_ENTRY.unpack_from(entries, k * 20)
                    raw = get_data(kphys, ksize)
                    if raw is not None:
                        ts = self._collect_span(topic, seed, raw, entries, k, k + 1) or ts
            i = j
        return ts

    def _collect_span(self, topic: str, seed: int, span, entries, i: int, j: int) -> int:
        """Hash the records of entries [i, j), back to back in `span`, into the run; each record
        the native pass cannot take goes through build_index (after what the run holds).
        Returns the store time of the last such record, else 0."""
        ts = pos = 0
        while i < j:
            i, pos = _native.collect_span(self._run, span, entries, i, j, seed, pos)
            if i >= j:
                break
            ophys, osize = _CQ_ENTRY.unpack_from(entries, i * 20)
            ts = self._build_odd(*_index_item(topic, ophys, span, pos))
            i += 1
            pos += osize
        return ts

    def stop(self) -> None:
        """Stop the thread without building what is queued: work queued from now on waits for a
        drain() (tests hold the builder this way; a crash test stops it as a kill would)."""
        self._stopped.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(30)
        self._thread = None

    def shutdown(self) -> None:
        self.accepting = False
        self.stop()
        self.drain()
