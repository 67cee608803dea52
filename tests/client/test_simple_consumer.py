"""rmq's SimpleConsumer (sync and aio) against a real broker: receive + ack, invisible durations,
the DLQ, FIFO groups, delayed messages, a broker SIGKILLed with messages in flight, consumers of
one group sharing a queue, two brokers holding a topic, batch acks, ACL."""
from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import copy
import json
import threading
import time

import pytest

from rmq_core import Message, Producer, SimpleConsumer, aio
from rmq_core.admin import AdminClient
from rmq_core.common.pop_extra_info import ExtraInfo, build_extra_info
from rmq_core.errors import MQBrokerError, MQClientError, ReceiptHandleExpiredError, RemotingError
from rmq_core.remoting.codes import RequestCode
from tests.client.conftest import FAST, wait_until
from tests.servers import NamesrvAndBroker, RmqProcess, acl_broker_props

# short timers; a receive waits at most a second at the broker, so the loops below move on
OPTS = dict(FAST, await_duration=1.0, consume_from_where="CONSUME_FROM_FIRST_OFFSET")


class AioSimple:
    """An aio.SimpleConsumer on an event loop of its own thread, driven with the sync API's calls
    (so every scenario runs through both APIs)."""

    def __init__(self, group, namesrv, **options):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-aio-loop", daemon=True)
        self.thread.start()
        self.c = aio.SimpleConsumer(group, namesrv, **options)

    def _call(self, make):
        async def run():
            return await make()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(60)

    def start(self):
        self._call(self.c.start)
        return self

    def shutdown(self):
        try:
            self._call(self.c.shutdown)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    def receive(self, n, invisible):
        return self._call(lambda: self.c.receive(n, invisible))

    def ack(self, m):
        return self._call(lambda: self.c.ack(m))

    def change_invisible_duration(self, m, d):
        return self._call(lambda: self.c.change_invisible_duration(m, d))

    @property
    def client_id(self):
        return self.c.consumer.client_id

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.shutdown()


@pytest.fixture(params=["sync", "aio"])
def simple(request):
    """Makes a SimpleConsumer of the parametrized API: simple(group, namesrv, topic, **options)."""
    made = []

    def make(group, namesrv, topic, expression="*", **options):
        kw = dict(OPTS, subscriptions={topic: expression}, **options)
        c = SimpleConsumer(group, namesrv=namesrv, **kw) if request.param == "sync" else AioSimple(group, namesrv, **kw)
        made.append(c)
        return c

    yield make


# The broker's semantics (redelivery, DLQ, FIFO, delay, crash) are the same whichever API asked: these
# cases run with the sync API only; the aio one is covered by the cases left on both.
SYNC_ONLY = pytest.mark.parametrize("simple", ["sync"], indirect=True)


def receive_until(c, want, *, n=32, invisible=30, timeout=30.0, into=None):
    """Receive (acking nothing) until `want` messages came in total or `timeout` passed."""
    got = [] if into is None else into
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += c.receive(n, invisible)
    return got


def create_topic(cluster, topic, queues):
    with AdminClient(cluster.tcp_namesrv) as a:
        a.create_or_update_topic(cluster.broker_addr, topic, read_queue_nums=queues, write_queue_nums=queues)


def fill_two_queues(cluster, topic, per_queue) -> list:
    """A new topic of two queues holding per_queue messages each ("m<queue>-<i>"): their bodies, sorted."""
    create_topic(cluster, topic, 2)
    with Producer(f"PG_{topic}", namesrv=cluster.tcp_namesrv, **FAST) as p:
        queues = p.fetch_publish_message_queues(topic)
        for q in range(2):
            p.send_batch([Message(topic, f"m{q}-{i}".encode()) for i in range(per_queue)], queue=queues[q])
    return sorted(f"m{q}-{i}".encode() for q in range(2) for i in range(per_queue))


def create_group(cluster, group, **config):
    with AdminClient(cluster.tcp_namesrv) as a:
        a.create_or_update_subscription_group(cluster.broker_addr, {"groupName": group, **config})


def handle(m) -> ExtraInfo:
    return ExtraInfo.parse(m.receipt_handle)


def test_1000_messages_received_and_acked_exact_none_twice(cluster, simple, no_thread_leak):
    topic = "SimpleMany"
    create_topic(cluster, topic, 4)
    sent = {}
    with Producer("PG_SIMPLE_MANY", namesrv=cluster.tcp_namesrv, **FAST) as p:
        for i in range(1000):
            body = f"body-{i}".encode() * (2000 if i % 100 == 7 else 1)  # some bodies big enough to be compressed
            m = Message(topic, body, tags=f"Tag{i % 3}", keys=[f"k{i}", f"x{i}"],
                        properties={"i": str(i), "p\u00e9": f"v\u00e9{i}"})
            sent[p.send(m).msg_id] = m
    with simple("CG_SIMPLE_MANY", cluster.tcp_namesrv, topic) as c:
        with AdminClient(cluster.tcp_namesrv) as a:  # registered by its heartbeat, as a pull-style consumer
            conn = a.consumer_connection("CG_SIMPLE_MANY")
            assert [x.client_id for x in conn.connections] == [c.client_id]
            assert conn.consume_type == "CONSUME_ACTIVELY" and conn.subscriptions == {topic: "*"}
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 1000 and time.monotonic() < deadline:
            batch = c.receive(32, 30)
            for m in batch:
                c.ack(m)
            got += batch
        assert c.receive(32, 30) == []  # (acked: nothing comes back)
    assert len(got) == 1000 and len({m.msg_id for m in got}) == 1000 and set(sent) == {m.msg_id for m in got}
    for m in got:
        s = sent[m.msg_id]
        assert (m.topic, m.body, m.tags, m.keys) == (topic, s.body, s.tags, s.keys)
        assert {k: m.properties[k] for k in s.properties} == s.properties
        assert m.delivery_attempt == 1 and handle(m).broker_name == "broker-a"


@SYNC_ONLY
def test_not_acked_comes_back_with_attempt_2_and_a_change_postpones(cluster, simple, no_thread_leak):
    topic = "SimpleBack"
    create_topic(cluster, topic, 1)
    with Producer("PG_SIMPLE_BACK", namesrv=cluster.tcp_namesrv, **FAST) as p:
        for body in (b"a", b"b"):
            p.send(Message(topic, body, keys=body.decode()))
    with simple("CG_SIMPLE_BACK", cluster.tcp_namesrv, topic) as c:
        first = {m.body: m for m in receive_until(c, 2, invisible=2)}
        assert sorted(first) == [b"a", b"b"] and all(m.delivery_attempt == 1 for m in first.values())
        a1, b1 = first[b"a"], first[b"b"]
        a_visible = handle(a1).visible_at
        c.change_invisible_duration(b1, 6)
        b_visible = handle(b1).visible_at
        assert b_visible >= a_visible + 3000  # (the new handle: 6 s from the change)
        again = receive_until(c, 1)
        assert [m.body for m in again] == [b"a"]
        a2 = again[0]
        assert a2.delivery_attempt == 2 and a2.msg_id == a1.msg_id and a2.keys == "a" and a2.topic == topic
        assert handle(a2).pop_time >= a_visible  # (the broker's clock: not before its invisible time was over)
        with pytest.raises(ReceiptHandleExpiredError, match=f"message {a1.msg_id}"):
            c.ack(a1)
        c.ack(a2)
        again = receive_until(c, 1)
        assert [m.body for m in again] == [b"b"]
        b2 = again[0]
        assert b2.delivery_attempt == 2 and handle(b2).pop_time >= b_visible
        c.ack(b2)
        assert c.receive(32, 30) == []


def test_a_list_is_acked_in_one_request_and_an_expired_one_is_named(cluster, simple, no_thread_leak):
    topic = "SimpleBatchAck"
    create_topic(cluster, topic, 2)
    with Producer("PG_SIMPLE_BATCH", namesrv=cluster.tcp_namesrv, **FAST) as p:
        for i in range(40):
            p.send(Message(topic, f"m{i}".encode()))
    with simple("CG_SIMPLE_BATCH", cluster.tcp_namesrv, topic) as c:
        got = receive_until(c, 40)
        assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(40))
        c.ack(got)
        assert c.receive(32, 30) == []  # every one acked
        with Producer("PG_SIMPLE_BATCH", namesrv=cluster.tcp_namesrv, **FAST) as p:
            p.send(Message(topic, b"late"))
        (late1,) = receive_until(c, 1, invisible=1)
        (late2,) = receive_until(c, 1)  # (back: the first handle expired)
        assert late2.msg_id == late1.msg_id and late2.delivery_attempt == 2
        with pytest.raises(ReceiptHandleExpiredError, match=f"1 of 2 messages not acked: .*{late1.msg_id}"):
            c.ack([late1, late2])
        assert c.receive(32, 30) == []  # the live handle was acked all the same


def test_a_receive_takes_more_than_32_and_one_ack_ends_them(cluster, simple, no_thread_leak):
    topic = "SimpleBig"
    create_topic(cluster, topic, 1)
    with Producer("PG_SIMPLE_BIG", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send_batch([Message(topic, f"m{i}".encode()) for i in range(300)])
    with simple("CG_SIMPLE_BIG", cluster.tcp_namesrv, topic) as c:
        got, sizes = [], []
        while len(got) < 300:
            batch = c.receive(1024, 30)
            assert batch, f"only {len(got)} of 300 received"
            sizes.append(len(batch))
            got += batch
        assert max(sizes) > 32  # (rmq's broker hands out up to 1024 per pop)
        assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(300))
        c.ack(got)
        assert c.receive(1024, 30) == []  # every one acked


@SYNC_ONLY
def test_after_max_attempts_in_the_dlq(cluster, simple, no_thread_leak):
    topic, group = "SimpleDlq", "CG_SIMPLE_DLQ"
    create_topic(cluster, topic, 1)
    create_group(cluster, group, retryMaxTimes=1)
    with Producer("PG_SIMPLE_DLQ", namesrv=cluster.tcp_namesrv, **FAST) as p:
        sent = p.send(Message(topic, b"poison", keys="kp"))
    with simple(group, cluster.tcp_namesrv, topic) as c:
        attempts = [m.delivery_attempt for m in receive_until(c, 1, invisible=1)]
        attempts += [m.delivery_attempt for m in receive_until(c, 1, invisible=1)]
        assert attempts == [1, 2]
        # not acked the second time either: retryMaxTimes 1 reached, it goes to %DLQ%group, not back
        with AdminClient(cluster.tcp_namesrv) as a:
            def dead():
                queues = a.queues(f"%DLQ%{group}") if f"%DLQ%{group}" in a.topic_list() else []
                return [m for q in queues for m in a.iter_messages(q, 0, a.max_offset(cluster.broker_addr, q.topic,
                                                                                         q.queue_id))]
            wait_until(dead, timeout=20, what="the message in the DLQ")
            (m,) = dead()
        assert (m.body, m.keys, m.msg_id, m.properties["RETRY_TOPIC"]) == (b"poison", "kp", sent.msg_id, topic)
        assert c.receive(32, 30) == []


@SYNC_ONLY
def test_fifo_group_three_message_groups_in_order_by_two_consumers(cluster, simple, no_thread_leak):
    topic, group = "SimpleFifo", "CG_SIMPLE_FIFO"
    create_topic(cluster, topic, 4)
    create_group(cluster, group, consumeMessageOrderly=True)
    with Producer("PG_SIMPLE_FIFO", namesrv=cluster.tcp_namesrv, **FAST) as p:
        for i in range(100):
            for g in ("g0", "g1", "g2"):
                p.send_orderly(Message(topic, f"{g}:{i}".encode()), arg=g)
    seen = collections.defaultdict(list)  # message group -> sequence numbers in the order received
    lock = threading.Lock()
    per_consumer = collections.Counter()
    errors = []

    def consume(c, name):
        try:
            deadline = time.monotonic() + 60
            while sum(map(len, seen.values())) < 300 and time.monotonic() < deadline:
                for m in c.receive(8, 30):
                    g, i = m.body.decode().split(":")
                    with lock:  # noted before the ack: the group's next message comes only after it
                        seen[g].append(int(i))
                        per_consumer[name] += 1
                    c.ack(m)
        except BaseException as e:  # (reported by the test's thread)
            errors.append(e)

    with simple(group, cluster.tcp_namesrv, topic) as c1, simple(group, cluster.tcp_namesrv, topic) as c2:
        threads = [threading.Thread(target=consume, args=(c, n)) for c, n in ((c1, "c1"), (c2, "c2"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
    assert not errors, errors
    assert {g: s for g, s in seen.items()} == {g: list(range(100)) for g in ("g0", "g1", "g2")}
    assert per_consumer["c1"] > 0 and per_consumer["c2"] > 0, per_consumer


@SYNC_ONLY
def test_a_delayed_message_arrives_no_earlier(cluster, simple, no_thread_leak):
    topic = "SimpleDelay"
    create_topic(cluster, topic, 1)
    with simple("CG_SIMPLE_DELAY", cluster.tcp_namesrv, topic) as c:
        with Producer("PG_SIMPLE_DELAY", namesrv=cluster.tcp_namesrv, **FAST) as p:
            due = int(time.time() * 1000) + 3000
            p.send(Message(topic, b"later", properties={"TIMER_DELIVER_MS": str(due)}))
            p.send(Message(topic, b"now"))
        got = receive_until(c, 2, timeout=20)
        for m in got:
            c.ack(m)
    assert [m.body for m in got] == [b"now", b"later"]
    later = got[1]
    assert later.store_timestamp >= due and handle(later).pop_time >= due, (later.store_timestamp, due)
    assert later.born_timestamp < due


def test_two_consumers_of_one_group_share_a_one_queue_topic(cluster, simple, no_thread_leak):
    topic, group = "SimpleShare", "CG_SIMPLE_SHARE"
    create_topic(cluster, topic, 1)
    with Producer("PG_SIMPLE_SHARE", namesrv=cluster.tcp_namesrv, **FAST) as p:
        for i in range(60):
            p.send(Message(topic, f"m{i}".encode()))
    with simple(group, cluster.tcp_namesrv, topic) as c1, simple(group, cluster.tcp_namesrv, topic) as c2:
        a = c1.receive(5, 30)
        b = c2.receive(5, 30)  # while c1's are in flight: the next ones of the same queue
        assert len(a) == len(b) == 5 and not {m.body for m in a} & {m.body for m in b}
        got = {c1: a, c2: b}
        for c, msgs in got.items():
            for m in msgs:
                c.ack(m)
        turn = 0
        while sum(map(len, got.values())) < 60 and turn < 200:
            c = (c1, c2)[turn % 2]
            turn += 1
            batch = c.receive(7, 30)
            for m in batch:
                c.ack(m)
            got[c] += batch
    bodies = [m.body for msgs in got.values() for m in msgs]
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(60))  # every one, none twice
    assert len(got[c1]) > 5 and len(got[c2]) > 5


@SYNC_ONLY
def test_receives_from_every_broker_holding_the_topic(tmp_path, simple, no_thread_leak):
    cl = NamesrvAndBroker(tmp_path, brokers=2, broker_props={"registerNameServerPeriod": "1000"})
    try:
        topic = "SimpleTwoBrokers"
        with AdminClient(cl.namesrv) as a:
            for addr in cl.broker_addrs:
                a.create_or_update_topic(addr, topic, read_queue_nums=2, write_queue_nums=2)
            wait_until(lambda: len(a.topic_route(topic).broker_datas) == 2, what="both brokers in the route")
        with Producer("PG_SIMPLE_TWO", namesrv=cl.namesrv, **FAST) as p:
            sent = {p.send(Message(topic, f"m{i}".encode())).queue.broker_name for i in range(40)}
        assert sent == {"broker-a", "broker-b"}
        with simple("CG_SIMPLE_TWO", cl.namesrv, topic) as c:
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 40 and time.monotonic() < deadline:
                batch = c.receive(8, 30)
                c.ack(batch[:4])  # (a list of one broker's, the rest one by one)
                for m in batch[4:]:
                    c.ack(m)
                got += batch
            assert c.receive(32, 30) == []
    finally:
        cl.stop()
    assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(40))
    assert {m.broker_name for m in got} == {handle(m).broker_name for m in got} == {"broker-a", "broker-b"}


def _restart(cl, tmp_path):
    proc = RmqProcess(["broker", "-n", cl.namesrv, "-c", str(tmp_path / "broker-a.conf"), "--listen-host", "127.0.0.1"])
    cl.brokers[0] = proc
    proc.wait_boot()


@SYNC_ONLY
def test_a_broker_sigkilled_redelivers_the_unacked_once_visible_and_none_of_the_acked(tmp_path, simple,
                                                                                       no_thread_leak):
    cl = NamesrvAndBroker(tmp_path, broker_props={"registerNameServerPeriod": "1000"})
    try:
        topic = "SimpleKill"
        with AdminClient(cl.namesrv) as a:
            a.create_or_update_topic(cl.broker_addrs[0], topic, read_queue_nums=4, write_queue_nums=4)
        with Producer("PG_SIMPLE_KILL", namesrv=cl.namesrv, **FAST) as p:
            for i in range(1000):
                p.send(Message(topic, f"m{i}".encode()))
        with simple("CG_SIMPLE_KILL", cl.namesrv, topic) as c:
            acked, unacked = [], []
            while len(acked) < 500:
                for m in c.receive(min(32, 500 - len(acked)), 30):
                    c.ack(m)
                    acked.append(m)
            receive_until(c, 500, n=32, invisible=4, into=unacked)
            assert len(unacked) == 500
            cl.brokers[0].kill()
            _restart(cl, tmp_path)
            again = []
            deadline = time.monotonic() + 60
            while len(again) < 500 and time.monotonic() < deadline:
                try:
                    batch = c.receive(32, 30)
                except (RemotingError, MQClientError, MQBrokerError):  # (the old connection, a route moment)
                    time.sleep(0.2)
                    continue
                for m in batch:
                    c.ack(m)
                again += batch
            assert c.receive(32, 30) == []
    finally:
        cl.stop()
    assert sorted(m.body for m in again) == sorted(m.body for m in unacked)  # all 500, each once
    assert not {m.body for m in again} & {m.body for m in acked}
    assert all(m.delivery_attempt == 2 for m in again)
    # none before its invisible time was over (the broker's clock)
    first = {m.body: handle(m).visible_at for m in unacked}
    assert all(handle(m).pop_time >= first[m.body] for m in again)


AK, SK = "simple-app", "simple-secret"
PLAIN_ACL = f"""\
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [SimpleAcl=PUB|SUB]
    groupPerms: [CG_SIMPLE_ACL=SUB]
  - accessKey: simple-admin
    secretKey: simple-admin-secret
    admin: true
"""


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simple-acl")
    cl = NamesrvAndBroker(tmp, broker_props={**acl_broker_props(tmp, PLAIN_ACL), "errorReplyDelayMs": "50",
                                             "registerNameServerPeriod": "1000"})
    try:
        with AdminClient(cl.namesrv, access_key="simple-admin", secret_key="simple-admin-secret") as a:
            a.create_or_update_topic(cl.broker_addrs[0], "SimpleAcl", read_queue_nums=2, write_queue_nums=2)
        yield cl
    finally:
        cl.stop()


def test_acl_the_right_key_receives_and_acks_a_wrong_secret_is_refused(acl_cluster, simple, no_thread_leak):
    ns = acl_cluster.namesrv
    with Producer("PG_SIMPLE_ACL", namesrv=ns, access_key=AK, secret_key=SK, **FAST) as p:
        p.send(Message("SimpleAcl", b"signed"))
    with simple("CG_SIMPLE_ACL", ns, "SimpleAcl", access_key=AK, secret_key=SK) as c:
        got = receive_until(c, 1)
        assert [m.body for m in got] == [b"signed"]
        c.ack(got[0])
        assert c.receive(32, 30) == []
    bad = simple("CG_SIMPLE_ACL", ns, "SimpleAcl", access_key=AK, secret_key="not-the-secret")
    with pytest.raises(MQBrokerError, match=f"Check signature failed for accessKey={AK}"):
        bad.start()
        bad.receive(1, 30)
    bad.shutdown()


def test_threads_sharing_a_consumer_have_their_waiting_receives_popped_as_one(cluster, no_thread_leak):
    """Receives made while a pop is in flight wait for it and then go as one pop; each gets at
    most its own maximum, none a message another got, and each message acks as usual."""
    topic, group = "SimpleThreads", "CG_SIMPLE_THREADS"
    create_topic(cluster, topic, 2)
    with SimpleConsumer(group, namesrv=cluster.tcp_namesrv, subscriptions={topic: "*"},
                        **dict(OPTS, await_duration=20.0)) as c:
        sizes = []
        pop_request = c._pop_request

        def counted(t, sub, max_nums, *args):  # (every pop's request, whichever route it goes)
            sizes.append(max_nums)
            return pop_request(t, sub, max_nums, *args)

        c._pop_request = counted
        loop_pops = []
        pop_once = c._pop_once

        async def on_loop(*args, **kw):
            loop_pops.append(args)
            return await pop_once(*args, **kw)

        c._pop_once = on_loop
        lanes = lambda: [*c._pop_lanes.values(), *c._channel_lanes.values()]  # noqa: E731
        got = {}

        def receive(i):
            got[i] = c.receive(5, 5)

        threads = [threading.Thread(target=receive, args=(0,))]
        threads[0].start()  # long-polls the empty topic
        wait_until(lambda: any(lane.in_flight for lane in lanes()), timeout=10)
        threads += [threading.Thread(target=receive, args=(i,)) for i in range(1, 8)]
        for t in threads[1:]:
            t.start()
        wait_until(lambda: sum(len(lane.waiting) for lane in lanes()) == 7, timeout=10)
        with Producer("PG_SIMPLE_THREADS", namesrv=cluster.tcp_namesrv, **FAST) as p:
            p.send_batch([Message(topic, f"m{i}".encode()) for i in range(40)],
                         queue=p.fetch_publish_message_queues(topic)[0])
        for t in threads:
            t.join(30)
        assert sorted(got) == list(range(8))
        assert all(1 <= len(msgs) <= 5 for msgs in got.values()), {i: len(m) for i, m in got.items()}
        assert 35 in sizes  # the seven waiting receives: one pop of 7 x 5
        assert loop_pops == []  # (one broker: shared on the command channel, no hop to the loop)
        bodies = [m.body for msgs in got.values() for m in msgs]
        assert len(bodies) == len(set(bodies)) == 40
        c.ack([m for msgs in got.values() for m in msgs])
        time.sleep(5.5)  # (their invisible time over)
        c.await_duration = 0.5
        assert c.receive(32, 30) == []  # every one acked: none comes back


def test_aio_tasks_sharing_a_consumer_share_pops_on_the_command_channel(cluster, no_thread_leak):
    """Eight asyncio tasks receiving and acking through one aio.SimpleConsumer: every message once,
    pops shared by the receives that waited (a pop asks for more than one receive's maximum), none
    through the client's loop, and nothing comes back once acked."""
    topic, group = "SimpleAioTasks", "CG_SIMPLE_AIO_TASKS"
    bodies_sent = fill_two_queues(cluster, topic, 200)

    async def scenario():
        async with aio.SimpleConsumer(group, cluster.tcp_namesrv, subscriptions={topic: "*"}, **OPTS) as c:
            inner = c.consumer
            sizes, loop_pops = [], []
            pop_request, pop_once = inner._pop_request, inner._pop_once

            def counted(t, sub, max_nums, *args):
                sizes.append(max_nums)
                return pop_request(t, sub, max_nums, *args)

            async def on_loop(*args, **kw):
                loop_pops.append(args)
                return await pop_once(*args, **kw)

            inner._pop_request, inner._pop_once = counted, on_loop
            bodies = []

            async def work():
                while len(bodies) < 400:
                    msgs = await c.receive(16, 30)
                    assert len(msgs) <= 16
                    if msgs:
                        await c.ack(msgs)
                    bodies.extend(m.body for m in msgs)

            await asyncio.wait_for(asyncio.gather(*(work() for _ in range(8))), 60)
            assert sorted(bodies) == bodies_sent
            assert max(sizes) > 16 and loop_pops == []
            inner.await_duration = 0.5
            assert await c.receive(32, 30) == []  # every one acked: none comes back

    asyncio.run(scenario())


def _batch_ack_requests(inner) -> list:
    """The BATCH_ACK_MESSAGE bodies `inner` (a SimpleConsumer) sends from now on, as parsed JSON."""
    sent, send = [], inner._send

    def recorded(request, *args):
        if request.code == RequestCode.BATCH_ACK_MESSAGE:
            sent.append(json.loads(bytes(request.body)))
        return send(request, *args)

    inner._send = recorded
    return sent


def _bits(ack: dict) -> int:
    """How many offsets a BatchAck's BitSet names."""
    return bin(int.from_bytes(base64.b64decode(ack["b"]), "little")).count("1")


def test_aio_tasks_ack_with_one_request_and_take_turns_in_two_pops(cluster, no_thread_leak):
    """Eight tasks given their messages by one pop ack in the same iteration of the loop: their acks
    go as one request, the offsets of one checkpoint in one BatchAck (one ack record at the
    broker).  Their receives go as pops of at most half of them, two in flight at once: the tasks
    take turns in two groups (one's pop at the broker while the other's messages are handed out
    and acked)."""
    topic, group = "SimpleAioMerged", "CG_SIMPLE_AIO_MERGED"
    bodies_sent = fill_two_queues(cluster, topic, 320)

    async def scenario():
        async with aio.SimpleConsumer(group, cluster.tcp_namesrv, subscriptions={topic: "*"}, **OPTS) as c:
            inner = c.consumer
            requests = _batch_ack_requests(inner)
            pops, send_pop = [], inner._send_pop  # (receives in the pop, pops in flight once it is sent)

            def counted(key, lane, taken, *args):
                send_pop(key, lane, taken, *args)
                pops.append((len(taken), len(inner._pops_here)))

            inner._send_pop = counted
            bodies, acks = [], [0]

            async def work():
                while len(bodies) < 640:
                    msgs = await c.receive(8, 30)
                    if msgs:
                        acks[0] += 1
                        await c.ack(msgs)
                    bodies.extend(m.body for m in msgs)

            await asyncio.wait_for(asyncio.gather(*(work() for _ in range(8))), 60)
            assert sorted(bodies) == bodies_sent
            assert len(requests) < acks[0]  # merged: fewer requests than acks
            assert max(_bits(a) for r in requests for a in r["acks"]) > 8  # several receives' offsets in one BatchAck
            assert sum(_bits(a) for r in requests for a in r["acks"]) == 640
            assert max(n for n, _ in pops) == 4  # half the eight receives seen waiting at once
            assert max(f for _, f in pops) == 2  # two pops in flight, never more
            inner.await_duration = 0.5
            assert await c.receive(32, 30) == []  # every one acked: none comes back

    asyncio.run(scenario())


def test_one_message_acks_made_together_go_as_one_request_and_one_alone_as_ack_message(cluster, no_thread_leak):
    """Acks of single messages made in one iteration of the loop (asyncio.gather of them, RocketMQ
    5's way: one ack per message) go as one BATCH_ACK_MESSAGE; a single one alone as ACK_MESSAGE."""
    topic, group = "SimpleAioSingles", "CG_SIMPLE_AIO_SINGLES"
    sent = fill_two_queues(cluster, topic, 20)

    async def scenario():
        async with aio.SimpleConsumer(group, cluster.tcp_namesrv, subscriptions={topic: "*"}, **OPTS) as c:
            inner = c.consumer
            codes, send = [], inner._send

            def recorded(request, *args):
                codes.append(request.code)
                return send(request, *args)

            inner._send = recorded
            got, merged = [], 0
            while len(got) < 39:
                msgs = await c.receive(39 - len(got), 30)
                got += msgs
                before = len(codes)
                await asyncio.gather(*(c.ack(m) for m in msgs))
                if len(msgs) > 1:
                    assert codes[before:] == [RequestCode.BATCH_ACK_MESSAGE]  # all of them, one request
                    merged += 1
            assert merged
            last = await c.receive(1, 30)
            await c.ack(last[0])
            assert codes[-1] == RequestCode.ACK_MESSAGE
            assert sorted(m.body for m in got + last) == sent
            inner.await_duration = 0.5
            assert await c.receive(32, 30) == []  # every one acked: none comes back

    asyncio.run(scenario())


def test_acks_gathered_in_one_iteration_each_learn_their_own_outcome(cluster, no_thread_leak):
    """Acks an iteration of the loop gathers go as one request, yet each caller gets its own
    outcome: an expired handle's ack fails alone, and when the broker refuses the merged request
    (a handle it does not know), each ack is sent again alone - the good one succeeds, the
    messages it acked never come back, the unacked ones do."""
    topic, group = "SimpleAioOwnOutcome", "CG_SIMPLE_AIO_OWN"
    create_topic(cluster, topic, 1)
    with Producer("PG_SIMPLE_AIO_OWN", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send_batch([Message(topic, f"m{i}".encode()) for i in range(3)],
                     queue=p.fetch_publish_message_queues(topic)[0])

    async def scenario():
        async with aio.SimpleConsumer(group, cluster.tcp_namesrv, subscriptions={topic: "*"}, **OPTS) as c:
            requests = _batch_ack_requests(c.consumer)
            stale = await c.receive(1, 1)
            assert [m.body for m in stale] == [b"m0"]
            await asyncio.sleep(1.1)  # its invisible time is over: its ack is refused before it is sent
            fresh = await c.receive(2, 3)
            assert [m.body for m in fresh] == [b"m1", b"m2"]
            outcomes = await asyncio.gather(c.ack(stale), c.ack([fresh[0]]), return_exceptions=True)
            assert isinstance(outcomes[0], ReceiptHandleExpiredError) and outcomes[1] is None
            assert len(requests) == 1 and [_bits(a) for a in requests[0]["acks"]] == [1]

            h = handle(fresh[1])
            forged = copy.copy(fresh[1])  # a handle of a checkpoint the broker never made
            forged.receipt_handle = build_extra_info(h.ck_queue_offset, h.pop_time + 1, h.invisible_time,
                                                     h.revive_qid, h.retry, h.broker_name, h.queue_id, h.queue_offset)
            del requests[:]
            outcomes = await asyncio.gather(c.ack([forged]), c.ack([fresh[1]]), return_exceptions=True)
            assert isinstance(outcomes[0], MQBrokerError) and "expired or unknown" in str(outcomes[0])
            assert outcomes[1] is None
            assert len(requests) == 3  # merged, refused, then each alone

            again = []
            deadline = time.monotonic() + 30
            while not again and time.monotonic() < deadline:
                again = await c.receive(32, 30)
            assert [(m.body, m.delivery_attempt) for m in again] == [(b"m0", 2)]
            await c.ack(again)
            await asyncio.sleep(max(0.0, (h.pop_time + h.invisible_time) / 1000 - time.time()) + 0.5)
            assert await c.receive(32, 30) == []  # m1 and m2 were acked: never again

    asyncio.run(scenario())


def test_a_receive_pops_on_the_command_channel_when_no_pop_of_its_lane_is_in_flight(cluster, no_thread_leak):
    """With one broker serving the topic and no pop of the receive's lane in flight, receive and
    receive_async pop on the broker's command channel (as acks go), not from the client's loop;
    the messages come in turn, each once, with their keys and tags, and acks end them."""
    topic, group = "SimpleHere", "CG_SIMPLE_HERE"
    create_topic(cluster, topic, 2)
    with Producer("PG_SIMPLE_HERE", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send_batch([Message(topic, f"m{i}".encode(), tags="TagA", keys=[f"k{i}"]) for i in range(100)],
                     queue=p.fetch_publish_message_queues(topic)[0])
    with SimpleConsumer(group, namesrv=cluster.tcp_namesrv, subscriptions={topic: "TagA"}, **OPTS) as c:
        loop_pops = []
        pop_once = c._pop_once

        async def counted(*args, **kw):
            loop_pops.append(args[2])
            return await pop_once(*args, **kw)

        c._pop_once = counted
        got = []
        while len(got) < 100:
            if len(got) < 60:
                msgs = c.receive(10, 30)
            else:
                future = c.receive_async(10, 30)
                assert future.channel is not None  # (a LeanFuture of the command channel)
                msgs = future.result(30)
            assert msgs, "the topic's messages stopped short"
            c.ack(msgs)
            got += msgs
        assert loop_pops == []
        assert [m.body for m in got] == [f"m{i}".encode() for i in range(100)]
        assert [m.keys for m in got] == [f"k{i}" for i in range(100)] and {m.tags for m in got} == {"TagA"}
        assert c.receive(32, 30) == []  # every one acked: none comes back
        assert not any(lane.in_flight for lane in (*c._pop_lanes.values(), *c._channel_lanes.values()))


def test_shutdown_ends_a_receive_long_polling_on_the_command_channel(cluster, no_thread_leak):
    """A sync receive long polling on the command channel when its consumer shuts down ends with
    the shutdown - cancelled, as a receive waiting on the client's loop is - while a producer keeps
    the client (and the channel) open; the channel holds no request of it any more."""
    topic, group = "SimpleShutdown", "CG_SIMPLE_SHUTDOWN"
    create_topic(cluster, topic, 1)
    shared = dict(OPTS, await_duration=60.0, instance_name="simple-shutdown")
    with Producer("PG_SIMPLE_SHUTDOWN", namesrv=cluster.tcp_namesrv, **FAST, instance_name="simple-shutdown"):
        c = SimpleConsumer(group, namesrv=cluster.tcp_namesrv, subscriptions={topic: "*"}, **shared).start()
        outcome = []

        def receive():
            try:
                outcome.append(c.receive(32, 30))
            except BaseException as e:  # noqa: BLE001 - the test looks at it
                outcome.append(e)

        t = threading.Thread(target=receive)
        t.start()
        wait_until(lambda: c._pops_here, timeout=10)
        [[waiter]] = c._pops_here.values()
        channel = waiter.future.channel
        c.shutdown()
        assert channel.pending_count == 0 and not channel.closed
        t.join(30)  # (a 60 s long poll otherwise)
        assert not t.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], concurrent.futures.CancelledError), outcome


def test_messages_popped_for_receives_that_gave_up_go_to_the_receives_waiting(cluster, no_thread_leak):
    """Two receives merged into one pop both cancelled while it long polls: the messages it brings
    go to the receives that waited behind it, not back to the broker for their invisible time."""
    topic, group = "SimpleGaveUp", "CG_SIMPLE_GAVE_UP"
    create_topic(cluster, topic, 1)
    with Producer("PG_SIMPLE_GAVE_UP", namesrv=cluster.tcp_namesrv, **FAST) as p, \
            SimpleConsumer(group, namesrv=cluster.tcp_namesrv, subscriptions={topic: "*"},
                           **dict(OPTS, await_duration=60.0)) as c:
        p.send(Message(topic, b"first"))
        first = c.receive(32, 300)  # (an answer with messages: the group is not orderly, receives merge)
        assert [m.body for m in first] == [b"first"]
        c.ack(first)
        alone = c.receive_async(32, 300)
        merged = [c.receive_async(8, 300) for _ in range(2)]  # (wait behind `alone`, then pop as one)
        p.send(Message(topic, b"wakes"))
        assert [m.body for m in alone.result(30)] == [b"wakes"]
        wait_until(lambda: any(len(t) == 2 for t in c._pops_here.values()), timeout=30, what="the merged pop")
        behind = [c.receive_async(2, 300), c.receive_async(8, 300)]
        assert all(f.cancel() for f in merged)
        p.send_batch([Message(topic, f"m{i}".encode()) for i in range(3)])
        first_share, second_share = behind[0].result(30), behind[1].result(30)
        # (each waiting receive up to its maximum; none of the three is left invisible for 300 s)
        assert len(first_share) <= 2 and [m.body for m in first_share + second_share] == [b"m0", b"m1", b"m2"]
        c.ack([*alone.result(), *behind[0].result(), *behind[1].result()])


def test_a_cancelled_receive_frees_its_lane_at_once(cluster, no_thread_leak):
    """receive_async cancelled while its pop long polls on the command channel (an aio caller's
    timeout): the pop is taken off the channel and the next receive pops on its own at once
    instead of waiting behind it."""
    topic, group = "SimpleCancel", "CG_SIMPLE_CANCEL"
    create_topic(cluster, topic, 1)
    with SimpleConsumer(group, namesrv=cluster.tcp_namesrv, subscriptions={topic: "*"},
                        **dict(OPTS, await_duration=60.0)) as c:
        first = c.receive_async(32, 30)
        channel = first.channel
        assert first.cancel()
        assert channel.pending_count == 0 and not c._pops_here
        assert not any(lane.in_flight for lane in (*c._pop_lanes.values(), *c._channel_lanes.values()))
        c.await_duration = 0.5
        assert c.receive(32, 30) == []  # (popped on its own at once, not behind the cancelled one)
