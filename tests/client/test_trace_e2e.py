"""Message trace end to end against real `rmq namesrv` + `rmq broker` processes: traced producers
and consumers (sync, PushConsumer, PullConsumer, rmq_core.aio) record Pub, SubBefore and SubAfter
through their client's inner producer; `rmq admin queryMsgTraceById` and AdminClient.message_trace
read them back; a full trace buffer drops records without failing a send."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import zlib

import pytest

from rmq_core import (ConsumeStatus, LocalTransactionState, Message, Producer, PullConsumer, PushConsumer,
                      TransactionProducer, aio)
from rmq_core.admin.client import AdminClient
from rmq_core.client.trace import TraceType, decode
from rmq_core.compression import COMPRESSED_FLAG, COMPRESSION_TYPE_MASK, COMPRESSION_ZLIB
from tests.admin.test_admin_cli import admin, fails, ok, rows, wait_for
from tests.servers import NamesrvAndBroker

FAST = dict(poll_name_server_interval=1.0, heartbeat_broker_interval=1.0, persist_consumer_offset_interval=1.0)


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    # traceTopicEnable creates RMQ_SYS_TRACE_TOPIC though topics are never made on the fly here
    # (a half message left UNKNOW is checked back within a second or two; a retry comes in 1 s)
    c = NamesrvAndBroker(tmp_path_factory.mktemp("trace"), broker_props={
        "traceTopicEnable": "true", "autoCreateTopicEnable": "false", "transactionCheckInterval": "1000",
        "transactionTimeOut": "1000", "messageDelayLevel": " ".join(["1s"] * 18)})
    try:
        for topic in ("TraceOrders", "TracePull", "TraceAio", "MyTraceTopic", "TraceFull", "TraceBatch", "TraceTx",
                      "TraceBig", "TraceAioPush"):
            ok("updateTopic", "-b", c.broker_addrs[0], "-t", topic, "-r", "2", "-w", "2", ns=c.namesrv)
        yield c
    finally:
        c.stop()


def trace_rows(ns, msg_id, *extra):
    return rows("queryMsgTraceById", "-i", msg_id, *extra, ns=ns)


def test_trace_topic_made_by_the_broker(cl):
    route = rows("topicRoute", "-t", "RMQ_SYS_TRACE_TOPIC", ns=cl.namesrv)
    assert route, "the broker registered no route for RMQ_SYS_TRACE_TOPIC"


def test_send_and_push_consume_are_traced(cl):
    ns, broker = cl.namesrv, cl.broker_addrs[0]
    got = threading.Event()

    def listener(msgs):
        got.set()
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("CG_TRACE", namesrv=ns, enable_msg_trace=True, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     **FAST)
    c.subscribe("TraceOrders", "*")
    c.register_message_listener(listener)
    c.start()
    try:
        with Producer("PG_TRACE", namesrv=ns, enable_msg_trace=True, **FAST) as p:
            r = p.send(Message("TraceOrders", b"order body", tags="TagA", keys="order-17"))
        assert got.wait(30)
        views = wait_for(lambda: (lambda v: v if {x["msgType"] for x in v} >= {"Pub", "SubBefore", "SubAfter"}
                                  else None)(trace_rows(ns, r.msg_id)), what="Pub, SubBefore and SubAfter")
    finally:
        c.shutdown()
    pub = next(v for v in views if v["msgType"] == "Pub")
    assert (pub["groupName"], pub["topic"], pub["tags"], pub["keys"], pub["storeHost"], pub["status"]) == (
        "PG_TRACE", "TraceOrders", "TagA", "order-17", broker, "success")
    # RocketMQ's TraceView fields, typed: costTime in integer ms
    assert (pub["msgId"], pub["offsetMsgId"]) == (r.msg_id, r.offset_msg_id)
    assert type(pub["costTime"]) is int and pub["costTime"] >= 0
    assert pub["timeStamp"] > 0 and pub["bornTime"] > 0 and pub["clientHost"]
    assert {"msgId", "offsetMsgId", "tags", "keys", "storeHost", "clientHost", "costTime", "msgType", "timeStamp",
            "bornTime", "topic", "groupName", "status"} <= set(pub)
    subs = [v for v in views if v["msgType"] != "Pub"]
    assert {v["groupName"] for v in subs} == {"CG_TRACE"}
    after = next(v for v in subs if v["msgType"] == "SubAfter")
    assert after["status"] == "success" and after["keys"] == "order-17"
    # the same through the library call, with the offset id and the request id linking SubBefore/After
    with AdminClient(ns) as a:
        lib = a.message_trace(r.msg_id)
    assert {v.type for v in lib} >= {"Pub", "SubBefore", "SubAfter"}
    assert next(v for v in lib if v.type == "Pub").offset_msg_id == r.offset_msg_id
    assert all(v.msg_id == r.msg_id and v.born_time > 0 for v in lib)
    before = next(v for v in lib if v.type == "SubBefore")
    assert before.request_id == next(v for v in lib if v.type == "SubAfter").request_id
    # the table form: a row per record
    table = ok("queryMsgTraceById", "-i", r.msg_id, ns=ns)
    assert "PG_TRACE" in table and "CG_TRACE" in table and "SubAfter" in table


def test_failed_consume_is_traced_as_failed(cl):
    ns = cl.namesrv
    calls = []

    def listener(msgs):
        calls.append(msgs[0].msg_id)
        if len(calls) == 1:
            raise RuntimeError("not yet")
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer("PG_TRACE_FAIL", namesrv=ns, **FAST) as p:  # an untraced producer: only the consumer records
        r = p.send(Message("TraceFull", b"x", keys="k-fail"))
    c = PushConsumer("CG_TRACE_FAIL", namesrv=ns, enable_msg_trace=True, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     **FAST)
    c.subscribe("TraceFull", "*")
    c.register_message_listener(listener)
    c.start()
    try:
        wait_for(lambda: len(calls) >= 1, what="the first delivery")
        views = wait_for(lambda: (lambda v: v if any(x["msgType"] == "SubAfter" for x in v) else None)(
            trace_rows(ns, r.msg_id)), what="the failed SubAfter")
    finally:
        c.shutdown()
    assert not any(v["msgType"] == "Pub" for v in views)
    assert any(v["msgType"] == "SubAfter" and v["status"] == "failed" for v in views)


def test_pull_consumer_and_customised_trace_topic(cl):
    ns = cl.namesrv
    with Producer("PG_TRACE_PULL", namesrv=ns, enable_msg_trace=True, customized_trace_topic="MyTraceTopic",
                  **FAST) as p:
        r = p.send(Message("TracePull", b"pulled", tags="T1"))
    c = PullConsumer("CG_TRACE_PULL", namesrv=ns, enable_msg_trace=True, customized_trace_topic="MyTraceTopic",
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    c.subscribe("TracePull", "*")
    c.start()
    try:
        got = wait_for(lambda: [m for m in c.poll(1.0) if m.msg_id == r.msg_id], what="the message polled")
        assert got
        c.commit()  # the polled batch counts as consumed: its SubAfter
        views = wait_for(lambda: (lambda v: v if {x["msgType"] for x in v} >= {"Pub", "SubBefore", "SubAfter"}
                                  else None)(trace_rows(ns, r.msg_id, "-t", "MyTraceTopic")),
                         what="the records in MyTraceTopic")
    finally:
        c.shutdown()
    assert {v["groupName"] for v in views} == {"PG_TRACE_PULL", "CG_TRACE_PULL"}
    # nothing went to the default trace topic
    assert trace_rows(ns, r.msg_id) == []


def test_aio_producer_and_consumer_are_traced(cl):
    ns = cl.namesrv

    async def run():
        async with aio.Producer("PG_TRACE_AIO", namesrv=ns, enable_msg_trace=True, **FAST) as p:
            r = await p.send(Message("TraceAio", b"aio body"))
        c = aio.PullConsumer("CG_TRACE_AIO", namesrv=ns, enable_msg_trace=True,
                             consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
        c.subscribe("TraceAio", "*")
        await c.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if any(m.msg_id == r.msg_id for m in await c.poll(1.0)):
                    break
            await c.commit()
        finally:
            await c.shutdown()
        return r

    r = asyncio.run(run())
    views = wait_for(lambda: (lambda v: v if {x["msgType"] for x in v} >= {"Pub", "SubBefore", "SubAfter"}
                              else None)(trace_rows(ns, r.msg_id)), what="the aio records")
    assert {v["groupName"] for v in views} == {"PG_TRACE_AIO", "CG_TRACE_AIO"}


def test_aio_push_consumer_is_traced(cl):
    """aio.PushConsumer wraps the push consumer: its coroutine listener's calls are recorded as
    SubBefore/SubAfter of its own group, a failing call as failed, its redelivery as a new pair."""
    ns = cl.namesrv
    calls: list[str] = []

    async def run():
        done = asyncio.Event()

        async def listener(msgs):
            calls.append(msgs[0].msg_id)
            if len(calls) == 1:
                return ConsumeStatus.RECONSUME_LATER  # the first delivery fails: traced as failed
            done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        # (rebalance_interval: the retry topic's queue is taken within a second of its creation)
        c = aio.PushConsumer("CG_TRACE_AIO_PUSH", namesrv=ns, enable_msg_trace=True, rebalance_interval=1.0,
                             consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
        c.subscribe("TraceAioPush", "*")
        c.register_message_listener(listener)
        async with aio.Producer("PG_TRACE_AIO_PUSH", namesrv=ns, **FAST) as p:  # untraced: only the consumer records
            r = await p.send(Message("TraceAioPush", b"aio push body", tags="TagP", keys="aio-push-1"))
        async with c:
            await asyncio.wait_for(done.wait(), 60)
            assert c.consumer.trace is not None
            c.consumer.trace.flush(30)
        return r

    r = asyncio.run(run())
    assert calls == [r.msg_id, r.msg_id]
    views = _types_of(cl.namesrv, r.msg_id, ["SubBefore", "SubAfter", "SubBefore", "SubAfter"])
    assert {v["groupName"] for v in views} == {"CG_TRACE_AIO_PUSH"}
    assert sorted(v["status"] for v in views if v["msgType"] == "SubAfter") == ["failed", "success"]
    assert {v["keys"] for v in views} == {"aio-push-1"}
    with AdminClient(ns) as a:
        lib = a.message_trace(r.msg_id)
    befores = {v.request_id: v.retry_times for v in lib if v.type == "SubBefore"}
    assert {v.request_id for v in lib if v.type == "SubAfter"} == set(befores)  # each call's pair linked
    assert sorted(befores.values()) == [0, 1]  # the redelivery is the first retry


def _types_of(ns, msg_id, wanted: list[str]):
    """The trace rows of a message once every type in `wanted` is there (as many of each)."""
    def ready():
        v = trace_rows(ns, msg_id)
        return v if sorted(x["msgType"] for x in v) == sorted(wanted) else None
    return wait_for(ready, what=f"the records {wanted} of {msg_id}")


def test_batches_are_traced_one_record_per_message(cl):
    ns, broker = cl.namesrv, cl.broker_addrs[0]
    with Producer("PG_TRACE_BATCH", namesrv=ns, enable_msg_trace=True, **FAST) as p:
        r = p.send_batch([Message("TraceBatch", b"one", keys="k-1"), Message("TraceBatch", b"two!", tags="T2")])
        ra = p.send_batch_async([Message("TraceBatch", b"three", keys="k-3")]).result(30)
    with Producer("PG_TRACE_AUTO", namesrv=ns, enable_msg_trace=True, auto_batch=True, **FAST) as p:
        auto = [f.result(30) for f in [p.send_async(Message("TraceBatch", b"auto %d" % i, keys=f"auto-{i}"))
                                       for i in range(20)]]
    ids = r.msg_id.split(",")
    assert len(ids) == 2
    one, = _types_of(ns, ids[0], ["Pub"])
    two, = _types_of(ns, ids[1], ["Pub"])
    assert (one["groupName"], one["keys"], one["storeHost"], one["status"]) == ("PG_TRACE_BATCH", "k-1", broker, "success")
    assert (two["tags"], two["keys"]) == ("T2", "")
    three, = _types_of(ns, ra.msg_id, ["Pub"])
    assert three["keys"] == "k-3"
    for i, res in enumerate(auto):  # each message of an auto batch is found by its own id
        pub, = _types_of(ns, res.msg_id, ["Pub"])
        assert (pub["groupName"], pub["keys"], pub["storeHost"]) == ("PG_TRACE_AUTO", f"auto-{i}", broker)
    with AdminClient(ns) as a:
        assert next(v for v in a.message_trace(ids[1]) if v.type == "Pub").offset_msg_id == r.offset_msg_id.split(",")[1]


class _Tx:
    def __init__(self):
        self.checked = threading.Event()

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE if arg == "commit" else LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        self.checked.set()
        return LocalTransactionState.ROLLBACK_MESSAGE


def test_end_transaction_is_traced(cl):
    ns, broker = cl.namesrv, cl.broker_addrs[0]
    listener = _Tx()
    with TransactionProducer("PG_TRACE_TX", namesrv=ns, transaction_listener=listener, enable_msg_trace=True,
                             **FAST) as p:
        committed = p.send_message_in_transaction(Message("TraceTx", b"pay", tags="TagTx", keys="tx-1"), "commit")
        checked = p.send_message_in_transaction(Message("TraceTx", b"later", keys="tx-2"), "unknown")
        assert listener.checked.wait(30), "the broker never checked the UNKNOW transaction back"
        rows_c = _types_of(ns, committed.msg_id, ["Pub", "EndTransaction"])
        rows_u = _types_of(ns, checked.msg_id, ["Pub", "EndTransaction", "EndTransaction"])
    end = next(v for v in rows_c if v["msgType"] == "EndTransaction")
    assert (end["groupName"], end["topic"], end["tags"], end["keys"], end["status"]) == (
        "PG_TRACE_TX", "TraceTx", "TagTx", "tx-1", "COMMIT_MESSAGE")
    with AdminClient(ns) as a:
        ends = sorted((v.status, v.from_transaction_check) for v in a.message_trace(checked.msg_id)
                      if v.type == "EndTransaction")
    assert ends == [("ROLLBACK_MESSAGE", True), ("UNKNOW", False)]


def test_full_trace_buffer_drops_records_never_sends(cl):
    ns = cl.namesrv
    with Producer("PG_TRACE_FULL", namesrv=ns, enable_msg_trace=True, **FAST) as p:
        t = p.trace
        t.capacity = 10
        with t._idle:  # the worker stalls at its next turn: nothing leaves the buffer meanwhile
            results = [p.send(Message("TraceFull", b"y" * 64)) for _ in range(60)]
            futures = [p.send_async(Message("TraceFull", b"z" * 64)) for _ in range(60)]
            results += [f.result(30) for f in futures]
        assert all(r.status.name == "SEND_OK" for r in results)
        assert t.discarded >= 60  # at most 10 + what the worker took before it stalled were kept
        last = results[-1].msg_id
    # what was kept still arrives; what was dropped is only counted
    assert t.sent >= 1 and t.send_failed == 0
    assert isinstance(last, str)


def test_query_trace_bad_input(cl):
    ns = cl.namesrv
    fails("queryMsgTraceById", "-i", "not-an-id", ns=ns, needle="not-an-id")
    fails("queryMsgTraceById", "-i", "7F0000010D5818B4AAC2795B82A70000", "-t", "bad topic!", ns=ns,
          needle="bad topic!")
    rc, out, err = admin("queryMsgTraceById", "-i", "7F0000010D5818B4AAC2795B82A7FFFF", "--json", ns=ns)
    assert rc == 0 and json.loads(out) == []


def test_trace_messages_are_stored_for_4x_java_readers(cl):
    """A trace batch over 4 KiB is stored as Java's trace producer stores it: deflated with zlib,
    sysFlag bit 0 and no LZ4/ZSTD type bits, so RocketMQ 4.9's readers (the dashboard, mqadmin
    queryMsgTraceById: Java's Inflater; zlib.decompress here) read RocketMQ's trace records."""
    ns = cl.namesrv
    with Producer("PG_TRACE_BIG", namesrv=ns, enable_msg_trace=True, **FAST) as p:
        futures = [p.send_async(Message("TraceBig", b"b" * 32, keys=f"big-key-{i:03d}-" + "k" * 40)) for i in range(80)]
        sent = {f.result(30).msg_id for f in futures}
        p.trace.flush(30)
        assert p.trace.sent >= 1 and p.trace.send_failed == 0
    wait_for(lambda: trace_rows(ns, sorted(sent)[0]), what="the trace of the first send indexed")
    traces = [m for m in cl.stored_messages("RMQ_SYS_TRACE_TOPIC")
              if sent & set((m.keys or "").split(" "))]
    assert traces, "no stored trace message carries the sends' ids as keys"
    pubs, compressed = set(), 0
    for m in traces:
        assert m.sys_flag & COMPRESSION_TYPE_MASK in (0, COMPRESSION_ZLIB), f"sysFlag 0x{m.sys_flag:X}"
        text = zlib.decompress(m.body) if m.sys_flag & COMPRESSED_FLAG else m.body
        compressed += bool(m.sys_flag & COMPRESSED_FLAG)
        assert (m.sys_flag & COMPRESSED_FLAG) == (len(text) >= 4096 and COMPRESSED_FLAG)  # Java's threshold
        for record in text.decode().split("\x02")[:-1]:  # TraceDataEncoder: \x02 ends each record
            fields = record.split("\x01")
            assert fields[0] == "Pub" and len(fields) == 14 and fields[3] == "PG_TRACE_BIG", fields
            pubs.add(fields[5])
        assert all(c.trace_type is TraceType.Pub for c in decode(text.decode()))
    assert compressed >= 1, "no trace batch went over 4 KiB"
    assert pubs == sent
