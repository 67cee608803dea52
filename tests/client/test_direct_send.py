"""Sync sends made from the caller's thread over pooled blocking connections (Producer._send_direct):
used once the route is cached, off when direct_send_connections=0 or the broker is in-proc, a broken
connection falls back to the loop's retrying path, and many threads share the pool."""
import socket
import threading
import time

from rmq_core import Message, Producer
from rmq_core.message import SendStatus
from rmq_core.remoting.aliases import resolve_inproc_alias
from tests.client.conftest import FAST, drain_topic


def _broker_addr(p: Producer, topic: str) -> str:
    mq = p.fetch_publish_message_queues(topic)[0]
    return p.instance.find_broker_addr_in_publish(mq.broker_name)


def test_sync_sends_use_one_direct_connection_and_land_once(cluster):
    topic = "DirectT"
    with Producer("PG_DIRECT", namesrv=cluster.tcp_namesrv, **FAST) as p:
        results = [p.send(Message(topic, f"d{i}".encode(), tags="TagD", keys=f"k{i}")) for i in range(40)]
        addr = _broker_addr(p, topic)
        assert p.instance.direct_channels.open_count(addr) == 1
    assert all(r.status is SendStatus.SEND_OK for r in results)
    # round robin over the 4 queues, offsets dense per queue, every id distinct
    per_queue = {}
    for r in results:
        per_queue.setdefault(r.queue.queue_id, []).append(r.queue_offset)
    assert sorted(per_queue) == [0, 1, 2, 3]
    for offsets in per_queue.values():
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    assert len({r.msg_id for r in results}) == 40 and len({r.offset_msg_id for r in results}) == 40

    got = drain_topic(cluster.tcp_namesrv, topic, "CG_DIRECT", 40)
    assert sorted(m.body for m in got) == sorted(f"d{i}".encode() for i in range(40))
    by_id = {r.msg_id: r for r in results}
    for m in got:
        r = by_id[m.msg_id]
        assert (m.queue_id, m.queue_offset, m.tags) == (r.queue.queue_id, r.queue_offset, "TagD")


def test_direct_path_off_uses_the_loop(cluster):
    with Producer("PG_NODIRECT", namesrv=cluster.tcp_namesrv, direct_send_connections=0, **FAST) as p:
        for i in range(5):
            assert p.send(Message("NoDirectT", b"x")).status is SendStatus.SEND_OK
        assert p.instance.direct_channels.open_count(_broker_addr(p, "NoDirectT")) == 0


def test_an_in_proc_broker_is_reached_without_the_client_loop(cluster):
    topic = "InprocDirectT"
    with Producer("PG_INPROC", namesrv=cluster.namesrv, **FAST) as p:
        results = [p.send(Message(topic, f"i{i}".encode(), tags="TagI")) for i in range(12)]
        inproc_addr = resolve_inproc_alias(_broker_addr(p, topic))
        assert inproc_addr.startswith("inproc://")
        assert p.instance.direct_channels.open_count(inproc_addr) == 1
        r = p.send_batch([Message(topic, b"ib0"), Message(topic, b"ib1")], queue=results[0].queue)
        assert r.status is SendStatus.SEND_OK and len(r.msg_id.split(",")) == 2
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({(r.queue.queue_id, r.queue_offset) for r in results}) == 12
    got = drain_topic(cluster.namesrv, topic, "CG_INPROC", 14)
    assert sorted(m.body for m in got) == sorted([f"i{i}".encode() for i in range(12)] + [b"ib0", b"ib1"])


def test_a_broken_direct_connection_falls_back_and_sends_once(cluster):
    topic = "DirectBreakT"
    with Producer("PG_BREAK", namesrv=cluster.tcp_namesrv, **FAST) as p:
        for i in range(3):
            p.send(Message(topic, f"a{i}".encode()))
        addr = _broker_addr(p, topic)
        pool = p.instance.direct_channels
        (channel,) = pool._idle[addr]
        channel._sock.shutdown(socket.SHUT_RDWR)  # as a reset connection would leave it
        r = p.send(Message(topic, b"after-break"))
        assert r.status is SendStatus.SEND_OK
        assert channel.closed and pool.open_count(addr) == 0  # dropped, not lent again
        p.send(Message(topic, b"again-direct"))
        assert pool.open_count(addr) == 1
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_BREAK", 5)
    bodies = sorted(m.body for m in got)
    assert bodies == sorted([b"a0", b"a1", b"a2", b"after-break", b"again-direct"])


def test_many_threads_send_through_a_small_pool(cluster):
    topic = "DirectThreadsT"
    results, errors = [], []
    with Producer("PG_THREADS", namesrv=cluster.tcp_namesrv, direct_send_connections=2, **FAST) as p:
        p.send(Message(topic, b"warm"))

        def sender(n):
            for i in range(25):
                try:
                    results.append(p.send(Message(topic, f"{n}-{i}".encode())))
                except Exception as e:  # noqa: BLE001 - asserted below
                    errors.append(e)

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert p.instance.direct_channels.open_count(_broker_addr(p, topic)) <= 2
    assert not errors
    assert len(results) == 200 and all(r.status is SendStatus.SEND_OK for r in results)
    assert len({(r.queue.queue_id, r.queue_offset) for r in results}) == 200
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_THREADS", 201)
    assert sorted(m.body for m in got if m.body != b"warm") == sorted(
        f"{n}-{i}".encode() for n in range(8) for i in range(25))


def test_a_batch_to_a_queue_goes_direct(cluster):
    topic = "DirectBatchT"
    with Producer("PG_DBATCH", namesrv=cluster.tcp_namesrv, **FAST) as p:
        q = p.fetch_publish_message_queues(topic)[1]
        r = p.send_batch([Message(topic, f"b{i}".encode(), keys=f"bk{i}") for i in range(10)], queue=q)
        assert r.status is SendStatus.SEND_OK and r.queue == q
        assert len(r.msg_id.split(",")) == 10
        assert p.instance.direct_channels.open_count(_broker_addr(p, topic)) == 1
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_DBATCH", 10)
    assert sorted(m.body for m in got) == sorted(f"b{i}".encode() for i in range(10))
    assert {m.queue_id for m in got} == {1}
