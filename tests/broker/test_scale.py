"""Costs that stay flat as a cluster grows (issue 23), on real `rmq` processes on 127.0.0.1:
topic creations coalesced into few registrations and topics.json writes, an acknowledged creation
surviving a SIGKILL, the listen backlog read back from the kernel, connect storms that never lose
a SYN (also against a broker restarted under its clients), and a consumer group whose committed
offsets never step back."""
from __future__ import annotations

import errno
import re
import selectors
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from rmq_core.admin.client import AdminClient
from rmq_core.config import DEFAULT_SERVER_SOCKET_BACKLOG
from rmq_core.remoting.body import TopicRouteData
from rmq_core.remoting.codes import RequestCode
from rmq_core.broker.topic_config_manager import TopicConfig, TopicConfigTable
from tests.client.conftest import FAST_CONSUMER, wait_until
from tests.servers import NamesrvAndBroker, RmqProcess, free_port

STORE = {"mappedFileSizeCommitLog": 4 * 1024 * 1024, "mappedFileSizeConsumeQueue": 1000 * 20,
         "maxHashSlotNum": 1000, "maxIndexNum": 4000}


@pytest.fixture
def cluster(tmp_path):
    servers = NamesrvAndBroker(tmp_path, brokers=0)
    try:
        servers.add_broker("broker-a", STORE, verbose=True)  # -v: its INFO lines count batches
        yield servers
    finally:
        servers.stop()


def _stored_topics(tmp_path, name="broker-a") -> dict:
    """The topic table as a broker starting on this directory loads it (topics.json + journal)."""
    table = TopicConfigTable(tmp_path / f"store-{name}" / "config")
    assert table.load()
    return dict(table.items())


def _count(proc: RmqProcess, pattern: str) -> int:
    return sum(bool(re.search(pattern, line)) for line in list(proc.lines))


# --- topics: coalesced, acknowledged = written ---------------------------------------------------
def test_topic_burst_shares_registrations_and_writes(cluster, tmp_path):
    """200 concurrent updateTopic calls: each is answered once its topic is on disk and routed,
    and the burst costs far fewer than 200 registrations and topics.json writes."""
    broker, proc = cluster.broker_addrs[0], cluster.brokers[0]
    names = [f"Burst{i}" for i in range(200)]
    writes0 = _count(proc, r"topics\.json written")
    admins = [AdminClient(cluster.namesrv) for _ in range(4)]  # 4 x 8 connections: 32 calls in flight
    try:
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda it: admins[it[0] % 4].create_or_update_topic(
                broker, it[1], read_queue_nums=2, write_queue_nums=2), enumerate(names)))
        # every call has returned: every topic is in the file and in the name server's routes
        assert set(names) <= set(_stored_topics(tmp_path))
        assert set(names) <= set(admins[0].topic_list())
    finally:
        for admin in admins:
            admin.close()
    increments = _count(proc, r"registered \d+ changed topics incrementally")
    writes = _count(proc, r"topics\.json written") - writes0
    assert 1 <= increments < len(names) / 4 and 1 <= writes < len(names) / 4, (increments, writes)


def test_acknowledged_topic_survives_sigkill(cluster, tmp_path):
    broker = cluster.broker_addrs[0]
    with AdminClient(cluster.namesrv) as admin:
        admin.create_or_update_topic(broker, "SurvivesKill", read_queue_nums=3, write_queue_nums=3)
    cluster.brokers[0].kill()  # right after the answer: no clean stop, nothing written later
    assert _stored_topics(tmp_path)["SurvivesKill"].read_queue_nums == 3
    restarted = RmqProcess(["broker", "-n", cluster.namesrv, "-c", str(tmp_path / "broker-a.conf"),
                            "--listen-host", "127.0.0.1"])
    cluster.brokers[0] = restarted
    restarted.wait_boot()
    with AdminClient(cluster.namesrv) as admin:
        assert admin.topic_config(broker, "SurvivesKill")["readQueueNums"] == 3


# --- listen backlog and connect storms -----------------------------------------------------------
def listen_backlog(port: int) -> int:
    """The accept-queue limit of the socket listening on `port`, as the kernel reports it (`ss`
    prints it as Send-Q for a listening socket)."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert rows, f"nothing listens on port {port}"
    return int(rows[0][2])


def listen_overflows() -> int:
    """TcpExtListenOverflows: SYNs dropped because an accept queue was full (this namespace)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split()[1:], values.split()[1:]))["ListenOverflows"])
    raise AssertionError("no TcpExt line in /proc/net/netstat")


def connect_storm(port: int, clients: int, deadline: float = 60.0) -> list[float]:
    """`clients` non-blocking connects fired together; each one's seconds from its (last) attempt
    to established.  A refused attempt (nothing listening yet: the broker is restarting) is
    retried at once.  A SYN the kernel drops costs its client the 1 s SYN retransmit."""
    sel = selectors.DefaultSelector()
    took: list[float] = []
    pending = 0
    end = time.monotonic() + deadline

    def attempt(i: int) -> None:
        nonlocal pending
        s = socket.socket()
        s.setblocking(False)
        started = time.monotonic()
        rc = s.connect_ex(("127.0.0.1", port))
        if rc in (0, errno.EINPROGRESS):
            sel.register(s, selectors.EVENT_WRITE, (i, started))
            pending += 1
        elif rc == errno.ECONNREFUSED:
            s.close()
            retry.append(i)
        else:
            s.close()
            raise AssertionError(f"connect failed: {errno.errorcode.get(rc, rc)}")

    retry: list[int] = []
    sockets = []
    for i in range(clients):
        attempt(i)
    while pending or retry:
        assert time.monotonic() < end, f"{pending + len(retry)} of {clients} connects unfinished"
        again, retry = retry, []
        for i in again:
            attempt(i)
        for key, _ in sel.select(0.01 if retry else 0.2):
            sel.unregister(key.fileobj)
            pending -= 1
            i, started = key.data
            err = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err == errno.ECONNREFUSED:
                key.fileobj.close()
                retry.append(i)
                continue
            assert err == 0, f"connect failed: {errno.errorcode.get(err, err)}"
            took.append(time.monotonic() - started)
            sockets.append(key.fileobj)
        if not pending and retry:
            time.sleep(0.005)
    for s in sockets:
        s.close()
    return took


def test_every_listening_socket_has_the_backlog(tmp_path):
    from rmq_core.dashboard.app import DashboardServer

    ns_metrics, broker_metrics = free_port(), free_port()
    servers = NamesrvAndBroker(tmp_path, brokers=0, namesrv_props={
        "serverSocketBacklog": 700, "metricsExporterType": "PROM", "metricsPromExporterPort": ns_metrics})
    try:
        servers.add_broker("broker-a", {**STORE, "metricsExporterType": "PROM",
                                        "metricsPromExporterPort": broker_metrics})
        broker_port = int(servers.broker_addrs[0].rpartition(":")[2])
        assert listen_backlog(broker_port) == DEFAULT_SERVER_SOCKET_BACKLOG == 1024
        assert listen_backlog(broker_metrics) == 1024
        assert listen_backlog(servers.ns_port) == 700 and listen_backlog(ns_metrics) == 700
        console = DashboardServer(backend=None, host="127.0.0.1", port=0)
        try:
            assert listen_backlog(int(console.address.rpartition(":")[2])) == 1024
        finally:
            console.httpd.server_close()
    finally:
        servers.stop()


def test_connect_storm_on_a_running_and_a_restarted_broker(cluster, tmp_path):
    """500 clients at once, then 500 clients reconnecting while the broker is killed and
    restarted under them: no SYN is dropped, so no connect waits for the kernel's 1 s retry."""
    port = int(cluster.broker_addrs[0].rpartition(":")[2])
    overflows0 = listen_overflows()
    took = connect_storm(port, 500)
    assert len(took) == 500
    assert listen_overflows() == overflows0, f"SYNs dropped (slowest connect {max(took):.2f} s)"

    cluster.brokers[0].kill()
    results: list = []
    storm = threading.Thread(target=lambda: results.append(connect_storm(port, 500)))
    storm.start()  # every client is being refused now, and retries at once
    conf = tmp_path / "broker-a.conf"
    restarted = RmqProcess(["broker", "-n", cluster.namesrv, "-c", str(conf), "--listen-host", "127.0.0.1"])
    cluster.brokers[0] = restarted
    restarted.wait_boot()
    storm.join(60)
    assert results and len(results[0]) == 500
    assert listen_overflows() == overflows0, f"SYNs dropped (slowest connect {max(results[0]):.2f} s)"


# --- committed offsets never step back -----------------------------------------------------------
def test_group_commits_never_step_back(cluster):
    """A one-member group consuming while its offsets are persisted every 0.1 s (racing the
    commit offsets its pulls carry): the broker logs every commit lower than the stored one
    ("update consumer offset less than store"); there must be none."""
    topic, group = "OffsetsForward", "GID_forward"
    with AdminClient(cluster.namesrv) as admin:
        admin.create_or_update_topic(cluster.broker_addrs[0], topic, read_queue_nums=8, write_queue_nums=8)
    producer = Producer("PID_forward", namesrv=cluster.namesrv)
    producer.start()
    consumed = set()
    consumer = PushConsumer(group, namesrv=cluster.namesrv, **{**FAST_CONSUMER, "persist_consumer_offset_interval": 0.1})
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(lambda msgs: (consumed.update(m.msg_id for m in msgs),
                                                          ConsumeStatus.CONSUME_SUCCESS)[1])
    consumer.start()
    try:
        sent = 0
        deadline = time.monotonic() + 6.0  # a run long enough for ~60 persists racing the pulls
        while time.monotonic() < deadline:
            for _ in range(50):
                producer.send(Message(topic, b"x" * 64))
                sent += 1
            time.sleep(0.02)
        wait_until(lambda: len(consumed) >= sent, timeout=60, what="every message consumed")
    finally:
        consumer.shutdown()
        producer.shutdown()
    back = [line for line in cluster.brokers[0].lines if "less than store" in line and group in line]
    assert sent > 0 and back == [], back[:5]


def test_compressed_full_registration_routes_the_table(tmp_path):
    """compressedRegister=true: the broker's full registrations use RocketMQ's deflate layout and
    the name server routes what they carry (topics.json written before the broker starts, so only
    the full registration at start carries them)."""
    table = TopicConfigTable(tmp_path / "store-broker-a" / "config")
    for i in range(300):
        table.put(TopicConfig(f"Zipped{i}", 4, 4))
    table.persist()
    servers = NamesrvAndBroker(tmp_path, brokers=0)
    try:
        servers.add_broker("broker-a", {**STORE, "compressedRegister": "true"})
        with AdminClient(servers.namesrv) as admin:
            assert {f"Zipped{i}" for i in range(300)} <= set(admin.topic_list())
            route = admin.invoke(admin.namesrv_addrs[0], RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Zipped299"})
            assert route.code == 0 and TopicRouteData.decode(route.body).queue_datas[0].write_queue_nums == 4
    finally:
        servers.stop()
