"""ConsumeThreads, the push consumer's consume threads (RocketMQ's consumeExecutor), on real
threads: at most consume_thread_max run tasks at once, consume_thread_min stay once idle and the
others leave after the keep-alive, shutdown drops the tasks not started and waits for the rest."""
import threading

from rmq_core.client import consume_service
from rmq_core.client.consume_service import ConsumeThreads
from tests.client.conftest import wait_until


def test_at_most_max_threads_run_and_every_task_runs():
    threads = ConsumeThreads("rmq-consume-T1", 2, 4)
    lock = threading.Lock()
    running = [0]
    peak = [0]
    done = []
    gate = threading.Event()

    def task(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        gate.wait(10)
        with lock:
            running[0] -= 1
            done.append(i)

    try:
        for i in range(20):
            assert threads.execute(task, i)
        wait_until(lambda: running[0] == 4, what="four tasks running")
        assert len(threads) == 4
        gate.set()
        wait_until(lambda: len(done) == 20, what="every task")
    finally:
        threads.shutdown()
    assert peak[0] == 4 and sorted(done) == list(range(20))


def test_threads_above_min_leave_after_the_keep_alive(monkeypatch):
    monkeypatch.setattr(consume_service, "KEEP_ALIVE", 0.2)
    threads = ConsumeThreads("rmq-consume-T2", 2, 5)
    gate = threading.Event()
    started = threading.Semaphore(0)

    def task():
        started.release()
        gate.wait(10)

    try:
        for _ in range(5):
            threads.execute(task)
        for _ in range(5):
            assert started.acquire(timeout=10)
        gate.set()
        wait_until(lambda: len(threads) == 2, timeout=10, what="the threads above consume_thread_min gone")
        names = {t.name for t in threading.enumerate() if t.name.startswith("rmq-consume-T2")}
        assert len(names) == 2
        # the ones that stayed still take work
        ran = threading.Event()
        threads.execute(ran.set)
        assert ran.wait(10)
    finally:
        threads.shutdown()


def test_shutdown_waits_for_running_tasks_and_drops_the_others():
    threads = ConsumeThreads("rmq-consume-T3", 1, 1)
    started = threading.Event()
    release = threading.Event()
    ran = []

    def slow():
        started.set()
        release.wait(10)
        ran.append("slow")

    threads.execute(slow)
    threads.execute(ran.append, "queued")  # behind slow on the only thread: never starts
    assert started.wait(10)
    stopper = threading.Thread(target=threads.shutdown)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive()  # still waiting for slow
    release.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert ran == ["slow"]
    assert not threads.execute(ran.append, "late")
    assert len(threads) == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("rmq-consume-T3")]
