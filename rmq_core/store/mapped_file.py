"""MappedFile (one memory-mapped segment file) and MappedFileQueue (the ordered segments of one log),
plus the service that creates the next segment off the hot path (AllocateMappedFileService).

A segment is named by the 20-digit, zero-padded logical offset of its first byte; all segments of a
queue have the same size.  Positions: `wrote_position` (bytes appended), `flushed_position` (bytes
known to be on disk).  The native routines reach the mapping through `native` (a NativeMap).
"""
from __future__ import annotations

import concurrent.futures
import errno
import logging
import mmap
import os
import re
import threading
import time

from rmq_core._native.mapped import NativeMap
from rmq_core.errors import DiskFullError, StoreError

log = logging.getLogger("rmq.store")

_NAME = re.compile(r"^\d{20}$")
_PAGE = mmap.PAGESIZE


def offset_to_file_name(offset: int) -> str:
    return f"{offset:020d}"


def statvfs_of(path: str):
    """os.statvfs of the file system that holds (or will hold) `path`: cheap, no I/O; None when
    it cannot be asked."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return os.statvfs(path or ".")
    except OSError:
        return None


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use where `path` lives, or -1 when unknown."""
    st = statvfs_of(path)
    return -1 if st is None else st.f_bavail * st.f_frsize


def check_room(path: str, need: int, max_used_ratio: float | None = None) -> None:
    """Raise DiskFullError unless `need` more bytes fit on the file system holding `path` (and,
    with max_used_ratio, leave it at most that full): the cheap check before a new file."""
    st = statvfs_of(path)
    if st is None:
        return  # cannot ask: the allocation itself will tell
    free = st.f_bavail * st.f_frsize
    total = st.f_blocks * st.f_frsize
    if need > free:
        raise DiskFullError(f"no space for a new {need}-byte file under {path!r}: {free} bytes free")
    if max_used_ratio is not None and total:
        used_after = (total - free + need) / total  # (reserved blocks count as used, as disk_usage_ratio counts them)
        if used_after > max_used_ratio:
            raise DiskFullError(
                f"a new {need}-byte file under {path!r} would fill its disk to {used_after:.1%}, over "
                f"diskSpaceWarningLevelRatio {max_used_ratio:.0%} ({free} bytes free)")


def allocate_file(fd: int, path: str, size: int, old_size: int) -> None:
    """Give the file `size` bytes of real blocks (posix_fallocate), so writes through a mapping
    never meet a hole the file system cannot fill (SIGBUS); on failure the file is cut back to
    `old_size` and DiskFullError (no space) or StoreError says why, naming the path."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as e:
        err = e
    try:
        os.ftruncate(fd, old_size)
    except OSError:
        pass
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFullError(f"no space to allocate {size} bytes for {path!r}: "
                            f"{max(free_bytes(path), 0)} bytes free on its file system") from None
    if err.errno in (errno.EOPNOTSUPP, errno.EINVAL):
        # (glibc writes zeros where the file system has no fallocate; EINVAL: nothing to do)
        os.ftruncate(fd, size)
        return
    raise StoreError(f"cannot allocate {size} bytes for {path!r}: {err.strerror}") from None


class MappedFile:
    def __init__(self, path: str, file_size: int, prefault: bool = False, write_through_fd: bool = False):
        self.path = path
        self.file_size = file_size
        name = os.path.basename(path)
        if not _NAME.match(name):
            raise StoreError(f"bad segment file name {path!r}: expected a 20-digit start offset")
        self.file_from_offset = int(name)
        created = not os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size > file_size:
                raise StoreError(
                    f"segment {path!r} is {size} bytes, larger than the configured size {file_size}; "
                    f"the mapped file size setting must not change for an existing store")
            if size < file_size:
                # new file, or a tail truncated by a crash: real blocks, not a sparse extension,
                # so "no space" is an error here rather than a SIGBUS at a later store
                allocate_file(fd, path, file_size, size)
            self._mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if created:
                try:
                    os.remove(path)
                except OSError:
                    pass
            raise
        # write_through_fd: appends go through pwrite on this descriptor (see commit_log.pyx: append_records)
        self.fd = fd if write_through_fd else None
        if not write_through_fd:
            os.close(fd)
        self.native = NativeMap(self._mm)
        self.wrote_position = 0
        self.flushed_position = 0
        self.first_create_in_queue = False
        self.destroyed = False
        if prefault:
            # Touch every page so appends take no page fault.  A write-through (SYNC_FLUSH) file
            # also has the zeros written back now, so its blocks are allocated before the first
            # append and a group commit's fdatasync writes data only (no block allocation or
            # journal commit on the put path).  A mapped (ASYNC_FLUSH) file is not: msync leaves
            # its pages clean and write-protected, and the first store to each then faults again
            # (measured: a batch append into such pages takes about twice as long).
            self.native.prefault(0, file_size)
            if write_through_fd:
                self.native.msync(0, file_size)

    # -- positions -----------------------------------------------------------------------------
    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def set_positions(self, pos: int) -> None:
        self.wrote_position = pos
        self.flushed_position = pos

    # -- io ------------------------------------------------------------------------------------
    def read(self, pos: int, size: int) -> bytes:
        return self.native.read(pos, size)

    def view(self) -> memoryview:
        return memoryview(self._mm)

    def prefetch(self, start: int, end: int) -> None:
        """Bring bytes [start, end) of this file into the page cache ahead of their use
        (posix_fadvise WILLNEED, without the GIL; preallocated blocks not written yet come in as
        zero pages, no disk read)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    def flush(self, upto: int | None = None) -> int:
        """Make [flushed, upto or wrote) durable; returns the new flushed position."""
        end = self.wrote_position if upto is None else min(upto, self.wrote_position)
        if end > self.flushed_position:
            if self.fd is not None:
                os.fdatasync(self.fd)  # releases the GIL; pwrite-dirtied pages
            else:
                self.native.msync(self.flushed_position, end)
            self.flushed_position = end
        return self.flushed_position

    def zero_tail(self, pos: int, live: bool = False) -> None:
        """Zero [pos, file_size) (a log cut there after a crash) without touching the pages after
        pos's page: they are dropped by cutting the file there and given fresh, zero blocks again,
        so recovery of a big segment holding little data reads and writes only that data (RocketMQ
        leaves the tail as it is; zeroing it keeps a stale record there from being taken for a new
        one by a later recovery).  Only while nothing else uses the mapping (recovery).

        live: the mapping is in use (a running store cut by truncate_to: a reader past the
        file's end would fault), so only [pos, wrote_position) is zeroed, through the mapping
        (what lies past wrote_position is zero already), and made durable at once (the positions
        move back, so no later flush would cover it: a crash must not bring the cut bytes back)."""
        if live:
            end = max(pos, self.wrote_position)
            if end > pos:
                self.native.zero_range(pos, end)
                if self.fd is not None:
                    os.fdatasync(self.fd)
                else:
                    self.native.msync(pos, end)
            return
        page_end = min(self.file_size, -(-pos // _PAGE) * _PAGE)
        if page_end > pos:
            self.native.zero_range(pos, page_end)
        if page_end >= self.file_size:
            return
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.ftruncate(fd, page_end)
            try:
                allocate_file(fd, self.path, self.file_size, page_end)
            except StoreError as e:
                os.ftruncate(fd, self.file_size)  # the mapping must stay backed; sparse, as before
                log.warning("%s: the tail after byte %d is sparse again: %s", self.path, page_end, e)
        finally:
            os.close(fd)

    def last_modified(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except FileNotFoundError:
            return 0.0

    def close(self) -> None:
        if self.native is not None:
            self.native.release()
            self.native = None
            try:
                self._mm.close()
            except BufferError:
                # a pull answer still holds views of its records (a write waiting for a slow
                # consumer): the mapping goes with the last of them
                log.debug("%s: mapping still viewed at close; unmapped when its last view goes", self.path)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def destroy(self) -> None:
        """Delete the file.  The mapping itself is not closed here: a reader on another thread may
        still be scanning it without the GIL, so it is unmapped when the last reference to this
        object goes (RocketMQ defers the unmap with a reference count for the same reason); the
        disk space is freed then."""
        self.destroyed = True
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, wrote={self.wrote_position}, flushed={self.flushed_position})"


class AllocateMappedFileService:
    """Creates (and optionally pre-faults) the next segment in the background, so the put that
    rolls over to it finds it ready (RocketMQ's AllocateMappedFileService)."""

    def __init__(self, prefault: bool = False, write_through_fd: bool = False):
        self.prefault = prefault
        self.write_through_fd = write_through_fd
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="AllocateMappedFile")
        self._pending: dict[str, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._closed = False

    def ready(self, path: str) -> bool:
        """True when `path` was pre-allocated successfully (its blocks are taken already)."""
        with self._lock:
            fut = self._pending.get(path)
        return fut is not None and fut.done() and fut.exception() is None

    def request(self, path: str, next_path: str | None, file_size: int,
                max_used_ratio: float | None = None) -> MappedFile:
        with self._lock:
            fut = self._pending.pop(path, None)
        mf = None
        if fut is not None:
            try:
                mf = fut.result()
            except Exception as e:  # fall back to creating it here
                log.warning("pre-allocating %s failed: %s", path, e)
        if mf is None:
            mf = MappedFile(path, file_size, prefault=self.prefault, write_through_fd=self.write_through_fd)
        if next_path is not None:
            try:  # no room for the next one yet: it is created (or refused) when needed
                check_room(os.path.dirname(next_path), file_size, max_used_ratio)
            except DiskFullError:
                return mf
            with self._lock:
                if not self._closed and next_path not in self._pending:
                    self._pending[next_path] = self._pool.submit(MappedFile, next_path, file_size, self.prefault,
                                                                self.write_through_fd)
        return mf

    def discard(self, path: str) -> None:
        """Remove the segment pre-allocated at `path`, if any (its log will not roll into it)."""
        with self._lock:
            fut = self._pending.pop(path, None)
        if fut is not None:
            try:
                fut.result().destroy()
            except Exception:
                pass

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            pending = list(self._pending.items())
            self._pending.clear()
        for path, fut in pending:
            try:
                mf = fut.result()
                # a pre-allocated, never used segment: remove it so a restart does not see it
                mf.destroy()
            except Exception:
                pass
        self._pool.shutdown(wait=True)


class MappedFileQueue:
    """The ordered segments of one log (commit log, or one consume queue)."""

    def __init__(self, store_path: str, mapped_file_size: int, allocator: AllocateMappedFileService | None = None,
                 write_through_fd: bool = False):
        self.write_through_fd = write_through_fd
        self.store_path = store_path
        self.mapped_file_size = mapped_file_size
        self.allocator = allocator
        self.mapped_files: list[MappedFile] = []
        # the commit log's hard watermark: a new segment that would fill the disk past it is refused
        self.max_used_ratio: float | None = None
        # SYNC_FLUSH commit log: the group commit's gate, whose rounds (served without Python)
        # advance the durable offset too; flushed_where reads and sets both
        self.durable_gate = None
        self._flushed_where = 0
        self.store_timestamp = 0  # store timestamp of the last record flushed (commit log)
        self._lock = threading.RLock()

    @property
    def flushed_where(self) -> int:
        """Every byte below this offset is durable."""
        gate = self.durable_gate
        if gate is not None:
            g = gate.flushed
            if g > self._flushed_where:
                return g
        return self._flushed_where

    @flushed_where.setter
    def flushed_where(self, value: int) -> None:
        self._flushed_where = value
        if self.durable_gate is not None:
            self.durable_gate.reset(value)

    # -- loading ---------------------------------------------------------------------------------
    def load(self) -> bool:
        if not os.path.isdir(self.store_path):
            return True
        names = sorted(n for n in os.listdir(self.store_path) if _NAME.match(n))
        for n in names:
            path = os.path.join(self.store_path, n)
            size = os.path.getsize(path)
            if size > self.mapped_file_size:
                raise StoreError(
                    f"segment {path!r} is {size} bytes, larger than the configured mapped file size "
                    f"{self.mapped_file_size}; the size setting must not change for an existing store")
            if int(n) % self.mapped_file_size:
                raise StoreError(f"segment {path!r} does not start at a multiple of {self.mapped_file_size}")
            mf = MappedFile(path, self.mapped_file_size, write_through_fd=self.write_through_fd)
            mf.set_positions(self.mapped_file_size)
            self.mapped_files.append(mf)
        return True

    # -- lookup ----------------------------------------------------------------------------------
    def get_first_mapped_file(self) -> MappedFile | None:
        files = self.mapped_files
        return files[0] if files else None

    def get_last_mapped_file(self, start_offset: int = 0, need_create: bool = False) -> MappedFile | None:
        files = self.mapped_files
        last = files[-1] if files else None
        if not need_create or (last is not None and not last.is_full()):
            return last
        with self._lock:
            files = self.mapped_files
            last = files[-1] if files else None
            if last is not None and not last.is_full():
                return last
            if last is None:
                create_offset = start_offset - start_offset % self.mapped_file_size
            else:
                create_offset = last.file_from_offset + self.mapped_file_size
            os.makedirs(self.store_path, exist_ok=True)
            path = os.path.join(self.store_path, offset_to_file_name(create_offset))
            if self.max_used_ratio is not None and not (self.allocator is not None and self.allocator.ready(path)):
                # statvfs before each new segment: a write burst between two retention rounds
                # cannot carry the disk past the hard watermark
                check_room(self.store_path, self.mapped_file_size, self.max_used_ratio)
            if self.allocator is not None:
                nxt = os.path.join(self.store_path, offset_to_file_name(create_offset + self.mapped_file_size))
                mf = self.allocator.request(path, nxt, self.mapped_file_size, self.max_used_ratio)
            else:
                mf = MappedFile(path, self.mapped_file_size, write_through_fd=self.write_through_fd)
            mf.first_create_in_queue = not self.mapped_files
            self.mapped_files = self.mapped_files + [mf]  # copy-on-write: readers iterate lock-free
            return mf

    def check_room_for_next(self) -> None:
        """Raise DiskFullError when the segment after the last one could not be created now."""
        files = self.mapped_files
        if not files or self.max_used_ratio is None:
            return
        nxt = os.path.join(self.store_path, offset_to_file_name(files[-1].end_offset))
        if not (self.allocator is not None and self.allocator.ready(nxt)):
            check_room(self.store_path, self.mapped_file_size, self.max_used_ratio)

    def find_mapped_file_by_offset(self, offset: int, return_first_on_not_found: bool = False) -> MappedFile | None:
        files = self.mapped_files
        if not files:
            return None
        first = files[0]
        idx = (offset - first.file_from_offset) // self.mapped_file_size
        if 0 <= idx < len(files):
            mf = files[idx]
            if mf.file_from_offset <= offset < mf.end_offset:
                return mf
        for mf in files:  # after deletions the list may not start at a segment boundary
            if mf.file_from_offset <= offset < mf.end_offset:
                return mf
        return first if return_first_on_not_found else None

    def get_min_offset(self) -> int:
        files = self.mapped_files
        return files[0].file_from_offset if files else -1

    def get_max_offset(self) -> int:
        files = self.mapped_files
        return files[-1].file_from_offset + files[-1].wrote_position if files else 0

    def holds_no_bytes(self) -> bool:
        """No segment, or only one that holds nothing."""
        files = self.mapped_files
        return not files or (len(files) == 1 and files[0].wrote_position == 0)

    def drop_empty(self) -> None:
        """A log that holds no bytes: delete its segment and the next one pre-allocated after it,
        so that it can start at another offset."""
        with self._lock:
            if not self.holds_no_bytes():
                raise StoreError(f"{self.store_path} holds data: its segments are not dropped")
            files, self.mapped_files = self.mapped_files, []
            for mf in files:
                if self.allocator is not None:
                    self.allocator.discard(os.path.join(self.store_path, offset_to_file_name(mf.end_offset)))
                mf.destroy()

    def get_max_wrote_position(self) -> int:
        return self.get_max_offset()

    def how_much_fall_behind(self) -> int:
        return self.get_max_offset() - self.flushed_where if self.mapped_files else 0

    # -- flush -----------------------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """Flush dirty segments (only if at least `least_pages` 4 KiB pages are dirty, when > 0).
        Returns True when something was flushed."""
        max_off = self.get_max_offset()
        if max_off <= self.flushed_where:
            return False
        if least_pages > 0 and (max_off // 4096 - self.flushed_where // 4096) < least_pages:
            return False
        files = self.mapped_files
        flushed = self.flushed_where
        for mf in files:
            if mf.end_offset <= flushed:
                continue
            if mf.file_from_offset > max_off:
                break
            upto = min(mf.wrote_position, max_off - mf.file_from_offset)
            mf.flush(upto)
            flushed = mf.file_from_offset + mf.flushed_position
        self.flushed_where = max(self.flushed_where, flushed)
        return True

    # -- truncation / deletion ------------------------------------------------------------------
    def truncate_dirty_files(self, offset: int, live: bool = False) -> None:
        """Cut the log at `offset`: zero what lies after it in its segment, delete later segments
        (live: on a running store, see MappedFile.zero_tail; a deleted segment's mapping stays
        until its last reader lets it go)."""
        with self._lock:
            keep = []
            for mf in self.mapped_files:
                if mf.end_offset > offset:
                    if offset >= mf.file_from_offset:
                        pos = offset - mf.file_from_offset
                        mf.zero_tail(pos, live)
                        mf.set_positions(pos)
                        keep.append(mf)
                    else:
                        mf.destroy()
                else:
                    keep.append(mf)
            self.mapped_files = keep
            self.flushed_where = min(self.flushed_where, offset) if self.flushed_where else offset

    def delete_last_mapped_file(self) -> None:
        with self._lock:
            if self.mapped_files:
                mf = self.mapped_files[-1]
                self.mapped_files = self.mapped_files[:-1]
                mf.destroy()

    def delete_files_before(self, count: int) -> list[MappedFile]:
        """Remove the first `count` segments; returns them (already destroyed)."""
        with self._lock:
            gone = self.mapped_files[:count]
            self.mapped_files = self.mapped_files[count:]
        for mf in gone:
            mf.destroy()
        return gone

    def delete_expired_files_by_time(self, expired_ms: int, clean_immediately: bool, max_batch: int = 10,
                                     now: float | None = None) -> int:
        """Delete whole segments (never the last, active one) whose last modification is older than
        expired_ms, or the oldest ones regardless of age when clean_immediately."""
        now = time.time() if now is None else now
        files = self.mapped_files[:-1]
        n = 0
        for mf in files:
            if n >= max_batch:
                break
            if clean_immediately or now * 1000 >= mf.last_modified() * 1000 + expired_ms:
                n += 1
            else:
                break
        if n:
            self.delete_files_before(n)
        return n

    def destroy(self) -> None:
        with self._lock:
            for mf in self.mapped_files:
                mf.destroy()
            self.mapped_files = []
            self.flushed_where = 0
        try:
            os.rmdir(self.store_path)
        except OSError:
            pass

    def shutdown(self) -> None:
        with self._lock:
            for mf in self.mapped_files:
                mf.close()
