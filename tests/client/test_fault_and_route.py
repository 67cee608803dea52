"""Latency fault tolerance, route parsing, publish/subscribe queue derivation, selectors."""
import pytest
from hypothesis import given, strategies as st

from rmq_core.client.fault import MQFaultStrategy
from rmq_core.client.route import TopicPublishInfo, decode_route, publish_info
from rmq_core.client.selector import (
    SelectMessageQueueByHash, check_group, check_message, resolve_selector,
)
from rmq_core.errors import IllegalArgumentError, MQClientError
from rmq_core.message import Message, MessageQueue, java_string_hash

ROUTE_JSON = (
    '{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10912"},"brokerName":"broker-a",'
    '"cluster":"DefaultCluster"},{"brokerAddrs":{"1":"127.0.0.1:10922"},"brokerName":"broker-b",'
    '"cluster":"DefaultCluster"},{"brokerAddrs":{"0":"127.0.0.1:10931"},"brokerName":"broker-c",'
    '"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":['
    '{"brokerName":"broker-c","perm":4,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2},'
    '{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":3},'
    '{"brokerName":"broker-b","perm":6,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2}]}'
)


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def test_route_parse_and_publish_info():
    route = decode_route(ROUTE_JSON.encode())
    assert route.broker_data("broker-a").master_addr == "127.0.0.1:10911"
    info = publish_info(route, "T")
    # broker-b has no master, broker-c is read-only: only broker-a's 3 write queues
    assert info.queues == [MessageQueue("T", "broker-a", i) for i in range(3)]
    subs = route.subscribe_queues("T")
    assert len(subs) == 4 + 2 + 2 and subs == sorted(subs)


def test_route_parse_fastjson_unquoted_keys():
    text = ('{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a","cluster":"C"}],'
            '"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,'
            '"topicSysFlag":0,"writeQueueNums":4}]}')
    route = decode_route(text)
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}


def test_route_malformed_names_the_problem():
    with pytest.raises(MQClientError, match="malformed topic route"):
        decode_route(b'{"queueDatas":[{"perm":6}]}')


def test_order_topic_conf_and_default_topic_cap():
    route = decode_route(ROUTE_JSON)
    capped = route.with_default_topic_queue_nums(2)
    assert all(q.write_queue_nums <= 2 for q in capped.queue_datas)
    import attrs
    ordered = attrs.evolve(route, order_topic_conf="broker-a:2;broker-x:1")
    info = publish_info(ordered, "T")
    assert info.order_topic and [(q.broker_name, q.queue_id) for q in info.queues] == [
        ("broker-a", 0), ("broker-a", 1), ("broker-x", 0)]


def test_select_one_avoids_last_broker():
    qs = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(2)]
    info = TopicPublishInfo("T", qs, None)
    for _ in range(20):
        assert info.select_one("a").broker_name == "b"
    with pytest.raises(MQClientError, match="no writable queue"):
        TopicPublishInfo("T", [], None).select_one()


def test_fault_strategy_benches_slow_broker_and_recovers():
    clock = Clock()
    fs = MQFaultStrategy(enabled=True, clock=clock)
    qs = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(2)]
    info = TopicPublishInfo("T", qs, None)
    assert fs.compute_not_available_duration(40) == 0
    assert fs.compute_not_available_duration(600) == 30000
    assert fs.compute_not_available_duration(20000) == 600000
    fs.update_fault_item("a", 600, isolation=False)  # slow: 30 s on the bench
    picks = {fs.select_one_message_queue(info, None).broker_name for _ in range(50)}
    assert picks == {"b"}
    clock.now += 30001
    picks = {fs.select_one_message_queue(info, None).broker_name for _ in range(50)}
    assert picks == {"a", "b"}
    # a failure counts as 30 s latency: benched for the top step of the ladder (600 s)
    fs.update_fault_item("b", 5, isolation=True)
    assert fs.tolerance.is_available("b") is False
    clock.now += 599_000
    assert fs.tolerance.is_available("b") is False
    clock.now += 1001
    assert fs.tolerance.is_available("b") is True


def test_fault_strategy_all_benched_still_picks_one():
    clock = Clock()
    fs = MQFaultStrategy(enabled=True, clock=clock)
    from rmq_core.remoting.body import QueueData, TopicRouteData as R, BrokerData
    route = R(queue_datas=(QueueData("a", 2, 2), QueueData("b", 2, 2)),
              broker_datas=(BrokerData("C", "a", {0: "x:1"}), BrokerData("C", "b", {0: "y:1"})))
    info = publish_info(route, "T")
    fs.update_fault_item("a", 2000, False)
    fs.update_fault_item("b", 16000, False)
    mq = fs.select_one_message_queue(info, None)
    assert mq.broker_name in ("a", "b") and 0 <= mq.queue_id < 2


def test_disabled_fault_strategy_round_robins():
    fs = MQFaultStrategy(enabled=False)
    qs = [MessageQueue("T", "a", i) for i in range(4)]
    info = TopicPublishInfo("T", qs, None)
    fs.update_fault_item("a", 100000, True)
    seen = {fs.select_one_message_queue(info, None).queue_id for _ in range(8)}
    assert seen == {0, 1, 2, 3}


@given(st.text(min_size=1, max_size=30), st.integers(1, 64))
def test_hash_selector_is_stable_and_java_compatible(key, n):
    qs = [MessageQueue("T", "a", i) for i in range(n)]
    sel = SelectMessageQueueByHash()
    msg = Message("T", b"x", keys=key)
    a = sel.select(qs, msg, key)
    assert a is sel.select(qs, msg, key)
    assert a.queue_id == abs(java_string_hash(key)) % n
    # with arg None the message keys are the sharding key
    assert sel.select(qs, msg, None) == a


def test_hash_selector_int_keys_like_java():
    qs = [MessageQueue("T", "a", i) for i in range(8)]
    sel = SelectMessageQueueByHash()
    assert sel.select(qs, Message("T", b"x"), 13).queue_id == 5
    assert sel.select(qs, Message("T", b"x"), -13).queue_id == 5
    assert resolve_selector(lambda mqs, m, a: mqs[0])(qs, None, None) == qs[0]
    with pytest.raises(IllegalArgumentError, match="bad queue selector"):
        resolve_selector(42)


@pytest.mark.parametrize("group,needle", [("", "empty"), ("a b", "' '"), ("x" * 300, "longer"), ("g/1", "'/'")])
def test_bad_group_names(group, needle):
    with pytest.raises(IllegalArgumentError, match=needle):
        check_group(group)


def test_message_validation_names_the_problem():
    with pytest.raises(IllegalArgumentError, match="empty body"):
        check_message(Message("T", b""))
    with pytest.raises(IllegalArgumentError, match="exceeds max_message_size 10"):
        check_message(Message("T", b"x" * 11), 10)
    with pytest.raises(IllegalArgumentError, match="bad topic name 'a b'"):
        check_message(Message("a b", b"x"))
    with pytest.raises(IllegalArgumentError, match="system topic"):
        check_message(Message("SCHEDULE_TOPIC_XXXX", b"x"))
    with pytest.raises(IllegalArgumentError, match="'TAGS' is reserved"):
        check_message(Message("T", b"x", properties={"TAGS": "a"}))
    check_message(Message("T", b"x", tags="A", keys=["k1", "k2"], properties={"a": "1"}))
