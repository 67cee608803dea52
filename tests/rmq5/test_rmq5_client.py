"""Apache's RocketMQ 5 Python client (rocketmq-python-client 5.1.x, over gRPC) against a real
`rmq broker` serving gRPC on grpcServerPort: normal, FIFO, delay and transactional messages, the
SimpleConsumer's receive / ack / change_invisible_duration, redelivery and the dead-letter queue,
and messages crossing between the 5.x client, rmq's 4.x clients and the official C++ client.
One broker for the module: each case has its own topic and group."""
from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from rmq_core.admin import AdminClient
from rmq_core.message import SysFlag
from rmq_core.remoting.codes import MQVersion
from tests.proxy.conftest import make_topic
from tests.rmq5.conftest import grpc_cluster, make_group

# The invisible duration of receives whose messages are acked at once (seconds: the client sends
# whole seconds), the short one of the redelivery case, and the long-polling wait of the
# SimpleConsumers.
INVISIBLE = 30
SHORT = 2
AWAIT = 2


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    c = grpc_cluster(tmp_path_factory.mktemp("rmq5"))
    try:
        yield c
    finally:
        c.stop()


def simple_consumer(rmq5_client, cl, group, topic, expr="*"):
    """A started 5.x SimpleConsumer of `topic`."""
    c = rmq5_client(cl.endpoint)
    c.client_id = c.call("simple_consumer", group=group, subscriptions={topic: expr}, **{"await": AWAIT})["client_id"]
    return c


def producer(rmq5_client, cl, topics=(), checks=None):
    p = rmq5_client(cl.endpoint)
    p.call("producer", topics=list(topics), checks=checks or {})
    return p


def send(p, messages, **kw):
    receipts = p.call("send", messages=messages, **kw)["receipts"]
    assert all("message_id" in r for r in receipts), [r for r in receipts if "message_id" not in r][:3]
    return receipts


def test_normal_send_and_receive_ack_1000_exact_once(cl, rmq5_client):
    topic, group = "Rmq5Normal", "GID_RMQ5_NORMAL"
    make_topic(cl, topic, 4)  # no message.type: a topic as 4.x makes them accepts every type
    c = simple_consumer(rmq5_client, cl, group, topic)
    p = producer(rmq5_client, cl, [topic])
    sent = [{"topic": topic, "body": f"normal-{i}-ü", "tag": "TagA" if i % 2 else "TagB",
             "keys": [f"key-{i}", f"alt-{i}"], "properties": {"idx": str(i), "userProp": f"value ü {i}"}}
            for i in range(1000)]
    receipts = send(p, sent)
    assert len({r["message_id"] for r in receipts}) == 1000

    got = c.call("drain", count=1000, seconds=120, max=32, invisible=30, timeout=180)
    msgs = got["messages"]
    assert len(msgs) == 1000, f"{len(msgs)} of 1000 received; receive errors {got['errors']}"
    assert [m for m in msgs if "ack_error" in m] == []
    ids = [m["message_id"] for m in msgs]
    assert len(set(ids)) == 1000, "a message received twice"
    want = {r["message_id"]: s for r, s in zip(receipts, sent)}
    for m in msgs:
        s = want[m["message_id"]]
        assert (m["topic"], m["body"], m["tag"], m["keys"], m["properties"]) == (
            topic, s["body"], s["tag"], sorted(s["keys"]), s["properties"]), m
        assert m["delivery_attempt"] == 1 and not m["corrupted"] and m["message_type"] == 1, m
    assert c.call("receive", max=32, invisible=INVISIBLE)["messages"] == [], "more than was sent"
    # the client's heartbeat made it a member of the group, named as the client names itself
    with AdminClient(cl.namesrv) as admin:
        conns = admin.consumer_connection(group).connections
    assert [(x.client_id, x.language, MQVersion.desc(x.version)) for x in conns] == [
        (c.client_id, "PYTHON", "V5_1_2")]


@pytest.mark.slow  # (tags and large bodies: rmq5 cases above and tests/proxy cover each)
def test_tag_expression_and_a_large_body(cl, rmq5_client):
    topic = "Rmq5Tags"
    make_topic(cl, topic, 2)
    c = simple_consumer(rmq5_client, cl, "GID_RMQ5_TAGS", topic, expr="TagA || TagC")
    p = producer(rmq5_client, cl, [topic])
    large = "".join(chr(0x41 + i % 26) for i in range(1024 * 1024))  # 1 MiB
    sent = [{"topic": topic, "body": f"tagged-{i}", "tag": ["TagA", "TagB", "TagC"][i % 3]}
            for i in range(12)] + [{"topic": topic, "body": large, "tag": "TagC"}]
    send(p, sent)
    got = c.call("drain", count=9, seconds=30, invisible=INVISIBLE)["messages"]
    assert sorted(m["body"] for m in got) == sorted(s["body"] for s in sent if s["tag"] != "TagB")
    assert not any(m["corrupted"] for m in got)
    assert c.call("receive", max=32, invisible=INVISIBLE)["messages"] == [], "a TagB message passed the filter"


def receive_one(c, seconds, invisible=SHORT):
    """Receive (not ack) until one message comes; it carries "asked_ms", when the receive that
    brought it was sent (the server handed it out no earlier)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        msgs = c.call("receive", max=1, invisible=invisible)["messages"]
        if msgs:
            assert len(msgs) == 1
            return msgs[0]
    raise AssertionError(f"nothing received in {seconds}s")


def test_unacked_comes_back_change_invisible_postpones_then_dead_letter(cl, rmq5_client):
    topic, group = "Rmq5Retry", "GID_RMQ5_RETRY"
    make_topic(cl, topic, 1)
    make_group(cl, group, retry_max=2)  # a first delivery and two retries
    c = simple_consumer(rmq5_client, cl, group, topic)
    p = producer(rmq5_client, cl, [topic])
    [r] = send(p, [{"topic": topic, "body": "retry-me", "tag": "TagR", "keys": ["retry-key"],
                    "properties": {"p": "1"}}])

    first = receive_one(c, 30)
    assert (first["message_id"], first["delivery_attempt"]) == (r["message_id"], 1)
    again = receive_one(c, SHORT + 30, invisible=2 * SHORT)  # (time enough to change it, on a busy machine too)
    assert (again["message_id"], again["delivery_attempt"], again["body"]) == (r["message_id"], 2, "retry-me")
    assert again["received_ms"] >= first["asked_ms"] + SHORT * 1000, "visible again before its invisible time"
    assert again["properties"] == {"p": "1"} and again["keys"] == ["retry-key"] and again["tag"] == "TagR"

    # postponed: not visible again before the new duration, counted from the change
    change = c.call("change_invisible", ref=again["ref"], invisible=3 * SHORT)  # later than the 2 * SHORT it had
    third = receive_one(c, 3 * SHORT + 30)
    assert (third["message_id"], third["delivery_attempt"]) == (r["message_id"], 3)
    assert third["received_ms"] >= change["asked_ms"] + 3 * SHORT * 1000, "came back before the changed duration"

    # the third delivery was the last (retryMaxTimes 2): unacked, it goes to %DLQ%GID_RMQ5_RETRY
    with AdminClient(cl.namesrv) as admin:
        deadline = time.monotonic() + SHORT + 30
        dlq = []
        while time.monotonic() < deadline and not dlq:
            try:
                dlq = [m for m in admin.dlq_messages(group) if m.body == b"retry-me"]
            except Exception:  # no dead-letter topic yet
                dlq = []
            if not dlq:
                time.sleep(0.5)
    assert len(dlq) == 1, "the message is not in %DLQ%" + group
    assert dlq[0].properties.get("UNIQ_KEY") == r["message_id"] and dlq[0].tags == "TagR"
    assert c.call("receive", max=1, invisible=SHORT)["messages"] == [], "delivered after the DLQ"


@pytest.mark.slow
def test_random_acks_while_sending_lose_nothing(cl, rmq5_client):
    """apache/rocketmq#7914's steps with the 5.x client: messages keep coming while a consumer
    receives 0 to 32 at a time and acks at random; every unacked one comes back, one delivery at a
    time, until it is acked - none lost, none handed out twice at once, none after its ack."""
    topic, group = "Rmq5Churn", "GID_RMQ5_CHURN"
    make_topic(cl, topic, 4)
    c = simple_consumer(rmq5_client, cl, group, topic)
    p = producer(rmq5_client, cl, [topic])
    with ThreadPoolExecutor(1) as ex:
        sending = ex.submit(send, p, [{"topic": topic, "body": f"churn-{i}"} for i in range(400)])
        got = c.call("churn", count=400, seconds=120, ack_ratio=0.7, invisible=SHORT, timeout=180)
        receipts = sending.result(60)
    by_id = {}
    for d in got["deliveries"]:
        by_id.setdefault(d["message_id"], []).append(d)
    assert set(by_id) == {r["message_id"] for r in receipts}, f"receive errors {got['errors']}"
    for mid, ds in by_id.items():
        assert [d["delivery_attempt"] for d in ds] == list(range(1, len(ds) + 1)), ds
        assert [d["acked"] for d in ds] == [False] * (len(ds) - 1) + [True], ds


def test_fifo_three_groups_in_order_across_two_consumers(cl, rmq5_client):
    topic, group = "Rmq5Fifo", "GID_RMQ5_FIFO"
    make_topic(cl, topic, 4, message_type="FIFO")
    make_group(cl, group, fifo=True)
    consumers = [rmq5_client(cl.endpoint) for _ in range(2)]
    for c in consumers:
        c.call("simple_consumer", group=group, subscriptions={topic: "*"}, **{"await": AWAIT})
    p = producer(rmq5_client, cl, [topic])
    sent = [{"topic": topic, "body": f"g{g}-{i}", "message_group": f"group-{g}", "properties": {"i": str(i)}}
            for i in range(100) for g in range(3)]
    receipts = send(p, sent)
    by_group_queue = {}
    for s, r in zip(sent, receipts):
        by_group_queue.setdefault(s["message_group"], set()).add(r["queue_id"])
    assert all(len(q) == 1 for q in by_group_queue.values()), f"a message group spread over queues: {by_group_queue}"

    def drain(c):
        return c.call("drain", count=300, seconds=120, max=16, invisible=INVISIBLE, idle=2 * AWAIT, timeout=180)

    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(drain, consumers))
    assert all(m.get("acked_ms") for r in results for m in r["messages"]), "an ack failed"
    assert all(r["messages"] for r in results), \
        f"one consumer got nothing: {[len(r['messages']) for r in results]} (both should share the groups)"
    for g in range(3):
        items = []  # (received, consumer, position in its list, message)
        for ci, r in enumerate(results):
            items += [(m["received_ms"], ci, pos, m) for pos, m in enumerate(r["messages"])
                      if m["message_group"] == f"group-{g}"]
        items.sort(key=lambda t: t[:3])
        seq = [int(m["body"].split("-")[1]) for *_, m in items]
        assert seq == list(range(100)), f"group-{g} out of order or not exactly once: {seq}"
        for (_, ca, _, a), (_, cb, _, b) in zip(items, items[1:]):
            if ca != cb or a["received_ms"] != b["received_ms"]:  # from another receive: after the previous ack
                assert b["received_ms"] >= a["acking_ms"], f"{b['body']} handed out before {a['body']} was acked"
        assert all(m["delivery_attempt"] == 1 and m["message_type"] == 2 for *_, m in items)


def test_delay_arrives_no_earlier_than_its_delivery_timestamp(cl, rmq5_client):
    topic, group = "Rmq5Delay", "GID_RMQ5_DELAY"
    make_topic(cl, topic, 2, message_type="DELAY")
    c = simple_consumer(rmq5_client, cl, group, topic)
    p = producer(rmq5_client, cl, [topic])
    # whole seconds: rocketmq-python-client 5.1.2 puts the value into the Timestamp's seconds
    at = math.ceil(time.time()) + 3
    [r] = send(p, [{"topic": topic, "body": "later", "tag": "TagD", "delivery_timestamp": at}])
    got = c.call("drain", count=1, seconds=30, invisible=INVISIBLE)["messages"]
    assert [m["message_id"] for m in got] == [r["message_id"]]
    m = got[0]
    assert m["received_ms"] >= at * 1000, f"received {at * 1000 - m['received_ms']:.0f} ms before its delivery time"
    assert m["delivery_timestamp"] == at * 1000 and m["message_type"] == 3 and m["body"] == "later"


def test_transactions_commit_rollback_and_check_back(cl, rmq5_client):
    topic, group = "Rmq5Tx", "GID_RMQ5_TX"
    make_topic(cl, topic, 2, message_type="TRANSACTION")
    c = simple_consumer(rmq5_client, cl, group, topic)
    p = producer(rmq5_client, cl, [topic], checks={"tx-unknown-commit": "COMMIT", "tx-unknown-rollback": "ROLLBACK"})
    receipts = p.call("transaction", messages=[
        {"topic": topic, "body": "tx-commit", "end": "commit"},
        {"topic": topic, "body": "tx-rollback", "end": "rollback"},
        {"topic": topic, "body": "tx-unknown-commit", "end": "none", "properties": {"order": "42"}},
        {"topic": topic, "body": "tx-unknown-rollback", "end": "none"},
    ])["receipts"]
    ids = {b: r["message_id"] for b, r in zip(["tx-commit", "tx-rollback", "tx-unknown-commit", "tx-unknown-rollback"],
                                               receipts)}
    checks = p.wait_event(lambda e: e.get("event") == "check" and e["body"] == "tx-unknown-rollback", 60,
                          "the check-back of tx-unknown-rollback")
    checks = p.wait_event(lambda e: e.get("event") == "check" and e["body"] == "tx-unknown-commit", 30,
                          "the check-back of tx-unknown-commit")
    assert checks[0]["message_id"] == ids["tx-unknown-commit"] and checks[0]["properties"] == {"order": "42"}

    got = c.call("drain", count=2, seconds=30, invisible=INVISIBLE)["messages"]
    assert sorted(m["body"] for m in got) == ["tx-commit", "tx-unknown-commit"]
    assert {m["body"]: m["message_id"] for m in got} == {b: ids[b] for b in ("tx-commit", "tx-unknown-commit")}
    assert all(m["message_type"] == 4 for m in got)
    assert c.call("receive", max=32, invisible=INVISIBLE)["messages"] == [], "a rolled-back message came"
    checked = {e["body"] for e in p.events if e.get("event") == "check"}
    assert checked <= {"tx-unknown-commit", "tx-unknown-rollback"}, f"an ended transaction was checked: {checked}"


# --- across protocols ------------------------------------------------------------------------------------------
def test_4x_producer_to_5x_simple_consumer(cl, rmq5_client):
    topic, group = "Rmq5From4x", "GID_RMQ5_FROM4X"
    make_topic(cl, topic, 4)
    c = simple_consumer(rmq5_client, cl, group, topic)
    big = "0123456789abcdef" * 640  # 10 KiB: rmq's producer compresses it; the 5.x client gets it plain
    with Producer("PG_RMQ5_4X", namesrv=cl.namesrv) as p:
        sent = [Message(topic, f"from-4x-{i}".encode(), tags="Tag4", keys=f"k{i} j{i}", properties={"userProp": f"u{i}"})
                for i in range(20)] + [Message(topic, big.encode(), tags="Big", keys="big")]
        results = [p.send(m) for m in sent]
    assert [m.sys_flag & SysFlag.COMPRESSED for m in cl.stored_messages(topic)].count(SysFlag.COMPRESSED) == 1, \
        "the big body is stored compressed"
    got = c.call("drain", count=21, seconds=30, invisible=INVISIBLE)["messages"]
    assert len(got) == 21
    by_id = {m["message_id"]: m for m in got}
    assert set(by_id) == {r.msg_id for r in results}, "the 5.x message id is the 4.x client's (UNIQ_KEY)"
    for s, r in zip(sent, results):
        m = by_id[r.msg_id]
        assert (m["body"], m["tag"], m["keys"], m["properties"]) == (
            s.body.decode(), s.tags, sorted(s.keys.split(" ")), s.properties), m
        assert not m["corrupted"] and m["delivery_attempt"] == 1 and m["message_type"] == 1


def test_5x_producer_to_rmq_push_consumer(cl, rmq5_client):
    topic = "Rmq5To4x"
    make_topic(cl, topic, 4)
    p = producer(rmq5_client, cl, [topic])
    sent = [{"topic": topic, "body": f"from-5x-{i}", "tag": "Tag5", "keys": [f"a{i}", f"b{i}"],
             "properties": {"userProp": f"v{i}"}} for i in range(20)]
    receipts = send(p, sent)
    got, lock = [], threading.Lock()

    def listener(msgs):
        with lock:
            got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("CID_RMQ5_TO4X", namesrv=cl.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     rebalance_interval=1.0, heartbeat_broker_interval=1.0, poll_name_server_interval=1.0)
    c.subscribe(topic, "*")
    c.register_message_listener(listener)
    with c:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(got) < 20:
            time.sleep(0.1)
    assert len(got) == 20
    by_id = {m.msg_id: m for m in got}
    for s, r in zip(sent, receipts):
        m = by_id[r["message_id"]]
        assert (m.body.decode(), m.tags, sorted(m.keys.split(" ")), m.properties.get("userProp"), m.reconsume_times) == (
            s["body"], s["tag"], sorted(s["keys"]), s["properties"]["userProp"], 0)


@pytest.mark.compat
def test_5x_producer_to_cpp_client(cl, rmq5_client, tmp_path):
    from tests.compat.test_cpp_client import Driver  # (the C++ client rocketmq==0.4.4 is a dev dependency)

    topic = "Rmq5ToCpp"
    make_topic(cl, topic, 2)
    p = producer(rmq5_client, cl, [topic])
    sent = [{"topic": topic, "body": f"to-cpp-{i}", "tag": "TagC", "keys": [f"c{i}"],
             "properties": {"userProp": f"w{i}", "a": "1"}} for i in range(10)]
    receipts = send(p, sent)
    d = Driver(tmp_path / "cpp", "consume", cl.namesrv, topic, "CID_RMQ5_CPP", "*", "CLUSTERING", 10, 60)
    d.wait(lambda items: len([i for i in items if "body" in i]) >= 10, 60)
    d.proc.terminate()
    d.finish(30)
    got = {m["id"]: m for m in d.messages()}
    assert set(got) == {r["message_id"] for r in receipts}, (d.items, d.stderr_tail())
    for s, r in zip(sent, receipts):
        m = got[r["message_id"]]
        assert (m["body"], m["tags"], m["keys"], m["props"]["userProp"], m["props"]["a"]) == (
            s["body"], s["tag"], s["keys"][0], s["properties"]["userProp"], "1"), m


def test_5x_push_consumer_consumes_and_retries_a_failure(cl, rmq5_client):
    topic, group = "Rmq5Push", "GID_RMQ5_PUSH"
    make_topic(cl, topic, 2)
    c = rmq5_client(cl.endpoint)
    c.call("push_consumer", group=group, subscriptions={topic: "*"}, fail_first=["push-7"])
    p = producer(rmq5_client, cl, [topic])
    receipts = send(p, [{"topic": topic, "body": f"push-{i}", "tag": "TagP"} for i in range(30)])
    c.wait_event(lambda e: e.get("event") == "message" and e["body"] == "push-7" and e["delivery_attempt"] == 2,
                 60, "the failed message's second delivery")
    time.sleep(AWAIT)  # (a message delivered twice would come by now)
    got = c.messages()
    firsts = sorted(m["message_id"] for m in got if m["delivery_attempt"] == 1)
    assert firsts == sorted(r["message_id"] for r in receipts), "each message delivered once (first attempt)"
    assert [(m["body"], m["delivery_attempt"]) for m in got if m["delivery_attempt"] > 1] == [("push-7", 2)]
