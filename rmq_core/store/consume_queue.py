"""ConsumeQueue: the per (topic, queue id) index into the commit log.

Files: `<store>/consumequeue/<topic>/<queueId>/<20-digit start byte offset>`, each
`mappedFileSizeConsumeQueue` bytes (300,000 entries by default).  Queue offset n is the entry at
byte n*20 of the logical queue:

    int64 commit-log offset | int32 record size | int64 tags code   (big-endian)

Entries written in front of the first real one (a queue that starts at a non-zero offset, e.g.
after every older file was deleted) are "blank": offset 0, size 0x7fffffff, tags code 0, as
RocketMQ writes them, so the file stays dense and `recover` walks through them.

Consume-queue ext (the per-entry filter bit map of RocketMQ's ConsumeQueueExt, for the SQL92
bloom prefilter), written when `enableConsumeQueueExt` is on.  Unlike RocketMQ's ext, which moves
the tag code into the ext unit and stores the unit's address in the entry, rmq keeps the 20-byte
entry untouched (the consume queue stays readable by RocketMQ tools) and writes a side file of
fixed-size units aligned with the entries:

    <store>/consumequeue_ext/<topic>/<queueId>/<20-digit name of the paired consume-queue file>
    header (16 bytes): b"RMQX" | int32 unit size | int32 units per file | int32 0
    unit i (entry file_first + i) at 16 + i * unit size:
        int64 store timestamp | int16 bit map length in bytes (0 = none) | bit map (padded)

The scan applies `MessageFilter.bloom_bits` only to entries whose unit holds a map of the filter's
size computed after the subscription was born; every other entry stays a candidate.
"""
from __future__ import annotations

import logging
import os
import struct

from rmq_core._native import cq as cq_native
from rmq_core.store.mapped_file import MappedFile, MappedFileQueue, check_room, offset_to_file_name

log = logging.getLogger("rmq.store")

CQ_STORE_UNIT_SIZE = 20
_BLANK_ENTRY = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)
_HEAD = struct.Struct(">qi")


class ConsumeQueue:
    def __init__(self, topic: str, queue_id: int, store_path: str, mapped_file_size: int):
        if mapped_file_size % CQ_STORE_UNIT_SIZE:
            mapped_file_size -= mapped_file_size % CQ_STORE_UNIT_SIZE
        self.topic = topic
        self.queue_id = queue_id
        self.mapped_file_size = mapped_file_size
        self.store_path = os.path.join(store_path, topic, str(queue_id))
        self.mapped_file_queue = MappedFileQueue(self.store_path, mapped_file_size)
        self.min_logic_offset = 0  # bytes
        self.max_physic_offset = -1  # commit-log end of the last entry (offset + size)
        self.ext: ConsumeQueueExt | None = None

    # -- load / recover -----------------------------------------------------------------------
    def load(self) -> bool:
        return self.mapped_file_queue.load()

    def recover(self) -> None:
        """Find the end of the written entries (files were opened as full)."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return
        # the last non-empty file holds the end; later (pre-created) empty ones are dropped
        idx = len(files) - 1
        while idx >= 0:
            end = cq_native.cq_valid_end(files[idx].native, 0)
            if end > 0 or idx == 0:
                break
            idx -= 1
        for mf in files[idx + 1:]:
            mf.destroy()
        self.mapped_file_queue.mapped_files = files[:idx + 1]
        last = files[idx]
        last.set_positions(end)
        self.mapped_file_queue.flushed_where = last.file_from_offset + end
        if end > 0:
            phys, size, _ = cq_native.cq_entry(last.native, end - CQ_STORE_UNIT_SIZE)
            self.max_physic_offset = phys + size
        elif idx == 0:
            self.max_physic_offset = -1
        first = files[0]
        if self.min_logic_offset < first.file_from_offset:
            self.min_logic_offset = first.file_from_offset

    def correct_min_offset(self, min_commit_log_offset: int) -> None:
        """Point the min offset at the first entry whose record still exists in the commit log."""
        files = self.mapped_file_queue.mapped_files
        for mf in files:
            end = mf.wrote_position
            if end <= 0:
                continue
            pos = cq_native.cq_first_phys_at_or_above(mf.native, 0, end, min_commit_log_offset)
            if pos < end:
                self.min_logic_offset = max(self.min_logic_offset, mf.file_from_offset + pos)
                return
            self.min_logic_offset = max(self.min_logic_offset, mf.file_from_offset + end)
        # every entry points below the commit log's start

    def truncate_dirty_logic_files(self, phys_offset: int, live: bool = False) -> None:
        """Drop entries whose record starts at or after phys_offset (the commit log was cut there;
        live: on a running store, see MappedFile.zero_tail)."""
        mfq = self.mapped_file_queue
        while mfq.mapped_files:
            mf = mfq.mapped_files[-1]
            end = mf.wrote_position
            pos = cq_native.cq_first_phys_at_or_above(mf.native, 0, end, phys_offset) if end else 0
            if pos == 0 and len(mfq.mapped_files) > 1:
                mfq.delete_last_mapped_file()
                continue
            if pos < end:
                mf.zero_tail(pos, live)
                mf.set_positions(pos)
            if pos > 0:
                p, s, _ = cq_native.cq_entry(mf.native, pos - CQ_STORE_UNIT_SIZE)
                self.max_physic_offset = p + s
            else:
                self.max_physic_offset = -1
            mfq.flushed_where = min(mfq.flushed_where, mf.file_from_offset + pos)
            break
        if self.min_logic_offset > self.get_max_offset_in_queue() * CQ_STORE_UNIT_SIZE:
            self.min_logic_offset = self.get_max_offset_in_queue() * CQ_STORE_UNIT_SIZE
        if self.ext is not None:
            self.ext.truncate(self.get_max_offset_in_queue())

    # -- write ----------------------------------------------------------------------------------
    def prepare_entries(self, first_queue_offset: int, count: int) -> None:
        """Before the commit log takes a put: create the file its first entry goes into when the
        queue must roll to it, and check there is room for any further file it spans, so a full
        disk refuses the put (DiskFullError) instead of failing its dispatch."""
        mfq = self.mapped_file_queue
        files = mfq.mapped_files
        start = first_queue_offset * CQ_STORE_UNIT_SIZE
        end = start + count * CQ_STORE_UNIT_SIZE
        if files and end <= files[-1].end_offset:
            return
        if not files or files[-1].is_full():
            mf = mfq.get_last_mapped_file(start, need_create=True)
        else:
            mf = files[-1]
        if end > mf.end_offset:
            check_room(self.store_path, end - mf.end_offset)

    def file_for_entry(self, queue_offset: int) -> MappedFile:
        """The file the entry of queue_offset is written into, its wrote position at that entry:
        the last file, or a new one when it is full; blank entries in front of a queue's first
        entry (RocketMQ fillPreBlank) or over a gap.  Every put's writes go where this says."""
        mfq = self.mapped_file_queue
        unit = CQ_STORE_UNIT_SIZE
        size = self.mapped_file_size
        expect = queue_offset * unit
        while True:
            mf = mfq.get_last_mapped_file(expect, need_create=True)
            if mf.first_create_in_queue and mf.wrote_position == 0 and expect > mf.file_from_offset:
                # a queue whose first entry is not at offset 0
                nblank = (expect - mf.file_from_offset) // unit
                mf.native.write(0, _BLANK_ENTRY * nblank)
                mf.set_positions(expect - mf.file_from_offset)
                mfq.flushed_where = mf.file_from_offset
                self.min_logic_offset = expect
                mf.first_create_in_queue = False
            cur_pos = mf.file_from_offset + mf.wrote_position
            if cur_pos == expect:
                return mf
            if expect < cur_pos:
                raise AssertionError(f"consume queue {self.topic}/{self.queue_id}: write at {expect} behind {cur_pos}")
            log.error("consume queue %s/%d: gap from byte %d to %d, filling with blank entries",
                      self.topic, self.queue_id, cur_pos, expect)
            gap = min((expect - cur_pos) // unit, (size - mf.wrote_position) // unit)
            mf.native.write(mf.wrote_position, _BLANK_ENTRY * gap)
            mf.wrote_position += gap * unit

    def put_entries(self, entries, first_queue_offset: int, count: int) -> None:
        """Write `count` 20-byte entries for queue offsets first_queue_offset.. (entries already
        present — a re-dispatch after recovery — are skipped)."""
        unit = CQ_STORE_UNIT_SIZE
        cur = self.get_max_offset_in_queue()
        skip = cur - first_queue_offset
        if skip >= count:
            return
        view = memoryview(entries)
        if skip > 0:
            view = view[skip * unit:count * unit]
            first_queue_offset = cur
            count -= skip
        else:
            view = view[:count * unit]
        while count > 0:
            mf = self.file_for_entry(first_queue_offset)
            n = min((self.mapped_file_size - mf.wrote_position) // unit, count)
            mf.native.write(mf.wrote_position, view[:n * unit])
            mf.wrote_position += n * unit
            phys, sz = _HEAD.unpack_from(view, (n - 1) * unit)
            self.max_physic_offset = phys + sz
            view = view[n * unit:]
            count -= n
            first_queue_offset += n

    def flush(self, least_pages: int = 0) -> bool:
        if self.ext is not None:
            self.ext.flush()
        return self.mapped_file_queue.flush(least_pages)

    # -- read -----------------------------------------------------------------------------------
    def get_min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    def get_max_offset_in_queue(self) -> int:
        return self.mapped_file_queue.get_max_offset() // CQ_STORE_UNIT_SIZE

    def find_file(self, queue_offset: int):
        """(mapped file, byte position in it, readable end) of queue_offset, or None."""
        pos = queue_offset * CQ_STORE_UNIT_SIZE
        if pos < self.min_logic_offset:
            return None
        mf = self.mapped_file_queue.find_mapped_file_by_offset(pos)
        if mf is None:
            return None
        rel = pos - mf.file_from_offset
        if rel >= mf.wrote_position:
            return None
        return mf, rel, mf.wrote_position

    def get_entry(self, queue_offset: int):
        """(commit-log offset, size, tags code) at queue_offset, or None."""
        found = self.find_file(queue_offset)
        if found is None:
            return None
        mf, rel, _ = found
        return cq_native.cq_entry(mf.native, rel)

    def get_last_offset(self) -> int:
        """Commit-log end covered by the entries (RocketMQ getLastOffset), -1 when empty."""
        return self.max_physic_offset

    def delete_expired_file(self, min_commit_log_offset: int) -> int:
        """Delete whole files (never the last) whose last entry points below min_commit_log_offset."""
        mfq = self.mapped_file_queue
        files = mfq.mapped_files[:-1]
        n = 0
        for mf in files:
            if mf.wrote_position < CQ_STORE_UNIT_SIZE:
                break
            phys, _, _ = cq_native.cq_entry(mf.native, mf.wrote_position - CQ_STORE_UNIT_SIZE)
            if phys < min_commit_log_offset:
                n += 1
            else:
                break
        if n:
            mfq.delete_files_before(n)
            if self.ext is not None and mfq.mapped_files:
                self.ext.delete_files_before(mfq.mapped_files[0].file_from_offset)
        self.correct_min_offset(min_commit_log_offset)
        return n

    def destroy(self) -> None:
        if self.ext is not None:
            self.ext.destroy()
        self.mapped_file_queue.destroy()
        try:
            os.rmdir(os.path.dirname(self.store_path))
        except OSError:
            pass

    def shutdown(self) -> None:
        if self.ext is not None:
            self.ext.shutdown()
        self.mapped_file_queue.shutdown()


class ConsumeQueueExt:
    """The filter bit maps beside one consume queue (format in the module docstring)."""

    MAGIC = b"RMQX"

    def __init__(self, topic: str, queue_id: int, store_path: str, cq_file_size: int, bit_map_bits: int):
        self.store_path = os.path.join(store_path, topic, str(queue_id))
        self.per_file = cq_file_size // CQ_STORE_UNIT_SIZE
        self.cq_file_size = self.per_file * CQ_STORE_UNIT_SIZE
        self.max_bytes = (bit_map_bits + 7) // 8
        self.unit = 10 + self.max_bytes
        self.files: dict[int, tuple[MappedFile, int]] = {}  # cq file start byte -> (file, unit size)

    def load(self) -> None:
        if not os.path.isdir(self.store_path):
            return
        for name in sorted(os.listdir(self.store_path)):
            if name.isdigit() and len(name) == 20:
                path = os.path.join(self.store_path, name)
                with open(path, "rb") as f:
                    head = f.read(16)
                if len(head) < 16 or head[:4] != self.MAGIC:
                    log.warning("ignoring %s: not a consume-queue ext file", path)
                    continue
                unit, per_file = struct.unpack_from(">ii", head, 4)
                mf = MappedFile(path, os.path.getsize(path))
                self.files[int(name)] = (mf, unit)

    def _file(self, start: int, create: bool):
        f = self.files.get(start)
        if f is None and create:
            os.makedirs(self.store_path, exist_ok=True)
            mf = MappedFile(os.path.join(self.store_path, offset_to_file_name(start)), 16 + self.per_file * self.unit)
            mf.native.write(0, self.MAGIC + struct.pack(">iii", self.unit, self.per_file, 0))
            f = self.files[start] = (mf, self.unit)
        return f

    def put(self, queue_offset: int, store_timestamp: int, bit_map: bytes | None) -> None:
        start = (queue_offset // self.per_file) * self.cq_file_size
        mf, unit = self._file(start, True)
        bm = bytes(bit_map) if bit_map else b""
        if len(bm) > unit - 10:
            log.error("filter bit map of %d bytes is larger than the ext unit (%d); stored without it",
                      len(bm), unit - 10)
            bm = b""
        mf.native.write(16 + (queue_offset % self.per_file) * unit, struct.pack(">qh", store_timestamp, len(bm)) + bm)

    def locate(self, queue_offset: int):
        """(NativeMap, byte position of the unit, unit size) for queue_offset, or None."""
        f = self._file((queue_offset // self.per_file) * self.cq_file_size, False)
        if f is None:
            return None
        mf, unit = f
        return mf.native, 16 + (queue_offset % self.per_file) * unit, unit

    def get(self, queue_offset: int) -> tuple[int, bytes] | None:
        """(store timestamp, bit map) of an entry, or None."""
        loc = self.locate(queue_offset)
        if loc is None:
            return None
        nm, pos, _ = loc
        ts, n = struct.unpack(">qh", nm.read(pos, 10))
        return ts, nm.read(pos + 10, n) if n > 0 else b""

    def truncate(self, queue_offset: int) -> None:
        """Forget the units of queue_offset and later (their entries were cut): zeroed in their
        file, later files deleted, so a stale bit map never stands for a new entry."""
        first = (queue_offset // self.per_file) * self.cq_file_size
        for start in sorted(self.files):
            if start > first:
                self.files.pop(start)[0].destroy()
            elif start == first:
                mf, unit = self.files[start]
                pos = 16 + (queue_offset % self.per_file) * unit
                mf.native.zero_range(pos, mf.file_size)
                mf.native.msync(pos, mf.file_size)

    def delete_files_before(self, cq_start: int) -> None:
        for start in sorted(self.files):
            if start < cq_start:
                self.files.pop(start)[0].destroy()

    def flush(self) -> None:
        for mf, _ in list(self.files.values()):
            try:
                mf.native.msync(0, mf.file_size)
            except (ValueError, AttributeError):  # destroyed by retention meanwhile: nothing to keep
                pass

    def destroy(self) -> None:
        for mf, _ in self.files.values():
            mf.destroy()
        self.files.clear()
        try:
            os.rmdir(self.store_path)
        except OSError:
            pass

    def shutdown(self) -> None:
        for mf, _ in self.files.values():
            mf.close()
