"""Splitting a TCP read into remoting frames (the 4-byte big-endian length prefix of REMOTING.md §1).

`split_frames(data, max_frame_length)` returns `(frames, consumed)`: every whole frame in `data`
as a zero-copy memoryview WITHOUT its length prefix, and how many bytes they used; the caller keeps
`data[consumed:]` for the next read.  A length outside 4..max_frame_length raises
RemotingCommandError naming it (the connection is then unusable: its framing is lost).

The native splitter (rmq_core._native.frame) is used when built; `split_frames_py` is the
pure-Python reference the tests compare it with.
"""
from __future__ import annotations

from rmq_core.errors import RemotingCommandError


def split_frames_py(data, max_frame_length: int) -> tuple[list[memoryview], int]:
    n = len(data)
    pos = 0
    frames = []
    view = None
    while n - pos >= 4:
        length = int.from_bytes(data[pos:pos + 4], "big", signed=True)
        if length < 4 or length > max_frame_length:
            raise RemotingCommandError(f"frame length {length} outside 4..{max_frame_length}")
        end = pos + 4 + length
        if end > n:
            break
        if view is None:
            view = memoryview(data)
        frames.append(view[pos + 4:end])
        pos = end
    return frames, pos


try:
    from rmq_core._native.frame import split_frames as split_frames_native
except ImportError:  # pragma: no cover - the extension is always built by `make build`
    split_frames_native = None

split_frames = split_frames_native or split_frames_py
