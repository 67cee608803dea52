import pytest

from rmq_core.config import BrokerConfig, FlushDiskType, MessageStoreConfig, load_broker_conf, parse_delay_levels
from rmq_core.errors import ConfigError


def test_store_config_from_properties_file(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# comment\nstorePathRootDir=/data/store\nflushDiskType = SYNC_FLUSH\n"
        "mappedFileSizeCommitLog=4096\nmessageDelayLevel=1s 2s 1m\nbrokerName=broker-b\nlistenPort=10999\n"
    )
    broker, store = load_broker_conf(str(conf), updated=False)  # (never /data/store of this machine)
    assert store.store_path_root_dir == "/data/store"
    assert store.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert store.mapped_file_size_commit_log == 4096
    assert store.delay_levels_ms == [1000, 2000, 60000]
    assert broker.broker_name == "broker-b" and broker.listen_port == 10999
    assert store.commit_log_dir == "/data/store/commitlog"


@pytest.mark.parametrize(
    "props, needle",
    [
        ({"storePathRootDirr": "/x"}, "storePathRootDirr"),
        ({"flushDiskType": "FAST"}, "'FAST'"),
        ({"mappedFileSizeCommitLog": "big"}, "'big'"),
        ({"mappedFileSizeCommitLog": "0"}, "mappedFileSizeCommitLog"),
        ({"messageDelayLevel": "1x"}, "'1x'"),
        ({"autoCreateTopicEnable": "maybe"}, "'maybe'"),
    ],
)
def test_bad_config_names_the_bad_value(props, needle):
    with pytest.raises(ConfigError) as e:
        load_broker_conf(props)
    assert needle in str(e.value)


def test_round_trip_properties():
    cfg = MessageStoreConfig.from_properties({"maxMessageSize": "1024"})
    again = MessageStoreConfig.from_properties(cfg.to_properties())
    assert again == cfg
    assert BrokerConfig.from_properties({"namesrvAddr": "a:1;b:2"}).namesrv_addr_list == ["a:1", "b:2"]
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")[-1] == 7_200_000
