"""wipeWritePerm / addWritePerm against a real name server and two brokers, under a live producer
and consumer: after the wipe every send goes to the other broker with no failed send while the
consumer drains the wiped broker's backlog; addWritePerm brings the broker back."""
from __future__ import annotations

import threading
import time

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from tests.admin.test_admin_cli import fails, ok, rows, wait_for
from tests.servers import NamesrvAndBroker

FAST = dict(poll_name_server_interval=0.5, heartbeat_broker_interval=1.0, persist_consumer_offset_interval=1.0)
TOPIC = "WipeTopic"


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    c = NamesrvAndBroker(tmp_path_factory.mktemp("wipe"), brokers=2)
    try:
        ok("updateTopic", "-c", "DefaultCluster", "-t", TOPIC, "-r", "4", "-w", "4", ns=c.namesrv)
        yield c
    finally:
        c.stop()


class Sender(threading.Thread):
    """Sends one message after another, noting each one's broker (and any failure)."""

    def __init__(self, producer):
        super().__init__(daemon=True)
        self.producer = producer
        self.brokers: list[str] = []
        self.ids: set[str] = set()
        self.by_broker: dict[str, set[str]] = {"broker-a": set(), "broker-b": set()}
        self.failures: list[BaseException] = []
        self.stop = threading.Event()

    def run(self):
        i = 0
        while not self.stop.is_set():
            try:
                r = self.producer.send(Message(TOPIC, f"m{i}".encode()))
                self.brokers.append(r.queue.broker_name)
                self.ids.add(r.msg_id)
                self.by_broker[r.queue.broker_name].add(r.msg_id)
            except Exception as e:  # noqa: BLE001 - counted: the test asserts there are none
                self.failures.append(e)
            i += 1
            time.sleep(0.002)

    def only_to(self, broker, since, n=50):
        tail = self.brokers[since:]
        return len(tail) >= n and all(b == broker for b in tail[-n:])


def test_wipe_and_add_write_perm_under_live_traffic(cl):
    ns = cl.namesrv
    consumed: set[str] = set()
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            consumed.update(m.msg_id for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("CG_WIPE", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    c.subscribe(TOPIC, "*")
    c.register_message_listener(listener)
    c.suspend()  # a backlog builds on both brokers first
    c.start()
    p = Producer("PG_WIPE", namesrv=ns, **FAST).start()
    s = Sender(p)
    s.start()
    try:
        wait_for(lambda: {"broker-a", "broker-b"} <= set(s.brokers), timeout=60, what="sends to both brokers")
        done = rows("wipeWritePerm", "-b", "broker-a", ns=ns)
        assert done == [{"name_server": ns, "broker_name": "broker-a", "wiped_topics": done[0]["wiped_topics"]}]
        assert done[0]["wiped_topics"] >= 1
        route = rows("topicRoute", "-t", TOPIC, ns=ns)
        assert route, "topicRoute shows the route"
        mark = len(s.brokers)
        wait_for(lambda: s.only_to("broker-b", mark), timeout=60, what="sends only to broker-b")
        backlog = set(s.by_broker["broker-a"])
        assert backlog and not backlog & consumed  # nothing of it consumed yet (the consumer was suspended)
        c.resume()  # the consumer drains broker-a's backlog (its queues stay readable) while sends go on
        wait_for(lambda: backlog <= consumed, timeout=60, what="broker-a's backlog consumed")
        assert s.only_to("broker-b", mark)
        table = ok("addWritePerm", "-b", "broker-a", ns=ns)
        assert "add write perm of broker[broker-a]" in table and "Added Topics" in table
        mark = len(s.brokers)
        wait_for(lambda: "broker-a" in s.brokers[mark:], timeout=60, what="sends to broker-a again")
    finally:
        s.stop.set()
        s.join(30)
        p.shutdown()
    try:
        wait_for(lambda: s.ids <= consumed, timeout=60, what="every sent message consumed")
    finally:
        c.shutdown()
    assert s.failures == []


def test_write_perm_bad_input(cl):
    fails("wipeWritePerm", "-b", "no-such-broker", ns=cl.namesrv, needle="no-such-broker")
    fails("addWritePerm", "-b", "nope", ns=cl.namesrv, needle="nope")
