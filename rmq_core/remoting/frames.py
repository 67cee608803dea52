"""Splitting a TCP read into remoting frames (the 4-byte big-endian length prefix of docs/protocol.md §1).

`split_frames(data, max_frame_length)` returns `(frames, consumed)`: every whole frame in `data`
as a zero-copy memoryview WITHOUT its length prefix, and how many bytes they used; the caller keeps
`data[consumed:]` for the next read.  A length outside 4..max_frame_length raises
RemotingCommandError naming it (the connection is then unusable: its framing is lost).

The native splitter (rmq_core._native.frame) is used when built; `split_frames_py` is the
pure-Python reference the tests compare it with.  The native frame walks raise ValueError for a
bad length (a native module imports nothing of rmq): `framing_errors` makes that the
RemotingCommandError every reader of frames expects.
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


def framing_errors(walk):
    """A native frame walk `walk(data, max_frame_length) -> (items, consumed)` whose bad-length
    ValueError is raised as RemotingCommandError (one try per read chunk, none per frame)."""
    def walk_frames(data, max_frame_length: int):
        try:
            return walk(data, max_frame_length)
        except ValueError as e:
            raise RemotingCommandError(str(e)) from None

    walk_frames.__name__ = walk_frames.__qualname__ = walk.__name__
    walk_frames.__doc__ = walk.__doc__
    walk_frames.native = walk
    return walk_frames


try:
    from rmq_core._native import frame as _frame_native
except ImportError:  # pragma: no cover - the extension is always built by `make build`
    split_frames_native = read_send_responses = None
else:
    split_frames_native = framing_errors(_frame_native.split_frames)
    # the producer's reader of send answers (rmq_core._native.frame.read_send_responses)
    read_send_responses = framing_errors(_frame_native.read_send_responses)

split_frames = split_frames_native or split_frames_py
