"""StoreLock: one process per store directory (RocketMQ's `<storePathRootDir>/lock`).

The lock is an exclusive, non-blocking `flock` on the file, which holds the holder's pid so a
refused second process can name it.  The kernel drops the lock when the holder's descriptor
closes, so a killed broker never leaves a stale lock behind (the pid left in the file is only
read while the lock is really held).
"""
from __future__ import annotations

import fcntl
import os

from rmq_core.errors import StoreError


class StoreLockedError(StoreError):
    """Another process (or another store in this one) has the store directory open."""


class StoreLock:
    def __init__(self, root: str):
        self.path = os.path.join(root, "lock")
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            if holder == os.getpid():
                who += " (this process: another store is open on it)"
            raise StoreLockedError(f"store {os.path.dirname(self.path)!r} is in use by {who} "
                                   f"(lock file {self.path}); one broker per store directory") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Unlock (the pid stays in the file: only the flock says whether it is held)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
