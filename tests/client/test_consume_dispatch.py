"""The push consumer's chunked dispatch keeps RocketMQ's semantics, against a real broker:

* a listener that fails some messages: they come back through %RETRY%<group>, delayed at level
  3 + reconsume times (counted in the broker's SCHEDULE_TOPIC_XXXX queues), and everything is
  consumed in the end;
* a listener stuck past consume_timeout: its message is sent back, the messages its chunk already
  consumed are not, and the other messages keep flowing on other consume threads meanwhile;
* a slow (I/O-bound) listener still runs on many consume threads at once;
* an orderly listener that suspends in the middle of a take: the part before it is committed, the
  rest comes again in order after suspend_current_queue_time;
* a consumer process SIGKILLed in the middle of its chunks (listener batch 1 and 32): the
  committed offsets never pass a message it had not consumed, and a restarted consumer brings
  every message at least once.
"""
import collections
import signal
import threading
import time

import pytest

from rmq_core import ConsumeStatus, Message, Producer
from tests.client.conftest import FAST, ChildConsumer, wait_until
from tests.client.test_e2e_groups import make_consumer

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


def _send(namesrv, topic, bodies, queue_index=None):
    with Producer(f"PG_{topic}", namesrv=namesrv, **FAST) as p:
        queue = p.fetch_publish_message_queues(topic)[queue_index] if queue_index is not None else None
        for b in bodies:
            p.send(Message(topic, b), queue=queue) if queue is not None else p.send(Message(topic, b))


@pytest.mark.parametrize("batch", [1, 32])
def test_failed_messages_come_back_through_the_retry_topic_at_the_next_level(cluster, batch):
    topic = f"FailSome{batch}"
    n = 96
    bodies = [str(i).encode() for i in range(n)]
    _send(cluster.namesrv, topic, bodies)
    failed_deliveries = collections.Counter()  # reconsume_times -> messages in failed listener calls
    ok = set()
    retried_from = set()
    lock = threading.Lock()

    def listener(msgs):
        # every 8th message fails on its first two deliveries (with batch 32 its batch-mates too)
        bad = any(int(m.body) % 8 == 0 and m.reconsume_times < 2 for m in msgs)
        with lock:
            for m in msgs:
                assert m.topic == topic  # a retried message shows its own topic
                if m.reconsume_times:
                    retried_from.add(m.get_property("RETRY_TOPIC"))
                if bad:
                    failed_deliveries[m.reconsume_times] += 1
                else:
                    ok.add(m.body)
        return ConsumeStatus.RECONSUME_LATER if bad else ConsumeStatus.CONSUME_SUCCESS

    c = make_consumer(cluster.namesrv, f"CG_FAIL{batch}", topic, listener, consume_message_batch_max_size=batch)
    with c:
        wait_until(lambda: len(ok) == n, timeout=60, what="every message consumed successfully")
    store = cluster.broker.store
    assert failed_deliveries[0] >= n // 8 and failed_deliveries[1] >= n // 8 and set(failed_deliveries) <= {0, 1}
    # CONSUMER_SEND_MSG_BACK with delay level 0: the broker delays reconsume time r at level 3 + r,
    # i.e. in SCHEDULE_TOPIC_XXXX queue 2 + r
    for r, count in failed_deliveries.items():
        assert store.get_max_offset_in_queue(SCHEDULE_TOPIC, 2 + r) == count
    assert store.get_max_offset_in_queue(SCHEDULE_TOPIC, 4) == 0
    assert retried_from == {topic}
    assert c.stats["sent_back"] == sum(failed_deliveries.values())


def test_a_listener_stuck_past_consume_timeout_has_only_its_message_sent_back(cluster):
    topic = "StuckInChunk"
    n = 20
    _send(cluster.namesrv, topic, [f"s{i}".encode() for i in range(n)], queue_index=0)
    deliveries = collections.defaultdict(list)
    release = threading.Event()
    lock = threading.Lock()

    def listener(msgs):
        m = msgs[0]
        with lock:
            deliveries[m.body].append(m.reconsume_times)
        if m.body == b"s5" and m.reconsume_times == 0:
            release.wait(30)  # stuck far longer than consume_timeout
        return ConsumeStatus.CONSUME_SUCCESS

    c = make_consumer(cluster.namesrv, "CG_STUCK_CHUNK", topic, listener, consume_timeout=0.5)
    try:
        c.start()
        # s5 comes back through the retry topic and is consumed while its first call still hangs
        wait_until(lambda: deliveries.get(b"s5") == [0, 1], timeout=30, what="s5 sent back and redelivered")
        assert not release.is_set()
        release.set()
        wait_until(lambda: len(deliveries) == n, timeout=30, what="every message")
    finally:
        release.set()
        c.shutdown()
    # s0..s4 ran before s5 in the same chunk: consumed, not expired, so never sent back
    for i in range(5):
        assert deliveries[f"s{i}".encode()] == [0]
    assert c.stats["sent_back"] == 1


def test_a_slow_listener_runs_on_many_consume_threads(cluster):
    topic = "SlowIO"
    n = 60
    _send(cluster.namesrv, topic, [str(i).encode() for i in range(n)], queue_index=0)
    running = [0]
    peak = [0]
    got = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)  # waits on "I/O": other threads should run meanwhile
        with lock:
            running[0] -= 1
            got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    with make_consumer(cluster.namesrv, "CG_SLOW_IO", topic, listener, consume_thread_max=10, consume_thread_min=10):
        wait_until(lambda: len(got) == n, timeout=60, what="every message")
    assert sorted(got) == sorted(str(i).encode() for i in range(n))
    assert peak[0] >= 5  # up to consume_thread_max listener calls at once, not one chunk after another


def test_orderly_suspend_inside_a_take_commits_the_consumed_part_and_retries_the_rest_in_order(cluster):
    """One take brings o0..o9; the listener suspends at o5: o0..o4 are committed at once, o5..o9
    wait suspend_current_queue_time and come again in order, o5 with reconsume times 1."""
    topic = "OrderlyTake"
    _send(cluster.namesrv, topic, [f"o{i}".encode() for i in range(10)], queue_index=0)
    seen = []
    suspended = threading.Event()

    def listener(msgs):
        m = msgs[0]
        seen.append((m.body, m.reconsume_times))
        if m.body == b"o5" and m.reconsume_times == 0:
            suspended.set()
            return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeStatus.SUCCESS

    c = make_consumer(cluster.namesrv, "CG_ORDERLY_TAKE", topic, listener, orderly=True,
                      suspend_current_queue_time=2.0)
    with c:
        assert suspended.wait(30)
        mq = next(q for q in c.process_queue_table if q.topic == topic and q.queue_id == 0)
        wait_until(lambda: c.offset_store.read_offset(mq, "READ_FROM_MEMORY") == 5, timeout=1.5,
                   what="o0..o4 committed while o5 is suspended")
        assert (b"o6", 0) not in seen
        wait_until(lambda: (b"o9", 0) in seen, what="the rest after the pause")
        wait_until(lambda: c.offset_store.read_offset(mq, "READ_FROM_MEMORY") == 10, what="all committed")
    assert seen == [(f"o{i}".encode(), 0) for i in range(6)] + [(b"o5", 1)] + [
        (f"o{i}".encode(), 0) for i in range(6, 10)]


@pytest.mark.parametrize("batch", [1, 32])
def test_consumer_killed_mid_chunk_never_committed_past_an_unconsumed_message(cluster, tmp_path, batch):
    topic = f"KillMidChunk{batch}"
    group = f"CG_KILL_MID{batch}"
    n = 3000
    with Producer("PG_KILL_MID", namesrv=cluster.namesrv, **FAST) as p:
        queues = p.fetch_publish_message_queues(topic)
        for i in range(0, n, 50):
            p.send_batch([Message(topic, f"{i + j}".encode()) for j in range(50)], queue=queues[(i // 50) % len(queues)])
    # RocketMQ's defaults (listener batch 1, 20 consume threads, pull batch 32), and listener
    # batch 32: chunks of many listener calls (10 ms a message: a few offset commits happen
    # before the kill); offsets reach the broker with every pull and every 0.2 s.  The first run
    # SIGKILLs itself inside the listener call of its 1500th message (with batch 32, in the
    # middle of a listener batch).
    child = ChildConsumer(tmp_path, cluster.tcp_namesrv, group, topic, listener_sleep_per_message=0.01,
                          persist_consumer_offset_interval=0.2, consume_message_batch_max_size=batch)

    def consumed():
        return {(q, o) for _, q, o in child.lines()}

    offsets = cluster.broker.offset_manager
    child.spawn(kill_after=n // 2)
    try:
        assert child.proc.wait(60) == -signal.SIGKILL
        seen = consumed()
        assert n // 2 <= len(seen) < n  # other consume threads may write a line before the kill lands
        committed = {q.queue_id: offsets.query_offset(group, topic, q.queue_id) for q in queues}
        assert sum(max(off, 0) for off in committed.values()) >= n // 10, committed
        for qid, off in committed.items():
            missing = [o for o in range(max(off, 0)) if (qid, o) not in seen]
            assert not missing, f"queue {qid}: committed {off} but offsets {missing[:10]} were never consumed"
        child.spawn()
        wait_until(lambda: len(consumed()) == n, timeout=90, what="every message after the restart")
    finally:
        child.kill()
    print(f"killed after {len(seen)} of {n} (committed {committed}); {len(child.lines()) - n} delivered twice")
