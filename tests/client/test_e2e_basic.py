"""End to end against a real embedded broker, over both transports (inproc and TCP)."""
import threading
import time

import pytest

from rmq_core import (
    ConsumeStatus, Message, MessageSelector, Producer, PullConsumer, PushConsumer, SelectMessageQueueByHash,
)
from rmq_core.message import MessageQueue, SendStatus
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until


class Collector:
    def __init__(self, status=ConsumeStatus.CONSUME_SUCCESS):
        self.msgs = []
        self.lock = threading.Lock()
        self.status = status

    def __call__(self, msgs):
        with self.lock:
            self.msgs.extend(msgs)
        return self.status

    def bodies(self):
        with self.lock:
            return [m.body for m in self.msgs]


def push(group, namesrv, topic, expr="*", listener=None, **kw):
    opts = dict(FAST_CONSUMER, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    opts.update(kw)
    orderly = opts.pop("orderly", False)
    c = PushConsumer(group, namesrv=namesrv, **opts)
    c.subscribe(topic, expr)
    c.register_message_listener(listener or Collector(), orderly=orderly)
    return c


def test_every_send_mode_and_message_fields(namesrv, no_thread_leak):
    topic = "SendModes"
    with Producer("PG_MODES", namesrv=namesrv, **FAST) as p:
        r = p.send(Message(topic, b"sync", tags="TagA", keys="k1", properties={"a": "1"}))
        assert r.status is SendStatus.SEND_OK and len(r.msg_id) == 32 and len(r.offset_msg_id) == 32
        assert r.queue.topic == topic and r.queue_offset >= 0
        done = threading.Event()
        got = {}
        fut = p.send_async(Message(topic, b"async", tags="TagA"),
                           lambda res, exc: (got.update(res=res, exc=exc), done.set()))
        assert fut.result(10).status is SendStatus.SEND_OK and done.wait(10) and got["exc"] is None
        p.send_oneway(Message(topic, b"oneway", tags="TagB"))
        qs = p.fetch_publish_message_queues(topic)
        rb = p.send_batch([Message(topic, f"batch-{i}".encode(), tags="TagB") for i in range(5)], queue=qs[0])
        assert rb.status is SendStatus.SEND_OK and rb.msg_id.count(",") == 4 and rb.queue == qs[0]
        big = bytes(range(256)) * 40  # 10 KiB: compressed on the wire (lz4), plain for the consumer
        rz = p.send(Message(topic, big, tags="Big"))
        assert rz.status is SendStatus.SEND_OK
        ro = p.send_orderly(Message(topic, b"ordered", keys="order-7"), arg="order-7")
        assert ro.queue == SelectMessageQueueByHash().select(qs, None, "order-7")

    col = Collector()
    with push("CG_MODES", namesrv, topic, listener=col):
        wait_until(lambda: len(col.msgs) >= 10, what="10 messages")
    by_body = {m.body: m for m in col.msgs}
    assert set(by_body) >= {b"sync", b"async", b"oneway", b"ordered", big} | {f"batch-{i}".encode() for i in range(5)}
    m = by_body[b"sync"]
    assert (m.topic, m.tags, m.keys, m.properties["a"], m.msg_id, m.offset_msg_id) == (
        topic, "TagA", "k1", "1", r.msg_id, r.offset_msg_id)
    assert m.queue_id == r.queue.queue_id and m.queue_offset == r.queue_offset and m.reconsume_times == 0
    assert m.born_timestamp > 0 and m.store_timestamp >= m.born_timestamp - 1000
    batch_ids = rb.msg_id.split(",")
    assert [by_body[f"batch-{i}".encode()].msg_id for i in range(5)] == batch_ids
    assert [by_body[f"batch-{i}".encode()].queue_offset for i in range(5)] == list(
        range(rb.queue_offset, rb.queue_offset + 5))


def test_zlib_compression_round_trip(cluster, no_thread_leak):
    body = b"0123456789" * 1000
    with Producer("PG_ZLIB", namesrv=cluster.namesrv, compress_type="zlib", **FAST) as p:
        r = p.send(Message("Zlib", body))
    col = Collector()
    with push("CG_ZLIB", cluster.namesrv, "Zlib", listener=col):
        wait_until(lambda: col.msgs, what="the compressed message")
    assert col.msgs[0].body == body and col.msgs[0].msg_id == r.msg_id


def test_delay_level(cluster):
    with Producer("PG_DELAY", namesrv=cluster.namesrv, **FAST) as p:
        t0 = time.time()
        p.send(Message("Delay", b"later", delay_time_level=2))
    col = Collector()
    with push("CG_DELAY", cluster.namesrv, "Delay", listener=col):
        wait_until(lambda: col.msgs, timeout=20, what="the delayed message")
    assert col.msgs[0].body == b"later" and col.msgs[0].topic == "Delay"
    assert col.msgs[0].store_timestamp - int(t0 * 1000) >= 900  # level 2 = 1 s in this broker's config


def test_tag_and_sql92_subscriptions(namesrv):
    topic = "Filtered"
    with Producer("PG_FILTER", namesrv=namesrv, **FAST) as p:
        for i in range(12):
            p.send(Message(topic, f"m{i}".encode(), tags=["TagA", "TagB", "TagC"][i % 3], properties={"n": str(i)}))
    tags = Collector()
    sql = Collector()
    with push("CG_TAGS", namesrv, topic, "TagA || TagC", listener=tags), \
            push("CG_SQL", namesrv, topic, MessageSelector.by_sql("n >= 6 AND n < 9"), listener=sql):
        wait_until(lambda: len(tags.msgs) >= 8 and len(sql.msgs) >= 3, what="filtered messages")
        time.sleep(0.3)
    assert sorted(tags.bodies()) == sorted(f"m{i}".encode() for i in range(12) if i % 3 != 1)
    assert sorted(sql.bodies()) == [b"m6", b"m7", b"m8"]


def test_ordered_messages_arrive_in_queue_order_at_orderly_consumer(namesrv, no_thread_leak):
    topic = "Orders"
    orders = [f"order-{i}" for i in range(6)]
    with Producer("PG_ORDER", namesrv=namesrv, **FAST) as p:
        for step in range(10):
            for o in orders:
                p.send(Message(topic, f"{o}:{step}".encode(), keys=o), selector=SelectMessageQueueByHash(), arg=o)
    seen = {}
    threads_per_queue = {}
    lock = threading.Lock()
    active = {}

    def listener(msgs):
        for m in msgs:
            with lock:
                # one thread per queue at a time
                assert active.get(m.queue_id) in (None, threading.get_ident())
                active[m.queue_id] = threading.get_ident()
            o, step = m.body.decode().split(":")
            seen.setdefault(o, []).append(int(step))
            threads_per_queue.setdefault(m.queue_id, set()).add(threading.get_ident())
            time.sleep(0.001)
            with lock:
                active.pop(m.queue_id, None)
        return ConsumeStatus.SUCCESS

    with push("CG_ORDER", namesrv, topic, listener=listener, orderly=True, consume_message_batch_max_size=3):
        wait_until(lambda: sum(len(v) for v in seen.values()) >= 60, what="60 ordered messages")
    assert all(steps == list(range(10)) for steps in seen.values()), seen


def test_broadcasting_delivers_everything_to_each(cluster, tmp_path):
    topic = "Broadcast"
    with Producer("PG_BC", namesrv=cluster.namesrv, **FAST) as p:
        for i in range(20):
            p.send(Message(topic, f"b{i}".encode()))
    cols = [Collector(), Collector()]
    consumers = [push("CG_BC", cluster.namesrv, topic, listener=cols[i], message_model="BROADCASTING",
                      offset_dir=str(tmp_path / f"c{i}")) for i in range(2)]
    for c in consumers:
        c.start()
    try:
        wait_until(lambda: all(len(c.msgs) >= 20 for c in cols), what="both broadcast consumers")
    finally:
        for c in consumers:
            c.shutdown()
    for col in cols:
        assert sorted(col.bodies()) == sorted(f"b{i}".encode() for i in range(20))
    # offsets were stored in the local file, keyed by group: a restart consumes nothing again
    again = Collector()
    c = push("CG_BC", cluster.namesrv, topic, listener=again, message_model="BROADCASTING",
             offset_dir=str(tmp_path / "c0"))
    with c:
        time.sleep(1.5)
    assert again.msgs == []


def test_consume_from_last_first_and_timestamp(cluster):
    topic = "FromWhere"
    with Producer("PG_FW", namesrv=cluster.namesrv, **FAST) as p:
        q = p.fetch_publish_message_queues(topic)[0]
        for i in range(4):
            p.send(Message(topic, f"old{i}".encode()), queue=q)
        time.sleep(0.05)
        mark = int(time.time() * 1000)
        time.sleep(0.05)
        p.send(Message(topic, b"mid"), queue=q)
    first = Collector()
    with push("CG_FIRST", cluster.namesrv, topic, listener=first, consume_from_where="CONSUME_FROM_FIRST_OFFSET"):
        wait_until(lambda: len(first.msgs) >= 5, what="FIRST consumes the backlog")

    class NoStoredOffset:
        """A group the broker has no offset for (QUERY_NOT_FOUND): consume_from_where decides."""
        def read_offset(self, mq, read_type):
            return -1

    starts = {}
    for where in ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP"):
        c = push("CG_FW_" + where[13:], cluster.namesrv, topic, consume_from_where=where, consume_timestamp=mark)
        with c:
            c.offset_store = NoStoredOffset()
            starts[where] = c.compute_pull_from_where(q)
            retry = MessageQueue("%RETRY%" + c.group, q.broker_name, 0)
            starts[where + "/retry"] = c.compute_pull_from_where(retry)
    assert starts["CONSUME_FROM_LAST_OFFSET"] == 5
    assert starts["CONSUME_FROM_FIRST_OFFSET"] == 0
    assert starts["CONSUME_FROM_TIMESTAMP"] == 4  # the first message stored at or after the mark
    # retry topics: LAST starts at 0, TIMESTAMP at the end (Java's rules)
    assert starts["CONSUME_FROM_LAST_OFFSET/retry"] == 0


def test_duplicate_client_id_is_refused_with_the_brokers_error(cluster):
    # a second process forced onto the same client id (same ip and instance name)
    with Producer("PG_DUP", namesrv=cluster.namesrv, **FAST) as p:
        p.send(Message("Dup", b"x"))
    # the broker registers an auto-created topic with the name server after answering the send:
    # until it has, a consumer starting knows no broker to heartbeat, and the first consumer
    # must be registered there before the second one comes
    from tests.rawclient import RawClient
    raw = RawClient("route-check")
    try:
        wait_until(lambda: raw.route(cluster.tcp_namesrv, "Dup")[0].code == 0, what="the route of Dup")
    finally:
        raw.close()
    a = push("CG_DUP", cluster.namesrv, "Dup", instance_name="same-id")
    a.start()
    try:
        import subprocess, sys, textwrap
        code = textwrap.dedent(f"""
            from rmq_core import PushConsumer, ConsumeStatus
            c = PushConsumer("CG_DUP", namesrv={cluster.tcp_namesrv!r}, instance_name="same-id",
                             client_ip={a.client_config.client_ip!r})
            c.subscribe("Dup", "*")
            c.register_message_listener(lambda m: ConsumeStatus.CONSUME_SUCCESS)
            try:
                c.start()
            except Exception as e:
                print("REFUSED:", e)
            else:
                print("STARTED")
                c.shutdown()
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert "REFUSED:" in out.stdout, out.stdout + out.stderr
        assert "same-id" in out.stdout and "unique instance name" in out.stdout
    finally:
        a.shutdown()


def test_pull_consumer_poll_commit_seek_pause(namesrv, no_thread_leak):
    topic = "LitePull"
    with Producer("PG_LITE", namesrv=namesrv, **FAST) as p:
        qs = p.fetch_publish_message_queues(topic)
        q0 = qs[0]
        sent = [p.send(Message(topic, f"p{i}".encode()), queue=q0) for i in range(10)]
        t_mid = sent[5]
    c = PullConsumer("CG_LITE", namesrv=namesrv, auto_commit=False, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     pull_batch_size=4, **FAST_CONSUMER)
    c.assign([q0])
    with c:
        got = []
        deadline = time.time() + 15
        while len(got) < 10 and time.time() < deadline:
            got.extend(c.poll(0.5))
        assert [m.body for m in got] == [f"p{i}".encode() for i in range(10)]
        assert c.committed(q0) in (-1, 0)
        c.commit()
        assert c.committed(q0) == 10
        c.seek(q0, 3)
        again = []
        while len(again) < 7 and time.time() < deadline + 10:
            again.extend(c.poll(0.5))
        assert [m.queue_offset for m in again] == list(range(3, 10))
        c.seek_to_begin(q0)
        assert c.poll(5)[0].queue_offset == 0
        ts_off = c.offset_for_timestamp(q0, int(time.time() * 1000) + 60_000)
        assert ts_off == 10
        c.seek_to_end(q0)
        c.pause([q0])
        with Producer("PG_LITE2", namesrv=namesrv, **FAST) as p2:
            p2.send(Message(topic, b"after-pause"), queue=q0)
        assert c.poll(1.0) == []
        c.resume([q0])
        got = []
        while not got and time.time() < deadline + 20:
            got = c.poll(0.5)
        assert got[0].body == b"after-pause"
        with pytest.raises(Exception, match="outside the queue's range"):
            c.seek(q0, 999)
        with pytest.raises(Exception, match="not assigned"):
            c.seek(MessageQueue(topic, q0.broker_name, 99), 0)
        _ = t_mid


def test_pull_consumer_subscribe_mode_and_async_iteration(cluster):
    import asyncio
    topic = "LiteSub"
    with Producer("PG_LS", namesrv=cluster.namesrv, **FAST) as p:
        for i in range(8):
            p.send(Message(topic, f"s{i}".encode()))
    c = PullConsumer("CG_LS", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
    c.subscribe(topic, "*")

    async def take(n):
        out = []
        async for m in c:
            out.append(m.body)
            if len(out) == n:
                return out

    with c:
        bodies = asyncio.run(asyncio.wait_for(take(8), 20))
    assert sorted(bodies) == sorted(f"s{i}".encode() for i in range(8))


async def _aio_send(p, topic):
    return await p.send_aio(Message(topic, b"aio"))


def test_asyncio_send(cluster):
    import asyncio
    with Producer("PG_AIO", namesrv=cluster.namesrv, **FAST) as p:
        r = asyncio.run(_aio_send(p, "Aio"))
        assert r.status is SendStatus.SEND_OK and r.queue.topic == "Aio"
