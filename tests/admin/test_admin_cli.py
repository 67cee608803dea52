"""`rmq admin` against real `rmq namesrv` + `rmq broker` processes: every command, in table and
--json form, run in-process through the CLI's main() (a few as real subprocesses)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from rmq_core.cli import main
from tests.servers import NamesrvAndBroker

FAST = {"messageDelayLevel": "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
        "errorReplyDelayMs": "50", "lockRefuseReplyDelayMs": "50", "flushConsumerOffsetInterval": "500"}


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    c = NamesrvAndBroker(tmp_path_factory.mktemp("admin"), broker_props=FAST)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def ns(cl):
    return cl.namesrv


@pytest.fixture(scope="module")
def broker(cl):
    return cl.broker_addrs[0]


def admin(*argv, ns=None):
    """Run `rmq admin ...` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    args = ["admin", *argv] + (["-n", ns] if ns else [])
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as e:  # argparse usage errors
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def ok(*argv, ns):
    rc, out, err = admin(*argv, ns=ns)
    assert rc == 0, f"rmq admin {' '.join(argv)} -> {rc}\nstdout: {out}\nstderr: {err}"
    return out


def rows(*argv, ns):
    """The --json rows of a command."""
    return json.loads(ok(*argv, "--json", ns=ns))


def fails(*argv, ns, needle):
    rc, out, err = admin(*argv, ns=ns)
    assert rc != 0, f"expected a failure of {argv}, got: {out}"
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout}s")


def make_topic(ns, broker, topic, queues=4):
    ok("updateTopic", "-b", broker, "-t", topic, "-r", str(queues), "-w", str(queues), ns=ns)
    wait_for(lambda: admin("topicRoute", "-t", topic, ns=ns)[0] == 0, what=f"route of {topic}")


def send(ns, topic, n, key_prefix="k", body_prefix="m", tags="TagA"):
    with Producer(f"PG_{topic}", namesrv=ns) as p:
        return [p.send(Message(topic, f"{body_prefix}{i}".encode(), tags=tags, keys=f"{key_prefix}{i}")) for i in range(n)]


class Collector:
    def __init__(self, fail_bodies=()):
        self.bodies, self.lock = [], threading.Lock()
        self.fail_bodies = set(fail_bodies)

    def __call__(self, msgs):
        with self.lock:
            for m in msgs:
                if m.body in self.fail_bodies:
                    return ConsumeStatus.RECONSUME_LATER
                self.bodies.append(m.body)
        return ConsumeStatus.CONSUME_SUCCESS


def consumer(ns, group, topic, listener, **kw):
    c = PushConsumer(group, namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", rebalance_interval=1.0, **kw)
    c.subscribe(topic, "*")
    c.register_message_listener(listener)
    c.start()
    return c


# --- topics --------------------------------------------------------------------------------------------
def test_topic_commands(ns, broker):
    out = ok("updateTopic", "-b", broker, "-t", "AdmTopic", "-r", "3", "-w", "3", ns=ns)
    assert f"create topic to {broker} success." in out
    wait_for(lambda: admin("topicRoute", "-t", "AdmTopic", ns=ns)[0] == 0, what="route")
    assert "AdmTopic" in ok("topicList", ns=ns)
    assert {"topic": "AdmTopic"} in rows("topicList", ns=ns)
    assert any(r["topic"] == "AdmTopic" and r["cluster_name"] == "DefaultCluster" for r in rows("topicList", "-c", ns=ns))

    route = rows("topicRoute", "-t", "AdmTopic", ns=ns)
    assert route == [{"cluster_name": "DefaultCluster", "broker_name": "broker-a", "broker_addrs": f"0:{broker}",
                      "read_queue": 3, "write_queue": 3, "perm": 6}]
    assert "broker-a" in ok("topicRoute", "-t", "AdmTopic", ns=ns)

    send(ns, "AdmTopic", 6)
    status = rows("topicStatus", "-t", "AdmTopic", ns=ns)
    assert [r["qid"] for r in status] == [0, 1, 2]
    assert set(status[0]) == {"broker_name", "qid", "min_offset", "max_offset", "last_updated"}
    assert sum(r["max_offset"] for r in status) == 6 and all(r["min_offset"] == 0 for r in status)
    table = ok("topicStatus", "-t", "AdmTopic", ns=ns)
    for header in ("Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"):
        assert header in table

    assert rows("topicClusterList", "-t", "AdmTopic", ns=ns) == [{"cluster_name": "DefaultCluster"}]

    perm = rows("updateTopicPerm", "-t", "AdmTopic", "-b", broker, "-p", "4", ns=ns)
    assert perm == [{"broker_addr": broker, "topic": "AdmTopic", "old_perm": 6, "new_perm": 4}]
    wait_for(lambda: rows("topicRoute", "-t", "AdmTopic", ns=ns)[0]["perm"] == 4, what="perm in route")
    ok("updateTopicPerm", "-t", "AdmTopic", "-c", "DefaultCluster", "-p", "6", ns=ns)

    alloc = rows("allocateMQ", "-t", "AdmTopic", "-i", "10.0.0.1@1,10.0.0.2@1", ns=ns)
    assert [(r["client_id"], r["qid"]) for r in alloc] == [("10.0.0.1@1", 0), ("10.0.0.1@1", 1), ("10.0.0.2@1", 2)]

    make_topic(ns, broker, "AdmDoomed", 2)
    out = ok("deleteTopic", "-t", "AdmDoomed", "-c", "DefaultCluster", ns=ns)
    assert "delete topic [AdmDoomed] from cluster [DefaultCluster] success." in out
    fails("topicRoute", "-t", "AdmDoomed", ns=ns, needle="'AdmDoomed' does not exist")
    assert "AdmDoomed" not in ok("topicList", ns=ns)


# --- cluster, broker, name server -------------------------------------------------------------------------
def test_acl_commands_on_a_broker_without_acl_say_so(ns, broker):
    for argv in (("getAclConfig", "-b", broker), ("clusterAclConfigVersion", "-c", "DefaultCluster"),
                 ("updateAclConfig", "-b", broker, "-a", "someone1", "-s", "secret12"),
                 ("deleteAclConfig", "-b", broker, "-a", "someone1"),
                 ("updateGlobalWhiteAddr", "-b", broker, "-g", "10.1.1.*")):
        fails(*argv, ns=ns, needle="ACL is not enabled on broker[broker-a, ")
    # signing does no harm where nobody checks
    assert rows("topicList", "--access-key", "someone1", "--secret-key", "secret12", ns=ns)


def test_cluster_and_config_commands(ns, broker):
    cl_rows = rows("clusterList", ns=ns)
    assert len(cl_rows) == 1
    r = cl_rows[0]
    assert (r["cluster_name"], r["broker_name"], r["bid"], r["addr"], r["version"]) == \
        ("DefaultCluster", "broker-a", 0, broker, "V4_9_7")
    assert {"in_tps", "out_tps", "pc_wait_ms", "hour", "space"} <= set(r)
    # typed: hours of messages kept (this store is new) and the disk ratio are numbers, none is null
    assert r["hour"] is None or (type(r["hour"]) is float and 0 <= r["hour"] < 1)
    assert type(r["space"]) is float and 0 <= r["space"] <= 1 and type(r["in_tps"]) is float
    table = ok("clusterList", ns=ns)
    for header in ("Cluster Name", "Broker Name", "BID", "Addr", "Version", "InTPS", "OutTPS"):
        assert header in table

    status = {r["key"]: r["value"] for r in rows("brokerStatus", "-b", broker, ns=ns)}
    assert status["brokerVersionDesc"] == "V4_9_7" and "putTps" in status
    assert type(status["msgPutTotalTodayNow"]) is int  # a number as a JSON number
    assert rows("brokerStatus", "-c", "DefaultCluster", ns=ns)

    config = {r["key"]: r["value"] for r in rows("getBrokerConfig", "-b", broker, ns=ns)}
    assert config["brokerName"] == "broker-a"
    ok("updateBrokerConfig", "-b", broker, "-k", "defaultTopicQueueNums", "-v", "5", ns=ns)
    config = {r["key"]: r["value"] for r in rows("getBrokerConfig", "-c", "DefaultCluster", ns=ns)}
    assert config["defaultTopicQueueNums"] == 5 and config["autoCreateTopicEnable"] in (True, False)
    # a read-only broker (mqadmin's way to drain one): the routes say so, sends are refused
    make_topic(ns, broker, "AdmPerm", 1)
    ok("updateBrokerConfig", "-b", broker, "-k", "brokerPermission", "-v", "4", ns=ns)
    try:
        wait_for(lambda: rows("topicRoute", "-t", "AdmPerm", ns=ns)[0]["perm"] == 4, what="perm 4 in the route")
        fails("sendMessage", "-t", "AdmPerm", "-p", "x", "-b", "broker-a", "-i", "0", ns=ns, needle="AdmPerm")
    finally:
        ok("updateBrokerConfig", "-b", broker, "-k", "brokerPermission", "-v", "6", ns=ns)
    wait_for(lambda: rows("topicRoute", "-t", "AdmPerm", ns=ns)[0]["perm"] == 6, what="perm 6 in the route")
    # a key a running broker cannot take is kept for its next start, and the answer says so
    assert "takes effect after a restart" in ok("updateBrokerConfig", "-b", broker, "-k", "brokerName", "-v", "broker-a", ns=ns)
    fails("updateBrokerConfig", "-b", broker, "-k", "noSuchKey", "-v", "1", ns=ns, needle="unknown config key 'noSuchKey'")
    fails("updateBrokerConfig", "-b", broker, "-k", "defaultTopicQueueNums", "-v", "abc", ns=ns, needle="abc")

    nsconf = rows("getNamesrvConfig", ns=ns)
    assert {"name_server": ns, "key": "listenPort", "value": int(ns.rpartition(":")[2])} in nsconf

    ok("updateKvConfig", "-s", "ADM_NS", "-k", "k1", "-v", "v1", ns=ns)
    from rmq_core.admin import AdminClient
    with AdminClient(ns) as a:
        assert a.get_kv_config("ADM_NS", "k1") == "v1"
        assert "delete kv config" in ok("deleteKvConfig", "-s", "ADM_NS", "-k", "k1", ns=ns)
        assert a.get_kv_config("ADM_NS", "k1") is None
    fails("deleteKvConfig", "-s", "ADM_NS", "-k", "k1", ns=ns, needle="no KV config item 'k1'")

    rt = rows("clusterRT", "-a", "5", "-s", "16", ns=ns)
    assert rt[0]["broker_name"] == "broker-a" and rt[0]["success_count"] == 5 and rt[0]["fail_count"] == 0

    make_topic(ns, broker, "AdmStats", 2)
    send(ns, "AdmStats", 3)
    stats = rows("statsAll", "-t", "AdmStats", ns=ns)
    assert stats[0]["topic"] == "AdmStats" and stats[0]["in_msg24_hour"] == 3


# --- messages ---------------------------------------------------------------------------------------------
def test_message_commands(ns, broker):
    make_topic(ns, broker, "AdmMsg", 2)
    sent = send(ns, "AdmMsg", 4, key_prefix="key", body_prefix="body")
    first = sent[0]

    found = rows("queryMsgByKey", "-t", "AdmMsg", "-k", "key1", ns=ns)
    assert [r["message_id"] for r in found] == [sent[1].msg_id]  # the producer's UNIQ_KEY, as mqadmin
    assert "Message ID" in ok("queryMsgByKey", "-t", "AdmMsg", "-k", "key1", ns=ns)
    fails("queryMsgByKey", "-t", "AdmMsg", "-k", "nokey", ns=ns, needle="no message with key 'nokey'")

    by_offset_id = rows("queryMsgById", "-i", first.offset_msg_id, ns=ns)
    assert by_offset_id[0]["message_id"] == first.msg_id and by_offset_id[0]["body"] == "body0"
    assert by_offset_id[0]["offset_id"] == first.offset_msg_id and by_offset_id[0]["keys"] == "key0"
    by_uniq = rows("queryMsgById", "-i", first.msg_id, "-t", "AdmMsg", ns=ns)
    assert by_uniq[0]["queue_offset"] == first.queue_offset
    table = ok("queryMsgById", "-i", first.offset_msg_id, ns=ns)
    assert first.msg_id in table and "Store Timestamp:" in table
    fails("queryMsgById", "-i", "nothex", ns=ns, needle="'nothex' not found")

    uq = rows("queryMsgByUniqueKey", "-i", sent[2].msg_id, "-t", "AdmMsg", ns=ns)
    assert uq[0]["body"] == "body2"
    fails("queryMsgByUniqueKey", "-i", "00" * 16, "-t", "AdmMsg", ns=ns, needle="no message with unique key")

    q = sent[3].queue
    bo = rows("queryMsgByOffset", "-t", "AdmMsg", "-b", q.broker_name, "-i", str(q.queue_id), "-o", str(sent[3].queue_offset), ns=ns)
    assert bo[0]["body"] == "body3" and bo[0]["message_id"] == sent[3].msg_id
    fails("queryMsgByOffset", "-t", "AdmMsg", "-b", q.broker_name, "-i", str(q.queue_id), "-o", "999", ns=ns,
          needle="no message at offset 999")

    printed = rows("printMsg", "-t", "AdmMsg", ns=ns)
    assert sorted(r["body"] for r in printed) == ["body0", "body1", "body2", "body3"]
    assert set(printed[0]) == {"message_id", "broker_name", "qid", "offset", "store_time", "tags", "keys", "body"}
    rc, out, err = admin("printMsg", "-t", "AdmMsg", ns=ns)
    assert rc == 0 and "body2" in out and "4 messages" in out
    by_queue = rows("printMsgByQueue", "-t", "AdmMsg", "-a", q.broker_name, "-i", str(q.queue_id), ns=ns)
    assert sent[3].msg_id in [r["message_id"] for r in by_queue]
    tags = rows("printMsgByQueue", "-t", "AdmMsg", "-a", q.broker_name, "-i", str(q.queue_id), "-f", "true", ns=ns)
    assert tags == [{"tag": "TagA", "count": len(by_queue)}]

    s = rows("sendMessage", "-t", "AdmMsg", "-p", "hello", "-k", "adm", "-c", "T", "-b", "broker-a", "-i", "1", ns=ns)
    assert s[0]["broker_name"] == "broker-a" and s[0]["qid"] == 1 and s[0]["send_result"] == "SEND_OK"
    assert rows("queryMsgById", "-i", s[0]["msg_id"], "-t", "AdmMsg", ns=ns)[0]["body"] == "hello"

    consumed = rows("consumeMessage", "-t", "AdmMsg", "-b", "broker-a", "-i", "1", "-o", "0", ns=ns)
    assert "hello" in [r["body"] for r in consumed]
    assert len(rows("consumeMessage", "-t", "AdmMsg", "-c", "2", ns=ns)) == 2


# --- consumer groups --------------------------------------------------------------------------------------
def test_consumer_group_commands(ns, broker):
    make_topic(ns, broker, "AdmCons", 4)
    send(ns, "AdmCons", 8)
    col = Collector()
    c = consumer(ns, "AdmGroup", "AdmCons", col)
    p = Producer("AdmProducerGroup", namesrv=ns)
    p.start()
    try:
        p.send(Message("AdmCons", b"from-live-producer"))
        wait_for(lambda: len(col.bodies) >= 9, what="consumption")
        # (the group's rows appear with its first committed offsets: an empty table is not "diff 0")
        wait_for(lambda: [r["diff"] for r in rows("consumerProgress", "-g", "AdmGroup", ns=ns)
                          if r["topic"] == "AdmCons"] == [0, 0, 0, 0], what="diff 0 on the 4 queues")
        prog = rows("consumerProgress", "-g", "AdmGroup", ns=ns)
        assert {r["topic"] for r in prog} >= {"AdmCons"}
        mine = [r for r in prog if r["topic"] == "AdmCons"]
        assert sum(r["consumer_offset"] for r in mine) == 9 and [r["qid"] for r in mine] == [0, 1, 2, 3]
        assert set(mine[0]) == {"topic", "broker_name", "qid", "broker_offset", "consumer_offset", "diff", "inflight",
                                "last_time"}
        table = ok("consumerProgress", "-g", "AdmGroup", ns=ns)
        assert "Consume TPS:" in table and "Diff Total: 0" in table and "LastTime" in table
        with_ip = rows("consumerProgress", "-g", "AdmGroup", "-s", "true", ns=ns)
        assert all(r["client_ip"] != "N/A" for r in with_ip if r["topic"] == "AdmCons")

        groups = rows("consumerProgress", ns=ns)
        g = next(r for r in groups if r["group"] == "AdmGroup")
        assert g["count"] == 1 and g["type"] == "PUSH" and g["model"] == "CLUSTERING" and g["diff_total"] == 0

        conns = rows("consumerConnection", "-g", "AdmGroup", ns=ns)
        assert len(conns) == 1 and conns[0]["language"] == "PYTHON"
        assert "Below is subscription:" in ok("consumerConnection", "-g", "AdmGroup", ns=ns)

        status = rows("consumerStatus", "-g", "AdmGroup", ns=ns)
        assert status[0]["client_id"] == conns[0]["client_id"] and status[0]["queues"] >= 4
        detail = rows("consumerStatus", "-g", "AdmGroup", "-i", conns[0]["client_id"], ns=ns)
        assert sorted(r["qid"] for r in detail if r["topic"] == "AdmCons") == [0, 1, 2, 3]
        fails("consumerStatus", "-g", "AdmGroup", "-i", "nobody@x", ns=ns, needle="'nobody@x' is not a member")

        pc = rows("producerConnection", "-g", "AdmProducerGroup", "-t", "AdmCons", ns=ns)
        assert len(pc) == 1 and pc[0]["language"] == "PYTHON"
        fails("producerConnection", "-g", "NoSuchProducer", "-t", "AdmCons", ns=ns, needle="'NoSuchProducer' is not online")

        bcs = rows("brokerConsumeStats", "-b", broker, ns=ns)
        assert any(r["group"] == "AdmGroup" and r["topic"] == "AdmCons" for r in bcs)
        assert "Diff Total:" in ok("brokerConsumeStats", "-b", broker, ns=ns)
    finally:
        p.shutdown()
        c.shutdown()

    # subscription groups, clone
    upd = rows("updateSubGroup", "-b", broker, "-g", "AdmSub", "-r", "3", ns=ns)
    assert upd == [{"broker_addr": broker, "group": "AdmSub", "consume_enable": True, "broadcast_enable": False,
                    "retry_queues": 1, "retry_max_times": 3}]
    cloned = rows("cloneGroupOffset", "-s", "AdmGroup", "-d", "AdmSub", "-t", "AdmCons", ns=ns)
    assert sum(r["consumer_offset"] for r in cloned) == 9
    assert "clone group offset success" in ok("cloneGroupOffset", "-s", "AdmGroup", "-d", "AdmSub", "-t", "AdmCons", ns=ns)
    ok("deleteSubGroup", "-b", broker, "-g", "AdmSub", "-r", "true", ns=ns)
    fails("deleteSubGroup", "-b", broker, "-g", "AdmSub", ns=ns, needle="'AdmSub' does not exist")


def test_reset_offset_by_time_rewinds_a_live_group(ns, broker):
    make_topic(ns, broker, "AdmReset", 2)
    send(ns, "AdmReset", 6)
    col = Collector()
    c = consumer(ns, "AdmResetGroup", "AdmReset", col)
    try:
        wait_for(lambda: len(col.bodies) >= 6, what="first consumption")
        wait_for(lambda: [r["diff"] for r in rows("consumerProgress", "-g", "AdmResetGroup", ns=ns)
                          if r["topic"] == "AdmReset"] == [0, 0], what="commit")
        reset = rows("resetOffsetByTime", "-g", "AdmResetGroup", "-t", "AdmReset", "-s", "0", ns=ns)
        assert [(r["qid"], r["offset"]) for r in reset] == [(0, 0), (1, 0)]
        wait_for(lambda: len(col.bodies) >= 12, what="re-consumption after the reset")
        assert sorted(col.bodies[6:12]) == sorted(col.bodies[:6])
    finally:
        c.shutdown()


def test_reset_offset_of_an_offline_group_moves_the_broker_offsets(ns, broker):
    make_topic(ns, broker, "AdmOffline", 2)
    send(ns, "AdmOffline", 4)
    ok("updateSubGroup", "-b", broker, "-g", "AdmOfflineGroup", ns=ns)
    skipped = rows("skipAccumulatedMessage", "-g", "AdmOfflineGroup", "-t", "AdmOffline", ns=ns)
    assert sum(r["offset"] for r in skipped) == 4
    prog = rows("consumerProgress", "-g", "AdmOfflineGroup", ns=ns)
    assert sum(r["consumer_offset"] for r in prog if r["topic"] == "AdmOffline") == 4
    out = ok("resetOffsetByTime", "-g", "AdmOfflineGroup", "-t", "AdmOffline", "-s", "0", ns=ns)
    assert "rollback consumer offset" in out
    prog = rows("consumerProgress", "-g", "AdmOfflineGroup", ns=ns)
    assert [r["consumer_offset"] for r in prog if r["topic"] == "AdmOffline"] == [0, 0]
    assert sum(r["diff"] for r in prog) == 4
    # and a consumer started now begins where the broker's offsets say
    col = Collector()
    c = consumer(ns, "AdmOfflineGroup", "AdmOffline", col)
    try:
        wait_for(lambda: len(col.bodies) >= 4, what="consumption from the reset offsets")
    finally:
        c.shutdown()


# --- dead letters -----------------------------------------------------------------------------------------
def test_dlq_list_and_resend_redelivers(ns, broker):
    make_topic(ns, broker, "AdmDlq", 2)
    ok("updateSubGroup", "-b", broker, "-g", "AdmDlqGroup", "-r", "0", ns=ns)
    col = Collector(fail_bodies={b"poison"})
    c = consumer(ns, "AdmDlqGroup", "AdmDlq", col, max_reconsume_times=0)
    try:
        with Producer("PG_dlq", namesrv=ns) as p:
            bad = p.send(Message("AdmDlq", b"poison", keys="bad"))
            p.send(Message("AdmDlq", b"fine"))
        wait_for(lambda: b"fine" in col.bodies, what="the good message")
        dead = wait_for(lambda: admin("dlq", "list", "-g", "AdmDlqGroup", "--json", ns=ns)[0] == 0 and
                        rows("dlq", "list", "-g", "AdmDlqGroup", ns=ns), what="a dead letter")
        assert [(d["message_id"], d["original_topic"], d["body"]) for d in dead] == [(bad.msg_id, "AdmDlq", "poison")]
        assert "1 dead letters" in ok("dlq", "list", "-g", "AdmDlqGroup", ns=ns)

        col.fail_bodies.clear()  # the consumer is fixed; send the dead letter back
        fails("dlq", "resend", "-g", "AdmDlqGroup", "-i", "NOPE", ns=ns, needle="NOPE")
        sent = rows("dlq", "resend", "-g", "AdmDlqGroup", "-i", bad.msg_id, ns=ns)
        assert sent[0]["message_id"] == bad.msg_id and sent[0]["topic"] == "%RETRY%AdmDlqGroup"
        wait_for(lambda: b"poison" in col.bodies, what="redelivery of the resent dead letter")
    finally:
        c.shutdown()
    fails("dlq", "list", "-g", "AdmNoDlq", ns=ns, needle="'AdmNoDlq' has no dead-letter queue")


def test_dlq_skip_unblocks_an_orderly_queue(ns, broker):
    make_topic(ns, broker, "AdmOrder", 1)
    seen = []

    def listener(msgs):
        for m in msgs:
            if m.body == b"poison":
                return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            seen.append(m.body)
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer("PG_order", namesrv=ns) as p:
        for body in (b"a", b"poison", b"b", b"c"):
            p.send(Message("AdmOrder", body))
    c = PushConsumer("AdmOrderGroup", namesrv=ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     rebalance_interval=1.0, suspend_current_queue_time=0.2)
    c.subscribe("AdmOrder", "*")
    c.register_message_listener(listener, orderly=True)
    c.start()
    try:
        wait_for(lambda: seen == [b"a"], what="the first message")
        wait_for(lambda: any(r["consumer_offset"] == 1 for r in rows("consumerProgress", "-g", "AdmOrderGroup", ns=ns)
                             if r["topic"] == "AdmOrder"), what="the stalled offset committed")
        time.sleep(0.5)
        assert seen == [b"a"]  # stalled on the poison message
        skip = rows("dlq", "skip", "-g", "AdmOrderGroup", "-t", "AdmOrder", "-b", "broker-a", "-i", "0", ns=ns)
        assert skip[0]["skipped_offset"] == 1 and skip[0]["new_offset"] == 2
        wait_for(lambda: seen == [b"a", b"b", b"c"], what="the queue moving past the poison message")
        dead = rows("dlq", "list", "-g", "AdmOrderGroup", ns=ns)
        assert [d["body"] for d in dead] == ["poison"]
    finally:
        c.shutdown()


# --- errors -----------------------------------------------------------------------------------------------
def test_unknown_topic_group_broker_give_one_line(ns, broker):
    fails("topicStatus", "-t", "NoSuchTopic", ns=ns, needle="topic 'NoSuchTopic' does not exist")
    fails("consumerProgress", "-g", "NoSuchGroup", ns=ns, needle="consumer group 'NoSuchGroup' does not exist")
    fails("consumerConnection", "-g", "NoSuchGroup", ns=ns, needle="'NoSuchGroup' is not online")
    fails("brokerStatus", "-b", "127.0.0.1:1", ns=ns, needle="broker 127.0.0.1:1 is not registered")
    fails("queryMsgByOffset", "-t", "TBW102", "-b", "no-broker", "-i", "0", "-o", "0", ns=ns,
          needle="broker 'no-broker' does not exist")
    fails("clusterList", "-c", "NoCluster", ns=ns, needle="cluster 'NoCluster' does not exist")
    fails("updateTopic", "-b", broker, "-t", "X", "-p", "7", ns=ns, needle="bad perm 7")
    fails("updateTopic", "-t", "X", ns=ns, needle="-b HOST:PORT")
    fails("resetOffsetByTime", "-g", "G", "-t", "TBW102", "-s", "yesterday", ns=ns, needle="bad timestamp 'yesterday'")
    fails("topicStatus", ns=ns, needle="-t/--topic")
    fails("topicList", ns="127.0.0.1:1", needle="127.0.0.1:1")
    env = os.environ.pop("NAMESRV_ADDR", None)
    try:
        fails("topicList", ns=None, needle="NAMESRV_ADDR")
    finally:
        if env is not None:
            os.environ["NAMESRV_ADDR"] = env


def test_as_subprocess_with_namesrv_from_environment(ns, broker):
    make_topic(ns, broker, "AdmProc", 2)
    send(ns, "AdmProc", 2)
    env = {**os.environ, "NAMESRV_ADDR": ns}
    r = subprocess.run([sys.executable, "-m", "rmq_core.cli", "admin", "topicStatus", "-t", "AdmProc", "--json"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sum(row["max_offset"] for row in json.loads(r.stdout)) == 2
    # a long operation draws a progress bar on stderr (a terminal's; FORCE_COLOR makes rich draw it here)
    r = subprocess.run([sys.executable, "-m", "rmq_core.cli", "admin", "printMsg", "-t", "AdmProc", "--json"],
                       capture_output=True, text=True, env={**env, "FORCE_COLOR": "1"}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 2
    assert "printMsg" in r.stderr and "2/2" in r.stderr
    r = subprocess.run([sys.executable, "-m", "rmq_core.cli", "admin", "consumerProgress", "-g", "NoSuchGroup"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and "NoSuchGroup" in r.stderr and "Traceback" not in r.stderr


def test_rich_is_not_imported_by_rmq_core():
    code = "import sys, rmq_core, rmq_core.cli; rmq_core.cli.build_parser(); print('rich' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_commands_span_every_broker_of_a_cluster(tmp_path):
    two = NamesrvAndBroker(tmp_path, brokers=2, broker_props=FAST)
    try:
        ns = two.namesrv
        wait_for(lambda: len(rows("clusterList", ns=ns)) == 2, what="both brokers registered")
        made = rows("updateTopic", "-c", "DefaultCluster", "-t", "AdmWide", "-r", "2", "-w", "2", ns=ns)
        assert sorted(r["broker_addr"] for r in made) == sorted(two.broker_addrs)
        wait_for(lambda: admin("topicRoute", "-t", "AdmWide", ns=ns)[0] == 0 and
                 len(rows("topicRoute", "-t", "AdmWide", ns=ns)) == 2, what="route over both brokers")
        sent = send(ns, "AdmWide", 8, key_prefix="same", body_prefix="w")
        assert {r.queue.broker_name for r in sent} == {"broker-a", "broker-b"}
        status = rows("topicStatus", "-t", "AdmWide", ns=ns)
        assert [(r["broker_name"], r["qid"]) for r in status] == [("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]
        assert sum(r["max_offset"] for r in status) == 8
        assert len(rows("printMsg", "-t", "AdmWide", ns=ns)) == 8
        with Producer("PG_same", namesrv=ns) as p:
            for _ in range(2):
                p.send(Message("AdmWide", b"dup", keys="shared"))
        assert {r["broker_name"] for r in rows("queryMsgByKey", "-t", "AdmWide", "-k", "shared", ns=ns)} <= {"broker-a", "broker-b"}
        assert len(rows("queryMsgByKey", "-t", "AdmWide", "-k", "shared", ns=ns)) == 2
        ok("updateSubGroup", "-c", "DefaultCluster", "-g", "AdmWideGroup", ns=ns)
        skipped = rows("skipAccumulatedMessage", "-g", "AdmWideGroup", "-t", "AdmWide", ns=ns)
        assert {r["broker_name"] for r in skipped} == {"broker-a", "broker-b"} and sum(r["offset"] for r in skipped) == 10
        prog = rows("consumerProgress", "-g", "AdmWideGroup", ns=ns)
        assert len(prog) == 4 and sum(r["diff"] for r in prog) == 0
        ok("deleteTopic", "-t", "AdmWide", "-c", "DefaultCluster", ns=ns)
        fails("topicStatus", "-t", "AdmWide", ns=ns, needle="'AdmWide' does not exist")
    finally:
        two.stop()
