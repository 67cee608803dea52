"""A master and its slave in one process (`rmq_core.standalone(slave=True)`): the slave refuses
writes as RocketMQ's does, serves pulls, answers suggestWhichBrokerId as 4.9, copies its master's
tables (SlaveSynchronize), keeps offsets committed to it, and the master takes the newer ones."""
import json

import pytest

import rmq_core
from rmq_core.broker.processors.pull import suggest_which_broker_id
from rmq_core.config import BrokerConfig
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.broker.config_file import SubscriptionGroupConfig
from tests.client.conftest import SMALL_BROKER, wait_until
from tests.rawclient import RawClient

TOPIC, GROUP = "HaRoleTopic", "CG_HA_ROLES"


@pytest.fixture
def pair(tmp_path):
    with rmq_core.standalone(store=str(tmp_path / "store"), config=dict(SMALL_BROKER), slave=True,
                             slave_read_enable=True) as cluster:
        yield cluster


@pytest.fixture
def raw():
    r = RawClient()
    yield r
    r.close()


def _create_topic(raw, addr, topic=TOPIC, queues=2):
    return raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                      {"topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues), "perm": "6"})


def test_slave_registers_as_bid_1_and_refuses_writes(pair, raw):
    assert _create_topic(raw, pair.broker_addr).code == ResponseCode.SUCCESS
    wait_until(lambda: len(raw.route(pair.tcp_namesrv, TOPIC)[1]["brokerDatas"][0]["brokerAddrs"]) == 2,
               what="the slave registered")
    route = raw.route(pair.tcp_namesrv, TOPIC)[1]
    addrs = {int(k): v for k, v in route["brokerDatas"][0]["brokerAddrs"].items()}
    assert addrs == {0: pair.broker_addr, 1: pair.slave_addr}

    refused = raw.send(pair.slave_addr, TOPIC, b"to the slave")
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "role is SLAVE" in refused.remark and pair.slave_addr in refused.remark
    admin = _create_topic(raw, pair.slave_addr, "OtherTopic")
    assert admin.code == ResponseCode.SYSTEM_ERROR and "from slave broker" in admin.remark
    group = raw.invoke(pair.slave_addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                       body=json.dumps({"groupName": "CG_X"}).encode())
    assert group.code == ResponseCode.SYSTEM_ERROR
    end_tx = raw.invoke(pair.slave_addr, RequestCode.END_TRANSACTION,
                        {"producerGroup": "PG", "tranStateTableOffset": "0", "commitLogOffset": "0",
                         "commitOrRollback": "8"})
    assert end_tx.code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert pair.slave.topic_manager.select("OtherTopic") is None  # nothing created by the refused send


def test_slave_serves_what_the_master_stored_and_copies_its_tables(pair, raw):
    assert _create_topic(raw, pair.broker_addr).code == ResponseCode.SUCCESS
    for i in range(10):
        assert raw.send(pair.broker_addr, TOPIC, f"m{i}".encode(), queue_id=0).code == ResponseCode.SUCCESS
    assert raw.invoke(pair.broker_addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                      body=json.dumps({"groupName": GROUP, "retryMaxTimes": 3}).encode()).code == ResponseCode.SUCCESS
    raw.invoke(pair.broker_addr, RequestCode.UPDATE_CONSUMER_OFFSET,
               {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "commitOffset": "4"})

    # the topic is unknown to the slave until its sync: a pull for it syncs at once
    wait_until(lambda: pair.slave.store.get_max_offset_in_queue(TOPIC, 0) == 10, what="replication")
    resp = raw.pull(pair.slave_addr, TOPIC, 0, 0, group=GROUP)
    assert resp.code == ResponseCode.SUCCESS
    assert resp.ext_fields["nextBeginOffset"] == "10"

    pair.call(pair.slave.slave_synchronize.run_once())
    slave = pair.slave
    assert slave.topic_manager.select(TOPIC).read_queue_nums == 2
    assert slave.subscription_manager.find(GROUP).retry_max_times == 3
    assert slave.offset_manager.query_offset(GROUP, TOPIC, 0) == 4
    assert slave.topic_manager.table.data_version.to_json() == pair.broker.topic_manager.table.data_version.to_json()
    with open(slave.offset_manager.config_file_path()) as f:  # persisted
        assert json.load(f)["offsetTable"][f"{TOPIC}@{GROUP}"] == {"0": 4}


def test_offsets_committed_to_the_slave_survive_its_sync_and_the_master_takes_them(pair, raw):
    assert _create_topic(raw, pair.broker_addr).code == ResponseCode.SUCCESS
    master, slave = pair.broker, pair.slave

    def commit(addr, offset, queue=0):
        r = raw.invoke(addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                       {"consumerGroup": GROUP, "topic": TOPIC, "queueId": str(queue), "commitOffset": str(offset)})
        assert r.code == ResponseCode.SUCCESS

    commit(pair.broker_addr, 100)
    commit(pair.broker_addr, 7, queue=1)
    pair.call(slave.slave_synchronize.run_once())
    assert slave.offset_manager.query_offset(GROUP, TOPIC, 0) == 100

    # the master away (in the consumers' eyes): they commit to the slave, which keeps it
    commit(pair.slave_addr, 150)
    pair.call(slave.slave_synchronize.run_once())  # the master still says 100: never moved back
    assert slave.offset_manager.query_offset(GROUP, TOPIC, 0) == 150
    q = raw.invoke(pair.slave_addr, RequestCode.QUERY_CONSUMER_OFFSET,
                   {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0"})
    assert q.ext_fields["offset"] == "150"

    # the master takes the greater offset of its slave, and only the ones committed to the slave
    master.offset_manager.commit_offset(None, GROUP, TOPIC, 1, 9)
    assert pair.call(master.slave_synchronize.take_slave_offsets()) == 1
    assert master.offset_manager.query_offset(GROUP, TOPIC, 0) == 150
    assert master.offset_manager.query_offset(GROUP, TOPIC, 1) == 9

    # once the master has it, the slave follows the master again (a reset back included)
    pair.call(slave.slave_synchronize.run_once())
    assert slave.offset_manager.received_table == {}
    master.offset_manager.reset_offsets(GROUP, TOPIC, {0: 20})
    pair.call(slave.slave_synchronize.run_once())
    assert slave.offset_manager.query_offset(GROUP, TOPIC, 0) == 20
    assert pair.call(master.slave_synchronize.take_slave_offsets()) == 0


def test_a_reset_on_the_returned_master_is_not_undone_by_a_greater_offset_the_slave_holds(pair, raw):
    """The master away, consumers move on on the slave; the master back, an operator resets the
    queue back before the slave's next sync: neither the master's take of the slave's offsets
    nor the slave's sync undoes the reset; offsets committed to the slave after it learned of
    the reset are taken again as before."""
    assert _create_topic(raw, pair.broker_addr).code == ResponseCode.SUCCESS
    master, slave = pair.broker, pair.slave

    def commit(addr, offset, queue=0):
        r = raw.invoke(addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                       {"consumerGroup": GROUP, "topic": TOPIC, "queueId": str(queue), "commitOffset": str(offset)})
        assert r.code == ResponseCode.SUCCESS

    commit(pair.broker_addr, 100)
    pair.call(slave.slave_synchronize.run_once())
    commit(pair.slave_addr, 150)  # the master away
    commit(pair.slave_addr, 60, queue=1)
    reset = raw.invoke(pair.broker_addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                       {"topic": TOPIC, "group": GROUP, "timestamp": "-1", "isForce": "true", "queueId": "0",
                        "offset": "20"})
    assert reset.code == ResponseCode.SUCCESS, reset.remark

    assert pair.call(master.slave_synchronize.take_slave_offsets()) == 1  # queue 1 only: not reset
    assert master.offset_manager.query_offsets(GROUP, TOPIC) == {0: 20, 1: 60}
    pair.call(slave.slave_synchronize.run_once())
    assert slave.offset_manager.query_offsets(GROUP, TOPIC) == {0: 20, 1: 60}
    assert slave.offset_manager.received_table == {}
    assert pair.call(master.slave_synchronize.take_slave_offsets()) == 0
    assert master.offset_manager.query_offset(GROUP, TOPIC, 0) == 20

    # the master away again: what the slave receives now comes after the reset, and is taken
    commit(pair.slave_addr, 35)
    pair.call(slave.slave_synchronize.run_once())
    assert slave.offset_manager.query_offset(GROUP, TOPIC, 0) == 35
    assert pair.call(master.slave_synchronize.take_slave_offsets()) == 1
    assert master.offset_manager.query_offset(GROUP, TOPIC, 0) == 35
    with open(slave.offset_manager.config_file_path()) as f:  # the slave's copy of the stamps persists
        stamps = json.load(f)["offsetResetTimestampTable"][f"{TOPIC}@{GROUP}"]
    assert stamps == {"0": master.offset_manager.reset_table[f"{TOPIC}@{GROUP}"][0]}


def test_received_offsets_are_persisted_with_the_slave_table(tmp_path):
    from rmq_core.broker.offset_manager import ConsumerOffsetManager

    m = ConsumerOffsetManager(tmp_path)
    m.commit_offset(None, GROUP, TOPIC, 0, 42, received_by_slave=True)
    m.persist()
    again = ConsumerOffsetManager(tmp_path)
    assert again.load()
    assert again.received_table == {f"{TOPIC}@{GROUP}": {0: 42}}
    again.merge_from_master({f"{TOPIC}@{GROUP}": {0: 41}})  # the master behind: kept
    assert again.query_offset(GROUP, TOPIC, 0) == 42


def test_slave_grants_no_queue_lock(pair, raw):
    body = json.dumps({"consumerGroup": GROUP, "clientId": "c1",
                       "mqSet": [{"topic": TOPIC, "brokerName": pair.broker_config.broker_name, "queueId": 0}]})
    on_slave = raw.invoke(pair.slave_addr, RequestCode.LOCK_BATCH_MQ, body=body.encode())
    assert json.loads(on_slave.body)["lockOKMQSet"] == []
    on_master = raw.invoke(pair.broker_addr, RequestCode.LOCK_BATCH_MQ, body=body.encode())
    assert len(json.loads(on_master.body)["lockOKMQSet"]) == 1


def test_suggest_which_broker_id_follows_rocketmq_4_9():
    sg = SubscriptionGroupConfig(group_name=GROUP)
    assert suggest_which_broker_id(BrokerConfig(), sg, True) == 0  # slaveReadEnable=false: the master
    on = BrokerConfig(slave_read_enable=True)
    assert suggest_which_broker_id(on, sg, True) == 1  # lagging beyond the memory share: the slave
    assert suggest_which_broker_id(on, sg, False) == 0


def test_slave_answers_pulls_with_the_master_suggested_without_slave_read(tmp_path, raw):
    with rmq_core.standalone(store=str(tmp_path / "s"), config=dict(SMALL_BROKER), slave=True) as pair:
        assert _create_topic(raw, pair.broker_addr).code == ResponseCode.SUCCESS
        assert raw.send(pair.broker_addr, TOPIC, b"x", queue_id=0).code == ResponseCode.SUCCESS
        wait_until(lambda: pair.slave.store.get_max_offset_in_queue(TOPIC, 0) == 1, what="replication")
        resp = raw.pull(pair.slave_addr, TOPIC, 0, 0)
        assert resp.code == ResponseCode.SUCCESS  # served all the same (as RocketMQ 4.9's slave)
        assert resp.ext_fields["suggestWhichBrokerId"] == "0"
        behind = raw.pull(pair.slave_addr, TOPIC, 0, 50)  # beyond the slave: never "offset moved"
        assert behind.code == ResponseCode.PULL_RETRY_IMMEDIATELY


def test_brokerstatus_fields_of_master_and_slave(pair, raw):
    assert _create_topic(raw, pair.broker_addr).code == ResponseCode.SUCCESS
    assert raw.send(pair.broker_addr, TOPIC, b"x" * 500, queue_id=0).code == ResponseCode.SUCCESS
    wait_until(lambda: pair.broker.store.slave_fall_behind_bytes() == 0, what="the slave acknowledging")
    master = pair.broker.runtime_info()
    assert master["brokerRole"] == "ASYNC_MASTER" and master["haConnectionNum"] == "1"
    conn = json.loads(master["haConnectionInfo"])[0]
    assert conn["slaveAckOffset"] == int(master["masterPutWhere"]) and conn["diff"] == 0
    assert master["slaveFallBehindBytes"] == "0"
    slave = pair.slave.runtime_info()
    assert slave["brokerRole"] == "SLAVE" and slave["masterBrokerAddr"] == pair.broker_addr
    assert slave["slaveFallBehindBytes"] == "0" and slave["haConnected"] == "True"


def test_concurrent_pulls_of_a_topic_the_slave_missed_with_its_master_away(pair, raw):
    """The master made the topic after the slave's last sync, then went away: the first pull
    looks the topic up in the name server's route, those arriving meanwhile wait for it."""
    assert _create_topic(raw, pair.broker_addr, "LateTopic", queues=4).code == ResponseCode.SUCCESS
    assert pair.slave.topic_manager.select("LateTopic") is None
    pair.call(pair.broker.stop())  # unregistered: the route keeps the topic's queues for the slave
    futs = [raw.invoke_async(pair.slave_addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": GROUP, "topic": "LateTopic", "queueId": str(q), "queueOffset": "0", "maxMsgNums": "32",
        "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
        "expressionType": "TAG"}) for q in range(4)]
    assert [f.result(30).code for f in futs] == [ResponseCode.PULL_NOT_FOUND] * 4
    assert pair.slave.topic_manager.select("LateTopic").read_queue_nums == 4
