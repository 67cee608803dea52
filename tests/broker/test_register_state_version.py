"""A broker registers its master epoch (broker.state_version) as dataVersion.stateVersion, in
every form of its registration body; the name server holds it."""
import pytest

from rmq_core.remoting.body import RegisterBrokerBody


@pytest.mark.parametrize("compressed, permission", [(False, 6), (True, 6), (False, 4)],
                         ids=["json", "compressedRegister", "read-only"])
def test_every_register_body_carries_the_state_version(cluster, compressed, permission):
    broker = cluster.broker
    broker.broker_config.compressed_register = compressed
    broker.broker_config.broker_permission = permission
    try:
        body, is_compressed = broker.register_all_body()
        assert is_compressed is compressed
        assert RegisterBrokerBody.decode(body, compressed).data_version.state_version == 0  # manual mode
        assert b"stateVersion" not in (body if not compressed else b"")
        broker.state_version = 7
        body, _ = broker.register_all_body()
        decoded = RegisterBrokerBody.decode(body, compressed)
        assert decoded.data_version.state_version == 7
        assert decoded.data_version.counter == broker.topic_manager.table.data_version.counter
        assert broker.topic_manager.table.data_version.state_version == 0  # (a copy is registered)
    finally:
        broker.broker_config.compressed_register = False
        broker.broker_config.broker_permission = 6
        broker.state_version = 0


def test_the_name_server_holds_the_epoch_of_the_brokers_registrations(cluster):
    from rmq_core.broker.topic_config_manager import TopicConfig

    broker, routes = cluster.broker, cluster.namesrv_controller.route_info_manager
    name = broker.broker_config.broker_name
    assert name not in routes.master_state_versions  # manual mode: nothing held
    broker.state_version = 3
    cluster.call(broker.register_broker_all())
    assert routes.master_state_versions[name] == 3
    # an incremental registration (a topic change: the changed topic alone) carries it too
    broker.state_version = 4
    cluster.call(broker.topic_manager.update_topic_config(TopicConfig("T_EPOCH", 4, 4)))
    assert routes.master_state_versions[name] == 4
    assert "T_EPOCH" in routes.topic_queue_table
    assert routes.broker_live_table[broker.broker_addr].data_version.state_version == 4
