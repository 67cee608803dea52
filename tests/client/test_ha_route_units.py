"""find_broker_addr_in_subscribe as RocketMQ's findBrokerAddressInSubscribe, plus the turn to the
group's other broker while a connect to one has just failed."""
import pytest

from rmq_core.client.config import ClientConfig
from rmq_core.client.instance import MQClientInstance


@pytest.fixture
def inst():
    i = MQClientInstance(ClientConfig(namesrv=["127.0.0.1:1"], connect_timeout=3.0))
    i.broker_addr_table["b"] = {0: "127.0.0.1:10", 1: "127.0.0.1:11"}
    return i


def test_rocketmq_rules(inst):
    find = inst.find_broker_addr_in_subscribe
    assert find("b") == "127.0.0.1:10"
    assert find("b", 1) == "127.0.0.1:11"
    assert find("b", 2) == "127.0.0.1:10"  # no id 2 nor 3: any broker of the group, the master first
    assert find("b", 2, only_this_broker=True) is None
    assert find("unknown") is None
    inst.broker_addr_table["b"] = {1: "127.0.0.1:11"}  # the master gone from the route
    assert find("b") == "127.0.0.1:11"
    assert find("b", 0, only_this_broker=True) is None  # queue locks: the master's alone


def test_a_master_that_refused_a_connect_is_passed_over_for_a_while(inst):
    find = inst.find_broker_addr_in_subscribe
    inst.note_connect_failed("127.0.0.1:10", "refused")
    assert find("b") == "127.0.0.1:11"
    assert find("b", 0, only_this_broker=True) == "127.0.0.1:10"  # no other choice for a lock
    inst.note_connect_failed("127.0.0.1:11", "refused")
    assert find("b") == "127.0.0.1:10"  # every one failed: the one asked for
    inst._connect_failed.clear()  # (the retry moment reached)
    assert find("b") == "127.0.0.1:10"
