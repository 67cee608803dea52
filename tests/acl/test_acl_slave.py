"""A slave of a master with aclEnable=true and no white list: its sync requests (topics, offsets,
delay offsets, subscription groups) are signed with the broker's own account (accessKey /
secretKey in the broker config), so it copies its master's tables; unsigned, they are refused."""
import pytest

import rmq_core
from rmq_core.admin import AdminClient
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.client.conftest import SMALL_BROKER, wait_until
from tests.rawclient import RawClient

TOPIC, GROUP = "AclSyncTopic", "CG_ACL_SYNC"
PLAIN_ACL = """\
accounts:
  - accessKey: rmq-admin
    secretKey: admin-secret
    admin: true
  - accessKey: rmq-broker
    secretKey: broker-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
"""


@pytest.fixture
def pair(tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(PLAIN_ACL)
    config = {**SMALL_BROKER, "aclEnable": "true", "plainAclFile": str(acl), "accessKey": "rmq-broker",
              "secretKey": "broker-secret"}
    with rmq_core.standalone(store=str(tmp_path / "store"), config=config, slave=True) as cluster:
        yield cluster


def test_a_slave_signs_its_sync_with_the_brokers_account(pair):
    raw = RawClient()
    try:  # without a signature the master refuses what a slave asks for
        r = raw.invoke(pair.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        assert r.code == ResponseCode.SYSTEM_ERROR and "No accessKey is configured" in r.remark
    finally:
        raw.close()
    with AdminClient(pair.tcp_namesrv, access_key="rmq-admin", secret_key="admin-secret") as admin:
        admin.create_or_update_topic(pair.broker_addr, TOPIC, read_queue_nums=2, write_queue_nums=2)
        admin.create_or_update_subscription_group(pair.broker_addr, {"groupName": GROUP, "retryMaxTimes": 5})
        admin.update_consumer_offset(pair.broker_addr, GROUP, TOPIC, 1, 42)
        # the broker's configured secret is not shown by getBrokerConfig
        assert admin.broker_config(pair.broker_addr)["secretKey"] == "***"
    master, slave = pair.broker, pair.slave
    wait_until(lambda: master.offset_manager.query_offset(GROUP, TOPIC, 1) == 42, what="the offset committed")
    pair.call(slave.slave_synchronize.run_once())
    assert slave.topic_manager.select(TOPIC).read_queue_nums == 2
    assert slave.subscription_manager.find(GROUP).retry_max_times == 5
    assert slave.offset_manager.query_offset(GROUP, TOPIC, 1) == 42
    assert slave.topic_manager.table.data_version.to_json() == master.topic_manager.table.data_version.to_json()


def test_half_an_account_is_refused_naming_the_missing_key(tmp_path):
    from rmq_core.errors import ConfigError

    with pytest.raises(ConfigError, match="the broker's own account: secretKey is missing: ACL credentials need both "
                                          "accessKey and secretKey"):
        rmq_core.standalone(store=str(tmp_path / "store"), config={**SMALL_BROKER, "accessKey": "rmq-broker"}).start()
