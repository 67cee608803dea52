"""The rest of mqadmin's commands against real `rmq namesrv` + `rmq broker` processes, each in
table and --json form with a one-line error for bad input: queryMsgById / queryMsgByUniqueKey -g [-d]
(the message handed to a live consumer's listener, concurrent or orderly, with CONSUME_MESSAGE_DIRECTLY), ..."""
from __future__ import annotations

import threading

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from tests.admin.test_admin_cli import admin, cl, fails, make_topic, ok, rows, wait_for  # noqa: F401 - cl: the module's cluster
from tests.servers import NamesrvAndBroker

CLIENT = dict(poll_name_server_interval=1.0, heartbeat_broker_interval=1.0, persist_consumer_offset_interval=1.0)


def sent_and_consumed(ns, topic, group, n) -> PushConsumer:
    """n messages sent to `topic`, then a started consumer of `group` that has consumed them all."""
    with Producer(f"PG_{group}", namesrv=ns, **CLIENT) as p:
        for i in range(n):
            p.send(Message(topic, f"{topic}-{i}".encode()))
    got = []
    c = PushConsumer(group, namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **CLIENT)
    c.subscribe(topic, "*")
    c.register_message_listener(lambda msgs: (got.extend(msgs), ConsumeStatus.CONSUME_SUCCESS)[1])
    c.start()
    try:
        wait_for(lambda: len(got) >= n, what=f"{n} messages of {topic} consumed")
    except BaseException:
        c.shutdown()
        raise
    return c


def test_query_msg_by_id_consumes_directly(cl):
    ns = cl.namesrv
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            seen.extend((m.msg_id, m.topic) for m in msgs)
        if msgs[0].keys == "boom":
            raise ValueError("listener refused boom")
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("CG_DIRECT", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **CLIENT)
    c.subscribe("DirectTopic", "*")
    c.register_message_listener(listener)
    c.start()
    try:
        with Producer("PG_DIRECT", namesrv=ns, **CLIENT) as p:
            good = p.send(Message("DirectTopic", b"hello", keys="fine"))
            bad = p.send(Message("DirectTopic", b"boom", keys="boom"))
        wait_for(lambda: {good.msg_id, bad.msg_id} <= {i for i, _ in seen}, what="both consumed")
        before = len(seen)
        r = rows("queryMsgById", "-i", good.msg_id, "-t", "DirectTopic", "-g", "CG_DIRECT", "-d", c.client_id, ns=ns)
        assert len(r) == 1 and r[0]["consume_result"] == "CR_SUCCESS" and r[0]["order"] is False
        assert r[0]["message_id"] == good.msg_id and r[0]["client_id"] == c.client_id
        with lock:
            assert seen[before:] == [(good.msg_id, "DirectTopic")]  # the listener got it once more
        # by the offset id, table form; a listener that raises is reported with its traceback
        table = ok("queryMsgById", "-i", bad.offset_msg_id, "-g", "CG_DIRECT", "-d", c.client_id, ns=ns)
        assert "CR_THROW_EXCEPTION" in table and "listener refused boom" in table
        # queryMsgByUniqueKey -g (4.9's), without -d: the group's live consumer is found
        r = rows("queryMsgByUniqueKey", "-i", good.msg_id, "-t", "DirectTopic", "-g", "CG_DIRECT", ns=ns)
        assert (r[0]["consume_result"], r[0]["client_id"]) == ("CR_SUCCESS", c.client_id)
        assert isinstance(r[0]["spent_time_ms"], int)
        fails("queryMsgById", "-i", good.msg_id, "-t", "DirectTopic", "-d", c.client_id, ns=ns, needle="-g")
        fails("queryMsgById", "-i", good.msg_id, "-t", "DirectTopic", "-g", "CG_DIRECT", "-d", "nobody@1", ns=ns,
              needle="nobody@1")
        fails("queryMsgByUniqueKey", "-i", good.msg_id, "-t", "DirectTopic", "-g", "CG_NOBODY", ns=ns,
              needle="CG_NOBODY")
        fails("queryMsgByUniqueKey", "-i", "7F0000010D5818B4AAC2795B82A7FFFF", "-t", "DirectTopic", "-g", "CG_DIRECT",
              ns=ns, needle="7F0000010D5818B4AAC2795B82A7FFFF")
        # consumeMessage keeps mqadmin's flags (-i a queue id): a message id there says where to go
        fails("consumeMessage", "-t", "DirectTopic", "-g", "CG_DIRECT", "-i", good.msg_id, ns=ns,
              needle="queryMsgByUniqueKey")
    finally:
        c.shutdown()


def test_consume_directly_by_an_orderly_consumer(cl):
    ns = cl.namesrv
    answers = iter([ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT])
    got = threading.Event()

    def listener(msgs):
        got.set()
        return next(answers, ConsumeStatus.SUCCESS)

    c = PushConsumer("CG_DIRECT_ORDER", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **CLIENT)
    c.subscribe("DirectOrder", "*")
    c.register_message_listener(listener, orderly=True)
    c.start()
    try:
        with Producer("PG_DIRECT_ORDER", namesrv=ns, **CLIENT) as p:
            m = p.send(Message("DirectOrder", b"in order"))
        assert got.wait(30)
        r = rows("queryMsgByUniqueKey", "-i", m.msg_id, "-t", "DirectOrder", "-g", "CG_DIRECT_ORDER", ns=ns)
        assert (r[0]["consume_result"], r[0]["order"]) == ("CR_SUCCESS", True)
    finally:
        c.shutdown()


def test_clone_group_offset_offline_flag(cl):
    ns = cl.namesrv
    with Producer("PG_CLONE", namesrv=ns, **CLIENT) as p:
        p.send(Message("CloneB", b"b"))
    sent_and_consumed(ns, "CloneA", "CG_CLONE_SRC", 8).shutdown()  # (its offsets are committed at shutdown)
    # the source group comes back online subscribing only CloneB
    c = PushConsumer("CG_CLONE_SRC", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **CLIENT)
    c.subscribe("CloneB", "*")
    c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    c.start()
    try:
        line = fails("cloneGroupOffset", "-s", "CG_CLONE_SRC", "-d", "CG_CLONE_DST", "-t", "CloneA", ns=ns,
                     needle="does not subscribe")
        assert "-o true" in line
        cloned = rows("cloneGroupOffset", "-s", "CG_CLONE_SRC", "-d", "CG_CLONE_DST", "-t", "CloneA", "-o", "true",
                      ns=ns)
        assert sum(r["consumer_offset"] for r in cloned) == 8
    finally:
        c.shutdown()


def test_check_msg_send_rt_and_send_msg_status(cl):
    ns = cl.namesrv
    ok("updateTopic", "-b", cl.broker_addrs[0], "-t", "RtTopic", "-r", "3", "-w", "3", ns=ns)
    r = rows("checkMsgSendRT", "-t", "RtTopic", "-a", "7", "-s", "64", ns=ns)
    assert len(r) == 7 and all(x["send_result"] is True and x["rt_ms"] >= 0 for x in r)
    assert [x["qid"] for x in r] == [0, 1, 2, 0, 1, 2, 0]  # one queue after another
    table = ok("checkMsgSendRT", "-t", "RtTopic", "-a", "3", ns=ns)
    assert "Avg RT:" in table
    fails("checkMsgSendRT", "-t", "RtTopic", "-a", "1", ns=ns, needle="-a 1")
    fails("checkMsgSendRT", "-t", "NoSuchRtTopic", ns=ns, needle="NoSuchRtTopic")
    s = rows("sendMsgStatus", "-b", "broker-a", "-c", "5", "-s", "32", ns=ns)
    assert len(s) == 5 and {x["send_status"] for x in s} == {"SEND_OK"} and {x["broker_name"] for x in s} == {"broker-a"}
    fails("sendMsgStatus", "-b", "broker-zz", ns=ns, needle="broker-zz")
    fails("sendMsgStatus", "-b", "broker-a", "-c", "0", ns=ns, needle="-c 0")


def test_update_order_conf_and_namesrv_config(cl):
    ns = cl.namesrv
    put = rows("updateOrderConf", "-t", "OrderedTopic", "-v", "broker-a:4", ns=ns)
    assert put == [{"topic": "OrderedTopic", "method": "put", "order_conf": "broker-a:4"}]
    assert rows("updateOrderConf", "-t", "OrderedTopic", "-m", "get", ns=ns)[0]["order_conf"] == "broker-a:4"
    assert "delete orderConf success" in ok("updateOrderConf", "-t", "OrderedTopic", "-m", "delete", ns=ns)
    fails("updateOrderConf", "-t", "OrderedTopic", "-m", "get", ns=ns, needle="OrderedTopic")
    fails("updateOrderConf", "-t", "OrderedTopic", "-v", "broker-a:x", ns=ns, needle="broker-a:x")
    fails("updateOrderConf", "-t", "OrderedTopic", ns=ns, needle="-v")
    r = rows("updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "true", ns=ns)
    assert r == [{"name_server": ns, "key": "orderMessageEnable", "value": True}]  # typed: a JSON boolean
    cfg = rows("getNamesrvConfig", ns=ns)
    assert {"name_server": ns, "key": "orderMessageEnable", "value": True} in cfg
    ok("updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "false", ns=ns)
    fails("updateNamesrvConfig", "-k", "noSuchKey", "-v", "1", ns=ns, needle="noSuchKey")


def test_get_consumer_status(cl):
    ns = cl.namesrv
    c = sent_and_consumed(ns, "StatusTopic", "CG_STATUS", 6)
    try:
        r = wait_for(lambda: (lambda v: v if sum(x["offset"] for x in v) == 6 else None)(
            rows("getConsumerStatus", "-g", "CG_STATUS", "-t", "StatusTopic", ns=ns)), what="offsets 6 in all")
        assert {x["client_id"] for x in r} == {c.client_id} and {x["broker_name"] for x in r} == {"broker-a"}
        one = rows("getConsumerStatus", "-g", "CG_STATUS", "-t", "StatusTopic", "-i", c.client_id, ns=ns)
        assert one == r
        assert "get consumer status from client" in ok("getConsumerStatus", "-g", "CG_STATUS", "-t", "StatusTopic",
                                                       ns=ns)
        fails("getConsumerStatus", "-g", "CG_STATUS", "-t", "StatusTopic", "-i", "ghost@1", ns=ns, needle="ghost@1")
        fails("getConsumerStatus", "-g", "CG_NOBODY", "-t", "StatusTopic", ns=ns, needle="CG_NOBODY")
    finally:
        c.shutdown()


def test_clean_unused_topic_and_expired_cq(tmp_path):
    """A topic whose config is gone (edited out of topics.json while the broker was down) keeps its
    consume queues until cleanUnusedTopic; cleanExpiredCQ runs on a cluster's masters."""
    import json
    import os

    from tests.servers import RmqProcess

    c = NamesrvAndBroker(tmp_path)
    try:
        ns, addr = c.namesrv, c.broker_addrs[0]
        for topic in ("KeepMe", "Orphan"):
            ok("updateTopic", "-b", addr, "-t", topic, ns=ns)
        with Producer("PG_CLEAN", namesrv=ns, **CLIENT) as p:
            p.send(Message("KeepMe", b"k"))
            p.send(Message("Orphan", b"o"))
        c.brokers[0].terminate()
        store = tmp_path / "store-broker-a"
        topics_file = store / "config" / "topics.json"
        table = json.loads(topics_file.read_text())
        del table["topicConfigTable"]["Orphan"]
        topics_file.write_text(json.dumps(table))
        c.brokers[0] = RmqProcess(["broker", "-n", ns, "-c", str(tmp_path / "broker-a.conf"), "--listen-host",
                                   "127.0.0.1"], ("boot success",))
        c.brokers[0].wait_boot()
        assert os.path.isdir(store / "consumequeue" / "Orphan")
        r = rows("cleanUnusedTopic", "-b", addr, ns=ns)
        assert r[0]["broker_addr"] == addr and "Orphan" in r[0]["topics"].split(", ") and "KeepMe" not in r[0]["topics"]
        assert not os.path.exists(store / "consumequeue" / "Orphan")
        assert os.path.isdir(store / "consumequeue" / "KeepMe")
        assert "0 topic(s) removed" in ok("cleanUnusedTopic", "-c", "DefaultCluster", ns=ns)
        # nothing expired here: every queue stays
        assert rows("cleanExpiredCQ", "-c", "DefaultCluster", ns=ns) == [{"broker_addr": addr, "removed": 0, "queues": ""}]
        assert "cleanExpiredCQ: 0 consume queue(s) removed" in ok("cleanExpiredCQ", "-b", addr, ns=ns)
        fails("cleanExpiredCQ", "-b", "10.9.9.9:1", ns=ns, needle="10.9.9.9:1")
        fails("cleanUnusedTopic", ns=ns, needle="-b")
    finally:
        c.stop()


def undone_rows(*argv, ns):
    return [r for r in rows("startMonitoring", *argv, ns=ns) if r["report"] == "UNDONE_MSG"]


def test_start_monitoring_reports_undone_messages(cl):
    ns = cl.namesrv
    c = sent_and_consumed(ns, "MonitorTopic", "CG_MONITOR", 4)
    try:
        wait_for(lambda: [r for r in undone_rows("--rounds", "1", ns=ns)
                          if r["consumer_group"] == "CG_MONITOR" and r["undone_msgs"] == 0], what="caught up")
    finally:
        c.shutdown()
    with Producer("PG_MONITOR", namesrv=ns, **CLIENT) as p:  # the group is away: these stay undone
        for i in range(3):
            p.send(Message("MonitorTopic", f"late{i}".encode()))
    r = undone_rows("--rounds", "2", "--interval", "0.1", ns=ns)
    mine = [x for x in r if x["consumer_group"] == "CG_MONITOR"]
    assert len(mine) == 2 and all(x["topic"] == "MonitorTopic" and x["undone_msgs"] == 3 for x in mine)
    assert all(x["undone_delay_ms"] >= 0 and 1 <= x["undone_single_mq"] <= 3 for x in mine)
    assert "[UNDONE_MSG] round 1" in ok("startMonitoring", "--rounds", "1", ns=ns)
    fails("startMonitoring", "--json", ns=ns, needle="--rounds")
    fails("startMonitoring", "--rounds", "1", "--interval", "0", ns=ns, needle="--interval 0")


def test_start_monitoring_reports_failures_throughput_and_running_info(cl):
    """The rest of MonitorService's round against live consumers: the messages a member failed to
    consume (its running info's statusTable), each member's throughput, and what its running info
    shows wrong - here two members of one group subscribing differently."""
    ns = cl.namesrv
    calls = {"ok": 0, "failed": 0}
    lock = threading.Lock()

    def listener(msgs):
        bad = any(m.body.startswith(b"bad") for m in msgs)
        with lock:
            calls["failed" if bad else "ok"] += len(msgs)
        return ConsumeStatus.RECONSUME_LATER if bad else ConsumeStatus.CONSUME_SUCCESS

    make_topic(ns, cl.broker_addrs[0], "MonitorRun")  # (a consumer of a topic no route names joins no broker)
    members = []
    for i, expression in enumerate(("*", "TagA || TagB")):
        c = PushConsumer("CG_MONITOR_RUN", namesrv=ns, instance_name=f"monitor-{i}",
                         consume_from_where="CONSUME_FROM_FIRST_OFFSET", **CLIENT)
        c.subscribe("MonitorRun", expression)
        c.register_message_listener(listener)
        members.append(c.start())
    try:
        # both members registered with the broker before anything is sent (a member that joins late
        # finds every message consumed by the other and has no consumption to report)
        wait_for(lambda: admin("consumerConnection", "-g", "CG_MONITOR_RUN", "--json", ns=ns)[1].count("monitor-") == 2,
                 what="both members online")
        with Producer("PG_MONITOR_RUN", namesrv=ns, **CLIENT) as p:
            for i in range(8):
                p.send(Message("MonitorRun", b"%s-%d" % (b"bad" if i < 3 else b"good", i), tags="TagA"))
        wait_for(lambda: calls["failed"] >= 3 and calls["ok"] >= 5, what="the good consumed and the bad failed")
        r = rows("startMonitoring", "--rounds", "1", "--settle", "0", ns=ns)
        ids = {c.client_id for c in members}
        failed = [x for x in r if x["report"] == "FAILED_MSG" and x["consumer_group"] == "CG_MONITOR_RUN"
                  and x["topic"] == "MonitorRun"]
        assert {x["client_id"] for x in failed} <= ids and sum(x["failed_msgs_last_hour"] for x in failed) >= 3
        stats = [x for x in r if x["report"] == "CONSUME_STATS" and x["consumer_group"] == "CG_MONITOR_RUN"]
        assert {x["client_id"] for x in stats} == ids
        ran = [x for x in stats if x["topic"] == "MonitorRun"]
        assert sum(x["ok_tps"] for x in ran) > 0 and sum(x["pull_tps"] for x in ran) > 0
        assert all(x["consume_rt_ms"] >= 0 and x["pull_rt_ms"] >= 0 for x in ran)
        findings = [x for x in r if x["report"] == "RUNNING_INFO" and x["consumer_group"] == "CG_MONITOR_RUN"]
        assert {x["client_id"] for x in findings} == ids
        assert all(x["finding"].startswith("Subscription differs in the same group of consumer") for x in findings)
        # members that have not run for --settle seconds yet are not compared (a rolling change)
        assert not [x for x in rows("startMonitoring", "--rounds", "1", ns=ns)
                    if x["report"] == "RUNNING_INFO" and x["consumer_group"] == "CG_MONITOR_RUN"]
        table = ok("startMonitoring", "--rounds", "1", "--settle", "0", ns=ns)
        for kind in ("UNDONE_MSG", "FAILED_MSG", "CONSUME_STATS", "RUNNING_INFO"):
            assert f"[{kind}] round 1" in table
        assert "Subscription differs" in table
        fails("startMonitoring", "--rounds", "1", "--settle", "-1", ns=ns, needle="--settle -1")
    finally:
        for c in members:
            c.shutdown()
