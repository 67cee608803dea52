"""SYNC_FLUSH group commit answered by an event loop (DefaultMessageStore.attach_event_loop): the
commit thread pings the loop after each round that covers a Future and the loop resolves them;
put_message_async awaits durability without a thread per put; the Futures of requests made
while the same rounds have started are shared (GroupCommitFutures)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading

import pytest

from rmq_core import loops
from rmq_core._native import group_commit as group_commit_native
from tests.codec_oracle import encode_batch_items
from rmq_core.config import FlushDiskType
from rmq_core.store import MessageExtBatch, PutMessageStatus
from rmq_core.store.flush_waits import FlushWaits

from .conftest import hold_python_rounds, msg


@pytest.fixture
def sync_store_1s(store_factory):
    # 1 s syncFlushTimeout: the held-flush tests below wait for it to pass
    return store_factory(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=1000,
                         mapped_file_size_commit_log=4 * 1024 * 1024)


@pytest.fixture
def held_store(sync_store_1s, monkeypatch):
    """(store, release, flushing): a SYNC_FLUSH store with a record in, whose group-commit rounds
    wait for `release` (see hold_python_rounds)."""
    assert sync_store_1s.put_message(msg()).is_ok()
    return (sync_store_1s, *hold_python_rounds(sync_store_1s, monkeypatch))


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def test_an_attached_loop_answers_many_writers_with_durable_puts(sync_store_1s):
    s = sync_store_1s
    svc = s.commit_log.flush_service
    callback_threads = set()

    async def main():
        s.attach_event_loop()
        loop_thread = threading.get_ident()

        async def writer(w):
            for i in range(25):
                r = await s.put_message_async(msg(queue_id=w % 4, body=b"w%d-%d" % (w, i)))
                assert r.status is PutMessageStatus.PUT_OK, r
                # durable when answered: the commit thread's durable offset passed its end
                assert svc.gate.flushed >= r.append_result.wrote_offset + r.append_result.wrote_bytes

        rounds = svc.rounds
        await asyncio.gather(*(writer(w) for w in range(16)))
        assert svc.rounds > rounds
        # a Future's done-callbacks run in the loop's thread (the loop resolves them)
        _, fut = s.put_message_nowait(msg(body=b"last"))
        fut.add_done_callback(lambda f: callback_threads.add(threading.get_ident()))
        assert await s.await_durable_async(s.put_message_nowait(msg())[0], fut) is not None
        await asyncio.sleep(0)
        s.detach_event_loop()
        return loop_thread

    loop_thread = loops.run(main())
    assert callback_threads == {loop_thread}
    assert sum(s.get_max_offset_in_queue("TopicA", q) for q in range(4)) == 16 * 25 + 2


def test_a_busy_attached_loop_still_answers_its_futures_itself(sync_store_1s, monkeypatch):
    """The commit thread finishes a pass after the round that covers a Future while the attached
    loop is too busy to read its ping (a loaded machine): the Future waits for the loop."""
    s = sync_store_1s
    svc = s.commit_log.flush_service
    callback_threads = set()
    passes_after = threading.Event()
    end = []
    real_after_rounds = svc._after_rounds

    def after_rounds(fail=False):
        real_after_rounds(fail)
        if end and svc.gate.flushed >= end[0]:
            passes_after.set()  # a whole pass of the commit thread after the covering round

    monkeypatch.setattr(svc, "_after_rounds", after_rounds)

    async def main():
        s.attach_event_loop()
        try:
            r, fut = s.put_message_nowait(msg(body=b"busy"))
            end.append(r.append_result.wrote_offset + r.append_result.wrote_bytes)
            fut.add_done_callback(lambda f: callback_threads.add(threading.get_ident()))
            assert passes_after.wait(10)  # the loop blocked: it cannot read the ping meanwhile
            assert not fut.done(), "the commit thread answered a Future of the attached loop"
            assert (await s.await_durable_async(r, fut)).status is PutMessageStatus.PUT_OK
        finally:
            s.detach_event_loop()
        return threading.get_ident()

    assert callback_threads == {loops.run(main())}


def test_batches_from_an_attached_loop_are_durable_when_answered(sync_store_1s):
    s = sync_store_1s
    svc = s.commit_log.flush_service

    async def main():
        s.attach_event_loop()
        try:
            async def batch(k):
                body = encode_batch_items([(0, b"b%d-%d" % (k, i), {"UNIQ_KEY": "K%d-%d" % (k, i)}) for i in range(10)])
                r = await s.put_messages_async(MessageExtBatch("TopicA", k % 2, body))
                assert r.status is PutMessageStatus.PUT_OK and r.append_result.msg_num == 10
                assert svc.gate.flushed >= r.append_result.wrote_offset + r.append_result.wrote_bytes

            await asyncio.gather(*(batch(k) for k in range(8)))
        finally:
            s.detach_event_loop()

    loops.run(main())
    assert s.get_max_offset_in_queue("TopicA", 0) + s.get_max_offset_in_queue("TopicA", 1) == 80


def test_requests_made_while_the_same_rounds_started_share_one_future(tmp_path):
    gate = group_commit_native.GroupCommitGate()
    futures = group_commit_native.GroupCommitFutures(gate, concurrent.futures.Future)
    a, b = futures.request(100), futures.request(200)
    assert a is b and not a.done()
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # one native round (fdatasync of fd) takes both requests; it returns to resolve them
        code, _ = gate.serve(fd, 0, 1 << 20, 5000, True)
    finally:
        os.close(fd)
    assert code == group_commit_native.GC_RETURN and gate.flushed == 200 and gate.rounds == 1
    c = futures.request(300)  # a round started since: a new Future
    assert c is not a
    # the durable offset covers a's requests only: a alone is handed back, c stays open
    assert futures.take_covered(gate.flushed) == [(a, 200)]
    assert futures.take_covered(gate.flushed) == [] and futures.pending
    assert futures.take_covered(300) == [(c, 300)] and not futures.pending


def test_a_refused_service_answers_every_later_request_with_its_future():
    futures = group_commit_native.GroupCommitFutures(group_commit_native.GroupCommitGate(), concurrent.futures.Future)
    refused = concurrent.futures.Future()
    refused.set_result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
    futures.refuse(refused)
    assert futures.request(100) is refused and not futures.pending


def test_a_request_already_durable_is_answered_by_the_loop(sync_store_1s):
    s = sync_store_1s
    svc = s.commit_log.flush_service
    assert s.put_message(msg()).is_ok()

    async def main():
        s.attach_event_loop()
        try:
            fut = svc.put_request(1)  # bytes below 1 are long durable: no round will come for it
            return await asyncio.wait_for(asyncio.wrap_future(fut), 5)
        finally:
            s.detach_event_loop()

    assert loops.run(main()) is PutMessageStatus.PUT_OK


def test_detaching_hands_unanswered_futures_back_to_the_commit_thread(held_store):
    s, hold, flushing = held_store

    async def main():
        s.attach_event_loop()
        _, fut = s.put_message_nowait(msg(body=b"held"))
        assert await asyncio.to_thread(flushing.wait, 10)
        s.detach_event_loop()  # the round covering the put is still flushing
        return fut

    fut = loops.run(main())
    assert not fut.done()
    hold.set()
    assert fut.result(timeout=10) is PutMessageStatus.PUT_OK  # answered by the commit thread


def test_a_shutdown_while_attached_answers_every_future_and_closes_the_descriptor(store_factory):
    s = store_factory(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    before = _open_fds()

    async def main():
        s.attach_event_loop()
        attached = _open_fds() - before
        assert attached  # the loop's eventfd (or pipe)
        _, fut = s.put_message_nowait(msg())
        await asyncio.to_thread(s.shutdown)  # the broker stopping without detaching first
        await asyncio.sleep(0.05)  # the loop runs the reader removal the shutdown handed it
        return fut, attached

    fut, attached = loops.run(main())
    assert fut.result(timeout=10) in (PutMessageStatus.PUT_OK, PutMessageStatus.SERVICE_NOT_AVAILABLE)
    assert not (attached & _open_fds())
    assert s.put_message_nowait(msg())[0].status is not PutMessageStatus.PUT_OK  # stopped


def test_attaching_twice_is_refused_and_async_flush_ignores_it(store_factory):
    s = store_factory(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    a = store_factory(config=None, flush_disk_type=FlushDiskType.ASYNC_FLUSH,
                      store_path_root_dir=str(s.config.store_path_root_dir) + "-async")

    async def main():
        s.attach_event_loop()
        try:
            with pytest.raises(RuntimeError, match="already attached"):
                s.attach_event_loop()
        finally:
            s.detach_event_loop()
        a.attach_event_loop()  # nothing to resolve under ASYNC_FLUSH
        r = await a.put_message_async(msg())
        assert r.status is PutMessageStatus.PUT_OK
        a.detach_event_loop()

    loops.run(main())


def test_an_undurable_put_is_answered_flush_disk_timeout(held_store):
    s, hold, _ = held_store

    async def main():
        s.attach_event_loop()
        try:
            return await s.put_message_async(msg(body=b"slow"))
        finally:
            hold.set()
            s.detach_event_loop()

    r = loops.run(main())
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and "syncFlushTimeout 1000 ms" in r.error
    assert r.append_result is not None  # stored, only not durable in time


def test_cancelling_one_waiter_leaves_the_others_of_its_group():
    async def main():
        waits = FlushWaits(asyncio.get_running_loop(), 5.0)
        shared = concurrent.futures.Future()
        first, second = waits.wait(shared), waits.wait(shared)
        first.cancel()
        assert not shared.cancelled()
        threading.Thread(target=shared.set_result, args=(PutMessageStatus.PUT_OK,)).start()
        assert await asyncio.wait_for(second, 5) is PutMessageStatus.PUT_OK
        # a Future already resolved answers at once
        assert await waits.wait(shared) is PutMessageStatus.PUT_OK

    loops.run(main())


def test_a_group_answered_past_its_timeout_stays_answered_flush_disk_timeout():
    async def main():
        waits = FlushWaits(asyncio.get_running_loop(), 0.05)
        shared = concurrent.futures.Future()
        w = waits.wait(shared)
        assert await asyncio.wait_for(w, 5) is PutMessageStatus.FLUSH_DISK_TIMEOUT
        shared.set_result(PutMessageStatus.PUT_OK)  # late: nothing left to answer, no error
        await asyncio.sleep(0)

    loops.run(main())
