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

from rmq_core._native.send_pipeline import finish_unwatched as _finish_unwatched
from rmq_core._native.send_pipeline import init_future_states
from rmq_core._native.send_pipeline import lean_result as _lean_result
from rmq_core._native.send_pipeline import subscribe_unwatched as _subscribe_unwatched

if TYPE_CHECKING:
    from rmq_core.remoting.pipelined import PipelinedChannel

log = logging.getLogger("rmq.client")

init_future_states(_PENDING, _RUNNING, _FINISHED)
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


class LeanFuture(CancellableFuture):
    """A CancellableFuture without a Condition until a thread waits on it or subscribes to it.

    concurrent.futures.Future makes a threading.Condition per Future (a few microseconds, most of
    the cost of one); an async send's Future is usually finished before anyone asks for it.  Here
    `_condition` is made on first use (__getattr__, installed with dict.setdefault so two threads
    get the same one), and finish() completes a Future nobody watches in one native step
    (send_pipeline.finish_unwatched): whoever comes later makes the Condition first and then reads
    the final state, so nobody can miss the completion.  Otherwise the usual Future methods run.

    `channel`: the PipelinedChannel whose answer completes it (None when something else does):
    result() and exception() then read answers on the waiting thread while no other thread reads
    (PipelinedChannel.wait) instead of sleeping until that connection's reader thread gets to them."""

    # what Future.__init__ sets, as class defaults (an instance's own value replaces one when set):
    # a LeanFuture made natively (send_pipeline.PipelinedSender) only sets _state
    channel: PipelinedChannel | None = None
    _result = None
    _exception = None
    on_cancel = None

    def __init__(self, channel: PipelinedChannel | None = None):
        self._state = _PENDING
        if channel is not None:
            self.channel = channel

    def __getattr__(self, name):  # only for attributes not set: made on first use, the same for all threads
        if name == "_condition":
            return self.__dict__.setdefault("_condition", threading.Condition())
        if name == "_waiters" or name == "_done_callbacks":
            return self.__dict__.setdefault(name, [])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def finish(self, result, exception: BaseException | None = None) -> None:
        """set_result(result), or set_exception(exception) when one is given; a Future cancelled
        meanwhile stays cancelled (no InvalidStateError)."""
        if _finish_unwatched(self, result, exception):
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
        recorded natively while the Future is pending and unwatched, and called once by whoever
        finishes it (finish, set_result, set_exception, cancel); otherwise add_done_callback."""
        if not _subscribe_unwatched(self, fn):
            self.add_done_callback(fn)

    def _invoke_callbacks(self):  # (Future's own, called by set_result / set_exception / cancel)
        fn = self.__dict__.pop("_lean_callback", None)
        if fn is not None:
            try:
                fn(self)
            except Exception:
                log.exception("exception calling callback for %r", self)
        super()._invoke_callbacks()

    result = _lean_result  # done and fine: answered natively, no Condition needed; else _result_slow

    def _result_slow(self, timeout: float | None = None):
        if self._state is _FINISHED and self._exception is None:
            return self._result
        return super().result(self._wait_on_channel(timeout))

    def exception(self, timeout: float | None = None):
        return super().exception(self._wait_on_channel(timeout))

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
