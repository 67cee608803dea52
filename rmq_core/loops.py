"""The event loops rmq runs on: uvloop where it is installed (a libuv loop answers a broker request
in roughly two thirds of the time the standard selector loop takes on a small machine), asyncio's
own otherwise.  RMQ_EVENT_LOOP=asyncio forces the standard loop (to compare, or to debug with
asyncio's debug mode)."""
from __future__ import annotations

import asyncio
import os
from typing import Any, Coroutine

try:  # an optional speed-up: everything works on the standard loop too
    import uvloop as _uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on the platforms it supports
    _uvloop = None

ENV = "RMQ_EVENT_LOOP"


async def cancel_and_wait(tasks) -> None:
    """Cancel background tasks (None passed over) and wait until each has really finished (their
    errors are theirs to log; a finished task's is taken, so none is reported as never retrieved)."""
    tasks = [t for t in tasks if t is not None]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def loop_kind() -> str:
    """"uvloop" or "asyncio": what new_event_loop() makes."""
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted not in ("", "uvloop", "asyncio"):
        raise ValueError(f"bad {ENV}={wanted!r}: expected 'uvloop' or 'asyncio'")
    if wanted == "asyncio" or _uvloop is None:
        return "asyncio"
    return "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    return _uvloop.new_event_loop() if loop_kind() == "uvloop" else asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run on the loop new_event_loop() makes."""
    if hasattr(asyncio, "Runner"):  # 3.11+
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(main)
    loop = new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


class CoalescedJob:
    """Serves requests for a job in coalesced runs: one run of `job` at a time, and every
    request made while a run is under way is served by the next run.  A burst of N requests costs
    two runs, not N; a lone request costs one run at once (no timer, no added latency).

    `request()` (in the event loop) returns a future that completes when a run that started after
    the request has finished: with None, or with the run's exception.  `job` is a coroutine
    function; it reads what to do from its owner's state (the changes pending at its start)."""

    def __init__(self, job, name: str):
        self._job = job
        self._name = name
        self._waiters: list[asyncio.Future] = []
        self._task: asyncio.Task | None = None

    def request(self) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:  # (another loop's run died with it)
            self._task = loop.create_task(self._run(), name=self._name)
        return waiter

    async def _run(self) -> None:
        while self._waiters:
            waiters, self._waiters = self._waiters, []
            try:
                await self._job()
            except asyncio.CancelledError:
                for w in waiters + self._waiters:
                    w.cancel()
                self._waiters = []
                raise
            except BaseException as e:  # noqa: BLE001 - handed to every waiter of this run
                for w in waiters:
                    if not w.done():
                        w.set_exception(e)
                        w.exception()  # a waiter that was not awaited must not log "never retrieved"
            else:
                for w in waiters:
                    if not w.done():
                        w.set_result(None)

    async def close(self) -> None:
        """Wait for the run under way (and the batch queued behind it)."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.gather(task, return_exceptions=True)
