"""Send and pull through a real broker over TCP (and in-proc), speaking the remoting protocol."""
import json
import threading
import time

import pytest

from rmq_core.codec import decode_messages
from rmq_core.remoting.codes import RequestCode, ResponseCode


def test_boot_lines_and_route_after_auto_create(cluster, raw):
    assert any("The Name Server boot success" in l for l in cluster.boot_lines)
    assert any(f"The broker[broker-a, {cluster.broker_addr}] boot success" in l for l in cluster.boot_lines)
    resp, route = raw.route(cluster.tcp_namesrv, "TBW102")
    assert resp.code == 0 and route["brokerDatas"][0]["brokerAddrs"]["0"] == cluster.broker_addr
    resp, _ = raw.route(cluster.tcp_namesrv, "NewTopic")
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    r = raw.send(cluster.broker_addr, "NewTopic", b"hello", tags="TagA", queue_id=1)
    assert r.code == 0, r.remark
    assert r.ext_fields["queueId"] == "1" and r.ext_fields["queueOffset"] == "0"
    assert len(r.ext_fields["msgId"]) == 32
    cluster.call(cluster.broker.register_broker_all())
    resp, route = raw.route(cluster.tcp_namesrv, "NewTopic")
    assert resp.code == 0
    assert route["queueDatas"][0]["writeQueueNums"] == 4  # defaultTopicQueueNums from the send header


@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2])
def test_send_then_pull_returns_exact_record(cluster, raw, code):
    addr = cluster.broker_addr
    for i in range(5):
        r = raw.send(addr, "T1", f"body-{i}".encode(), tags="TagA" if i % 2 == 0 else "TagB", keys=f"k{i}",
                     queue_id=0, props={"userProp": "v"}, code=code)
        assert r.code == 0 and r.ext_fields["queueOffset"] == str(i)
    resp = raw.pull(addr, "T1", 0, 0)
    assert resp.code == 0
    assert resp.ext_fields["nextBeginOffset"] == "5" and resp.ext_fields["maxOffset"] == "5"
    msgs = decode_messages(resp.body)
    assert [m.body for m in msgs] == [f"body-{i}".encode() for i in range(5)]
    assert [m.queue_offset for m in msgs] == list(range(5))
    assert msgs[1].tags == "TagB" and msgs[1].keys == "k1" and msgs[1].properties["userProp"] == "v"
    assert msgs[0].store_host == cluster.broker_addr
    # a 4.x client's pull (its answer re-encoded for zlib-only clients): the same plain records
    assert raw.pull(addr, "T1", 0, 0, language="JAVA").body == resp.body
    # tag filter on the broker: only TagA
    resp = raw.pull(addr, "T1", 0, 0, sub="TagA")
    assert [m.body for m in decode_messages(resp.body)] == [b"body-0", b"body-2", b"body-4"]
    # nothing new
    resp = raw.pull(addr, "T1", 0, 5)
    assert resp.code == ResponseCode.PULL_NOT_FOUND
    # offset past the end
    resp = raw.pull(addr, "T1", 0, 99)
    assert resp.code == ResponseCode.PULL_OFFSET_MOVED and resp.ext_fields["nextBeginOffset"] == "5"


def test_long_polling_returns_on_arrival(cluster, raw):
    addr = cluster.broker_addr
    raw.send(addr, "LP", b"first", queue_id=0)
    fut = raw.invoke_async(addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "CG_LP", "topic": "LP", "queueId": "0", "queueOffset": "1", "maxMsgNums": "32",
        "sysFlag": str(4 | 2), "commitOffset": "0", "suspendTimeoutMillis": "15000", "subscription": "*",
        "subVersion": "0"})
    time.sleep(0.5)
    assert not fut.done(), "an empty pull must be held"
    t0 = time.monotonic()
    raw.send(addr, "LP", b"second", queue_id=0)
    resp = fut.result(10)
    waited = time.monotonic() - t0
    assert resp.code == 0 and [m.body for m in decode_messages(resp.body)] == [b"second"]
    assert waited < 1.0, f"held pull answered {waited:.3f}s after the send"


def test_long_polling_times_out_with_not_found(cluster, raw):
    t0 = time.monotonic()
    raw.send(cluster.broker_addr, "LP2", b"x", queue_id=0)
    resp = raw.pull(cluster.broker_addr, "LP2", 0, 1, suspend_ms=400)
    assert resp.code == ResponseCode.PULL_NOT_FOUND
    assert time.monotonic() - t0 >= 0.35


def test_consumer_offsets_query_update_and_persist(make_cluster, raw, tmp_path):
    c = make_cluster()
    addr = c.broker_addr
    raw.send(addr, "OFF", b"x", queue_id=0)
    q = raw.invoke(addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "G1", "topic": "OFF", "queueId": "0"})
    assert q.code == 0 and q.ext_fields["offset"] == "0"  # Java's rule for a new group, head in memory
    u = raw.invoke(addr, RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "G1", "topic": "OFF", "queueId": "0",
                                                              "commitOffset": "1"})
    assert u.code == 0
    c.stop()
    raw.close()
    c2 = make_cluster(store=tmp_path / "store")
    from tests.rawclient import RawClient
    r2 = RawClient()
    try:
        q = r2.invoke(c2.broker_addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "G1", "topic": "OFF", "queueId": "0"})
        assert q.code == 0 and q.ext_fields["offset"] == "1"
        resp = r2.pull(c2.broker_addr, "OFF", 0, 0)
        assert [m.body for m in decode_messages(resp.body)] == [b"x"]
    finally:
        r2.close()


def test_heartbeat_consumer_list_and_notify(cluster, raw):
    from rmq_core.remoting.client import RemotingClient  # noqa: F401
    addr = cluster.broker_addr
    assert raw.heartbeat(addr, "client-1", "CG_HB", "T_HB").code == 0
    resp = raw.invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG_HB"})
    assert json.loads(resp.body)["consumerIdList"] == ["client-1"]
    # the retry topic of a clustering group exists
    assert cluster.broker.topic_manager.select("%RETRY%CG_HB") is not None
    # a second connection with another client id: the first gets NOTIFY_CONSUMER_IDS_CHANGED
    from tests.rawclient import RawClient
    notified = threading.Event()

    class Notify:
        async def process_request(self, ctx, request):
            notified.set()
            return None

    raw.client.register_processor(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, Notify())
    other = RawClient("other")
    try:
        assert other.heartbeat(addr, "client-2", "CG_HB", "T_HB").code == 0
        assert notified.wait(5)
        resp = raw.invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG_HB"})
        assert json.loads(resp.body)["consumerIdList"] == ["client-1", "client-2"]
        # same client id from a second live connection is refused with a clear error
        dup = other.heartbeat(addr, "client-1", "CG_HB", "T_HB")
        assert dup.code != 0 and "client-1" in dup.remark and "already connected" in dup.remark
    finally:
        other.close()
    deadline = time.time() + 5
    while time.time() < deadline:
        resp = raw.invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG_HB"})
        if json.loads(resp.body)["consumerIdList"] == ["client-1"]:
            break
        time.sleep(0.05)
    else:
        pytest.fail("closing a connection did not remove its consumer")


def test_lock_batch_is_exclusive_until_expiry(make_cluster, raw):
    c = make_cluster({"rebalanceLockMaxLiveTime": "300"})
    addr = c.broker_addr
    mq = {"topic": "T_LOCK", "brokerName": "broker-a", "queueId": 0}
    body = lambda cid: json.dumps({"consumerGroup": "CG_L", "clientId": cid, "mqSet": [mq]}).encode()  # noqa: E731
    r = raw.invoke(addr, RequestCode.LOCK_BATCH_MQ, {}, body("c1"))
    assert json.loads(r.body)["lockOKMQSet"] == [mq]
    r = raw.invoke(addr, RequestCode.LOCK_BATCH_MQ, {}, body("c2"))
    assert json.loads(r.body)["lockOKMQSet"] == []
    time.sleep(0.4)  # lease expired
    r = raw.invoke(addr, RequestCode.LOCK_BATCH_MQ, {}, body("c2"))
    assert json.loads(r.body)["lockOKMQSet"] == [mq]


def test_bad_requests_get_clear_errors_and_broker_keeps_serving(make_cluster, raw):
    cluster = make_cluster({"maxMessageSize": "65536"})
    addr = cluster.broker_addr
    r = raw.invoke(addr, 9999, {})
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in (r.remark or "")
    r = raw.send(addr, "bad topic!", b"x")
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "bad topic!" in r.remark
    r = raw.send(addr, "T_BIG", b"x" * 70000)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "maxMessageSize" in r.remark
    r = raw.send(addr, "T_Q", b"x", queue_id=77)
    assert r.code == ResponseCode.SYSTEM_ERROR and "queueId[77]" in r.remark
    r = raw.pull(addr, "NoSuchTopic", 0, 0)
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    r = raw.invoke(addr, RequestCode.HEART_BEAT, {}, b"{not json")
    assert r.code == ResponseCode.SYSTEM_ERROR and "heartbeat" in r.remark
    assert raw.send(addr, "T_OK", b"still serving").code == 0


def test_sql92_subscription_rejected_at_heartbeat_with_position(cluster, raw):
    r = raw.heartbeat(cluster.broker_addr, "c-sql", "CG_SQL", "T_SQL", sub="a > ", expression_type="SQL92")
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "position" in r.remark


def test_sql92_disabled_names_the_setting(make_cluster, raw):
    c = make_cluster({"enablePropertyFilter": "false"})
    r = raw.heartbeat(c.broker_addr, "c-sql", "CG_SQL", "T_SQL", sub="a > 1", expression_type="SQL92")
    assert r.code == 0  # registered, as RocketMQ's broker does; the pull says why it cannot filter
    assert raw.send(c.broker_addr, "T_SQL", b"x", queue_id=0).code == 0
    r = raw.pull(c.broker_addr, "T_SQL", 0, 0, group="CG_SQL", sub="a > 1", expression_type="SQL92")
    assert r.code != 0 and "enablePropertyFilter=true" in r.remark


def test_view_and_query_message(cluster, raw):
    addr = cluster.broker_addr
    r = raw.send(addr, "T_Q2", b"findme", keys="order-42", queue_id=0)
    phys = int(r.ext_fields["msgId"][16:], 16)
    v = raw.invoke(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(phys)})
    assert v.code == 0 and decode_messages(v.body)[0].body == b"findme"
    deadline = time.time() + 5
    while True:
        q = raw.invoke(addr, RequestCode.QUERY_MESSAGE, {"topic": "T_Q2", "key": "order-42", "maxNum": "32",
                                                         "beginTimestamp": "0", "endTimestamp": str(2**62)})
        if q.code == 0 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert q.code == 0 and decode_messages(q.body)[0].body == b"findme"


def test_search_offset_by_timestamp_and_min_max(cluster, raw):
    addr = cluster.broker_addr
    raw.send(addr, "T_TS", b"a", queue_id=0)
    time.sleep(0.02)
    mid = int(time.time() * 1000)
    time.sleep(0.02)
    raw.send(addr, "T_TS", b"b", queue_id=0)
    q = lambda code, **kw: raw.invoke(addr, code, {"topic": "T_TS", "queueId": "0", **kw})  # noqa: E731
    assert q(RequestCode.GET_MAX_OFFSET).ext_fields["offset"] == "2"
    assert q(RequestCode.GET_MIN_OFFSET).ext_fields["offset"] == "0"
    assert q(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp=str(mid)).ext_fields["offset"] == "1"
    assert int(q(RequestCode.GET_EARLIEST_MSG_STORETIME).ext_fields["timestamp"]) <= mid
