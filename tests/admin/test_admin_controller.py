"""Controller mode's `rmq admin` commands (getSyncStateSet, getBrokerEpoch, electMaster,
getControllerMetaData, clusterList's role and epoch) and the console's cluster rows, against a real
RemotingServer on 127.0.0.1 that answers as a controller, a name server and the brokers of a group
in controller mode would: its answers are built with the controller's own functions
(GroupMeta.summary, meta_answer) and the broker's body formats (docs/failover.md)."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from rmq_core.controller.manager import ControllerError
from rmq_core.controller.service import meta_answer
from rmq_core.controller.state import GroupMeta, ReplicaAlive, Replicas, elected
from rmq_core.remoting.body import BrokerData, ClusterInfo, kv_table_encode
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.server import RemotingServer
from tests.admin.test_admin_cli import fails, ok, rows

GROUP, CLUSTER = "broker-a", "DefaultCluster"


class _Group:
    """One broker group of three replicas (ids 1, 2, 3), 1 the master at epoch 2, 3 not alive."""

    def __init__(self, addrs: list[str]):
        self.addrs = addrs  # replica i + 1 answers at addrs[i] (all the same server here)
        self.meta = GroupMeta(CLUSTER, GROUP, 1, addrs[0], 2, [1, 2], 3)
        self.replicas = Replicas(4, {i + 1: {"address": a} for i, a in enumerate(addrs)})
        self.alive = {1: ReplicaAlive(1, addrs[0], epoch=2, max_offset=4096),
                      2: ReplicaAlive(2, addrs[1], epoch=2, max_offset=4000)}
        self.elect_requests: list[dict] = []

    async def process_request(self, ctx, request):
        code = request.code
        if code == RequestCode.CONTROLLER_GET_SYNC_STATE_DATA:
            names = json.loads(request.body) or [GROUP]
            body = {GROUP: self.meta.summary(self.replicas, self.alive)} if GROUP in names else {}
            return request.make_response(ResponseCode.SUCCESS, None, None, json.dumps(body).encode())
        if code == RequestCode.CONTROLLER_ELECT_MASTER:
            self.elect_requests.append(dict(request.ext_fields))
            bid = int(request.get_str("brokerId"))
            if bid not in self.alive:  # the controller's own refusal text
                e = ControllerError(f"cannot elect brokerId {bid} of {GROUP}: it is not alive (alive: {sorted(self.alive)})")
                return request.make_response(e.code, f"[CONTROLLER] {e}")
            self.meta = elected(self.meta, bid, self.alive[bid].address)
            return meta_answer(request, self.meta, self.alive)
        if code == RequestCode.CONTROLLER_GET_METADATA_INFO:
            info = {"controllerAddress": self.addrs[0], "etcdEndpoints": "127.0.0.1:23790,127.0.0.1:23791",
                    "etcdRoot": "/rmq/controller", "etcdHealth": {"127.0.0.1:23790": True, "127.0.0.1:23791": False},
                    "enableElectUncleanMaster": False, "electionsByThisController": 1}
            return request.make_response(ResponseCode.SUCCESS, None, {"controllerLeaderAddress": self.addrs[0],
                                                                      "isLeader": "true", "etcdHealthy": "true"},
                                         json.dumps(info).encode())
        if code == RequestCode.GET_BROKER_CLUSTER_INFO:  # the master as brokerId 0, the slave as its own id
            bd = BrokerData(CLUSTER, GROUP, {0: self.addrs[0], 2: self.addrs[1]})
            return request.make_response(ResponseCode.SUCCESS, None, None,
                                         ClusterInfo({GROUP: bd}, {CLUSTER: {GROUP}}).encode())
        if code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            return request.make_response(ResponseCode.SUCCESS, None, None, b'{"topicList":[]}')
        if code == RequestCode.GET_BROKER_EPOCH_CACHE:
            body = {"brokerName": GROUP, "brokerId": 1, "masterEpoch": 2, "maxOffset": 4096,
                    "epochList": [{"epoch": 1, "startOffset": 0, "endOffset": 1024},
                                  {"epoch": 2, "startOffset": 1024, "endOffset": 4096}]}
            return request.make_response(ResponseCode.SUCCESS, None, None, json.dumps(body).encode())
        if code == RequestCode.GET_BROKER_RUNTIME_INFO:
            info = {"brokerVersionDesc": "V4_9_7", "brokerRole": "SYNC_MASTER", "brokerControllerId": "1",
                    "masterEpoch": "2", "syncStateSet": "[1, 2]", "syncStateSetEpoch": "3", "masterBrokerId": "1"}
            return request.make_response(ResponseCode.SUCCESS, None, None, kv_table_encode(info))
        return request.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {code} not supported")


@pytest.fixture(scope="module")
def ctl():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    srv = RemotingServer(["127.0.0.1:0"], name="canned-controller")
    asyncio.run_coroutine_threadsafe(srv.start(), loop).result(10)
    addr = srv.listen_address
    group = _Group([addr, addr, addr])
    for code in (RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, RequestCode.CONTROLLER_ELECT_MASTER,
                 RequestCode.CONTROLLER_GET_METADATA_INFO, RequestCode.GET_BROKER_CLUSTER_INFO,
                 RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, RequestCode.GET_BROKER_EPOCH_CACHE,
                 RequestCode.GET_BROKER_RUNTIME_INFO):
        srv.register_processor(code, group)
    try:
        yield addr, group
    finally:
        asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_get_sync_state_set_rows_table_and_unknown_groups(ctl):
    addr, _ = ctl
    (row,) = rows("getSyncStateSet", "-a", addr, "-b", GROUP, ns=None)
    assert {k: row[k] for k in ("broker_name", "master_broker_id", "master_addr", "master_epoch", "sync_state_set",
                                "sync_state_set_epoch")} == {
        "broker_name": GROUP, "master_broker_id": 1, "master_addr": addr, "master_epoch": 2,
        "sync_state_set": [1, 2], "sync_state_set_epoch": 3}
    assert [(r["broker_id"], r["alive"], r["role"], r["epoch"], r["max_offset"], r["in_sync_state_set"])
            for r in row["replicas"]] == [(1, True, "MASTER", 2, 4096, True), (2, True, "SLAVE", 2, 4000, True),
                                          (3, False, "SLAVE", None, None, False)]
    # -c: the cluster's groups from the name server (-n), the controller asked for them
    assert rows("getSyncStateSet", "-a", addr, "-c", CLUSTER, ns=addr) == [row]
    table = ok("getSyncStateSet", "-a", addr, "-b", GROUP, ns=None)
    for text in ("Master Broker Id", "Sync State Set Epoch", "[1, 2]", "In Sync State Set", "MASTER"):
        assert text in table
    fails("getSyncStateSet", "-a", addr, "-b", "nope", ns=None, needle="knows no broker group 'nope'")
    fails("getSyncStateSet", "-a", addr, ns=None, needle="give broker name(s) (-b NAME[,NAME]) or a cluster name")
    # an address that is no controller: said so, naming it (here: nothing listens)
    fails("getSyncStateSet", "-a", "127.0.0.1:1", "-b", GROUP, ns=None, needle="no controller answered (")


def test_get_broker_epoch_asks_every_replica_of_the_group(ctl):
    addr, _ = ctl
    got = rows("getBrokerEpoch", "-b", GROUP, ns=addr)
    assert [(r["broker_addr"], r["epoch"], r["start_offset"], r["end_offset"], r["max_offset"]) for r in got] == \
        [(addr, 1, 0, 1024, 4096), (addr, 2, 1024, 4096, 4096)] * 2  # the master (bid 0) and the slave
    fails("getBrokerEpoch", "-b", "nope", ns=addr, needle="no broker named 'nope' in the name server")


def test_elect_master_prints_the_new_master_and_a_refusal_exits_non_zero(ctl):
    addr, group = ctl
    out = ok("electMaster", "-a", addr, "-b", "2", "-n", GROUP, "-c", CLUSTER, ns=None)
    assert f"elect master success: broker 2 of {GROUP} is the master at {addr}, epoch 3 (the switch took " in out
    assert group.elect_requests[-1] == {"clusterName": CLUSTER, "brokerName": GROUP, "brokerId": "2",
                                        "designateElect": "true"}
    (rec,) = rows("electMaster", "-a", addr, "-b", "1", "-n", GROUP, "-c", CLUSTER, ns=None)
    assert (rec["master_broker_id"], rec["master_epoch"], rec["sync_state_set"]) == (1, 4, [1])
    assert rec["took_ms"] >= 0
    fails("electMaster", "-a", addr, "-b", "3", "-n", GROUP, "-c", CLUSTER, ns=None,
          needle=f"refused: [CONTROLLER] cannot elect brokerId 3 of {GROUP}: it is not alive (alive: [1, 2])")


def test_get_controller_meta_data_shows_etcd_and_its_health(ctl):
    addr, _ = ctl
    (rec,) = rows("getControllerMetaData", "-a", addr, ns=None)
    assert rec["controller_address"] == addr and rec["etcd_healthy"] is True
    assert rec["etcd_health"] == {"127.0.0.1:23790": True, "127.0.0.1:23791": False}
    table = ok("getControllerMetaData", "-a", addr, ns=None)
    assert "127.0.0.1:23791" in table and "false" in table


def test_cluster_list_and_the_console_show_role_epoch_and_sync_state_set(ctl):
    from rmq_core.dashboard.backend import Backend

    addr, _ = ctl
    got = rows("clusterList", ns=addr)
    assert [(r["broker_name"], r["bid"], r["addr"], r["role"], r["epoch"]) for r in got] == \
        [(GROUP, 0, addr, "SYNC_MASTER", 2), (GROUP, 2, addr, "SYNC_MASTER", 2)]
    backend = Backend.connect(addr)
    try:
        brokers = backend.cluster()["brokers"]
    finally:
        backend.close()
    assert [(b["bid"], b["epoch"], b["sync_state_set"]) for b in brokers] == [(0, 2, [1, 2]), (2, 2, [1, 2])]
