"""The broker: processors, services and the controller that owns them."""
from __future__ import annotations

import asyncio


async def cancel_and_wait(tasks) -> None:
    """Cancel background tasks and wait until each has really finished (errors already logged)."""
    tasks = [t for t in tasks if t is not None]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
