"""The name server's epoch check (docs/failover.md, Fencing 3): a master registers with its master
epoch as dataVersion.stateVersion; the name server keeps the highest per broker name and ignores a
master registration with a lower one.  stateVersion 0 (manual mode) changes nothing."""
import logging
import zlib

import pytest

from rmq_core.errors import RemotingCommandError
from rmq_core.namesrv import NamesrvController
from rmq_core.namesrv.route_info import RegisterBrokerResult, RouteInfoManager
from rmq_core.remoting import RemotingClient, RemotingCommand
from rmq_core.remoting.body import DataVersion, RegisterBrokerBody, TopicRouteData, register_body_json
from rmq_core.remoting.codes import RequestCode, ResponseCode

from tests.namesrv.test_namesrv_routes import _config, route

A, B = "127.0.0.1:10911", "127.0.0.1:20911"


def body(epoch: int, *topics: str, counter: int = 1) -> RegisterBrokerBody:
    table = {t: {"topicName": t, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicFilterType": "SINGLE_TAG",
                 "topicSysFlag": 0, "order": False} for t in topics or ("TopicA",)}
    return RegisterBrokerBody(table, DataVersion(1_700_000_000_000, counter, epoch))


def register(rim, addr, epoch, *topics, broker_id=0, name="broker-a"):
    return rim.register_broker("C", addr, name, broker_id, addr.replace("911", "912"), body(epoch, *topics))


# --- the body ---------------------------------------------------------------------------------------
def test_state_version_survives_every_register_body_encoding():
    version = DataVersion(1_700_000_000_000, 7, 5)
    assert version.to_json() == {"counter": 7, "stateVersion": 5, "timestamp": 1_700_000_000_000}
    assert DataVersion(1, 2).to_json() == {"counter": 2, "timestamp": 1}  # manual mode: RocketMQ 4's JSON
    assert DataVersion.from_json({"counter": 2, "timestamp": 1}) == DataVersion(1, 2, 0)
    configs = {"T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                     "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}}
    built = RegisterBrokerBody.build(configs, version)
    assert RegisterBrokerBody.decode(built.encode()).data_version == version
    assert RegisterBrokerBody.decode(built.encode(compress=True), compressed=True).data_version == version
    compressed = RegisterBrokerBody.encode_compressed(version, [("T", 4, 4, 6, "SINGLE_TAG")])
    assert RegisterBrokerBody.decode(compressed, compressed=True).data_version == version
    raw = register_body_json(version, '"T":{"topicName":"T","readQueueNums":4,"writeQueueNums":4,"perm":6}')
    assert RegisterBrokerBody.decode(raw).data_version == version
    with pytest.raises(RemotingCommandError, match="stateVersion.*'x'"):
        DataVersion.from_json({"counter": 1, "timestamp": 1, "stateVersion": "x"})


# --- RouteInfoManager -------------------------------------------------------------------------------
def test_manual_mode_registrations_behave_as_before():
    rim = RouteInfoManager()
    register(rim, A, 0)
    register(rim, B, 0)  # another address as master, stateVersion 0 both: the last one wins, as before
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: B}
    assert set(rim.broker_live_table) == {A, B}
    register(rim, A, 0)
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: A}
    assert rim.master_state_versions == {}


def test_a_master_of_a_lower_epoch_is_ignored_and_a_higher_one_replaces_the_old_master(caplog):
    rim = RouteInfoManager()
    register(rim, A, 1, "TopicA")
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: A}
    # the controller elected B (epoch 2): B takes brokerId 0 over, A's entry goes
    register(rim, B, 2, "TopicA")
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: B}
    assert set(rim.broker_live_table) == {B}
    assert rim.master_state_versions == {"broker-a": 2}
    # A, not yet aware, registers as master of epoch 1 (with a topic of its own): nothing changes
    live_b = rim.broker_live_table[B]
    with caplog.at_level(logging.WARNING, logger="rmq.namesrv"):
        result = register(rim, A, 1, "TopicA", "OnlyOnA")
    assert result == RegisterBrokerResult()  # answered as a success without a master (RocketMQ 5)
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: B}
    assert set(rim.broker_live_table) == {B} and rim.broker_live_table[B] is live_b
    assert "OnlyOnA" not in rim.topic_queue_table
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and A in warning[0] and B in warning[0] and "stateVersion 1 < 2" in warning[0]
    # A learns the new master and registers as a slave under its own id
    result = register(rim, A, 2, broker_id=3)
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: B, 3: A}
    assert result.master_addr == B
    # B's heartbeats (same epoch) and a later epoch go on as usual; another group is not affected
    register(rim, B, 2, "TopicA", "TopicB")
    assert "TopicB" in rim.topic_queue_table
    register(rim, "127.0.0.1:30911", 0, "TopicC", name="broker-b")
    assert rim.broker_addr_table["broker-b"].broker_addrs == {0: "127.0.0.1:30911"}
    # (a slave's registration is not checked: A of epoch 1 as a slave still counts)
    register(rim, A, 1, broker_id=3)
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: B, 3: A}


def test_the_held_epoch_outlives_the_new_masters_absence():
    """The new master's connection drops (its entry goes): the old master of a lower epoch is
    still ignored until a master of at least the held epoch registers."""
    rim = RouteInfoManager()
    register(rim, A, 1)
    register(rim, B, 2)
    rim.remove_broker_addr(B, "connection closed")
    assert "broker-a" not in rim.broker_addr_table
    register(rim, A, 1)
    assert "broker-a" not in rim.broker_addr_table
    register(rim, A, 3)  # elected again, a newer epoch
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: A}


# --- over real sockets ------------------------------------------------------------------------------
async def test_register_broker_over_tcp_ignores_an_old_masters_registration(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        client = RemotingClient(name="brokers")

        async def register_tcp(addr, epoch, *topics, broker_id=0, compressed=False):
            data = body(epoch, *topics).encode(compress=compressed)
            crc = zlib.crc32(data)
            ext = {"clusterName": "C", "brokerName": "broker-a", "brokerAddr": addr, "brokerId": broker_id,
                   "haServerAddr": addr, "compressed": compressed,
                   "bodyCrc32": crc - (1 << 32) if crc & 0x80000000 else crc}
            return await client.invoke(ns.listen_address,
                                       RemotingCommand.create_request(RequestCode.REGISTER_BROKER, ext, data), 3)

        async def masters(topic="TopicA"):
            resp = await route(client, ns, topic)
            if resp.code != ResponseCode.SUCCESS:
                return None
            return TopicRouteData.decode(resp.body).broker_datas[0].broker_addrs

        try:
            assert (await register_tcp(A, 4)).code == ResponseCode.SUCCESS
            assert await masters() == {0: A}
            assert (await register_tcp(B, 5, compressed=True)).code == ResponseCode.SUCCESS
            assert await masters() == {0: B}
            old = await register_tcp(A, 4, "TopicA", "OnlyOnA")
            assert old.code == ResponseCode.SUCCESS and not old.ext_fields.get("masterAddr")
            assert await masters() == {0: B}
            assert await masters("OnlyOnA") is None
            slave = await register_tcp(A, 5, broker_id=2)
            assert slave.code == ResponseCode.SUCCESS and slave.ext_fields["masterAddr"] == B
            assert await masters() == {0: B, 2: A}
        finally:
            await client.close()
