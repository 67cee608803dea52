"""StoreCheckpoint: RocketMQ's `<store>/checkpoint` file.

Layout (4 KiB file, big-endian int64s): 0 physicMsgTimestamp (store time of the last commit-log
record flushed), 8 logicsMsgTimestamp (same for the consume queues), 16 indexMsgTimestamp.
rmq adds, at 24, the commit-log max physical offset written at a clean shutdown and, at 32, the
magic 0x524d5143 ("RMQC") marking it valid; the abort marker tells whether to trust it.  The Java
reader ignores bytes past 24, so the file stays compatible.
"""
from __future__ import annotations

import mmap
import os
import struct

from rmq_core.store.mapped_file import allocate_file

_SIZE = 4096
_CLEAN_MAGIC = 0x524D5143


class StoreCheckpoint:
    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < _SIZE:
                allocate_file(fd, path, _SIZE, size)  # real blocks: never a SIGBUS at a flush
            self._mm = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
         clean_offset, magic) = struct.unpack_from(">qqqqI", self._mm, 0)
        self.clean_shutdown_phys_offset = clean_offset if magic == _CLEAN_MAGIC else -1

    def get_min_timestamp(self) -> int:
        """The oldest of the commit-log and consume-queue flush times, less 3 s of slack for
        records whose timestamps were taken out of order (RocketMQ's rule)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def get_min_timestamp_index(self) -> int:
        return min(self.get_min_timestamp(), self.index_msg_timestamp)

    def flush(self, clean_shutdown_phys_offset: int | None = None) -> None:
        if clean_shutdown_phys_offset is None:
            struct.pack_into(">qqqqI", self._mm, 0, self.physic_msg_timestamp, self.logics_msg_timestamp,
                             self.index_msg_timestamp, 0, 0)
        else:
            struct.pack_into(">qqqqI", self._mm, 0, self.physic_msg_timestamp, self.logics_msg_timestamp,
                             self.index_msg_timestamp, clean_shutdown_phys_offset, _CLEAN_MAGIC)
        self._mm.flush()

    def invalidate_clean_offset(self) -> None:
        """Called at start: from now on the clean-shutdown offset is stale until the next shutdown."""
        self.clean_shutdown_phys_offset = -1
        self.flush()

    def shutdown(self) -> None:
        if not self._mm.closed:
            self._mm.close()
