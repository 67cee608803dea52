"""LeanFuture (an async send's Future: no Condition until someone waits) behaves as a
concurrent.futures.Future in every way a caller can see, under races between the thread that
finishes it and threads that wait on it, subscribe to it or cancel it; and the native UNIQ_KEY
maker (record_batch.UniqIds, which MessageClientIDSetter.create_uniq_id is) makes ids from its parts."""
import asyncio
import concurrent.futures
import random
import re
import threading
import time

import pytest

from rmq_core._native.record_batch import UniqIds
from rmq_core.client.futures import CancellableFuture, LeanFuture
from rmq_core.message import MessageClientIDSetter


def test_finished_before_anyone_asks_needs_no_condition():
    f = LeanFuture()
    f.finish("r")
    assert "_condition" not in f.__dict__
    assert f.done() and not f.cancelled() and f.result() == "r" and f.exception() is None
    assert isinstance(f, CancellableFuture) and isinstance(f, concurrent.futures.Future)


def test_a_waiting_thread_is_woken_by_finish():
    f = LeanFuture()
    got = []
    t = threading.Thread(target=lambda: got.append(f.result(10)))
    t.start()
    time.sleep(0.1)  # the waiter made the Condition and waits on it
    assert "_condition" in f.__dict__
    f.finish(42)
    t.join(5)
    assert got == [42]


def test_an_exception_is_raised_by_result_and_returned_by_exception():
    f = LeanFuture()
    error = ValueError("bad")
    f.finish(None, error)
    assert f.exception() is error
    with pytest.raises(ValueError, match="bad"):
        f.result()


def test_result_times_out_while_pending():
    f = LeanFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        f.result(0.05)
    assert not f.done()


def test_cancel_then_finish_stays_cancelled_and_finish_then_cancel_is_refused():
    calls = []
    f = LeanFuture()
    f.on_cancel = lambda: calls.append("on_cancel")
    assert f.cancel() and f.cancelled()
    f.finish("late")  # no InvalidStateError: the caller gave up on it
    assert f.cancelled() and calls == ["on_cancel"]
    with pytest.raises(concurrent.futures.CancelledError):
        f.result()
    g = LeanFuture()
    g.finish("done")
    assert not g.cancel() and g.result() == "done"


def test_done_callbacks_fire_once_whether_added_before_or_after():
    seen = []
    f = LeanFuture()
    f.add_done_callback(lambda fut: seen.append(("before", fut.result())))
    f.finish(1)
    f.add_done_callback(lambda fut: seen.append(("after", fut.result())))
    assert seen == [("before", 1), ("after", 1)]


def test_wait_as_completed_and_asyncio_see_lean_futures():
    futures = [LeanFuture() for _ in range(5)]
    threading.Timer(0.05, lambda: [f.finish(i) for i, f in enumerate(futures)]).start()
    done, not_done = concurrent.futures.wait(futures, timeout=5)
    assert len(done) == 5 and not not_done
    more = [LeanFuture() for _ in range(3)]
    threading.Timer(0.05, lambda: [f.finish(i) for i, f in enumerate(more)]).start()
    assert sorted(f.result() for f in concurrent.futures.as_completed(more, timeout=5)) == [0, 1, 2]

    async def main():
        f = LeanFuture()
        asyncio.get_running_loop().call_later(0.02, lambda: threading.Thread(target=f.finish, args=("aio",)).start())
        return await asyncio.wrap_future(f)

    assert asyncio.run(main()) == "aio"


def test_races_between_finishing_waiting_subscribing_and_cancelling():
    """One thread finishes each Future while others wait on it, subscribe to it or cancel it, at
    random moments: every waiter returns, every callback runs exactly once, and a Future is either
    finished with its value or cancelled (cancel() said True), never both or neither."""
    n = 3000
    futures = [LeanFuture() for _ in range(n)]
    callbacks = [0] * n
    outcomes = [None] * n
    cancelled_ok = [False] * n
    lock = threading.Lock()
    rng = random.Random(5)
    plan = [rng.choice(["wait", "callback", "cancel", "none"]) for _ in range(n)]

    def finisher():
        for i, f in enumerate(futures):
            if i % 7 == 0:
                time.sleep(0)  # let the others in at varied points
            f.finish(i)

    def waiter():
        for i, f in enumerate(futures):
            if plan[i] == "wait":
                try:
                    outcomes[i] = f.result(10)
                except concurrent.futures.CancelledError:
                    outcomes[i] = "cancelled"

    def subscriber():
        for i, f in enumerate(futures):
            if plan[i] == "callback":
                def cb(fut, i=i):
                    with lock:
                        callbacks[i] += 1
                f.add_done_callback(cb)

    def canceller():
        for i, f in enumerate(futures):
            if plan[i] == "cancel":
                cancelled_ok[i] = f.cancel()

    threads = [threading.Thread(target=fn) for fn in (waiter, subscriber, canceller, finisher)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, f in enumerate(futures):
        assert f.done()
        if cancelled_ok[i]:
            assert f.cancelled()
        else:
            assert not f.cancelled() and f.result() == i
        if plan[i] == "wait":
            assert outcomes[i] == i
        if plan[i] == "callback":
            assert callbacks[i] == 1


# --- UNIQ_KEY --------------------------------------------------------------------------------------
def test_native_ids_have_the_layout_and_share_one_counter():
    other = UniqIds(MessageClientIDSetter.hex_prefix, MessageClientIDSetter.month_bounds,
                    MessageClientIDSetter._sequence)
    ids = []
    for _ in range(50):
        ids.append(MessageClientIDSetter.create_uniq_id())
        ids.append(other())
    assert all(re.fullmatch(r"[0-9A-F]{32}", u) for u in ids)
    assert {u[:20] for u in ids} == {MessageClientIDSetter.hex_prefix()}
    counters = [int(u[28:], 16) for u in ids]
    # one shared sequence: consecutive (mod 2**16) whichever maker took the next number
    assert all((b - a) % 0x10000 == 1 for a, b in zip(counters, counters[1:]))


def test_the_time_part_counts_from_the_month_start_the_bounds_give():
    asked = []

    def bounds(now_ms):
        asked.append(now_ms)
        return now_ms - 5000, now_ms + 10**9  # "this month" began 5 s before the first id

    ids = UniqIds(lambda: "AB" * 10, bounds, iter(range(7, 100)))
    first, second = ids(), ids()
    assert len(asked) == 1  # asked again only when the next month begins
    assert first.startswith("AB" * 10) and int(first[20:28], 16) == 5000 and int(first[28:], 16) == 7
    assert int(second[20:28], 16) >= 5000 and int(second[28:], 16) == 8
    assert MessageClientIDSetter.month_bounds(0) == (0, 31 * 86400 * 1000)  # January 1970
    with pytest.raises(ValueError, match="not ASCII hex"):
        UniqIds(lambda: "é" * 20, MessageClientIDSetter.month_bounds, iter(range(3)))()


def test_native_ids_are_distinct_across_threads():
    native = MessageClientIDSetter.create_uniq_id
    out = []

    def make():
        out.append([native() for _ in range(5000)])

    threads = [threading.Thread(target=make) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    flat = [u for chunk in out for u in chunk]
    assert len(flat) == 30000 and len(set(flat)) == 30000


def test_a_lean_callback_is_called_once_by_whoever_finishes_and_makes_no_condition():
    f = LeanFuture()
    seen = []
    f.add_lean_callback(seen.append)
    assert "_condition" not in f.__dict__
    f.finish("r")
    assert seen == [f] and "_condition" not in f.__dict__ and "_lean_callback" not in f.__dict__
    f.finish("again")  # finished already: nothing more is called
    assert seen == [f] and f.result() == "r"


@pytest.mark.parametrize("how", ["set_result", "set_exception", "cancel"])
def test_a_lean_callback_is_called_by_the_usual_ways_too(how):
    f = LeanFuture()
    seen = []
    f.add_lean_callback(seen.append)
    f.add_done_callback(seen.append)  # a second subscriber makes the Condition: the usual way
    if how == "set_result":
        f.set_result(1)
    elif how == "set_exception":
        f.set_exception(ValueError("x"))
    else:
        assert f.cancel()
    assert seen == [f, f]


def test_a_lean_callback_on_a_finished_future_is_called_at_once():
    f = LeanFuture()
    f.finish(None, ValueError("bad"))
    seen = []
    f.add_lean_callback(seen.append)
    assert seen == [f]


def test_lean_callbacks_race_finishers_and_are_called_exactly_once():
    counts = []
    for _ in range(300):
        f = LeanFuture()
        seen = []
        t = threading.Thread(target=lambda: f.finish(1))
        t.start()
        f.add_lean_callback(seen.append)
        t.join(5)
        counts.append(len(seen))
    assert set(counts) == {1}
