"""ProcessQueue: the client-side buffer of one message queue between pulling and consuming.

Messages are kept by queue offset.  RocketMQ uses a TreeMap; here a dict holds offset -> message
and a binary heap of offsets (with lazy deletion) gives the smallest live offset in amortised
O(log n), so committing "the lowest unconsumed offset" never scans the buffer.

Concurrent consumption: `put_messages` on pull, `remove_messages` when a chunk of consume requests
is done; the returned offset is what may be committed (everything below it is consumed).  A chunk
registers its list of consumed-but-not-yet-removed messages (`track_consumed`) so the expired-message
cleaner does not take them for stuck ones.  A pull loop held back by flow control leaves a waiter
(`flow_waiter`) that a removal calls, so it pulls again as soon as the buffer has room.
Orderly consumption: `take_messages` moves the smallest messages into a "consuming" table,
`commit` forgets them and returns the next offset, `make_messages_to_consume_again` puts them back.
"""
from __future__ import annotations

import heapq
import threading
import time


REBALANCE_LOCK_MAX_LIVE_TIME = 30.0  # client-side lock validity (Java: 30 s)
PULL_MAX_IDLE_TIME = 120.0  # a queue not pulled for this long is rebuilt by the next rebalance


def _now() -> float:
    return time.monotonic()


class ProcessQueue:
    __slots__ = (
        "_tree", "_heap", "_lock", "msg_count", "msg_size", "queue_offset_max", "dropped",
        "last_pull_timestamp", "last_consume_timestamp", "locked", "last_lock_timestamp",
        "consuming", "_consuming_tree", "consume_lock", "msg_acc_cnt", "try_unlock_times",
        "_consumed_lists", "flow_waiter", "__weakref__",
    )

    def __init__(self):
        self._tree: dict = {}  # queue offset -> MessageExt
        self._heap: list = []  # offsets; an offset no longer in _tree is stale
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
        self._consumed_lists: dict = {}  # id(list) -> list of consumed messages not yet removed
        self.flow_waiter = None  # set by a pull loop waiting for room; called (once) after removals

    # --- state -----------------------------------------------------------------------------------
    def is_lock_expired(self, max_live: float = REBALANCE_LOCK_MAX_LIVE_TIME) -> bool:
        return _now() - self.last_lock_timestamp > max_live

    def is_pull_expired(self, max_idle: float = PULL_MAX_IDLE_TIME) -> bool:
        return _now() - self.last_pull_timestamp > max_idle

    def _min_offset_locked(self):
        heap, tree = self._heap, self._tree
        while heap and heap[0] not in tree:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _compact_locked(self) -> None:
        # stale heap entries pile up when removals are mostly from the middle; rebuild when the
        # heap is much larger than the live set so memory stays proportional to the buffer
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._tree):
            self._heap = list(self._tree)
            heapq.heapify(self._heap)

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
        dispatch = False
        with self._lock:
            tree, heap = self._tree, self._heap
            added = 0
            for m in msgs:
                off = m.queue_offset
                if off in tree:
                    continue
                tree[off] = m
                heapq.heappush(heap, off)
                added += 1
                self.msg_size += len(m.body or b"")
                if off > self.queue_offset_max:
                    self.queue_offset_max = off
            self.msg_count += added
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
            result = self.queue_offset_max + 1
            removed = 0
            for m in msgs:
                old = tree.pop(m.queue_offset, None)
                if old is not None:
                    removed += 1
                    self.msg_size -= len(old.body or b"")
            self.msg_count -= removed
            if tree:
                result = self._min_offset_locked()
            self._compact_locked()
            return result

    def track_consumed(self, lst: list) -> None:
        self._consumed_lists[id(lst)] = lst

    def untrack_consumed(self, lst: list) -> None:
        self._consumed_lists.pop(id(lst), None)

    def consumed_ids(self) -> set:
        """ids of the messages whose listener returned but which are still buffered."""
        return {id(m) for lst in list(self._consumed_lists.values()) for m in list(lst)}

    def wake_flow_waiter(self) -> None:
        waiter = self.flow_waiter
        if waiter is not None:
            waiter()

    def first_messages(self, n: int) -> list:
        """Up to n buffered messages with the smallest offsets (expired-message cleaning)."""
        with self._lock:
            return [self._tree[o] for o in heapq.nsmallest(n, (o for o in self._heap if o in self._tree))]

    # --- orderly ---------------------------------------------------------------------------------
    def take_messages(self, batch_size: int) -> list:
        now = _now()
        out = []
        with self._lock:
            self.last_consume_timestamp = now
            tree, heap = self._tree, self._heap
            while heap and len(out) < batch_size:
                off = heapq.heappop(heap)
                m = tree.pop(off, None)
                if m is None:
                    continue
                self._consuming_tree[off] = m
                out.append(m)
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
            for m in self._consuming_tree.values():
                self.msg_size -= len(m.body or b"")
            self._consuming_tree.clear()
            return offset

    def make_messages_to_consume_again(self, msgs) -> None:
        with self._lock:
            for m in msgs:
                off = m.queue_offset
                self._consuming_tree.pop(off, None)
                if off not in self._tree:
                    self._tree[off] = m
                    heapq.heappush(self._heap, off)

    def rollback(self) -> None:
        with self._lock:
            for off, m in self._consuming_tree.items():
                if off not in self._tree:
                    self._tree[off] = m
                    heapq.heappush(self._heap, off)
            self._consuming_tree.clear()

    def clear(self) -> None:
        with self._lock:
            self._tree.clear()
            self._heap.clear()
            self._consuming_tree.clear()
            self.msg_count = 0
            self.msg_size = 0
            self.queue_offset_max = -1

    def __repr__(self) -> str:
        return (f"ProcessQueue(count={self.msg_count}, size={self.msg_size}, max={self.queue_offset_max}, "
                f"dropped={self.dropped}, locked={self.locked})")


__all__ = ["ProcessQueue", "REBALANCE_LOCK_MAX_LIVE_TIME", "PULL_MAX_IDLE_TIME"]
