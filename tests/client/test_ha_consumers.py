"""rmq's consumers with the master of their broker group SIGKILLed (real `rmq broker` processes):
the lite PullConsumer and rmq_core.aio's consumers read on from the slave and commit there; an
orderly PushConsumer pauses once its queue locks (which live on the master) expire, and resumes,
in order, when the master is back."""
import asyncio
import threading

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer, aio
from tests.broker.ha_cluster import QUEUES, TOPIC, consumer_offsets, kill_master, running_group
from tests.broker.ha_group import wait_replicated
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until


@pytest.fixture
def group(tmp_path):
    with running_group(tmp_path) as g_raw:
        yield g_raw


def send(g, bodies) -> None:
    with Producer("PG_HA_CONSUMERS", namesrv=g.namesrv, **FAST) as p:
        for i, b in enumerate(bodies):
            p.send(Message(TOPIC, b), queue=p.fetch_publish_message_queues(TOPIC)[i % QUEUES])


def test_lite_and_aio_pull_consumers_read_and_commit_on_the_slave(group):
    g, raw = group
    bodies = [f"p{i}".encode() for i in range(40)]
    send(g, bodies)
    wait_replicated(g.master_store, g.slave_store)
    kill_master(g, raw)

    c = PullConsumer("CG_HA_LITE", namesrv=g.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     auto_commit=False, pull_time_delay_when_exception=0.2, **FAST)
    c.subscribe(TOPIC)
    c.start()
    try:
        got = []
        wait_until(lambda: got.extend(m.body for m in c.poll(0.5)) or len(got) >= len(bodies), 60,
                   what="the lite consumer reading from the slave")
        assert sorted(got) == sorted(bodies)
        c.commit()
        assert consumer_offsets(raw, g.slave_addr, "CG_HA_LITE") == [10] * QUEUES
    finally:
        c.shutdown()

    async def read_async():
        out = []
        async with aio.PullConsumer("CG_HA_AIO", namesrv=g.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                    pull_time_delay_when_exception=0.2, **FAST) as ac:
            ac.subscribe(TOPIC)
            async for m in ac:
                out.append(m.body)
                if len(out) == len(bodies):
                    return out

    assert sorted(asyncio.run(asyncio.wait_for(read_async(), 60))) == sorted(bodies)


def test_orderly_consumer_pauses_without_its_master_and_resumes_in_order(group):
    g, raw = group
    consumed: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            consumed.extend(m.body for m in msgs)
        return ConsumeStatus.SUCCESS

    c = PushConsumer("CG_HA_ORDERLY", namesrv=g.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     lock_interval=1.0, lock_max_live_time=3.0, **FAST_CONSUMER)
    c.subscribe(TOPIC)
    c.register_message_listener(listener, orderly=True)
    c.start()
    try:
        first = [f"a{i:03d}".encode() for i in range(20)]
        send(g, first)
        wait_until(lambda: len(consumed) == len(first), 60, what="consumption with the master's locks")
        c.suspend()
        later = [f"b{i:03d}".encode() for i in range(20)]
        send(g, later)
        wait_replicated(g.master_store, g.slave_store)
        kill_master(g, raw)
        pqs = list(c.process_queue_table.values())
        wait_until(lambda: all(pq.is_lock_expired(3.0) for pq in pqs), 30, what="the queue locks expiring")
        with lock:  # (a pull held at the broker when suspended may have brought a few of them)
            before = list(consumed)
        c.resume()
        # the pull loops run on against the slave; consumption waits for a lock only the master grants
        wait_until(lambda: sum(pq.msg_count for pq in pqs) + len(before) - len(first) == len(later), 30,
                   what="the backlog pulled from the slave")
        with lock:
            assert consumed == before
        g.start_master()
        wait_until(lambda: len(consumed) == len(first) + len(later), 60, what="consumption resumed on the master's locks")
        with lock:
            resumed = consumed[len(first):]
        for q in range(QUEUES):  # each queue in its order
            sent_q = [b for i, b in enumerate(later) if i % QUEUES == q]
            assert [b for b in resumed if b in sent_q] == sent_q
    finally:
        c.shutdown()
