"""rmq_core.aio against an embedded cluster (TCP and in-proc), on asyncio's loop and on uvloop."""
import asyncio
import threading

import pytest

from rmq_core import ConsumeStatus, Message, aio
from rmq_core.message import SendStatus
from tests.client.conftest import FAST, FAST_CONSUMER, drain_topic

LOOPS = ["asyncio", "uvloop"]


def run(coro, loop_kind: str):
    """Run coro to its end on a new loop of that kind (asyncio.Runner is 3.11+)."""
    if loop_kind == "uvloop":
        loop = pytest.importorskip("uvloop").new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def _contiguous(results) -> None:
    per_queue = {}
    for r in results:
        per_queue.setdefault(r.queue, []).append(r.queue_offset)
    for offsets in per_queue.values():  # nothing lost or doubled in any queue
        offsets.sort()
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_ten_thousand_sends_awaited_concurrently(namesrv, loop_kind):
    n = 10_000

    async def main():
        async with aio.Producer("PG_AIO_GATHER", namesrv=namesrv, **FAST) as p:
            return await asyncio.gather(*(p.send(Message("AioGatherT", f"m{i}".encode())) for i in range(n)))

    results = run(main(), loop_kind)
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == n
    _contiguous(results)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_ticker_keeps_ticking_during_a_send_storm(namesrv, loop_kind):
    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        async with aio.Producer("PG_AIO_STORM", namesrv=namesrv, **FAST) as p:
            await p.send(Message("AioStormT", b"warm"))
            tick_task = asyncio.ensure_future(ticker())
            ticks_seen = []

            async def sender(w):  # 50 senders, 100 sends each, each awaited
                for i in range(100):
                    await p.send(Message("AioStormT", f"{w}-{i}".encode()))
                    ticks_seen.append(ticks)

            await asyncio.gather(*(sender(w) for w in range(50)))
            stop.set()
            await tick_task
        return ticks_seen

    ticks_seen = run(main(), loop_kind)
    # the loop went round between the answers (a sender waiting in the loop's thread, a blocking
    # read or write, would leave the ticker standing): it ticked all through the storm
    assert len(ticks_seen) == 5000
    assert ticks_seen[-1] - ticks_seen[0] >= 50
    assert len(set(ticks_seen)) >= 50


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_ordered_batch_and_oneway_sends_then_async_for(cluster, loop_kind):
    ns = cluster.tcp_namesrv

    async def main():
        async with aio.Producer("PG_AIO_ORDER", namesrv=ns, **FAST) as p:
            ordered = [await p.send_orderly(Message("AioOrderT", f"{order}-{step}".encode()), None, order)
                       for step in range(5) for order in ("o1", "o2", "o3")]
            batch = await p.send_batch([Message("AioOrderT", f"b{i}".encode()) for i in range(10)])
            await p.send_oneway(Message("AioOrderT", b"oneway"))
        for order in ("o1", "o2", "o3"):  # one queue per order key, offsets in send order
            mine = [r for r, m in zip(ordered, [o for _ in range(5) for o in ("o1", "o2", "o3")]) if m == order]
            assert len({r.queue for r in mine}) == 1
            assert [r.queue_offset for r in mine] == sorted(r.queue_offset for r in mine)
        assert batch.status is SendStatus.SEND_OK and len(batch.msg_id.split(",")) == 10

        got = []
        async with aio.PullConsumer("CG_AIO_ORDER", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                    **FAST_CONSUMER) as c:
            c.subscribe("AioOrderT", "*")
            async for msg in c:
                got.append(msg)
                if len(got) == 26:
                    break
            await c.commit()
            queues = c.assignment()
            committed = {mq: await c.committed(mq) for mq in queues}
        bodies = [m.body for m in got]
        assert sorted(bodies) == sorted([f"{o}-{s}".encode() for s in range(5) for o in ("o1", "o2", "o3")]
                                        + [f"b{i}".encode() for i in range(10)] + [b"oneway"])
        for order in (b"o1", b"o2", b"o3"):  # each order's messages arrive in their send order
            assert [b for b in bodies if b.startswith(order)] == [order + f"-{s}".encode() for s in range(5)]
        assert sum(max(v, 0) for v in committed.values()) == 26

    run(main(), loop_kind)


def test_a_failing_async_listener_is_retried(cluster):
    async def main():
        async with aio.Producer("PG_AIO_PUSH", namesrv=cluster.namesrv, **FAST) as p:
            for i in range(3):
                await p.send(Message("AioPushT", f"p{i}".encode()))
        seen: dict[bytes, list[int]] = {}
        done = asyncio.Event()
        loop_thread = threading.get_ident()

        async def listener(msgs):
            assert threading.get_ident() == loop_thread  # the coroutine runs on our loop
            await asyncio.sleep(0)
            for m in msgs:
                seen.setdefault(m.body, []).append(m.reconsume_times)
            if any(m.reconsume_times == 0 for m in msgs):
                raise RuntimeError("injected: first delivery fails")
            if len(seen) == 3 and all(len(v) >= 2 for v in seen.values()):
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        c = aio.PushConsumer("CG_AIO_PUSH", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                             **FAST_CONSUMER)
        c.subscribe("AioPushT", "*")
        c.register_message_listener(listener)
        async with c:
            await asyncio.wait_for(done.wait(), 60)
        assert set(seen) == {b"p0", b"p1", b"p2"}
        assert all(v[0] == 0 and v[-1] >= 1 for v in seen.values())

    run(main(), "asyncio")


def test_a_plain_function_is_refused_as_an_async_listener(cluster):
    from rmq_core.errors import ConfigError

    c = aio.PushConsumer("CG_AIO_BAD", namesrv=cluster.namesrv)
    with pytest.raises(ConfigError, match="coroutine function"):
        c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_cancelling_a_pending_send(cluster, loop_kind):
    async def main():
        async with aio.Producer("PG_AIO_CANCEL", namesrv=cluster.tcp_namesrv, **FAST) as p:
            await p.send(Message("AioCancelT", b"warm"))
            task = asyncio.ensure_future(p.send(Message("AioCancelT", b"abandoned")))  # written at once
            task.cancel()  # (before the loop could read its answer: not after a sleep(0), which could)
            with pytest.raises(asyncio.CancelledError):
                await task
            # the producer goes on: the next sends are answered
            results = await asyncio.gather(*(p.send(Message("AioCancelT", b"after")) for _ in range(20)))
            assert all(r.status is SendStatus.SEND_OK for r in results)

    run(main(), loop_kind)
    # the abandoned request was written before its task was cancelled: the broker stored it
    got = drain_topic(cluster.tcp_namesrv, "AioCancelT", "CG_AIO_CANCEL", 22, timeout=10)
    assert sorted(m.body for m in got).count(b"abandoned") == 1
