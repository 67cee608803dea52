"""Client behaviour that needs only a name server (no broker)."""
import threading

import pytest

from rmq_core import Message, Producer, PullConsumer, PushConsumer
from rmq_core.errors import ConfigError, MQClientError, PluginNotFoundError
from rmq_core.message import ConsumeStatus
from tests.client.conftest import FAST, FAST_CONSUMER


def test_send_to_unknown_topic_without_broker_names_topic(namesrv_only, no_thread_leak):
    with Producer("PG_NS", namesrv=namesrv_only, **FAST) as p:
        with pytest.raises(MQClientError, match="no route info of topic 'NoSuchTopic'"):
            p.send(Message("NoSuchTopic", b"x"))


def test_producer_not_started_and_bad_settings(namesrv_only):
    p = Producer("PG_NS2", namesrv=namesrv_only)
    with pytest.raises(MQClientError, match="not started"):
        p.send(Message("T", b"x"))
    with pytest.raises(ConfigError, match="Producer: unknown setting 'retries'; accepted here .*instance_name"):
        Producer("PG", namesrv=namesrv_only, retries=3)
    with pytest.raises(ConfigError, match="PushConsumer: unknown setting 'threads'"):
        PushConsumer("CG", namesrv=namesrv_only, threads=3)
    with pytest.raises(Exception, match="bad compress_type 'gzip'; available: lz4, zlib"):
        Producer("PG", namesrv=namesrv_only, compress_type="gzip")


def test_unknown_plugin_names_fail_at_start_listing_available(namesrv_only, no_thread_leak):
    c = PushConsumer("CG_NS", namesrv=namesrv_only, allocate_strategy="nope", **FAST_CONSUMER)
    c.subscribe("T", "*")
    c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    with pytest.raises(PluginNotFoundError, match=r"unknown allocate strategy 'nope'; available: .*averagely"):
        c.start()
    c2 = PullConsumer("CG_NS2", namesrv=namesrv_only, offset_store="nowhere", **FAST_CONSUMER)
    c2.subscribe("T", "*")
    with pytest.raises(PluginNotFoundError, match=r"unknown offset store 'nowhere'; available: local_file, remote"):
        c2.start()


def test_consumer_needs_listener_and_subscription(namesrv_only):
    c = PushConsumer("CG_NS3", namesrv=namesrv_only)
    with pytest.raises(MQClientError, match="register a message listener"):
        c.start()
    c.register_message_listener(lambda m: ConsumeStatus.CONSUME_SUCCESS)
    with pytest.raises(MQClientError, match="subscribe to a topic"):
        c.start()
    with pytest.raises(Exception, match="bad message_model 'RING'"):
        PushConsumer("CG", namesrv=namesrv_only, message_model="RING")
    assert PushConsumer("CG", namesrv=namesrv_only, consume_from_where="first").consume_from_where.value == \
        "CONSUME_FROM_FIRST_OFFSET"
    with pytest.raises(Exception, match="bad consume_from_where 'NOW'"):
        PushConsumer("CG", namesrv=namesrv_only, consume_from_where="NOW")
    with pytest.raises(Exception, match="consume_thread_min 5 is larger than consume_thread_max 2"):
        PushConsumer("CG", namesrv=namesrv_only, consume_thread_min=5, consume_thread_max=2)


def test_instances_start_and_stop_without_leaking_threads(namesrv_only, no_thread_leak):
    before = threading.active_count()
    for i in range(3):
        p = Producer(f"PG_LEAK{i}", namesrv=namesrv_only, **FAST).start()
        c = PushConsumer(f"CG_LEAK{i}", namesrv=namesrv_only, **FAST_CONSUMER)
        c.subscribe("LeakTopic", "*")
        c.register_message_listener(lambda m: ConsumeStatus.CONSUME_SUCCESS)
        c.start()
        assert threading.active_count() > before
        c.shutdown()
        p.shutdown()


def test_shared_instance_name_shares_one_client_instance(namesrv_only, no_thread_leak):
    a = Producer("PG_SH_A", namesrv=namesrv_only, instance_name="shared", **FAST).start()
    b = Producer("PG_SH_B", namesrv=namesrv_only, instance_name="shared", **FAST).start()
    try:
        assert a.instance is b.instance and a.client_id == b.client_id
        c = Producer("PG_SH_A", namesrv=namesrv_only, instance_name="shared", **FAST)
        with pytest.raises(MQClientError, match="producer group 'PG_SH_A' is already used"):
            c.start()
    finally:
        a.shutdown()
        assert b.instance.running  # still used by b
        b.shutdown()
