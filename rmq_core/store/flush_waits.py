"""Awaiting SYNC_FLUSH durability (and SYNC_MASTER replication) from an event loop.

Every put a group commit covers shares one `concurrent.futures.Future` (GroupCommitService).
`asyncio.wrap_future` per put would hang one callback per put on it and, when the round ends, make
one `call_soon_threadsafe` per put; `FlushWaits` hangs one callback per Future and resolves every
waiter of that Future in one loop callback.  Each awaiting coroutine still gets an asyncio future
of its own, so cancelling one (a client gone) leaves the others and the shared Future alone.
A group not durable within syncFlushTimeout is answered FLUSH_DISK_TIMEOUT, as RocketMQ answers a
SYNC_FLUSH send whose flush did not finish in time.  SYNC_MASTER puts share a replication round's
Future the same way (GroupTransferService); those rounds answer their own timeout.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from rmq_core.store.types import PutMessageStatus


class _Group:
    __slots__ = ("waiters", "timer", "settled")

    def __init__(self, waiter: asyncio.Future) -> None:
        self.waiters = [waiter]
        self.timer: asyncio.TimerHandle | None = None
        self.settled = False  # answered: a waiter added now would never be


class FlushWaits:
    """Per event loop: waiters of group-commit Futures.  Use from the loop's thread only."""

    __slots__ = ("loop", "timeout", "timeout_status", "thread", "_future", "_group")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float,
                 timeout_status: PutMessageStatus = PutMessageStatus.FLUSH_DISK_TIMEOUT) -> None:
        self.loop = loop
        self.timeout = timeout
        self.timeout_status = timeout_status  # the answer when `timeout` runs out
        self.thread = threading.get_ident()  # the loop's
        self._future: concurrent.futures.Future | None = None
        self._group: _Group | None = None

    def wait(self, future: concurrent.futures.Future) -> asyncio.Future:
        """An asyncio future resolved with `future`'s result (a PutMessageStatus), or with
        FLUSH_DISK_TIMEOUT after `timeout` seconds."""
        w = self.loop.create_future()
        if future is self._future and not self._group.settled:  # the usual case: no lock taken
            self._group.waiters.append(w)
        elif future.done():
            _settle(_Group(w), future)
        else:
            self._future = future
            group = self._group = _Group(w)
            group.timer = self.loop.call_later(self.timeout, _expire, group, self.timeout_status)
            future.add_done_callback(lambda f: self._done(group, f))
        return w

    def _done(self, group: _Group, future: concurrent.futures.Future) -> None:
        # an attached loop resolves the Futures in its own thread: no hop through the self-pipe
        if threading.get_ident() == self.thread:
            _settle(group, future)
        else:
            try:
                self.loop.call_soon_threadsafe(_settle, group, future)
            except RuntimeError:  # the loop is closed: nobody is left awaiting
                pass


def _settle(group: _Group, future: concurrent.futures.Future) -> None:
    group.settled = True
    if group.timer is not None:
        group.timer.cancel()
    cancelled = future.cancelled()
    exc = None if cancelled else future.exception()
    for w in group.waiters:
        if w.done():  # its coroutine was cancelled meanwhile, or the group timed out
            continue
        if cancelled:
            w.cancel()
        elif exc is not None:
            w.set_exception(exc)
        else:
            w.set_result(future.result())


def _expire(group: _Group, status: PutMessageStatus) -> None:
    group.timer = None  # (not settled: the Future's own answer still comes, to nobody)
    for w in group.waiters:
        if not w.done():
            w.set_result(status)
