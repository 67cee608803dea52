"""A broker group's master dies (SIGKILL) and a new master registers under the same brokerName at
another address: rmq's clients ask the name server for the route at once (route_suspect), so
writes, pulls and offset commits move to the new master without waiting for the periodic route
poll - which these clients have set to 60 s and which is watched not to run meanwhile.  Also the
"not master" refusal (the old master back as a slave) and the chase's coalescing."""
from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer, aio
from rmq_core.client.config import ClientConfig
from rmq_core.client.instance import MQClientInstance
from rmq_core.remoting.body import TopicRouteData
from rmq_core.errors import MQBrokerError, MQClientError, RemotingConnectError, RMQError
from rmq_core.message import SendStatus
from rmq_core.remoting.body import BrokerData, QueueData
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.client.conftest import wait_until
from tests.rawclient import RawClient
from tests.servers import RmqProcess, free_port, freeze, write_conf

TOPIC, QUEUES = "RouteSuspectTopic", 4
SLOW_POLL = dict(poll_name_server_interval=60.0)  # the periodic poll cannot be what rescues a client


class Cluster:
    """`rmq namesrv` and `rmq broker` processes on free ports; a broker is (re)started on a config
    of its own (brokerName, brokerId, role, port, store)."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.namesrv = f"127.0.0.1:{free_port()}"
        self.ns = RmqProcess(["namesrv", "--listen", self.namesrv], ("The Name Server boot success",))
        self.procs: list[RmqProcess] = [self.ns]
        self.running: dict[str, RmqProcess] = {}  # broker address -> its process
        self.raw = RawClient()
        self.ns.wait_boot()

    def broker(self, name: str, store: str, broker_id: int = 0, port: int | None = None) -> str:
        """Start a broker of `name` (a master with broker id 0, else a slave); its address."""
        port = port or free_port()
        conf = write_conf(self.tmp_path / f"{name}-{port}-{broker_id}.conf", {
            "brokerClusterName": "RouteCluster", "brokerName": name, "brokerId": broker_id,
            "brokerRole": "ASYNC_MASTER" if broker_id == 0 else "SLAVE", "brokerIP1": "127.0.0.1",
            "listenPort": port, "haListenPort": free_port(), "storePathRootDir": self.tmp_path / store,
            "mappedFileSizeCommitLog": 1024 * 1024, "mappedFileSizeConsumeQueue": 6000 * 20,
            "maxHashSlotNum": 10000, "maxIndexNum": 40000, "registerNameServerPeriod": 1000})
        proc = RmqProcess(["broker", "-n", self.namesrv, "-c", conf, "--listen-host", "127.0.0.1"])
        self.procs.append(proc)
        proc.wait_boot()
        self.running[f"127.0.0.1:{port}"] = proc
        return f"127.0.0.1:{port}"

    def create_topic(self, addr: str) -> None:
        r = self.raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                            {"topic": TOPIC, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES), "perm": "6"})
        assert r.code == ResponseCode.SUCCESS, r.remark

    def kill(self, addr: str) -> None:
        self.running.pop(addr).kill()

    def new_master(self, name: str, store: str) -> str:
        """Start a new master of `name` (brokerId 0) on another port with a copy of the dead one's
        store (as a promoted replica would hold it); its address."""
        shutil.copytree(self.tmp_path / store, self.tmp_path / f"{store}-new")
        return self.broker(name, f"{store}-new")

    def replace_master(self, name: str, old_addr: str, store: str) -> str:
        """SIGKILL the master at old_addr, then new_master."""
        self.kill(old_addr)
        return self.new_master(name, store)

    def master_in_route(self, name: str) -> str | None:
        _, route = self.raw.route(self.namesrv, TOPIC)
        return next((bd["brokerAddrs"].get("0") for bd in (route or {}).get("brokerDatas", ())
                     if bd["brokerName"] == name), None)

    def offsets(self, addr: str, group: str) -> list[int]:
        out = []
        for q in range(QUEUES):
            r = self.raw.invoke(addr, RequestCode.QUERY_CONSUMER_OFFSET,
                                {"consumerGroup": group, "topic": TOPIC, "queueId": str(q)})
            out.append(int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else -1)
        return out

    def queue_ends(self, addr: str) -> list[int]:
        return [int(self.raw.invoke(addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(q)})
                    .ext_fields["offset"]) for q in range(QUEUES)]

    def stop(self) -> None:
        self.raw.close()
        for p in reversed(self.procs):
            p.terminate()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def polls(monkeypatch):
    """How many times the periodic route poll (pollNameServerInterval) of any client ran."""
    count = [0]
    job = MQClientInstance._refresh_routes_job

    def counted(self):
        count[0] += 1
        job(self)

    monkeypatch.setattr(MQClientInstance, "_refresh_routes_job", counted)
    return count


def first_poll_done(polls, clients: int = 1) -> None:
    """Each client instance's first poll runs moments after its start (then every 60 s): past
    them, none runs in a test."""
    wait_until(lambda: polls[0] >= clients, 10, what="the first route poll of each client")


def send_until_ok(send, what: str, timeout: float = 60.0):
    """send() until it answers SEND_OK (failures while the group has no master are expected)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = send()
            if r.status is SendStatus.SEND_OK:
                return r
        except (MQClientError, MQBrokerError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no SEND_OK within {timeout}s: {what}")
        time.sleep(0.05)


def test_sync_sends_reach_the_new_master_without_the_route_poll(cluster, polls):
    a0 = cluster.broker("broker-a", "store-a")
    b0 = cluster.broker("broker-b", "store-b")
    for addr in (a0, b0):
        cluster.create_topic(addr)
    with Producer("PG_ROUTE_SYNC", namesrv=cluster.namesrv, send_msg_timeout=3.0, **SLOW_POLL) as p:
        wait_until(lambda: {q.broker_name for q in p.fetch_publish_message_queues(TOPIC)} == {"broker-a", "broker-b"},
                   20, what="both groups in the route")
        first_poll_done(polls)
        seen = polls[0]
        cluster.kill(a0)
        # while broker-a has no master, sends go on to broker-b (a failed attempt's retry goes there)
        for _ in range(8):
            r = send_until_ok(lambda: p.send(Message(TOPIC, b"during")), "sends to the other group")
            assert r.queue.broker_name == "broker-b"
        a1 = cluster.new_master("broker-a", "store-a")
        wait_until(lambda: cluster.master_in_route("broker-a") == a1, 20, what="the new master registered")

        def on_new_master():
            r = p.send(Message(TOPIC, b"after"))
            assert r.status is SendStatus.SEND_OK
            return r.queue.broker_name == "broker-a"

        # the failed master's group is sent to again, at its new address (not benched for minutes)
        wait_until(on_new_master, 30, what="a send landing on broker-a's new master")
        assert p.instance.broker_addr_table["broker-a"][0] == a1
        assert polls[0] == seen, "the periodic route poll ran: it, not the failure, may have found the new master"
    assert cluster.queue_ends(a1) != [0] * QUEUES


def test_aio_sends_reach_the_new_master_without_the_route_poll(cluster, polls):
    a0 = cluster.broker("broker-a", "store-a")
    cluster.create_topic(a0)

    async def run():
        async with aio.Producer("PG_ROUTE_AIO", namesrv=cluster.namesrv, **SLOW_POLL) as p:
            assert (await p.send(Message(TOPIC, b"before"))).status is SendStatus.SEND_OK
            await asyncio.get_running_loop().run_in_executor(None, first_poll_done, polls)
            seen = polls[0]
            a1 = await asyncio.get_running_loop().run_in_executor(None, cluster.replace_master, "broker-a", a0,
                                                                   "store-a")
            for _ in range(1200):
                try:
                    r = await p.send(Message(TOPIC, b"after"))
                    if r.status is SendStatus.SEND_OK:
                        break
                except (MQClientError, MQBrokerError):
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("no SEND_OK from the new master")
            assert p.producer.instance.broker_addr_table["broker-a"][0] == a1
            assert polls[0] == seen, "the periodic route poll ran"
            return a1

    a1 = asyncio.run(asyncio.wait_for(run(), 90))
    assert sum(cluster.queue_ends(a1)) == 2  # "before" (copied with the store) and "after"


def test_a_not_master_refusal_refreshes_the_route(cluster, polls):
    """The producer's route still names the old master's address, where the old master now runs
    as a slave: its SERVICE_NOT_AVAILABLE refusal makes the client ask for the route at once."""
    a0 = cluster.broker("broker-a", "store-a")
    cluster.create_topic(a0)
    # no heartbeats meanwhile: a failed heartbeat would refresh the route before any send is refused
    with Producer("PG_ROUTE_REFUSED", namesrv=cluster.namesrv, retry_times_when_send_failed=0,
                  heartbeat_broker_interval=60.0, **SLOW_POLL) as p:
        assert p.send(Message(TOPIC, b"before")).status is SendStatus.SEND_OK
        first_poll_done(polls)
        seen = polls[0]
        a1 = cluster.replace_master("broker-a", a0, "store-a")
        cluster.broker("broker-a", "store-a", broker_id=1, port=int(a0.rsplit(":", 1)[1]))  # the old one, a slave
        wait_until(lambda: cluster.master_in_route("broker-a") == a1, 20, what="the new master registered")
        assert p.instance.broker_addr_table["broker-a"][0] == a0  # (the client has not noticed anything)

        with pytest.raises(MQBrokerError) as refused:
            p.send(Message(TOPIC, b"refused"))
        assert refused.value.code == ResponseCode.SERVICE_NOT_AVAILABLE and refused.value.addr == a0
        r = send_until_ok(lambda: p.send(Message(TOPIC, b"after")), "the send after the refusal")
        assert r.queue.broker_name == "broker-a" and p.instance.broker_addr_table["broker-a"][0] == a1
        assert polls[0] == seen, "the periodic route poll ran"


def test_a_master_that_times_out_on_an_open_connection_refreshes_the_route(cluster, polls):
    """A master cut off by the network (here: frozen by SIGSTOP) never breaks the connection, its
    sends only time out: the client asks for the route once per such failure, so the send after
    the new master registered goes there without waiting for the periodic poll."""
    import os
    import signal

    a0 = cluster.broker("broker-a", "store-a")
    cluster.create_topic(a0)
    with Producer("PG_ROUTE_TIMEOUT", namesrv=cluster.namesrv, retry_times_when_send_failed=0,
                  send_msg_timeout=1.0, heartbeat_broker_interval=60.0, **SLOW_POLL) as p:
        assert p.send(Message(TOPIC, b"before")).status is SendStatus.SEND_OK
        first_poll_done(polls)
        seen = polls[0]
        frozen = cluster.running[a0].proc.pid
        freeze(frozen)
        try:
            a1 = cluster.new_master("broker-a", "store-a")
            wait_until(lambda: cluster.master_in_route("broker-a") == a1, 20, what="the new master registered")
            assert p.instance.is_connected(a0) or p.instance.has_send_channel(a0)  # (nothing broke)
            with pytest.raises(RMQError):  # no answer in time
                p.send(Message(TOPIC, b"timed-out"))
            r = send_until_ok(lambda: p.send(Message(TOPIC, b"after")), "the send after the timeout", timeout=20)
            assert p.instance.broker_addr_table["broker-a"][0] == a1 and r.queue.broker_name == "broker-a"
            assert polls[0] == seen, "the periodic route poll ran"
        finally:
            os.kill(frozen, signal.SIGCONT)


def test_push_consumer_pulls_and_commits_on_the_new_master(cluster, polls):
    a0 = cluster.broker("broker-a", "store-a")
    cluster.create_topic(a0)
    got: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            got.extend(m.body for m in msgs)
        return ConsumeStatus.SUCCESS

    c = PushConsumer("CG_ROUTE_PUSH", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     pull_time_delay_when_exception=0.2, persist_consumer_offset_interval=0.5,
                     heartbeat_broker_interval=1.0, **SLOW_POLL)
    c.subscribe(TOPIC)
    c.register_message_listener(listener)
    c.start()
    try:
        with Producer("PG_ROUTE_PUSH", namesrv=cluster.namesrv, **SLOW_POLL) as p:
            before = [f"b{i}".encode() for i in range(8)]
            for b in before:
                p.send(Message(TOPIC, b))
            wait_until(lambda: len(got) >= len(before), 30, what="consumption from the first master")
            first_poll_done(polls, clients=1 if p.instance is c.instance else 2)
            wait_until(lambda: cluster.offsets(a0, "CG_ROUTE_PUSH") == cluster.queue_ends(a0), 20,
                       what="offsets committed on the first master")
            seen = polls[0]
            a1 = cluster.replace_master("broker-a", a0, "store-a")
            after = [f"a{i}".encode() for i in range(8)]
            for b in after:
                send_until_ok(lambda: p.send(Message(TOPIC, b)), "a send to the new master")
            wait_until(lambda: set(after) <= set(got), 30, what="consumption from the new master")
            wait_until(lambda: cluster.offsets(a1, "CG_ROUTE_PUSH") == cluster.queue_ends(a1), 20,
                       what="offsets committed on the new master")
            assert c.instance.broker_addr_table["broker-a"][0] == a1
            assert polls[0] == seen, "the periodic route poll ran"
    finally:
        c.shutdown()


def test_many_failures_make_one_chase_asking_one_route_at_a_time(cluster):
    """Failures reported from many threads at once: one chase of the group, its route asked for
    one request at a time (never a burst), and it goes on while the group has no other master."""
    inst = MQClientInstance(ClientConfig(namesrv=[cluster.namesrv]))
    inst.start()
    try:
        dead = f"127.0.0.1:{free_port()}"
        inst.topic_route_table[TOPIC] = TopicRouteData(
            queue_datas=[QueueData("broker-x", 4, 4, 6, 0)],
            broker_datas=[BrokerData("RouteCluster", "broker-x", {0: dead})])
        inst.broker_addr_table["broker-x"] = {0: dead}
        asked, in_flight, most = [0], [0], [0]
        get_route = inst.get_topic_route

        async def counted(topic, timeout=None):
            asked[0] += 1
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            try:
                return await get_route(topic, timeout)
            finally:
                in_flight[0] -= 1

        inst.get_topic_route = counted
        threads = [threading.Thread(target=inst.note_request_failed, args=(dead, RemotingConnectError("refused")))
                   for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_until(lambda: asked[0] >= 3, 20, what="the chase asking again while the group has no master")
        assert len(inst._route_suspects) == 1
        assert most[0] == 1
        # a failure that says nothing of the master (a refusal other than "not master") starts none
        inst.broker_addr_table["broker-y"] = {0: "127.0.0.1:9"}
        inst.note_request_failed("127.0.0.1:9", MQBrokerError(ResponseCode.NO_PERMISSION, "no", "127.0.0.1:9"))
        inst.run(asyncio.sleep(0))
        assert set(inst._route_suspects) == {"broker-x"}
    finally:
        inst.shutdown()
