"""A name server's route lookup as its route table grows, and what the garbage collector does to it
(issue 37): GET_ROUTEINFO_BY_TOPIC on a real `rmq namesrv` process holding 10 brokers x 1,000 and
x 10,000 topics (the same answer size), p50 / p99 / p99.9 over 6,000 lookups in extra_info.

A full collection walks every object the table holds (some 10 per topic and broker); the
registrations' decodes bring them about, and with the interpreter's settings one took 66 ms at
1,000 topics and 132 ms at 10,000.  `rmq namesrv` freezes the long-lived objects out of the
collector's walk (rmq_core/cli.py); the lookups start after the freeze that follows the
registrations (FREEZE_INTERVAL).  This process's own collector is off while it measures (it would
walk the table this process built to register).  The p99 at 10,000 topics is to stay within 2x of
the one at 1,000."""
from __future__ import annotations

import gc
import json
import random
import threading
import time
import zlib

import pytest

from rmq_core.admin.client import AdminClient
from rmq_core.cli import FREEZE_INTERVAL
from rmq_core.remoting.body import DataVersion, RegisterBrokerBody
from rmq_core.remoting.codes import RequestCode
from tests.servers import NamesrvAndBroker

LOOKUPS = 6000
BROKERS = 10


def _register(admin, ns, topics: int, brokers: int = BROKERS) -> list[str]:
    table = {f"Gc{i:05d}": {"topicName": f"Gc{i:05d}", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6,
                            "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
             for i in range(topics)}
    body = RegisterBrokerBody(table, DataVersion()).encode()
    for b in range(brokers):
        r = admin.invoke(ns, RequestCode.REGISTER_BROKER, {
            "clusterName": "DefaultCluster", "brokerName": f"broker-{b}", "brokerAddr": f"127.0.0.1:{20000 + b}",
            "brokerId": 0, "haServerAddr": f"127.0.0.1:{21000 + b}", "compressed": "false",
            "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF}, body)
        assert r.code == 0, r.remark
    return list(table)


@pytest.mark.parametrize("reregistering", [False, True], ids=["idle", "reregistering"])
@pytest.mark.parametrize("topics", [1000, 10000])
def test_route_lookup_p99_as_the_table_grows(benchmark, tmp_path, topics, reregistering):
    """`reregistering`: one broker registers its whole table again every second meanwhile (brokers do
    every registerNameServerPeriod): its decode allocates as many objects as it has topics, which
    brings full collections - each a walk of the whole route table unless it is frozen."""
    servers = NamesrvAndBroker(tmp_path, brokers=0, namesrv_props={"brokerChannelExpiredTime": 600_000})
    done = threading.Event()
    try:
        with AdminClient(servers.namesrv, timeout=30) as admin, AdminClient(servers.namesrv, timeout=30) as reg:
            ns = admin.namesrv_addrs[0]
            names = _register(reg, ns, topics)  # (over this connection: kept open while measuring)
            time.sleep(2 * FREEZE_INTERVAL)  # the registrations' objects frozen
            def register_again():
                while not done.is_set():
                    _register(reg, ns, topics, brokers=1)
                    done.wait(1.0)

            again = threading.Thread(target=register_again)
            if reregistering:
                again.start()
            rng = random.Random(37)
            latencies: list[float] = []

            def lookups():
                for _ in range(LOOKUPS // 3):
                    t0 = time.perf_counter()
                    r = admin.invoke(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": rng.choice(names)})
                    latencies.append(time.perf_counter() - t0)
                    assert r.code == 0 and len(json.loads(r.body)["brokerDatas"]) == BROKERS

            benchmark.group = "namesrv-route-lookup-gc"
            benchmark.name = f"route_lookup_{BROKERS}_brokers_{topics}_topics_{'reregistering' if reregistering else 'idle'}"
            gc.disable()  # (this process's own collector, walking the table it registered, is not measured)
            try:
                benchmark.pedantic(lookups, rounds=3)
            finally:
                gc.enable()
                done.set()
                if reregistering:
                    again.join()
            latencies.sort()
            for q, name in ((0.5, "p50_ms"), (0.99, "p99_ms"), (0.999, "p999_ms")):
                benchmark.extra_info[name] = round(latencies[int(len(latencies) * q)] * 1000, 3)
            print(f"\n{topics} topics x {BROKERS} brokers, {benchmark.name}: " +
                  ", ".join(f"{k} {v}" for k, v in benchmark.extra_info.items()))
    finally:
        done.set()
        servers.stop()
