"""Costs as a cluster grows (issue 23), each size beside the smallest one measured in the same run
(the "baseline"), so the report's ratio says how the cost grows, not only what it is:

* topic creation through AdminClient.create_or_update_topic (mqadmin updateTopic) against real
  `rmq namesrv` + `rmq broker` processes holding 1,000 / 5,000 / 10,000 topics: one at a time
  (each answered after its topics.json write and its registration), and 200 at once (32 in
  flight: they share writes and registrations).  Figure: ms_per_topic.
* broker restart with 1,000 / 10,000 topics: process start to the boot line and the name server
  routing the broker's topics again.
* one full registration of 10,000 topics x 8 queues: the broker's CPU to build the body (plain,
  as topics.json holds the entries already encoded; compressedRegister's deflate layout; and the
  previous way, encoding every entry again) and the name server's CPU to apply it, beside an
  incremental registration of one topic applied to a name server that holds 10,000.
* route lookups (GET_ROUTEINFO_BY_TOPIC) on a real name server holding 10 brokers x 10,000
  topics, beside 10 brokers x 1,000 topics (the same answer size): p99 in extra_info.
"""
from __future__ import annotations

import json
import random
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from rmq_core.admin.client import AdminClient
from rmq_core.config import BrokerConfig, MessageStoreConfig
from rmq_core.remoting.body import DataVersion, RegisterBrokerBody
from rmq_core.remoting.codes import RequestCode
from rmq_core.broker.topic_config_manager import TopicConfig, TopicConfigTable
from tests.servers import KEEP_DATA, NamesrvAndBroker, RmqProcess

STORE = {"mappedFileSizeCommitLog": 4 * 1024 * 1024, "mappedFileSizeConsumeQueue": 1000 * 20,
         "maxHashSlotNum": 1000, "maxIndexNum": 4000, "registerNameServerPeriod": 30_000}


def _preload(tmp_path, n: int) -> None:
    """topics.json with `n` topics of 8 queues, written before the broker first starts."""
    table = TopicConfigTable(tmp_path / "store-broker-a" / "config")
    for i in range(n):
        table.put(TopicConfig(f"Scale{i:05d}", 8, 8))
    table.persist()


class Sized:
    """A name server and a broker process holding `n` topics."""

    def __init__(self, tmp_path, n: int):
        self.n = n
        _preload(tmp_path, n)
        self.servers = NamesrvAndBroker(tmp_path, brokers=0)
        self.servers.add_broker("broker-a", STORE)
        self.addr = self.servers.broker_addrs[0]
        self.admins = [AdminClient(self.servers.namesrv, timeout=30) for _ in range(4)]
        self.created = 0

    def create(self, count: int, parallel: bool) -> None:
        names = [f"New{self.created + i:06d}" for i in range(count)]
        self.created += count
        if not parallel:
            for t in names:
                self.admins[0].create_or_update_topic(self.addr, t, read_queue_nums=8, write_queue_nums=8)
            return
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda it: self.admins[it[0] % 4].create_or_update_topic(
                self.addr, it[1], read_queue_nums=8, write_queue_nums=8), enumerate(names)))

    def close(self) -> None:
        for a in self.admins:
            a.close()
        self.servers.stop()


@pytest.fixture(scope="module", params=[1000, 5000, 10000], ids=lambda n: f"{n}")
def sized(request, tmp_path_factory):
    s = Sized(tmp_path_factory.mktemp(f"scale{request.param}"), request.param)
    try:
        yield s
    finally:
        s.close()


def _name(base: str, n: int) -> str:
    return f"{base}_baseline_{n}" if n == 1000 else f"{base}_{n}"


@pytest.mark.parametrize("mode", ["one_by_one", "200_at_once"])
def test_topic_create(benchmark, sized, mode):
    count = 20 if mode == "one_by_one" else 200
    benchmark.group = f"scale-topic-create-{mode}"
    benchmark.name = _name(f"create_{mode}", sized.n)
    benchmark.extra_info["existing_topics"] = sized.n
    benchmark.pedantic(sized.create, args=(count, mode != "one_by_one"), rounds=3, warmup_rounds=1)
    benchmark.extra_info["ms_per_topic"] = benchmark.stats.stats.median / count * 1000
    benchmark.extra_info["records_per_s"] = count / benchmark.stats.stats.median


@pytest.mark.parametrize("n", [1000, 10000])
def test_broker_restart(benchmark, tmp_path, n):
    """Start to boot line, then until the name server routes the last topic again."""
    _preload(tmp_path, n)
    servers = NamesrvAndBroker(tmp_path, brokers=0)
    try:
        servers.add_broker("broker-a", STORE)
        conf = tmp_path / "broker-a.conf"
        last = f"Scale{n - 1:05d}"
        with AdminClient(servers.namesrv) as admin:
            def restart():
                servers.brokers[0].terminate()
                servers.brokers[0] = RmqProcess(["broker", "-n", servers.namesrv, "-c", str(conf),
                                                 "--listen-host", "127.0.0.1"])
                servers.brokers[0].wait_boot(120)
                # the old registration lingers until the connection drop is seen: wait for the new one
                while not _routed(admin, last):
                    time.sleep(0.01)

            benchmark.group = "scale-broker-restart"
            benchmark.name = _name("broker_restart", n)
            benchmark.extra_info["topics"] = n
            benchmark.pedantic(restart, rounds=3)
    finally:
        servers.stop()


def _routed(admin: AdminClient, topic: str) -> bool:
    r = admin.invoke(admin.namesrv_addrs[0], RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return r.code == 0


# --- one full registration: the broker's and the name server's CPU ---------------------------------
N_FULL = 10_000


@pytest.fixture(scope="module")
def big_broker(tmp_path_factory):
    from rmq_core.broker.controller import BrokerController

    d = tmp_path_factory.mktemp("full")
    ctrl = BrokerController(BrokerConfig(namesrv_addr="127.0.0.1:1"),
                            MessageStoreConfig.from_properties(KEEP_DATA, store_path_root_dir=str(d)))
    for i in range(N_FULL):
        ctrl.topic_manager.table.put(TopicConfig(f"Scale{i:05d}", 8, 8))
    return ctrl


@pytest.mark.parametrize("how", ["baseline_reencode", "plain", "compressed"])
def test_full_registration_body(benchmark, big_broker, how):
    """The broker's CPU for the body of one full registration (10,000 topics x 8 queues)."""
    table = big_broker.topic_manager.table
    if how == "baseline_reencode":  # the previous way: every entry encoded again, each time
        def build():
            return RegisterBrokerBody.build(dict(table.items()), table.data_version).encode()
    else:
        big_broker.broker_config.compressed_register = how == "compressed"

        def build():
            return big_broker.register_all_body()[0]
    benchmark.group = "scale-full-registration-broker"
    benchmark.name = f"register_all_body_{how}"
    benchmark._timer = time.process_time  # CPU, not wall clock (the machine is shared)
    body = benchmark.pedantic(build, rounds=10, warmup_rounds=1)
    benchmark.extra_info["body_bytes"] = len(body)
    benchmark.extra_info["topics"] = N_FULL


@pytest.mark.parametrize("what", ["baseline_increment_1_topic", "full_10000_topics"])
def test_namesrv_apply_registration(benchmark, what):
    """The name server's CPU to decode and apply a registration, holding 10,000 topics already."""
    from rmq_core.namesrv.route_info import RouteInfoManager

    rim = RouteInfoManager()
    version = DataVersion()
    table = {f"Scale{i:05d}": {"topicName": f"Scale{i:05d}", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6,
                               "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
             for i in range(N_FULL)}
    full = RegisterBrokerBody(table, version).encode()
    rim.register_broker("C", "127.0.0.1:10911", "broker-a", 0, None, RegisterBrokerBody.decode(full), register_all=True)
    counter = iter(range(10**9))

    def apply():
        version.next_version()
        if what == "full_10000_topics":
            body = RegisterBrokerBody(table, version).encode()
            register_all = True
        else:
            i = next(counter)
            body = RegisterBrokerBody({f"Inc{i}": dict(table["Scale00000"], topicName=f"Inc{i}")}, version).encode()
            register_all = False
        return body, register_all

    def run(body, register_all):
        rim.register_broker("C", "127.0.0.1:10911", "broker-a", 0, None, RegisterBrokerBody.decode(body),
                            register_all=register_all)

    benchmark.group = "scale-full-registration-namesrv"
    benchmark.name = f"apply_{what}"
    benchmark._timer = time.process_time
    benchmark.pedantic(run, setup=lambda: (apply(), {}), rounds=10)


# --- route lookups ------------------------------------------------------------------------------
@pytest.mark.parametrize("brokers,topics", [(10, 1000), (10, 10000)])
def test_route_lookup(benchmark, tmp_path, brokers, topics):
    """GET_ROUTEINFO_BY_TOPIC on a real name server process; p99 over 2,000 lookups."""
    servers = NamesrvAndBroker(tmp_path, brokers=0, namesrv_props={"brokerChannelExpiredTime": 600_000})
    try:
        table = {f"Scale{i:05d}": {"topicName": f"Scale{i:05d}", "readQueueNums": 8, "writeQueueNums": 8,
                                   "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
                 for i in range(topics)}
        body = RegisterBrokerBody(table, DataVersion()).encode()
        with AdminClient(servers.namesrv, timeout=30) as admin:
            ns = admin.namesrv_addrs[0]
            for b in range(brokers):
                r = admin.invoke(ns, RequestCode.REGISTER_BROKER, {
                    "clusterName": "DefaultCluster", "brokerName": f"broker-{b}", "brokerAddr": f"127.0.0.1:{20000 + b}",
                    "brokerId": 0, "haServerAddr": f"127.0.0.1:{20001 + b}", "compressed": "false",
                    "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF}, body)
                assert r.code == 0
            rng = random.Random(7)
            names = list(table)
            latencies: list[float] = []

            def lookups():
                for _ in range(2000):
                    t = rng.choice(names)
                    t0 = time.perf_counter()
                    r = admin.invoke(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": t})
                    latencies.append(time.perf_counter() - t0)
                    assert r.code == 0 and len(json.loads(r.body)["brokerDatas"]) == brokers

            benchmark.group = "scale-route-lookup"
            benchmark.name = _name(f"route_lookup_{brokers}_brokers", topics)
            benchmark.pedantic(lookups, rounds=3)
            latencies.sort()
            benchmark.extra_info["p99_ms"] = latencies[int(len(latencies) * 0.99)] * 1000
            benchmark.extra_info["p50_ms"] = latencies[len(latencies) // 2] * 1000
            benchmark.extra_info["records_per_s"] = 2000 / benchmark.stats.stats.median
    finally:
        servers.stop()

