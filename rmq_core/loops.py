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
