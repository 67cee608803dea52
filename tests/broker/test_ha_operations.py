"""Operating a broker group (real `rmq namesrv` + master + slave processes): `rmq admin
clusterList` lists the slave, `brokerStatus` shows the HA fields, the Prometheus series
rocketmq_replication_lag_bytes follows a frozen slave (SIGSTOP) falling behind and catching up,
and the console's cluster API places each broker in its group."""
import json
import os
import signal

import pytest

from rmq_core.dashboard.backend import Backend
from tests.admin.test_admin_cli import rows
from tests.broker.ha_cluster import TOPIC, running_group
from tests.broker.ha_group import wait_replicated
from tests.client.conftest import wait_until
from tests.servers import free_port, freeze

prom = pytest.importorskip("prometheus_client.parser")


@pytest.fixture
def group(tmp_path):
    mport, sport = free_port(), free_port()
    with running_group(tmp_path, master_props={"metricsExporterType": "PROM", "metricsPromExporterPort": mport},
                       slave_props={"metricsExporterType": "PROM", "metricsPromExporterPort": sport}) as (g, raw):
        g.prom_ports = (mport, sport)
        yield g, raw


def lag_samples(port) -> list[tuple[dict, float]]:
    from tests.metrics.test_prometheus import scrape
    return scrape(port).get("rocketmq_replication_lag_bytes", [])


def test_cluster_list_broker_status_lag_series_and_console(group):
    g, raw = group
    for i in range(50):
        assert raw.send(g.master_addr, TOPIC, b"x" * 1000, queue_id=i % 4).code == 0
    wait_replicated(g.master_store, g.slave_store)

    brokers = rows("clusterList", ns=g.namesrv)
    assert [(b["broker_name"], b["bid"], b["addr"]) for b in brokers] == [
        ("broker-ha", 0, g.master_addr), ("broker-ha", 1, g.slave_addr)]

    def status(addr):
        return {r["key"]: r["value"] for r in rows("brokerStatus", "-b", addr, ns=g.namesrv)}

    wait_until(lambda: status(g.master_addr)["slaveFallBehindBytes"] == 0, 30, what="the slave acknowledging")
    master = status(g.master_addr)
    assert master["brokerRole"] == "ASYNC_MASTER" and master["haConnectionNum"] == 1
    (conn,) = json.loads(master["haConnectionInfo"])
    assert conn["slaveAckOffset"] == int(master["masterPutWhere"]) and conn["diff"] == 0
    slave = status(g.slave_addr)
    assert slave["brokerRole"] == "SLAVE" and slave["masterBrokerAddr"] == g.master_addr
    assert slave["haConnected"] is True and slave["slaveFallBehindBytes"] == 0

    mport, sport = g.prom_ports
    wait_until(lambda: [v for _, v in lag_samples(mport)] == [0.0], 30, what="no lag on the master's series")
    (labels, _), = lag_samples(sport)
    assert labels["broker_role"] == "slave"

    # a frozen slave falls behind: the master's series says by how many bytes, then it catches up
    freeze(g.slave.proc.pid)
    try:
        for i in range(20):
            assert raw.send(g.master_addr, TOPIC, b"y" * 1000, queue_id=0).code == 0
        wait_until(lambda: [v for _, v in lag_samples(mport)] and lag_samples(mport)[0][1] >= 20 * 1000, 30,
                   what="the lag series counting the frozen slave's bytes")
    finally:
        os.kill(g.slave.proc.pid, signal.SIGCONT)
    wait_until(lambda: [v for _, v in lag_samples(mport)] == [0.0], 60, what="the slave catching up")

    backend = Backend.connect(g.namesrv)
    try:
        by_bid = {r["bid"]: r for r in backend.cluster()["brokers"]}
    finally:
        backend.close()
    assert by_bid[0]["replication"] == "ASYNC_MASTER, 1 slave" and by_bid[0]["lag_bytes"] == 0
    assert by_bid[1]["replication"] == f"SLAVE of {g.master_addr}" and by_bid[1]["lag_bytes"] == 0
