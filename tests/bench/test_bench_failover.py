"""Automatic failover benchmarks (real etcd, name server with the controller, three `rmq broker`
replicas in controller mode, real SIGKILLs).

* failover-time: seconds from SIGKILL of the master to the first SEND_OK on the group, p50 and
  max over the rounds, with rmq's defaults (controllerHeartBeatTimeoutMills 3000,
  brokerHeartbeatInterval 500, scanInactiveMasterInterval 200) against the same cluster with
  RocketMQ 5's defaults (10000, 1000, 5000), measured in the same run.  Both use rmq's producer,
  which refreshes the route at once when a master's connection fails.
* failover-send: sends/s of rmq's Producer.send_async (128 in flight) to a three-replica group
  with allAckInSyncStateSet=true against an ASYNC_MASTER alone (baseline, same run).  Goal >= 0.5x.
"""
from __future__ import annotations

import statistics
import time

import pytest

from rmq_core import Message, Producer
from tests.bench.test_bench_ha import BODY, FAST, N_SENDS, ROUNDS, _pct, _window
from tests.broker.ha_group import HAGroup
from tests.controller.failover_group import FailoverGroup, kill_rounds
from tests.etcd_cluster import EtcdCluster

KILL_ROUNDS = 4
RMQ_DEFAULTS: dict = {}
ROCKETMQ_DEFAULTS = {"controllerHeartBeatTimeoutMills": 10000, "brokerHeartbeatInterval": 1000}
ROCKETMQ_CONTROLLER = {"scanInactiveMasterInterval": 5000}
_times: dict[str, list[float]] = {}
_rates: dict[str, float] = {}


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"), members=1)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("defaults", ["rmq", "rocketmq"])
def test_failover_time(benchmark, tmp_path_factory, etcd, defaults):
    benchmark.group = "failover-time"
    props, ns_props = (RMQ_DEFAULTS, {}) if defaults == "rmq" else (ROCKETMQ_DEFAULTS, ROCKETMQ_CONTROLLER)
    g = FailoverGroup(tmp_path_factory.mktemp(f"fo-{defaults}"), etcd.endpoints, broker_props=props,
                      namesrv_props=ns_props, verbose=False)
    try:
        times = benchmark.pedantic(lambda: kill_rounds(g, KILL_ROUNDS, per_round=50)[0], rounds=1, iterations=1)
    finally:
        g.stop()
    _times[defaults] = times
    info = {"p50_s": statistics.median(times), "max_s": max(times), "rounds": len(times)}
    if "rmq" in _times and defaults == "rocketmq":
        info["rmq_vs_rocketmq_p50"] = statistics.median(_times["rmq"]) / info["p50_s"]
    benchmark.extra_info.update(info)


@pytest.mark.parametrize("mode", ["baseline_async_master_alone", "controller_3_all_ack"])
def test_failover_send(benchmark, tmp_path_factory, etcd, mode):
    benchmark.group = "failover-send-128"
    tmp = tmp_path_factory.mktemp(mode)
    if mode == "baseline_async_master_alone":
        g = HAGroup(tmp, role="ASYNC_MASTER")
        g.start_master()
        namesrv = g.namesrv
    else:
        g = FailoverGroup(tmp, etcd.endpoints, verbose=False)
        g.start_all()
        g.create_topic(g.wait_master()["masterAddress"], "BenchHA")
        g.wait_full_sync_state_set()
        namesrv = g.namesrv
    producer = Producer(f"PG_{mode}", namesrv=namesrv, **FAST).start()
    try:
        deadline = time.monotonic() + 60
        while producer.send(Message("BenchHA", BODY)).status.name != "SEND_OK":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        lats, seen = [], {}

        def run():
            secs, lat, statuses = _window(producer, N_SENDS, 128)
            lats.extend(lat)
            for k, v in statuses.items():
                seen[k] = seen.get(k, 0) + v
            return secs

        _window(producer, N_SENDS // 4, 128)
        benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    finally:
        producer.shutdown()
        g.stop()
    assert seen == {"SEND_OK": N_SENDS * ROUNDS}, seen
    rate = N_SENDS / benchmark.stats.stats.median
    _rates[mode] = rate
    info = {"records_per_s": rate, "p99_ms": _pct(lats, 99), "p50_ms": _pct(lats, 50)}
    if mode == "controller_3_all_ack" and "baseline_async_master_alone" in _rates:
        info["vs_async_master_alone"] = rate / _rates["baseline_async_master_alone"]
    benchmark.extra_info.update(info)
