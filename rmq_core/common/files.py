"""Crash-safe file writes, for every small file rmq rewrites whole (the broker's tables and
checkpoints, the name server's KV table, a consumer's local offsets).

`atomic_write` writes `<file>.tmp`, fsyncs it, renames it over `<file>` and fsyncs the directory,
so after a crash the file is either the old or the new version, never a mix.
"""
from __future__ import annotations

import os

from rmq_core.errors import IllegalArgumentError


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename inside it survives a power cut (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with `data` atomically: tmp file in the same dir, fsync, rename, fsync dir.
    `mode`: the file's permissions (0o600 for a file holding secrets), set before any byte is in it."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise IllegalArgumentError(f"atomic_write needs bytes, not {type(data).__name__}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # (a leftover tmp file keeps its own mode through O_CREAT)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.remove(tmp)  # (a full disk: the half-written copy would only hold space)
        except OSError:
            pass
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def read_file_bytes(path: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


__all__ = ["atomic_write", "fsync_dir", "read_file_bytes"]
