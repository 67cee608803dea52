"""The Futures a client call returns: CancellableFuture, and LeanFuture, the one an async send
returns (it makes its Condition only when a thread waits on it; the native send pipeline
completes it).  A module of their own: the producer, the send accumulator, the client instance
and the asyncio adapter all use them, and none of those should import another for them."""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from concurrent.futures._base import CANCELLED as _CANCELLED
from concurrent.futures._base import CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED
from concurrent.futures._base import FINISHED as _FINISHED
from concurrent.futures._base import PENDING as _PENDING
from concurrent.futures._base import RUNNING as _RUNNING

if TYPE_CHECKING:
    from rmq_core.remoting.pipelined import PipelinedChannel

log = logging.getLogger("rmq.client")

_DONE_STATES = frozenset({_CANCELLED, _CANCELLED_AND_NOTIFIED, _FINISHED})


class CancellableFuture(concurrent.futures.Future):
    """A concurrent Future whose cancel() also calls `on_cancel` (set by whoever runs the work):
    cheaper than a done-callback on every Future just to notice the rare cancellation."""

    def __init__(self):
        super().__init__()
        self.on_cancel: Callable[[], Any] | None = None

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        on_cancel = self.on_cancel
        if on_cancel is not None:
            try:
                on_cancel()
            except RuntimeError:  # the loop is closed: the work went with it
                pass
        return True


# LeanFuture's lazy parts (its Condition, its one lean callback) and its unwatched finish are
# decided under this one lock: whoever makes the Condition does so before or after a lean finish,
# never between its read of the state and its write (a process-wide lock held for a few dict
# operations: cheaper than a Condition per Future)
_LEAN = threading.Lock()
_UNFINISHED = frozenset({_PENDING, _RUNNING})


class LeanFuture(CancellableFuture):
    """A CancellableFuture without a Condition until a thread waits on it or subscribes to it.

    concurrent.futures.Future makes a threading.Condition per Future (a few microseconds, most of
    the cost of one); an async send's Future is usually finished before anyone asks for it.  Here
    `_condition` is made on first use (__getattr__), and finish() completes a Future nobody
    watches in one step under the module's lock (_LEAN): whoever comes later makes the Condition
    first and then reads the final state, so nobody can miss the completion.  Otherwise the usual
    Future methods run.  (The native completion, send_pipeline.PipelinedCompletion, finishes one
    through finish(): set_result on a LeanFuture would make and notify its Condition, over 10 us a
    send.)

    `channel`: the PipelinedChannel whose answer completes it (None when something else does):
    result() and exception() then read answers on the waiting thread while no other thread reads
    (PipelinedChannel.wait, which sleeps in sleep() and is woken by wake()) instead of sleeping
    until that connection's reader thread gets to them."""

    # what Future.__init__ sets, as class defaults (an instance's own value replaces one when set)
    channel: PipelinedChannel | None = None
    _result = None
    _exception = None
    on_cancel = None
    _woken = False

    def __init__(self, channel: PipelinedChannel | None = None):
        self._state = _PENDING
        if channel is not None:
            self.channel = channel

    def __getattr__(self, name):  # only for attributes not set: made on first use, the same for all threads
        if name == "_condition":
            with _LEAN:
                return self.__dict__.setdefault("_condition", threading.Condition())
        if name == "_waiters" or name == "_done_callbacks":
            return self.__dict__.setdefault(name, [])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def finish(self, result, exception: BaseException | None = None) -> None:
        """set_result(result), or set_exception(exception) when one is given; a Future cancelled
        meanwhile stays cancelled (no InvalidStateError)."""
        d = self.__dict__
        with _LEAN:
            lean = "_condition" not in d and self._state in _UNFINISHED
            if lean:
                if exception is None:
                    d["_result"] = result
                else:
                    d["_exception"] = exception
                d["_state"] = _FINISHED
                callback = d.pop("_lean_callback", None)
        if lean:
            if callback is not None:
                try:
                    callback(self)
                except Exception:  # a subscriber's failure is not the finisher's (Future._invoke_callbacks)
                    log.exception("exception calling callback for %r", self)
            return
        try:
            if exception is None:
                self.set_result(result)
            else:
                self.set_exception(exception)
        except concurrent.futures.InvalidStateError:
            pass

    def done(self) -> bool:
        return self._state in _DONE_STATES  # (one read: no lock needed)

    def add_lean_callback(self, fn: Callable[["LeanFuture"], Any]) -> None:
        """add_done_callback for one subscriber (an aio waiter) without making the Condition: fn is
        recorded while the Future is pending and unwatched, and called once by whoever finishes it
        (finish, set_result, set_exception, cancel); otherwise add_done_callback."""
        d = self.__dict__
        with _LEAN:
            lean = "_condition" not in d and "_lean_callback" not in d and self._state in _UNFINISHED
            if lean:
                d["_lean_callback"] = fn
        if not lean:
            self.add_done_callback(fn)

    def _invoke_callbacks(self):  # (Future's own, called by set_result / set_exception / cancel)
        with _LEAN:
            fn = self.__dict__.pop("_lean_callback", None)
        if fn is not None:
            try:
                fn(self)
            except Exception:
                log.exception("exception calling callback for %r", self)
        super()._invoke_callbacks()

    def result(self, timeout: float | None = None):
        if self._state is _FINISHED and self._exception is None:  # answered: no Condition needed
            return self._result
        return super().result(self._wait_on_channel(timeout))

    def exception(self, timeout: float | None = None):
        return super().exception(self._wait_on_channel(timeout))

    def sleep(self, timeout: float | None) -> None:
        """Block until done or woken (wake()) or `timeout` passes (PipelinedChannel.wait)."""
        cond = self._condition
        with cond:
            if not self._woken and self._state not in _DONE_STATES:
                cond.wait(timeout)
            self._woken = False

    def wake(self) -> None:
        cond = self._condition
        with cond:
            self._woken = True
            cond.notify_all()

    def _wait_on_channel(self, timeout: float | None) -> float | None:
        """Read answers on this thread while pending on a channel (see the class doc); the time
        left of `timeout` for the usual wait (which returns at once when the Future is done)."""
        channel = self.channel
        if channel is None or self._state in _DONE_STATES:
            return timeout
        if timeout is None:
            channel.wait(self, None)
            return None
        deadline = time.monotonic() + timeout
        channel.wait(self, timeout)
        return max(0.0, deadline - time.monotonic())


__all__ = ["CancellableFuture", "LeanFuture"]
