"""Consumer groups against a real broker: clustering rebalance on join/leave, retry and DLQ,
at-least-once after SIGKILL, orderly lock takeover after the lease expires."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time


from rmq_core import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from rmq_core.message import MessageQueue
from tests.client.conftest import FAST, FAST_CONSUMER, ChildConsumer, wait_until

class Counter:
    """Counts deliveries per message body; records which consumer saw what."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts: dict[bytes, int] = {}
        self.by_consumer: dict[str, set] = {}

    def listener(self, name, status=ConsumeStatus.CONSUME_SUCCESS):
        def fn(msgs):
            with self.lock:
                for m in msgs:
                    self.counts[m.body] = self.counts.get(m.body, 0) + 1
                    self.by_consumer.setdefault(name, set()).add(m.body)
            return status
        return fn

    def distinct(self):
        with self.lock:
            return len(self.counts)

    def duplicates(self):
        with self.lock:
            return sum(c - 1 for c in self.counts.values())


def make_consumer(namesrv, group, topic, listener, **kw):
    opts = dict(FAST_CONSUMER, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    opts.update(kw)
    orderly = opts.pop("orderly", False)
    c = PushConsumer(group, namesrv=namesrv, **opts)
    c.subscribe(topic, "*")
    c.register_message_listener(listener, orderly=orderly)
    return c


def owned(c):
    return {mq for mq in c.process_queue_table if not mq.topic.startswith("%RETRY%")}


def test_clustering_splits_and_resplits_on_join_and_leave(namesrv, no_thread_leak):
    """Messages keep flowing while consumer b joins and then leaves the group: the queues are
    split between a and b (disjoint, complete) and handed back; nothing is lost."""
    topic = "Cluster"
    counter = Counter()
    sent = []
    with Producer("PG_CL", namesrv=namesrv, **FAST) as p:
        p.send(Message(topic, b"warmup"))
        sent.append(b"warmup")
        # a long rebalance interval: only the broker's NOTIFY_CONSUMER_IDS_CHANGED can re-split in time
        a = make_consumer(namesrv, "CG_CL", topic, counter.listener("a"), rebalance_interval=60.0).start()
        b = None
        stop = threading.Event()

        def produce():
            i = 0
            while not stop.is_set():
                body = f"m{i}".encode()
                p.send(Message(topic, body))
                sent.append(body)
                i += 1
                time.sleep(0.002)

        t = threading.Thread(target=produce)
        try:
            wait_until(lambda: len(owned(a)) == 4, what="a owns all 4 queues")
            t.start()
            time.sleep(0.3)
            b = make_consumer(namesrv, "CG_CL", topic, counter.listener("b"), rebalance_interval=60.0).start()
            wait_until(lambda: owned(a) and owned(b) and not owned(a) & owned(b)
                       and len(owned(a) | owned(b)) == 4, timeout=10, what="queues split between a and b")
            wait_until(lambda: counter.by_consumer.get("b"), what="b consumes")
            time.sleep(0.3)
            b.shutdown()
            b = None
            wait_until(lambda: len(owned(a)) == 4, timeout=10, what="a owns every queue after b left")
            time.sleep(0.3)
        finally:
            stop.set()
            if t.is_alive():
                t.join()
            try:
                wait_until(lambda: counter.distinct() == len(sent), what="every message consumed")
            finally:
                if b is not None:
                    b.shutdown()
                a.shutdown()
    assert set(counter.counts) == set(sent)
    assert counter.by_consumer["a"] and counter.by_consumer["b"]
    dups = counter.duplicates()
    print(f"clustering: {len(sent)} messages, {dups} duplicate deliveries around rebalances")
    # duplicates only around the two rebalances: at most what was in flight on the moved queues
    assert dups <= 2 * 4 * 32


def test_reconsume_later_goes_to_retry_topic_then_dlq(cluster):
    topic = "RetryMe"
    group = "CG_RETRY"
    attempts = {}
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            for m in msgs:
                attempts.setdefault(m.body, []).append((m.topic, m.reconsume_times))
        return ConsumeStatus.RECONSUME_LATER

    with Producer("PG_RETRY", namesrv=cluster.namesrv, **FAST) as p:
        r = p.send(Message(topic, b"fail-me", keys="k-retry"))
    c = make_consumer(cluster.namesrv, group, topic, listener, max_reconsume_times=2)
    with c:
        # first delivery + 2 redeliveries through %RETRY%CG_RETRY (delay levels are 1 s here)
        wait_until(lambda: len(attempts.get(b"fail-me", [])) >= 3, timeout=30, what="two redeliveries")
        time.sleep(1.5)
    seen = attempts[b"fail-me"]
    assert seen[:3] == [(topic, 0), (topic, 1), (topic, 2)]  # the original topic is restored on retries
    assert len(seen) == 3  # after max_reconsume_times it went to the DLQ, not back to us
    # the message is in %DLQ%CG_RETRY with the original id
    dlq = "%DLQ%" + group
    pc = PullConsumer("CG_DLQ_READER", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                      **FAST_CONSUMER)
    pc.assign([MessageQueue(dlq, "broker-a", 0)])  # a DLQ has one queue
    with pc:
        got = []
        deadline = time.time() + 15
        while not got and time.time() < deadline:
            got = pc.poll(0.5)
    assert got and got[0].body == b"fail-me"
    assert got[0].get_property("ORIGIN_MESSAGE_ID") == r.msg_id or got[0].msg_id == r.msg_id


def test_send_back_keeps_a_compressed_body_compressed(cluster):
    """A compressed message sent back for retry is stored in %RETRY% with its compressed body and
    flag, as RocketMQ stores it (lookMessageByOffset without decompression), and redelivered whole."""
    topic, group = "RetryCompressed", "CG_RETRY_Z"
    body = b"compress me " * 1000  # over the producer's 4 KiB compression threshold
    seen = []

    def listener(msgs):
        seen.extend((m.reconsume_times, m.body) for m in msgs)
        return ConsumeStatus.RECONSUME_LATER if len(seen) == 1 else ConsumeStatus.CONSUME_SUCCESS

    with Producer("PG_RETRY_Z", namesrv=cluster.namesrv, **FAST) as p:
        p.send(Message(topic, body))
    with make_consumer(cluster.namesrv, group, topic, listener):
        wait_until(lambda: len(seen) >= 2, timeout=30, what="the redelivery")
    assert seen[:2] == [(0, body), (1, body)]
    store = cluster.broker.store
    cq = store.find_consume_queue("%RETRY%" + group, 0)
    assert cq.get_max_offset_in_queue() >= 1
    stored = store.look_message_by_offset(cq.get_entry(0)[0], decompress=False)
    assert stored.sys_flag & 0x1 and len(stored.body) < len(body) // 4  # kept compressed
    assert store.look_message_by_offset(cq.get_entry(0)[0]).body == body


def test_sigkill_consumer_loses_nothing(cluster, tmp_path):
    topic = "KillMe"
    n = 600
    with Producer("PG_KILL", namesrv=cluster.namesrv, **FAST) as p:
        for i in range(n):
            p.send(Message(topic, f"k{i}".encode()))
    child = ChildConsumer(tmp_path, cluster.tcp_namesrv, "CG_KILL", topic, listener_sleep_per_message=0.01,
                          persist_consumer_offset_interval=0.3, consume_thread_max=4, consume_thread_min=4)

    def consumed():
        return [body for body, _, _ in child.lines()]

    child.spawn()
    try:
        wait_until(lambda: len(consumed()) >= n // 3, timeout=30, what="the child consumes some messages")
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(10)
        first_run = len(consumed())
        child.spawn()
        wait_until(lambda: set(consumed()) >= {f"k{i}" for i in range(n)}, timeout=60,
                   what="every message after the restart")
    finally:
        child.kill()
    lines = consumed()
    assert set(lines) == {f"k{i}" for i in range(n)}
    redelivered = len(lines) - n
    print(f"sigkill: {n} messages, killed after {first_run} deliveries, {redelivered} redelivered")
    # offsets are committed every 0.3 s: only what was in flight since the last commit comes back
    assert redelivered < first_run


def test_orderly_queue_taken_over_after_lock_lease_expires(cluster, tmp_path):
    """The broker lease is 3 s here (rebalanceLockMaxLiveTime=3000).  Consumer A holds every lock
    and is SIGKILLed (no unlock); B gets the queues only once A's lease has expired."""
    topic = "LockTakeover"
    with Producer("PG_LOCK", namesrv=cluster.namesrv, **FAST) as p:
        for i in range(20):
            p.send(Message(topic, f"o{i}".encode()))
    script = tmp_path / "orderly_child.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from rmq_core import PushConsumer, ConsumeStatus
        c = PushConsumer("CG_LOCK", namesrv=sys.argv[1], consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                         rebalance_interval=1.0, heartbeat_broker_interval=1.0, poll_name_server_interval=1.0,
                         lock_interval=1.0, persist_consumer_offset_interval=60.0)
        c.subscribe(sys.argv[2], "*")
        def listener(msgs):
            time.sleep(60)  # hold the queue while being consumed
            return ConsumeStatus.SUCCESS
        c.register_message_listener(listener, orderly=True)
        c.start()
        while not [q for q, pq in c.process_queue_table.items() if pq.locked and not q.topic.startswith("%")]:
            time.sleep(0.05)
        print("LOCKED", flush=True)
        time.sleep(600)
    """))
    child = subprocess.Popen([sys.executable, str(script), cluster.tcp_namesrv, topic], stdout=subprocess.PIPE,
                             text=True)
    got = []
    b = None
    try:
        assert child.stdout.readline().strip() == "LOCKED"
        time.sleep(1.0)  # let A lock all its queues
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        killed_at = time.monotonic()
        first_at = []

        def listener(msgs):
            if not first_at:
                first_at.append(time.monotonic())
            got.extend(m.body for m in msgs)
            return ConsumeStatus.SUCCESS

        b = make_consumer(cluster.namesrv, "CG_LOCK", topic, listener, orderly=True, lock_interval=0.5,
                          pull_time_delay_when_exception=0.2)
        b.start()
        wait_until(lambda: len(got) >= 20, timeout=30, what="B consumes everything after A's lease expired")
        # B could not lock before the 3 s lease of the killed A ran out
        assert first_at[0] - killed_at >= 2.0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if b is not None:
            b.shutdown()
    assert sorted(got) == sorted(f"o{i}".encode() for i in range(20))
