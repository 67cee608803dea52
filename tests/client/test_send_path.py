"""The instance's batched hand-off to its loop (`post`), `run` on a plain lock (errors,
cancellation, timeouts), `submit` Futures, and sends whose message is prepared in the caller's
thread."""
import asyncio
import concurrent.futures
import threading
import time

import pytest

from rmq_core import Message, Producer
from rmq_core.client.config import ClientConfig
from rmq_core.client.instance import MQClientInstance
from rmq_core.errors import IllegalArgumentError, MQClientError


@pytest.fixture()
def instance():
    inst = MQClientInstance(ClientConfig(namesrv=["127.0.0.1:1"], instance_name=f"send-path-{time.monotonic_ns()}"))
    inst.start()
    yield inst
    inst.shutdown()


def test_post_runs_every_call_in_order_on_the_loop(instance):
    seen = []
    done = threading.Event()
    threads = set()

    def make(i):
        def fn():
            threads.add(threading.current_thread().name)
            seen.append(i)
            if i == 999:
                done.set()
        return fn

    for i in range(1000):
        instance.post(make(i))
    assert done.wait(10)
    assert seen == list(range(1000))
    assert threads == {instance._loop_thread.name}


def test_post_from_many_threads_loses_nothing(instance):
    count = [0]
    lock = threading.Lock()

    def bump():
        with lock:
            count[0] += 1

    def producer():
        for _ in range(500):
            instance.post(bump)

    ts = [threading.Thread(target=producer) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert instance.run(asyncio.sleep(0, "flushed"), timeout=10) == "flushed"
    assert count[0] == 2000


def test_a_failing_posted_call_does_not_stop_the_others(instance, caplog):
    def boom():
        raise ValueError("posted boom")

    instance.post(boom)
    assert instance.run(asyncio.sleep(0, 7), timeout=10) == 7
    assert "posted boom" in caplog.text


def test_run_returns_results_and_raises_the_coroutines_error(instance):
    async def ok():
        await asyncio.sleep(0.001)
        return threading.current_thread().name

    async def bad():
        raise IllegalArgumentError("bad value 42")

    assert instance.run(ok(), timeout=5) == instance._loop_thread.name
    with pytest.raises(IllegalArgumentError, match="bad value 42"):
        instance.run(bad(), timeout=5)


def test_run_timeout_cancels_the_coroutine(instance):
    cancelled = threading.Event()

    async def slow():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(MQClientError, match="timed out after 0.05 s"):
        instance.run(slow(), timeout=0.05)
    assert cancelled.wait(5)


def test_run_of_a_cancelled_coroutine_raises_cancelled(instance):
    async def cancel_me():
        asyncio.current_task().cancel()
        await asyncio.sleep(1)

    with pytest.raises(concurrent.futures.CancelledError):
        instance.run(cancel_me(), timeout=5)


def test_submit_future_result_error_and_cancel(instance):
    async def value():
        return 5

    async def bad():
        raise IllegalArgumentError("nope")

    started = threading.Event()
    cancelled = threading.Event()

    async def slow():
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    assert instance.submit(value()).result(5) == 5
    with pytest.raises(IllegalArgumentError, match="nope"):
        instance.submit(bad()).result(5)
    f = instance.submit(slow())
    assert started.wait(5)
    assert f.cancel()
    assert cancelled.wait(5)


def test_run_and_submit_refuse_when_not_running():
    inst = MQClientInstance(ClientConfig(namesrv=["127.0.0.1:1"], instance_name=f"never-{time.monotonic_ns()}"))

    async def never():
        raise AssertionError("must not run")

    with pytest.raises(MQClientError, match="is not running"):
        inst.submit(never())
    with pytest.raises(MQClientError, match="is not running"):
        inst.run(never(), timeout=1)


def test_send_async_of_a_bad_message_fails_its_future_and_callback(instance):
    p = Producer("PG_BAD_ASYNC", namesrv="127.0.0.1:1", instance_name=instance.config.instance_name)
    p.start()
    try:
        got = []
        done = threading.Event()
        f = p.send_async(Message("T", b""), callback=lambda r, e: (got.append((r, e)), done.set()))
        with pytest.raises(IllegalArgumentError, match="body"):
            f.result(5)
        assert done.wait(5)
        assert got[0][0] is None and isinstance(got[0][1], IllegalArgumentError)
        with pytest.raises(IllegalArgumentError, match="body"):
            p.send(Message("T", b""))
    finally:
        p.shutdown()


def test_encode_send_batch_carries_every_message_and_its_uniq_key():
    from tests.codec_oracle import decode_batch_body_py
    from rmq_core.message import string_to_properties

    p = Producer("PG_BATCH_ENC", namesrv="127.0.0.1:9876")
    msgs = [Message("T", f"m{i}".encode(), tags="TagA", keys=f"k{i}", flag=i) for i in range(5)]
    topic, uniq, body, outer, outer_props = p._encode_batch(msgs)
    items = decode_batch_body_py(body)
    uniqs = uniq.split(",")
    assert topic == "T" and len(uniqs) == 5 and len(set(uniqs)) == 5
    assert outer_props == {"WAIT": "true"}
    for i, (flag, b, raw) in enumerate(items):
        props = string_to_properties(raw)
        assert (flag, b, props["TAGS"], props["KEYS"], props["UNIQ_KEY"]) == (i, f"m{i}".encode(), "TagA", f"k{i}", uniqs[i])


@pytest.mark.parametrize("msgs, error", [
    ([], "at least one message"),
    ([Message("T", b"a"), Message("U", b"b")], "same topic: 'U' differs from 'T'"),
    ([Message("T", b"a", delay_time_level=2)], "delay messages are not supported"),
    ([Message("T", b"a" * 600), Message("T", b"b" * 600)], "bytes encoded, more than max_message_size 1024"),
])
def test_encode_batch_refuses_bad_batches(msgs, error):
    p = Producer("PG_BATCH_BAD", namesrv="127.0.0.1:9876", max_message_size=1024)
    with pytest.raises(IllegalArgumentError, match=error):
        p._encode_batch(msgs)


# --- sends against a real embedded broker ---------------------------------------------------------
from rmq_core.message import SendStatus  # noqa: E402
from tests.client.conftest import FAST  # noqa: E402


@pytest.fixture()
def started_producer(cluster):
    p = Producer(f"PG_FAST{time.monotonic_ns()}", namesrv=cluster.namesrv, **FAST).start()
    yield p
    p.shutdown()


def test_cold_route_then_fast_sends_store_every_message(started_producer):
    p = started_producer
    results = [p.send(Message("FastT", f"m{i}".encode(), keys=f"k{i}")) for i in range(5)]
    results += [p.send_async(Message("FastT", f"a{i}".encode())).result(10) for i in range(5)]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    per_queue = {}
    for r in results:
        per_queue.setdefault(r.queue, []).append(r.queue_offset)
    for offsets in per_queue.values():  # each queue's offsets climb one by one: nothing lost or doubled
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    assert len({r.msg_id for r in results}) == 10


def test_check_message_remembers_only_good_topic_names(monkeypatch):
    from rmq_core.client import selector

    monkeypatch.setattr(selector, "_SENDABLE_TOPICS", set())
    monkeypatch.setattr(selector, "_SENDABLE_TOPICS_MAX", 3)
    for _ in range(2):  # the second round is answered from the remembered names: same verdicts
        selector.check_message(Message("GoodTopic", b"x"))
        with pytest.raises(IllegalArgumentError, match="bad topic name 'bad topic'"):
            selector.check_message(Message("bad topic", b"x"))
        with pytest.raises(IllegalArgumentError, match="system topic"):
            selector.check_message(Message("TBW102", b"x"))
        with pytest.raises(IllegalArgumentError, match="reserved by RocketMQ"):
            selector.check_message(Message("GoodTopic", b"x", properties={"TAGS": "a"}))
    assert selector._SENDABLE_TOPICS == {"GoodTopic"}
    for name in ("T1", "T2", "T3", "T4"):
        selector.check_message(Message(name, b"x"))
    assert len(selector._SENDABLE_TOPICS) <= 3 and "T4" in selector._SENDABLE_TOPICS


def test_send_from_the_client_loop_is_refused_not_deadlocked(started_producer):
    p = started_producer
    p.send(Message("FastLoop", b"warm"))

    async def send_on_loop():
        p.send(Message("FastLoop", b"from the loop"))

    with pytest.raises(RuntimeError, match="would deadlock"):
        p.instance.run(send_on_loop(), timeout=10)
