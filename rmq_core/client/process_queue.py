"""ProcessQueue: the client-side buffer of one message queue between pulling and consuming.

Messages are kept by queue offset.  RocketMQ uses a TreeMap; here a dict holds offset -> message
with its keys in ascending order (a dict keeps insertion order, and pulls bring ascending offsets
past everything buffered), so the lowest unconsumed offset is the dict's first key and a pulled
batch goes in with one `update`.  The rare insert below the highest buffered offset (orderly
messages put back to be consumed again, an out-of-order batch) re-sorts the dict.

Concurrent consumption: `put_messages` on pull, `remove_messages` when a chunk of consume requests
is done; the returned offset is what may be committed (everything below it is consumed).  A running
chunk registers itself (`add_running_chunk`): the expired-message cleaner learns from it which
buffered messages are in a listener since when, and which are consumed but not yet removed.  A pull
loop held back by flow control leaves a waiter (`flow_waiter`) that a removal calls, so it pulls
again as soon as the buffer has room.
Orderly consumption: `take_messages` moves the smallest messages into a "consuming" table,
`commit` forgets them and returns the next offset, `make_messages_to_consume_again` puts them back.
"""
from __future__ import annotations

import itertools
import operator
import threading
import time


REBALANCE_LOCK_MAX_LIVE_TIME = 30.0  # client-side lock validity (Java: 30 s)
PULL_MAX_IDLE_TIME = 120.0  # a queue not pulled for this long is rebuilt by the next rebalance


def _now() -> float:
    return time.monotonic()


_offset_of = operator.attrgetter("queue_offset")
_body_of = operator.attrgetter("body")


def _body_bytes(msgs) -> int:
    """Total body length (RocketMQ's cached message size), without a Python step per message."""
    try:
        return sum(map(len, map(_body_of, msgs)))
    except TypeError:  # a message without a body (decoded with read_body=False)
        return sum(len(m.body or b"") for m in msgs)


class ProcessQueue:
    __slots__ = (
        "_tree", "_lock", "msg_count", "msg_size", "queue_offset_max", "dropped",
        "last_pull_timestamp", "last_consume_timestamp", "locked", "last_lock_timestamp",
        "consuming", "_consuming_tree", "consume_lock", "msg_acc_cnt", "try_unlock_times",
        "_running_chunks", "flow_waiter", "__weakref__",
    )

    def __init__(self):
        self._tree: dict = {}  # queue offset -> MessageExt
        self._lock = threading.Lock()
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = -1
        self.dropped = False
        self.last_pull_timestamp = _now()
        self.last_consume_timestamp = _now()
        self.locked = False
        self.last_lock_timestamp = _now()
        self.consuming = False  # orderly: a consume request is scheduled/running for this queue
        self._consuming_tree: dict = {}
        # orderly: one thread consumes a queue at a time; rebalance takes it before unlocking
        self.consume_lock = threading.Lock()
        self.msg_acc_cnt = 0  # messages the broker still has behind this pull (maxOffset - offset)
        self.try_unlock_times = 0
        self._running_chunks: dict = {}  # id -> a consume service's record of a running chunk
        self.flow_waiter = None  # set by a pull loop waiting for room; called (once) after removals

    # --- state -----------------------------------------------------------------------------------
    def is_lock_expired(self, max_live: float = REBALANCE_LOCK_MAX_LIVE_TIME) -> bool:
        return _now() - self.last_lock_timestamp > max_live

    def is_pull_expired(self, max_idle: float = PULL_MAX_IDLE_TIME) -> bool:
        return _now() - self.last_pull_timestamp > max_idle

    def _min_offset_locked(self):
        for offset in self._tree:  # the keys are ascending
            return offset
        return None

    def _resort_locked(self) -> None:
        self._tree = dict(sorted(self._tree.items()))

    @property
    def max_span(self) -> int:
        with self._lock:
            lo = self._min_offset_locked()
            return 0 if lo is None else self.queue_offset_max - lo

    def has_temp_message(self) -> bool:
        return bool(self._tree)

    def __len__(self) -> int:
        return len(self._tree)

    def min_offset(self) -> int | None:
        with self._lock:
            return self._min_offset_locked()

    # --- concurrent ------------------------------------------------------------------------------
    def put_messages(self, msgs) -> bool:
        """Buffer freshly pulled messages.  Returns True when an orderly consumer should schedule
        a consume request (the queue was idle and now has messages)."""
        offsets = list(map(_offset_of, msgs))
        dispatch = False
        with self._lock:
            tree = self._tree
            before = len(tree)
            if offsets and offsets[0] > self.queue_offset_max and (
                    offsets[-1] - offsets[0] == len(offsets) - 1 or offsets == sorted(offsets)):
                # the usual pull: ascending offsets past everything buffered
                tree.update(zip(offsets, msgs))
                self.queue_offset_max = offsets[-1]
                if len(tree) - before == len(offsets):
                    self.msg_size += _body_bytes(msgs)
                else:  # a repeated offset inside the batch: count what stayed
                    self.msg_size = _body_bytes(tree.values()) + _body_bytes(self._consuming_tree.values())
            else:
                for m in msgs:
                    off = m.queue_offset
                    if off in tree or off in self._consuming_tree:
                        continue
                    tree[off] = m
                    self.msg_size += len(m.body or b"")
                    if off > self.queue_offset_max:
                        self.queue_offset_max = off
                self._resort_locked()
                tree = self._tree
            self.msg_count += len(tree) - before
            if tree and not self.consuming:
                self.consuming = True
                dispatch = True
        return dispatch

    def remove_messages(self, msgs) -> int:
        """Forget consumed messages; return the offset that may be committed, or -1 if none."""
        with self._lock:
            self.last_consume_timestamp = _now()
            tree = self._tree
            if not tree:
                return -1
            removed = list(filter(None, map(tree.pop, map(_offset_of, msgs), itertools.repeat(None))))
            self.msg_count -= len(removed)
            self.msg_size -= _body_bytes(removed)
            for offset in tree:  # the lowest still buffered
                return offset
            return self.queue_offset_max + 1

    def add_running_chunk(self, chunk) -> None:
        self._running_chunks[id(chunk)] = chunk

    def remove_running_chunk(self, chunk) -> None:
        self._running_chunks.pop(id(chunk), None)

    def running_chunks(self) -> list:
        return list(self._running_chunks.values())

    def wake_flow_waiter(self) -> None:
        waiter = self.flow_waiter
        if waiter is not None:
            waiter()

    def first_messages(self, n: int) -> list:
        """Up to n buffered messages with the smallest offsets (expired-message cleaning)."""
        with self._lock:
            return list(itertools.islice(self._tree.values(), n))

    # --- orderly ---------------------------------------------------------------------------------
    def take_messages(self, batch_size: int) -> list:
        now = _now()
        with self._lock:
            self.last_consume_timestamp = now
            tree = self._tree
            offsets = list(itertools.islice(tree, batch_size))
            out = [tree.pop(off) for off in offsets]
            self._consuming_tree.update(zip(offsets, out))
            if not out:
                self.consuming = False
        return out

    def commit(self) -> int:
        """Orderly: the taken messages are consumed; return the next offset to commit (-1 if none)."""
        with self._lock:
            if not self._consuming_tree:
                return -1
            offset = max(self._consuming_tree) + 1
            self.msg_count -= len(self._consuming_tree)
            self.msg_size -= _body_bytes(self._consuming_tree.values())
            self._consuming_tree.clear()
            return offset

    def make_messages_to_consume_again(self, msgs) -> None:
        with self._lock:
            tree = self._tree
            for m in msgs:
                off = m.queue_offset
                self._consuming_tree.pop(off, None)
                if off not in tree:
                    tree[off] = m
            self._resort_locked()

    def rollback(self) -> None:
        with self._lock:
            tree = self._tree
            for off, m in self._consuming_tree.items():
                if off not in tree:
                    tree[off] = m
            self._consuming_tree.clear()
            self._resort_locked()

    def clear(self) -> None:
        with self._lock:
            self._tree.clear()
            self._consuming_tree.clear()
            self.msg_count = 0
            self.msg_size = 0
            self.queue_offset_max = -1

    def __repr__(self) -> str:
        return (f"ProcessQueue(count={self.msg_count}, size={self.msg_size}, max={self.queue_offset_max}, "
                f"dropped={self.dropped}, locked={self.locked})")


__all__ = ["ProcessQueue", "REBALANCE_LOCK_MAX_LIVE_TIME", "PULL_MAX_IDLE_TIME"]
