"""SendWait (the completion a sync send on the native path waits on): finished once, by any
thread; a waiter sleeps until then, and a wake() that comes before its sleep is not lost."""
from __future__ import annotations

import threading

import pytest

from rmq_core._native.send_route import SendWait


def test_finished_before_the_wait_answers_at_once_and_only_the_first_outcome_counts():
    w = SendWait()
    assert not w.done()
    w.finish("r1")
    w.finish(None, RuntimeError("late"))  # a second outcome is ignored
    assert w.done() and w.result(0) == "r1" and w.exception(0) is None


def test_a_failure_is_raised_by_result_and_returned_by_exception():
    w = SendWait()
    w.finish(None, ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        w.result(1)
    assert isinstance(w.exception(1), ValueError)


def test_a_waiter_sleeps_until_another_thread_finishes_it():
    w = SendWait()
    started = threading.Event()
    got = []

    def wait():
        started.set()
        got.append(w.result(30))

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    started.wait(5)
    w.finish("answer")
    for t in threads:
        t.join(10)
    assert got == ["answer"] * 3


def test_no_answer_in_time_raises_timeout_naming_it():
    with pytest.raises(TimeoutError, match="0.01"):
        SendWait().result(0.01)


def test_a_wake_before_the_sleep_is_not_lost():
    w = SendWait()
    w.wake()
    assert w.sleep(30) is False  # returned at once: woken, not finished
    w.finish(1)
    assert w.sleep(30) is True
