"""A lost master, with real processes and a real SIGKILL: `rmq namesrv`, a SYNC_MASTER and its
SLAVE (`rmq broker` each).  rmq's producer streams while the master is killed; every message
answered SEND_OK is on the slave and reaches a push consumer that goes on consuming from the
slave; the offsets it commits there are kept; the master comes back with nothing taken from the
slave, takes the newer offsets, and the producer returns to it."""
import threading
import time

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from rmq_core.codec import decode_messages
from rmq_core.errors import RMQError
from rmq_core.message import SendStatus
from rmq_core.remoting.codes import ResponseCode
from tests.broker.ha_cluster import QUEUES, TOPIC, consumer_offsets, queue_ends, running_group
from tests.broker.ha_group import commit_log_segments, log_end
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until

GROUP = "CG_HA_FAILOVER"


@pytest.fixture
def sync_group(tmp_path):
    with running_group(tmp_path, role="SYNC_MASTER") as group:
        yield group


def bodies_on(raw, addr, topic=TOPIC) -> list[bytes]:
    out = []
    for q in range(QUEUES):
        offset = 0
        while True:
            resp = raw.pull(addr, topic, q, offset, max_nums=32)
            if resp.code != ResponseCode.SUCCESS:
                break
            out += [m.body for m in decode_messages(resp.body)]
            offset = int(resp.ext_fields["nextBeginOffset"])
    return out


class Stream:
    """A producer thread sending until stopped; records the bodies answered SEND_OK."""

    def __init__(self, producer):
        self.producer = producer
        self.ok: list[bytes] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        i = 0
        while not self._stop.is_set():
            body = f"m{i:06d}".encode()
            i += 1
            try:
                r = self.producer.send(Message(TOPIC, body))
            except RMQError:
                self.failed += 1
                time.sleep(0.05)
                continue
            if r.status is SendStatus.SEND_OK:
                self.ok.append(body)

    def stop(self):
        self._stop.set()
        self._thread.join(60)


def test_sync_master_killed_mid_stream_slave_serves_everything_acknowledged(sync_group):
    g, raw = sync_group
    consumed: set[bytes] = set()
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            consumed.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    producer = Producer("PG_HA_FAILOVER", namesrv=g.namesrv, send_msg_timeout=3.0, **FAST).start()
    consumer = PushConsumer(GROUP, namesrv=g.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
    consumer.subscribe(TOPIC, "*")
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        stream = Stream(producer)
        wait_until(lambda: len(stream.ok) >= 150 and consumed, 60, what="sends consumed from the master")
        consumer.suspend()  # a backlog for the slave to serve
        wait_until(lambda: len(stream.ok) >= 300, 60, what="acknowledged sends")
        g.master.kill()  # SIGKILL mid-stream
        killed_at = len(stream.ok)
        with lock:
            consumed_at_kill = len(consumed)
        consumer.resume()
        time.sleep(1.0)  # sends go on failing meanwhile (no master in the route)
        stream.stop()
        acknowledged = set(stream.ok)
        assert len(acknowledged) >= killed_at >= 300
        assert consumed_at_kill < killed_at  # some are left to read from the slave

        # every SEND_OK message is on the slave, and the consumer gets all of them from there
        on_slave = set(bodies_on(raw, g.slave_addr))
        assert acknowledged <= on_slave
        wait_until(lambda: acknowledged <= consumed, 90, what="the consumer reading on from the slave")
        # the offsets it commits land on the slave, which keeps them
        expected = queue_ends(raw, g.slave_addr)
        wait_until(lambda: consumer_offsets(raw, g.slave_addr, GROUP) == expected, 30, what="offsets committed to the slave")
    finally:
        consumer.shutdown()

    # the master comes back: its own log, nothing taken from the slave
    master_end = log_end(commit_log_segments(g.master_store))
    g.start_master()
    wait_until(lambda: consumer_offsets(raw, g.master_addr, GROUP) == expected, 60,
               what="the master taking the offsets committed to its slave")
    assert log_end(commit_log_segments(g.master_store)) == master_end
    # and the producer returns to it (SEND_OK needs the master and its slave)
    wait_until(lambda: _send_ok(producer), 60, what="a send acknowledged by the restarted master")
    producer.shutdown()


def _send_ok(producer) -> bool:
    try:
        return producer.send(Message(TOPIC, b"after the restart")).status is SendStatus.SEND_OK
    except RMQError:
        return False
