"""A heartbeat carrying an SQL92 subscription to a broker with enablePropertyFilter=false is
accepted as RocketMQ's broker accepts it: the group registers, and the refusal naming the setting
comes from CHECK_CLIENT_CONFIG (a consumer's start) and from the pull.  Other groups and producers
in the same heartbeat are never refused with it."""
import json
import threading

import pytest

from rmq_core import ConsumeStatus, Message, MessageSelector, Producer, PushConsumer
from rmq_core.errors import MQBrokerError
from rmq_core.remoting.codes import RequestCode, ResponseCode


def _heartbeat_body(client_id, groups, producers):
    consumers = [{"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                  "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                  "subscriptionDataSet": [{"topic": topic, "subString": sub, "tagsSet": [], "codeSet": [],
                                           "subVersion": 1, "expressionType": etype, "classFilterMode": False}]}
                 for g, topic, sub, etype in groups]
    return json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": p} for p in producers],
                       "consumerDataSet": consumers}).encode()


def _members(raw, addr, group):
    r = raw.invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    return json.loads(r.body)["consumerIdList"] if r.code == ResponseCode.SUCCESS else []


def test_heartbeat_registers_sql92_group_and_the_others(make_cluster, raw):
    c = make_cluster({"enablePropertyFilter": "false"})
    addr = c.broker_addr
    body = _heartbeat_body("10.0.0.9@hb", [("CG_SQL_OFF", "T_SQL_OFF", "a > 1", "SQL92"),
                                           ("CG_TAG_ON", "T_SQL_OFF", "*", "TAG")], ["PG_SAME_HB"])
    r = raw.invoke(addr, RequestCode.HEART_BEAT, {}, body)
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert _members(raw, addr, "CG_SQL_OFF") == ["10.0.0.9@hb"]
    assert _members(raw, addr, "CG_TAG_ON") == ["10.0.0.9@hb"]

    check = json.dumps({"clientId": "10.0.0.9@hb", "group": "CG_SQL_OFF", "subscriptionData": {
        "topic": "T_SQL_OFF", "subString": "a > 1", "expressionType": "SQL92"}}).encode()
    r = raw.invoke(addr, RequestCode.CHECK_CLIENT_CONFIG, {}, check)
    assert r.code != ResponseCode.SUCCESS and "enablePropertyFilter=true" in r.remark

    assert raw.send(addr, "T_SQL_OFF", b"x", queue_id=0).code == ResponseCode.SUCCESS
    r = raw.pull(addr, "T_SQL_OFF", 0, 0, group="CG_SQL_OFF", sub="a > 1", expression_type="SQL92")
    assert r.code != ResponseCode.SUCCESS and "enablePropertyFilter=true" in r.remark
    r = raw.pull(addr, "T_SQL_OFF", 0, 0, group="CG_TAG_ON")
    assert r.code == ResponseCode.SUCCESS


def test_malformed_sql92_refuses_only_its_group(make_cluster, raw):
    c = make_cluster({"enablePropertyFilter": "true"})
    addr = c.broker_addr
    body = _heartbeat_body("10.0.0.9@bad", [("CG_BAD_SQL", "T_BAD_SQL", "a > ", "SQL92"),
                                            ("CG_GOOD_TAG", "T_BAD_SQL", "*", "TAG")], ["PG_BAD_HB"])
    r = raw.invoke(addr, RequestCode.HEART_BEAT, {}, body)
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "position" in r.remark
    assert _members(raw, addr, "CG_BAD_SQL") == []
    assert _members(raw, addr, "CG_GOOD_TAG") == ["10.0.0.9@bad"]


def test_sql92_consumer_refused_at_start_while_the_other_group_consumes(make_cluster):
    c = make_cluster({"enablePropertyFilter": "false"})
    with Producer("PG_SQL_OFF", namesrv=c.tcp_namesrv) as p:
        p.send(Message("T_SQL_MIX", b"first", tags="A"))
        got = threading.Event()
        bodies = []

        def on_msgs(msgs):
            bodies.extend(m.body for m in msgs)
            if b"second" in bodies:
                got.set()
            return ConsumeStatus.CONSUME_SUCCESS

        tag = PushConsumer("CG_MIX_TAG", namesrv=c.tcp_namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        tag.subscribe("T_SQL_MIX", "*")
        tag.register_message_listener(on_msgs)
        tag.start()
        try:
            sql = PushConsumer("CG_MIX_SQL", namesrv=c.tcp_namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
            sql.subscribe("T_SQL_MIX", MessageSelector.by_sql("a > 1"))
            sql.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
            with pytest.raises(MQBrokerError) as ei:
                sql.start()
            assert "enablePropertyFilter=true" in str(ei.value) and "SQL92" in str(ei.value)
            p.send(Message("T_SQL_MIX", b"second", tags="A"))
            assert got.wait(30), bodies
            assert bodies.count(b"first") >= 1
        finally:
            tag.shutdown()


def test_the_refusal_suggests_a_command_that_runs_as_printed(make_cluster, capsys):
    import shlex

    from rmq_core.admin import AdminClient
    from rmq_core.cli import main

    c = make_cluster({"enablePropertyFilter": "false"})
    with Producer("PG_SQL_FIX", namesrv=c.tcp_namesrv) as p:
        p.send(Message("T_SQL_FIX", b"x"))  # (the topic exists: the consumer's start asks its broker)
    sql = PushConsumer("CG_SQL_FIX", namesrv=c.tcp_namesrv)
    sql.subscribe("T_SQL_FIX", MessageSelector.by_sql("a > 1"))
    sql.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    with pytest.raises(MQBrokerError) as ei:
        sql.start()
    text = str(ei.value)
    printed = text.split("on the running broker with: ", 1)[1]
    assert printed == (f"rmq admin updateBrokerConfig -n {c.tcp_namesrv} -b {c.broker_addr} "
                       "-k enablePropertyFilter -v true")
    argv = shlex.split(printed)
    assert argv[0] == "rmq" and main(argv[1:]) == 0, capsys.readouterr().err
    with AdminClient(c.tcp_namesrv) as admin:
        assert admin.broker_config(c.broker_addr)["enablePropertyFilter"] == "true"
    sql.start()  # the same consumer is accepted now
    sql.shutdown()
