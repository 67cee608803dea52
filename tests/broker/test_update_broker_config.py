"""updateBrokerConfig tells the truth (issue 24): every key a running broker can change takes effect
at once (one case per key, against a real broker), a key that needs a restart is persisted and
answered so (and is in effect after the restart), an unknown key or a bad value is refused naming it."""
from __future__ import annotations

import enum

import attrs
import pytest

from rmq_core import Message, Producer
from rmq_core.admin import AdminClient
from rmq_core.admin.client import AdminError
from rmq_core.config import RUNTIME_BROKER_KEYS, BrokerConfig, MessageStoreConfig, read_properties_file
from rmq_core.embedded import Cluster
from tests.broker.conftest import SMALL

# a valid new value where "the next one" is not (ratios, hours, addresses)
NEW_VALUES = {"diskSpaceCleanForciblyRatio": "0.8", "diskSpaceWarningLevelRatio": "0.95", "deleteWhen": "05;17",
              "brokerPermission": "4"}
BAD_VALUES = {int: "x1", bool: "maybe", float: "abc", "deleteWhen": "25"}
RESTART_KEYS = ["listenPort", "brokerName", "mappedFileSizeCommitLog", "flushDiskType", "messageDelayLevel",
                "registerNameServerPeriod", "transactionCheckInterval", "enableCalcFilterBitMap"]


def _field(key):
    for cls in (BrokerConfig, MessageStoreConfig):
        if key in cls.keys():
            return cls, attrs.fields_dict(cls)[cls.keys()[key]]
    raise KeyError(key)


def _live(cluster, key):
    cls, field = _field(key)
    cfg = cluster.broker_config if cls is BrokerConfig else cluster.store_config
    return getattr(cfg, field.name)


def _text(value) -> str:
    return value.value if isinstance(value, enum.Enum) else "true" if value is True else "false" if value is False \
        else str(value)


def _new_value(cluster, key) -> str:
    if key in NEW_VALUES:
        return NEW_VALUES[key]
    current = _live(cluster, key)
    if key == "namesrvAddr":
        return current  # where it registers: the same name server, written again
    if isinstance(current, bool):
        return _text(not current)
    if isinstance(current, int):
        return str(current + 1)
    raise AssertionError(f"no test value for {key} ({current!r})")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    cluster = Cluster(str(tmp_path_factory.mktemp("ubc") / "store"), dict(SMALL))
    cluster.start()
    admin = AdminClient(cluster.tcp_namesrv)
    try:
        yield cluster, admin
    finally:
        admin.close()
        cluster.stop()


@pytest.mark.parametrize("key", sorted(RUNTIME_BROKER_KEYS))
def test_a_runtime_key_takes_effect_at_once(live, key):
    cluster, admin = live
    old = _text(_live(cluster, key))
    new = _new_value(cluster, key)
    try:
        assert admin.update_broker_config(cluster.broker_addr, {key: new}) is None  # no "after a restart"
        assert _text(_live(cluster, key)) == new
        assert admin.broker_config(cluster.broker_addr)[key] == new
        assert read_properties_file(cluster.store_config.updated_config_file)[key] == new
    finally:
        admin.update_broker_config(cluster.broker_addr, {key: old})
    assert _text(_live(cluster, key)) == old


@pytest.mark.parametrize("key", sorted(RUNTIME_BROKER_KEYS - {"namesrvAddr"}))
def test_a_bad_value_is_refused_naming_the_key(live, key):
    cluster, admin = live
    _, field = _field(key)
    bad = BAD_VALUES.get(key) or BAD_VALUES[type(_live(cluster, key))]
    before = _text(_live(cluster, key))
    with pytest.raises(AdminError) as e:
        admin.update_broker_config(cluster.broker_addr, {key: bad})
    assert key in str(e.value) and repr(bad) in str(e.value)
    assert _text(_live(cluster, key)) == before


def test_max_message_size_is_enforced_by_the_store_at_once(live):
    """The issue's case: maxMessageSize lowered to 1000, the next 2000-byte send is refused."""
    cluster, admin = live
    with Producer("UbcPG", namesrv=cluster.tcp_namesrv) as p:  # the client's own limit stays 4 MiB
        p.send(Message("UbcTopic", b"x" * 2000))
        admin.update_broker_config(cluster.broker_addr, {"maxMessageSize": "1000"})
        try:
            with pytest.raises(Exception, match="exceeds maxMessageSize 1000 bytes"):
                p.send(Message("UbcTopic", b"x" * 2000))
        finally:
            admin.update_broker_config(cluster.broker_addr, {"maxMessageSize": str(4 * 1024 * 1024)})
        p.send(Message("UbcTopic", b"x" * 2000))


def test_the_disk_watermark_reaches_the_commit_log(live):
    cluster, admin = live
    admin.update_broker_config(cluster.broker_addr, {"diskSpaceWarningLevelRatio": "0.97"})
    try:
        assert cluster.broker.store.commit_log.mapped_file_queue.max_used_ratio == 0.97
    finally:
        admin.update_broker_config(cluster.broker_addr, {"diskSpaceWarningLevelRatio": "0.9"})


@pytest.mark.parametrize("key", RESTART_KEYS)
def test_a_restart_key_is_persisted_and_answered_so(live, key):
    cluster, admin = live
    assert key not in RUNTIME_BROKER_KEYS
    before = _text(_live(cluster, key))
    value = {"listenPort": "10999", "brokerName": "broker-z", "mappedFileSizeCommitLog": "8388608",
             "flushDiskType": "SYNC_FLUSH", "messageDelayLevel": "1s 2s", "registerNameServerPeriod": "20000",
             "transactionCheckInterval": "20000", "enableCalcFilterBitMap": "true"}[key]
    remark = admin.update_broker_config(cluster.broker_addr, {key: value})
    path = cluster.store_config.updated_config_file
    assert remark == f"{key}: written to {path}, takes effect after a restart"
    assert _text(_live(cluster, key)) == before  # not applied to the running broker
    assert read_properties_file(path)[key] == value
    # taken back, so the cases after this one run against the same broker
    admin.update_broker_config(cluster.broker_addr, {key: before})


def test_unknown_keys_are_refused_with_the_nearest_name(live):
    cluster, admin = live
    with pytest.raises(AdminError, match=r"unknown config key 'maxMessageSiz' \(did you mean 'maxMessageSize'\?\)"):
        admin.update_broker_config(cluster.broker_addr, {"maxMessageSiz": "1"})


def test_a_persisted_restart_key_is_in_effect_after_the_restart(tmp_path):
    store = tmp_path / "store"
    first = Cluster(str(store), dict(SMALL)).start()
    try:
        with AdminClient(first.tcp_namesrv) as admin:
            remark = admin.update_broker_config(first.broker_addr, {"mappedFileSizeCommitLog": str(8 * 1024 * 1024),
                                                                    "fileReservedTime": "24"})
        assert remark.startswith("mappedFileSizeCommitLog: written to ")  # fileReservedTime: at once
        assert first.store_config.file_reserved_time == 24
        assert first.store_config.mapped_file_size_commit_log == 4 * 1024 * 1024
    finally:
        first.stop()
    second = Cluster(str(store), dict(SMALL)).start()  # the same broker.conf: the update wins over it
    try:
        assert second.store_config.mapped_file_size_commit_log == 8 * 1024 * 1024
        assert second.store_config.file_reserved_time == 24
    finally:
        second.stop()


def test_the_property_filter_switch_takes_effect_at_once(live):
    """enablePropertyFilter turned off on a running broker: the next SQL92 subscription is refused."""
    from rmq_core import ConsumeStatus, MessageSelector, PushConsumer

    cluster, admin = live

    def start_sql_consumer():
        c = PushConsumer("UbcSql", namesrv=cluster.tcp_namesrv)
        c.subscribe("UbcSqlTopic", MessageSelector.by_sql("a > 1"))
        c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
        try:
            c.start()
        finally:
            c.shutdown()

    with Producer("UbcPG", namesrv=cluster.tcp_namesrv) as p:
        p.send(Message("UbcSqlTopic", b"x", properties={"a": "2"}))  # the topic exists on the broker
    start_sql_consumer()  # on (SMALL): accepted
    admin.update_broker_config(cluster.broker_addr, {"enablePropertyFilter": "false"})
    try:
        with pytest.raises(Exception, match=r"property filtering is off \(enablePropertyFilter=false\)"):
            start_sql_consumer()
    finally:
        admin.update_broker_config(cluster.broker_addr, {"enablePropertyFilter": "true"})
    start_sql_consumer()
