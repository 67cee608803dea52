"""The bridge between callers' threads and a client's event loop: the loop runs in its own
daemon thread; a caller posts a call to it (`post`, one wake-up per burst), starts a coroutine on it
and gets a Future (`submit`), or runs one and blocks for its outcome (`run`).  MQClientInstance is
one (its producers and consumers reach the loop through it)."""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
from typing import Any, Callable

from rmq_core import loops
from rmq_core.client.futures import CancellableFuture
from rmq_core.errors import MQClientError

log = logging.getLogger("rmq.client")


class BlockingCall:
    """One coroutine run on the client loop for a blocked caller: the loop releases `_done`."""

    __slots__ = ("coro", "task", "result", "error", "cancelled", "_done")

    def __init__(self, coro):
        self.coro = coro
        self.task: asyncio.Task | None = None
        self.cancelled = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def start(self) -> None:  # on the loop
        if self.cancelled:  # the caller gave up before the loop got here
            self.coro.close()
            self.error = concurrent.futures.CancelledError()
            self._done.release()
            return
        self.task = task = asyncio.get_running_loop().create_task(self.coro)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:  # on the loop
        if task.cancelled():
            self.error = concurrent.futures.CancelledError()
        else:
            self.error = task.exception()
            if self.error is None:
                self.result = task.result()
        self._done.release()

    def wait(self, loop: asyncio.AbstractEventLoop, timeout: float | None):
        if not self._done.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            # cancel, then wait for the task to see it: the coroutine never outlives the call
            try:
                loop.call_soon_threadsafe(self._cancel)
            except RuntimeError:  # loop closed: the coroutine is gone with it
                raise MQClientError(f"operation timed out after {timeout} s") from None
            self._done.acquire(timeout=5)
            if self.error is None or isinstance(self.error, concurrent.futures.CancelledError):
                raise MQClientError(f"operation timed out after {timeout} s") from None
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        return self.result

    def _cancel(self) -> None:  # on the loop
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()


class LoopBridge:
    """An event loop in its own thread, and the ways other threads hand it work."""

    def __init__(self, name: str):
        self._bridge_name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._pending_tasks: set = set()
        self._posted: collections.deque = collections.deque()  # calls waiting for the loop (see post)
        self._drain_scheduled = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    def _start_loop(self) -> None:
        """Make the loop and run it in its thread; returns once it runs."""
        self._loop = loops.new_event_loop()
        ready = threading.Event()

        def run_loop():
            asyncio.set_event_loop(self._loop)
            self._loop.call_soon(ready.set)
            self._loop.run_forever()

        self._loop_thread = threading.Thread(target=run_loop, name=f"rmq-loop-{self._bridge_name}", daemon=True)
        self._loop_thread.start()
        ready.wait()

    def _stop_loop(self) -> None:
        """Stop the loop, wait for its thread and close it (its tasks already ended)."""
        loop = self._loop
        loop.call_soon_threadsafe(loop.stop)
        self._loop_thread.join(10)
        loop.close()

    @property
    def loop_thread_ident(self) -> int | None:
        """The client loop's thread id (None before start)."""
        t = self._loop_thread
        return None if t is None else t.ident

    def in_loop_thread(self) -> bool:
        return self._loop_thread is threading.current_thread()

    def post(self, fn: Callable[[], Any]) -> None:
        """Run fn() on the loop soon.  Calls posted while the loop has not yet drained the earlier
        ones share one wake-up (one self-pipe write per burst, not per call)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise MQClientError(f"client {self._bridge_name} is not running")
        self._posted.append(fn)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            try:
                loop.call_soon_threadsafe(self._drain_posted)
            except RuntimeError:  # the loop closed between the check and the call
                self._drain_scheduled = False
                raise MQClientError(f"client {self._bridge_name} is not running") from None

    def _drain_posted(self) -> None:
        # Clear the flag before draining: a call appended after it is cleared schedules its own
        # drain, one appended before is taken by this one (no call is ever left behind).
        self._drain_scheduled = False
        posted = self._posted
        while posted:
            fn = posted.popleft()
            try:
                fn()
            except Exception:
                log.exception("posted call %r failed", fn)

    def submit(self, coro) -> concurrent.futures.Future:
        """Start coro on the loop; its outcome lands in the returned Future (cancelling the Future
        cancels the coroutine)."""
        fut = CancellableFuture()

        def start():
            if fut.cancelled():  # cancelled before the loop got to it
                coro.close()
                return
            task = self._loop.create_task(coro)

            def done(t: asyncio.Task):
                # the Future stays pending while the task runs (so cancel() works), as with
                # run_coroutine_threadsafe; a Future cancelled meanwhile just stays cancelled
                if t.cancelled():
                    fut.cancel()
                if not fut.set_running_or_notify_cancel():
                    return
                exc = t.exception()
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(t.result())

            task.add_done_callback(done)
            fut.on_cancel = lambda: self._loop.call_soon_threadsafe(task.cancel)
            if fut.cancelled():  # cancelled between the check above and now
                task.cancel()

        try:
            self.post(start)
        except MQClientError:
            coro.close()
            raise
        return fut

    def run(self, coro, timeout: float | None = None):
        """Run a coroutine on the client loop and wait for it (never call from the loop itself).

        The caller blocks on a plain lock the loop releases when the coroutine ends: cheaper than
        run_coroutine_threadsafe's concurrent Future (a Condition, chained callbacks)."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError(f"{type(self).__name__}.run() called on the client event loop (would deadlock)")
        call = BlockingCall(coro)
        try:
            self.post(call.start)
        except MQClientError:
            coro.close()
            raise
        return call.wait(self._loop, timeout)

    def spawn(self, coro) -> asyncio.Task:
        """Start a background task on the loop (call from the loop); cancelled at shutdown."""
        task = asyncio.get_running_loop().create_task(coro)
        self._pending_tasks.add(task)
        task.add_done_callback(self._pending_tasks.discard)
        return task


__all__ = ["BlockingCall", "LoopBridge"]
