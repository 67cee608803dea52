"""Long polling (RocketMQ's PullRequestHoldService), woken by message arrival, not by a timer.

A pull that finds nothing registers a future under (topic, queue id) with the offset it waits
past; the store's arrival listener resolves the futures whose offset is now below the queue's
max offset (and whose filter can match the new entry's tag code).  The pull processor awaits the
future with the request's suspend timeout and then re-runs the read once.

Pops (RocketMQ 5's PopLongPollingService) register with their consumer group: the consumers of a
group share the queue, so an arrival wakes as many of a group's held pops as the new messages can
feed (one per POP_WAKE_BATCH), oldest first, not all of them; a woken pop that finds nothing holds
again at the back.  Waking every waiter made the broker's cost per message grow with the group's
idle consumers.
"""
from __future__ import annotations

import asyncio
import threading


# the messages one woken pop is counted on to take (a receive's usual batch)
POP_WAKE_BATCH = 32


class _Waiter:
    __slots__ = ("offset", "message_filter", "future", "group")

    def __init__(self, offset, message_filter, future, group):
        self.offset, self.message_filter, self.future, self.group = offset, message_filter, future, group


class PullRequestHoldService:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        # (topic, queue id) -> waiters.  Public for one O(1) test on the put path: an empty table
        # (no pull held anywhere, the usual state of a producer-only broker) means nothing to wake.
        # The dict object is never replaced, only changed in place.
        self.held: dict[tuple[str, int], list[_Waiter]] = {}
        self._table = self.held
        self._loop_thread_id: int | None = None

    def bind_thread(self) -> None:
        self._loop_thread_id = threading.get_ident()

    def hold(self, topic: str, queue_id: int, offset: int, message_filter=None, group: str | None = None
             ) -> asyncio.Future:
        """Register in the loop thread; the returned future resolves when a match may exist.
        `group`: a pop's consumer group (its waiters share the queue), None for a pull."""
        fut = self.loop.create_future()
        self._table.setdefault((topic, queue_id), []).append(_Waiter(offset, message_filter, fut, group))
        return fut

    def release(self, topic: str, queue_id: int, fut: asyncio.Future) -> None:
        waiters = self._table.get((topic, queue_id))
        if waiters:
            waiters[:] = [w for w in waiters if w.future is not fut]
            if not waiters:
                del self._table[(topic, queue_id)]

    def notify_message_arriving(self, topic: str, queue_id: int, max_offset: int, tags_code=None,
                                store_timestamp=None, properties=None) -> None:
        """Store arrival listener: callable from any thread."""
        if (topic, queue_id) not in self._table:  # cheap unlocked peek: nobody waiting → nothing to do
            return
        if threading.get_ident() == self._loop_thread_id:
            self._wake(topic, queue_id, max_offset, tags_code)
        else:
            self.loop.call_soon_threadsafe(self._wake, topic, queue_id, max_offset, tags_code)

    def _wake(self, topic, queue_id, max_offset, tags_code) -> None:
        waiters = self._table.get((topic, queue_id))
        if not waiters:
            return
        keep = []
        pops_left: dict[str, int] = {}  # a pop group -> how many more of its waiters this arrival wakes
        for w in waiters:
            if w.future.done():
                continue
            if max_offset <= w.offset:
                keep.append(w)
                continue
            mf = w.message_filter
            # Only the last entry's tag code is known here; a non-match may still have an
            # earlier matching entry, so a tag miss only defers when max moved by exactly one.
            if (mf is not None and tags_code is not None and mf.tag_codes is not None
                    and tags_code not in mf.tag_codes and max_offset == w.offset + 1):
                keep.append(w)
                continue
            if w.group is not None:
                left = pops_left.setdefault(w.group, -(-(max_offset - w.offset) // POP_WAKE_BATCH))
                if left <= 0:
                    keep.append(w)
                    continue
                pops_left[w.group] = left - 1
            w.future.set_result(True)
        if keep:
            self._table[(topic, queue_id)] = keep
        else:
            del self._table[(topic, queue_id)]

    def wake_all(self) -> None:
        for waiters in self._table.values():
            for w in waiters:
                if not w.future.done():
                    w.future.set_result(False)
        self._table.clear()

    def held_count(self) -> int:
        return sum(len(v) for v in self._table.values())
