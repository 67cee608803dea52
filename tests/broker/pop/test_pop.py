"""Pop consumption at the broker through the remoting codes (POP_MESSAGE, ACK_MESSAGE,
CHANGE_MESSAGE_INVISIBLETIME), against a real broker on 127.0.0.1."""
from __future__ import annotations

import json
import time

import pytest

from rmq_core.common.pop_extra_info import ExtraInfo
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.broker.pop.popraw import ack, change, create_group, create_topic, pop

G = "CG_POP"


def _send(raw, addr, topic, n, queues=4, prefix="m", **kw):
    for i in range(n):
        r = raw.send(addr, topic, f"{prefix}{i}".encode(), queue_id=i % queues, keys=f"k{i}", tags="TagA",
                     props={"color": f"c{i}"}, **kw)
        assert r.code == ResponseCode.SUCCESS, r.remark


def _drain(raw, addr, group, topic, want, **kw):
    """Pop (long polling) until `want` messages came; acks none."""
    got = []
    deadline = time.time() + 30
    while len(got) < want and time.time() < deadline:
        _, ps = pop(raw, addr, group, topic, poll_ms=2000, **kw)
        got += ps
    return got


def test_receive_and_ack_many_none_twice(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_MANY")
    _send(raw, addr, "TP_MANY", 300)
    seen = []
    while True:
        r, ps = pop(raw, addr, G, "TP_MANY", max_nums=32, invisible_ms=30_000)
        if not ps:
            assert r.code == ResponseCode.POLLING_TIMEOUT
            for f in ("popTime", "invisibleTime", "reviveQid", "restNum"):  # (the Java client reads them always)
                assert f in r.ext_fields
            break
        for p in ps:
            assert ack(raw, addr, G, p).code == ResponseCode.SUCCESS
            seen.append(p)
    bodies = [p.body for p in seen]
    assert len(bodies) == len(set(bodies)) == 300
    by_body = {p.body: p.msg for p in seen}
    m = by_body[b"m7"]
    assert m.topic == "TP_MANY" and m.keys == "k7" and m.tags == "TagA" and m.properties["color"] == "c7"
    assert all(p.attempt == 1 for p in seen)
    assert c.broker.pop_service.inflight(G, "TP_MANY") == 0
    # a repeated ack of an acked message is answered OK (a client retrying its ack)
    assert ack(raw, addr, G, seen[0]).code == ResponseCode.SUCCESS


def test_not_acked_comes_back_after_invisible_time_with_attempt_2(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_BACK", queues=1)
    _send(raw, addr, "TP_BACK", 1, queues=1)
    _, first = pop(raw, addr, G, "TP_BACK", invisible_ms=1500)
    assert [p.body for p in first] == [b"m0"] and first[0].attempt == 1
    # not before its invisible time is over
    _, early = pop(raw, addr, G, "TP_BACK")
    assert early == []
    assert c.broker.pop_service.inflight(G, "TP_BACK") == 1
    again = _drain(raw, addr, G, "TP_BACK", 1)
    assert [p.body for p in again] == [b"m0"]
    p = again[0]
    assert p.attempt == 2 and p.msg.reconsume_times == 1
    assert p.real_topic == f"%RETRY%{G}_TP_BACK" and p.msg.properties["RETRY_TOPIC"] == "TP_BACK"
    assert p.msg.keys == "k0" and p.msg.properties["color"] == "c0" and p.msg.msg_id == first[0].msg.msg_id
    # the first handle is stale now: acking it is refused naming it
    r = ack(raw, addr, G, first[0])
    assert r.code != ResponseCode.SUCCESS and first[0].handle in r.remark and "expired" in r.remark
    assert ack(raw, addr, G, p, topic="TP_BACK").code == ResponseCode.SUCCESS
    assert c.broker.pop_service.inflight(G, "TP_BACK") == 0
    svc = c.broker.pop_service
    assert svc.revived[("TP_BACK", G)] == 1 and svc.acked[("TP_BACK", G)] == 1 and svc.received[("TP_BACK", G)] == 2


def test_change_invisible_time_postpones(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_CHG", queues=1)
    _send(raw, addr, "TP_CHG", 2, queues=1)
    _, ps = pop(raw, addr, G, "TP_CHG", invisible_ms=1000)
    assert len(ps) == 2
    r = change(raw, addr, G, ps[0], 60_000)
    assert r.code == ResponseCode.SUCCESS, r.remark
    new_handle = r.ext_fields["extraInfo"]
    assert r.ext_fields["invisibleTime"] == "60000" and new_handle != ps[0].handle
    # the other one (not changed) comes back after its second; the changed one does not
    again = _drain(raw, addr, G, "TP_CHG", 1)
    assert [p.body for p in again] == [b"m1"]
    _, none = pop(raw, addr, G, "TP_CHG", poll_ms=1500)
    assert none == []
    # the old handle is no longer valid; the new one acks
    old = ack(raw, addr, G, ps[0])
    assert old.code != ResponseCode.SUCCESS and ps[0].handle in old.remark
    ps[0].handle = new_handle
    assert ack(raw, addr, G, ps[0]).code == ResponseCode.SUCCESS
    assert c.broker.pop_service.inflight(G, "TP_CHG") == 1  # (m1's second delivery, not acked)


@pytest.mark.slow  # (the DLQ by attempts runs by default through SimpleConsumer and the 5.x client)
def test_after_max_attempts_in_dlq(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_DLQ", queues=1)
    create_group(raw, addr, "CG_POP_DLQ", retryMaxTimes=1)
    _send(raw, addr, "TP_DLQ", 1, queues=1)
    _, ps = pop(raw, addr, "CG_POP_DLQ", "TP_DLQ", invisible_ms=1000)
    assert ps[0].attempt == 1
    again = _drain(raw, addr, "CG_POP_DLQ", "TP_DLQ", 1, invisible_ms=1000)
    assert again[0].attempt == 2
    # its second delivery not acked either: reconsume times 1 reached retryMaxTimes 1 -> %DLQ%
    deadline = time.time() + 20
    dlq = None
    while time.time() < deadline:
        r = raw.pull(addr, "%DLQ%CG_POP_DLQ", 0, 0, group="CG_DLQ_READER")
        if r.code == ResponseCode.SUCCESS:
            from rmq_core.codec import decode_messages
            dlq = decode_messages(r.body)
            break
        time.sleep(0.2)
    assert dlq is not None and [m.body for m in dlq] == [b"m0"]
    assert dlq[0].properties["RETRY_TOPIC"] == "TP_DLQ" and dlq[0].keys == "k0"
    _, none = pop(raw, addr, "CG_POP_DLQ", "TP_DLQ", poll_ms=1500)
    assert none == []
    assert c.broker.pop_service.inflight("CG_POP_DLQ", "TP_DLQ") == 0


def test_fifo_group_in_order_next_only_after_ack(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_FIFO", queues=2)
    create_group(raw, addr, "CG_FIFO", consumeMessageOrderly=True)
    _send(raw, addr, "TP_FIFO", 6, queues=2)  # queue 0: m0 m2 m4, queue 1: m1 m3 m5
    _, ps = pop(raw, addr, "CG_FIFO", "TP_FIFO", max_nums=1, invisible_ms=1000, queue_id=0)
    assert [p.body for p in ps] == [b"m0"] and ExtraInfo.parse(ps[0].handle).is_order
    # queue 0 is blocked while m0 is in flight; queue 1 is not
    _, blocked = pop(raw, addr, "CG_FIFO", "TP_FIFO", queue_id=0)
    assert blocked == []
    _, q1 = pop(raw, addr, "CG_FIFO", "TP_FIFO", max_nums=1, invisible_ms=30_000, queue_id=1)
    assert [p.body for p in q1] == [b"m1"]
    # not acked in time: m0 again from the same queue, attempt 2 (not through the retry topic)
    again = _drain(raw, addr, "CG_FIFO", "TP_FIFO", 1, max_nums=1, invisible_ms=30_000, queue_id=0)
    assert [p.body for p in again] == [b"m0"] and again[0].attempt == 2 and again[0].real_topic == "TP_FIFO"
    # a pop held on the blocked queue is woken by the ack that opens it
    fut = raw.invoke_async(addr, RequestCode.POP_MESSAGE, {
        "consumerGroup": "CG_FIFO", "topic": "TP_FIFO", "queueId": "0", "maxMsgNums": "32", "invisibleTime": "30000",
        "pollTime": "20000", "bornTime": "0", "initMode": "0"})
    time.sleep(0.3)
    assert not fut.done()
    assert ack(raw, addr, "CG_FIFO", again[0]).code == ResponseCode.SUCCESS
    r = fut.result(15)
    assert r.code == ResponseCode.SUCCESS
    from rmq_core.codec import decode_messages
    assert [m.body for m in decode_messages(r.body)] == [b"m2", b"m4"]  # in order, as one batch
    assert c.broker.pop_service.inflight("CG_FIFO", "TP_FIFO") == 3


def test_fifo_requested_by_the_pop(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_ORDER", queues=1)
    _send(raw, addr, "TP_ORDER", 3, queues=1)
    _, ps = pop(raw, addr, G, "TP_ORDER", max_nums=1, order=True)
    assert [p.body for p in ps] == [b"m0"]
    assert pop(raw, addr, G, "TP_ORDER", order=True)[1] == []
    assert ack(raw, addr, G, ps[0]).code == ResponseCode.SUCCESS
    assert [p.body for p in pop(raw, addr, G, "TP_ORDER", order=True)[1]] == [b"m1", b"m2"]


def test_two_consumers_of_one_group_share_a_one_queue_topic(make_cluster, raw):
    from tests.rawclient import RawClient
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_SHARE", queues=1)
    _send(raw, addr, "TP_SHARE", 40, queues=1)
    other = RawClient("other")
    try:
        _, a = pop(raw, addr, G, "TP_SHARE", max_nums=4)
        _, b = pop(other, addr, G, "TP_SHARE", max_nums=4)  # while a's are in flight
        assert [p.body for p in a] == [b"m0", b"m1", b"m2", b"m3"]
        assert [p.body for p in b] == [b"m4", b"m5", b"m6", b"m7"]
        got = a + b
        for p in a:
            assert ack(raw, addr, G, p).code == ResponseCode.SUCCESS
        for p in b:
            assert ack(other, addr, G, p).code == ResponseCode.SUCCESS
        turn = 0
        while True:
            client = (raw, other)[turn % 2]
            turn += 1
            _, ps = pop(client, addr, G, "TP_SHARE", max_nums=5)
            if not ps:
                break
            for p in ps:
                assert ack(client, addr, G, p).code == ResponseCode.SUCCESS
            got += ps
        assert sorted(p.body for p in got) == sorted(f"m{i}".encode() for i in range(40))
    finally:
        other.close()


def test_long_poll_wakes_on_arrival_and_tag_filter(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_POLL", queues=2)
    fut = raw.invoke_async(addr, RequestCode.POP_MESSAGE, {
        "consumerGroup": G, "topic": "TP_POLL", "queueId": "-1", "maxMsgNums": "32", "invisibleTime": "30000",
        "pollTime": "20000", "bornTime": "0", "initMode": "0", "expType": "TAG", "exp": "TagB"})
    time.sleep(0.3)
    assert not fut.done()
    raw.send(addr, "TP_POLL", b"not-mine", tags="TagA", queue_id=1)
    raw.send(addr, "TP_POLL", b"mine", tags="TagB", queue_id=1)
    r = fut.result(15)
    assert r.code == ResponseCode.SUCCESS
    from rmq_core.codec import decode_messages
    assert [m.body for m in decode_messages(r.body)] == [b"mine"]
    # an SQL92 filter, the pull path's
    raw.send(addr, "TP_POLL", b"sql-a", queue_id=0, props={"n": "1"})
    raw.send(addr, "TP_POLL", b"sql-b", queue_id=0, props={"n": "5"})
    _, ps = pop(raw, addr, "CG_POP_SQL", "TP_POLL", exp="n > 3", exp_type="SQL92")
    assert [p.body for p in ps] == [b"sql-b"]


def test_attempt_id_gives_the_same_messages(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_ATT", queues=1)
    _send(raw, addr, "TP_ATT", 3, queues=1)
    _, a = pop(raw, addr, G, "TP_ATT", max_nums=2, attempt_id="att-1")
    _, b = pop(raw, addr, G, "TP_ATT", max_nums=2, attempt_id="att-1")
    assert [p.handle for p in a] == [p.handle for p in b] and len(a) == 2
    _, other = pop(raw, addr, G, "TP_ATT", max_nums=2, attempt_id="att-2")
    assert [p.body for p in other] == [b"m2"]


def test_bad_requests_are_refused_naming_the_value(make_cluster, raw):
    c = make_cluster({"autoCreateSubscriptionGroup": "false"})
    addr = c.broker_addr
    create_topic(raw, addr, "TP_BAD", queues=1)
    create_group(raw, addr, G)
    _send(raw, addr, "TP_BAD", 1, queues=1)
    r, _ = pop(raw, addr, "CG_NOBODY", "TP_BAD")
    assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and "CG_NOBODY" in r.remark
    r, _ = pop(raw, addr, G, "TP_NOWHERE")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and "TP_NOWHERE" in r.remark
    r, _ = pop(raw, addr, G, "TP_BAD", invisible_ms=500)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "500" in r.remark and "invisible" in r.remark
    r, _ = pop(raw, addr, G, "TP_BAD", queue_id=3)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "queueId[3]" in r.remark
    r, _ = pop(raw, addr, G, "TP_BAD", max_nums=5000)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "5000" in r.remark
    r, _ = pop(raw, addr, G, "TP_BAD", exp="a >", exp_type="SQL92")
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    bad = raw.invoke(addr, RequestCode.ACK_MESSAGE, {"consumerGroup": G, "topic": "TP_BAD", "queueId": "0",
                                                     "extraInfo": "garbage", "offset": "0"})
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and "'garbage'" in bad.remark
    never = "0 1700000000000 30000 3 0 broker-a 0 0"
    r = raw.invoke(addr, RequestCode.ACK_MESSAGE, {"consumerGroup": G, "topic": "TP_BAD", "queueId": "0",
                                                   "extraInfo": never, "offset": "0"})
    assert r.code == ResponseCode.NO_MESSAGE and never in r.remark
    _, ps = pop(raw, addr, G, "TP_BAD")
    r = change(raw, addr, G, ps[0], 100)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "100" in r.remark


def test_consume_stats_show_inflight(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_STATS", queues=2)
    _send(raw, addr, "TP_STATS", 10, queues=2)
    _, ps = pop(raw, addr, G, "TP_STATS", max_nums=6)
    ack(raw, addr, G, ps[0])
    r = raw.invoke(addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": G, "topic": "TP_STATS"})
    rows = json.loads(r.body)["offsetTable"]
    assert sum(row["inflight"] for row in rows) == 5
    assert sum(row["brokerOffset"] - row["consumerOffset"] for row in rows) == 4  # never handed out


def test_slave_refuses_pop(make_cluster, raw):
    c = make_cluster(slave=True)
    r, _ = pop(raw, c.slave_addr, G, "TBW102")
    assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "SLAVE" in r.remark


def test_admin_makes_a_fifo_group_and_shows_inflight(make_cluster, raw):
    from tests.admin.test_admin_cli import admin, ok, rows
    c = make_cluster()
    addr, ns = c.broker_addr, c.namesrv
    ok("updateSubGroup", "-b", addr, "-g", "CG_ADMIN_FIFO", "-o", "true", ns=ns)
    assert c.broker.subscription_manager.find("CG_ADMIN_FIFO").consume_message_orderly is True
    rc, _, err = admin("updateSubGroup", "-b", addr, "-g", "CG_ADMIN_FIFO", "-o", "maybe", ns=ns)
    assert rc != 0 and "'maybe'" in err
    create_topic(raw, addr, "TP_ADMIN", queues=1)
    _send(raw, addr, "TP_ADMIN", 5, queues=1)
    _, ps = pop(raw, addr, "CG_ADMIN_FIFO", "TP_ADMIN", max_nums=3)
    assert [p.body for p in ps] == [b"m0", b"m1", b"m2"]
    prog = [r for r in rows("consumerProgress", "-g", "CG_ADMIN_FIFO", ns=ns) if r["topic"] == "TP_ADMIN"]
    assert [(r["diff"], r["inflight"]) for r in prog] == [(2, 3)]
    assert "Inflight Total: 3" in ok("consumerProgress", "-g", "CG_ADMIN_FIFO", ns=ns)


def test_batch_ack_as_the_java_client_sends_it(make_cluster, raw):
    import base64
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_BATCH", queues=1)
    _send(raw, addr, "TP_BATCH", 12, queues=1)
    _, ps = pop(raw, addr, G, "TP_BATCH", max_nums=12)
    h = ExtraInfo.parse(ps[0].handle)
    so = h.ck_queue_offset
    bits = 0
    for p in ps[:10]:
        bits |= 1 << (p.msg.queue_offset - so)
    ack_body = {"c": G, "t": "TP_BATCH", "r": "0", "so": so, "q": 0, "rq": h.revive_qid, "pt": h.pop_time,
                "it": h.invisible_time,
                "b": base64.b64encode(bits.to_bytes((bits.bit_length() + 7) // 8, "little")).decode()}
    r = raw.invoke(addr, RequestCode.BATCH_ACK_MESSAGE, {},
                   json.dumps({"brokerName": "broker-a", "acks": [ack_body]}).encode())
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert c.broker.pop_service.inflight(G, "TP_BATCH") == 2
    # the same again: acked before, answered OK; with an offset never handed out under it: that one refused
    r = raw.invoke(addr, RequestCode.BATCH_ACK_MESSAGE, {},
                   json.dumps({"brokerName": "broker-a", "acks": [ack_body]}).encode())
    assert r.code == ResponseCode.SUCCESS, r.remark
    more = bits | 1 << 20
    r = raw.invoke(addr, RequestCode.BATCH_ACK_MESSAGE, {}, json.dumps({"brokerName": "broker-a", "acks": [
        {**ack_body, "b": base64.b64encode(more.to_bytes((more.bit_length() + 7) // 8, "little")).decode()}]}).encode())
    assert r.code == ResponseCode.NO_MESSAGE and f"offset {so + 20} " in r.remark, r.remark
    assert c.broker.pop_service.inflight(G, "TP_BATCH") == 2
    r = raw.invoke(addr, RequestCode.BATCH_ACK_MESSAGE, {}, b"{not json")
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "batch ack" in r.remark


def test_service_api_ack_batch_and_forward_to_dead_letter(make_cluster, raw):
    from rmq_core.broker.pop.service import PopError
    from rmq_core.common.subscription import SubscriptionData
    c = make_cluster()
    addr = c.broker_addr
    svc = c.broker.pop_service
    create_topic(raw, addr, "TP_API", queues=2)
    _send(raw, addr, "TP_API", 4, queues=2)
    res = c.call(svc.pop(group=G, topic="TP_API", max_nums=4, invisible_ms=30_000,
                         sub=SubscriptionData.build("TP_API", "TagA"), poll_ms=0, client_id="test"))
    assert res.status == "FOUND" and len(res.messages) == 4
    m = res.messages[0]
    assert m.topic == m.real_topic == "TP_API" and m.delivery_attempt == 1 and m.record[4:8] == b"\xda\xa3\x20\xa7"
    assert m.msg.keys in {"k0", "k1", "k2", "k3"}
    outcomes = c.call(svc.ack_batch(group=G, topic="TP_API",
                                    receipt_handles=[res.messages[1].receipt_handle, "junk", res.messages[2].receipt_handle]))
    assert [getattr(o, "status", None) for o in outcomes] == ["OK", None, "OK"]
    assert isinstance(outcomes[1], PopError) and outcomes[1].kind == "INVALID_RECEIPT_HANDLE" and "'junk'" in str(outcomes[1])
    out = c.call(svc.forward_to_dead_letter(group=G, topic="TP_API", receipt_handle=res.messages[3].receipt_handle))
    assert out.status == "OK" and svc.inflight(G, "TP_API") == 1
    r = raw.pull(addr, f"%DLQ%{G}", 0, 0, group="CG_DLQ_READER")
    from rmq_core.codec import decode_messages
    assert r.code == ResponseCode.SUCCESS and [x.body for x in decode_messages(r.body)] == [decode_messages(res.messages[3].record)[0].body]
    new = c.call(svc.change_invisible_time(group=G, topic="TP_API", receipt_handle=m.receipt_handle, invisible_ms=5000))
    assert new != m.receipt_handle
    with pytest.raises(PopError, match="expired or unknown"):
        c.call(svc.ack(group=G, topic="TP_API", receipt_handle=m.receipt_handle))
    assert c.call(svc.ack(group=G, topic="TP_API", receipt_handle=new)).status == "OK"
    assert svc.inflight(G, "TP_API") == 0
    empty = c.call(svc.pop(group=G, topic="TP_API", max_nums=4, invisible_ms=30_000, poll_ms=300))
    assert empty.status == "POLLING_NOT_FOUND" and empty.messages == []


def test_random_acks_while_sending_lose_nothing(make_cluster, raw):
    """Upstream's apache/rocketmq#7914 / #8835 shapes: pops of 0..32 while messages keep coming,
    acks at random (some of a checkpoint quickly, the rest later): every message ends acked, none
    is lost, and none acked comes again."""
    import random
    rnd = random.Random(34)
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_RANDOM", queues=2)
    acked, held, sent = set(), [], 0
    deadline = time.time() + 60
    while time.time() < deadline:
        if sent < 150:
            for _ in range(min(rnd.randint(0, 10), 150 - sent)):
                assert raw.send(addr, "TP_RANDOM", f"r{sent}".encode(), queue_id=sent % 2).code == ResponseCode.SUCCESS
                sent += 1
        _, ps = pop(raw, addr, G, "TP_RANDOM", max_nums=rnd.randint(1, 32), invisible_ms=1000,
                    poll_ms=0 if sent < 150 else 500)
        for p in ps:
            assert p.body not in acked, f"{p.body} acked, then delivered again"
            if rnd.random() < 0.5:
                assert ack(raw, addr, G, p).code == ResponseCode.SUCCESS
                acked.add(p.body)
            elif rnd.random() < 0.5:
                held.append(p)  # acked a little later
        for p in held[:]:
            if rnd.random() < 0.5:
                held.remove(p)
                r = ack(raw, addr, G, p)
                if r.code == ResponseCode.SUCCESS:
                    acked.add(p.body)
                else:  # (too late: its invisible time ran out, so it comes again)
                    assert r.code == ResponseCode.NO_MESSAGE and "expired" in r.remark
        if sent >= 150 and len(acked) == sent:
            break
    assert len(acked) == sent == 150
    assert c.broker.pop_service.inflight(G, "TP_RANDOM") == 0


def test_checkpoint_of_a_deleted_and_recreated_topic_is_dropped(make_cluster, raw):
    """apache/rocketmq#8479: a checkpoint whose offsets the recreated topic does not have is
    dropped at its revive, not retried for ever or revived as another message."""
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_GONE", queues=1)
    _send(raw, addr, "TP_GONE", 3, queues=1)
    _, ps = pop(raw, addr, G, "TP_GONE", invisible_ms=1000)
    assert len(ps) == 3
    r = raw.invoke(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "TP_GONE"})
    assert r.code == ResponseCode.SUCCESS, r.remark
    create_topic(raw, addr, "TP_GONE", queues=1)
    _send(raw, addr, "TP_GONE", 1, queues=1, prefix="new")
    deadline = time.time() + 15
    while c.broker.pop_service.inflight(G, "TP_GONE") and time.time() < deadline:
        time.sleep(0.1)
    assert c.broker.pop_service.inflight(G, "TP_GONE") == 0
    got = _drain(raw, addr, G, "TP_GONE", 1)
    assert [p.body for p in got] == [b"new0"]
    _, more = pop(raw, addr, G, "TP_GONE", poll_ms=1000)
    assert more == []


def test_fifo_message_past_max_attempts_goes_to_dlq_and_the_queue_moves_on(make_cluster, raw):
    from rmq_core.codec import decode_messages
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_FIFO_DLQ", queues=1)
    create_group(raw, addr, "CG_FIFO_DLQ", consumeMessageOrderly=True, retryMaxTimes=1)
    _send(raw, addr, "TP_FIFO_DLQ", 2, queues=1)
    got = []
    deadline = time.time() + 30
    while time.time() < deadline and not any(p.body == b"m1" for p in got):
        _, ps = pop(raw, addr, "CG_FIFO_DLQ", "TP_FIFO_DLQ", max_nums=1, invisible_ms=1000, poll_ms=1500)
        got += ps
    assert [(p.body, p.attempt) for p in got] == [(b"m0", 1), (b"m0", 2), (b"m1", 1)]
    r = raw.pull(addr, "%DLQ%CG_FIFO_DLQ", 0, 0, group="CG_DLQ_READER")
    assert r.code == ResponseCode.SUCCESS
    dlq = decode_messages(r.body)
    assert [m.body for m in dlq] == [b"m0"] and dlq[0].properties["RETRY_TOPIC"] == "TP_FIFO_DLQ"


def test_sync_flush_broker_answers_after_the_records_are_flushed(make_cluster, raw):
    c = make_cluster({"flushDiskType": "SYNC_FLUSH"})
    addr = c.broker_addr
    create_topic(raw, addr, "TP_SYNC", queues=2)
    _send(raw, addr, "TP_SYNC", 10, queues=2)
    _, ps = pop(raw, addr, G, "TP_SYNC", invisible_ms=1000)
    assert len(ps) == 10
    for p in ps[:5]:
        assert ack(raw, addr, G, p).code == ResponseCode.SUCCESS
    r = change(raw, addr, G, ps[5], 30_000)
    assert r.code == ResponseCode.SUCCESS
    again = _drain(raw, addr, G, "TP_SYNC", 4)
    assert sorted(p.body for p in again) == sorted(p.body for p in ps[6:])


def test_metrics_count_receives_acks_and_expiries(make_cluster, raw):
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_METRICS", queues=1)
    _send(raw, addr, "TP_METRICS", 3, queues=1)
    _, ps = pop(raw, addr, G, "TP_METRICS", invisible_ms=1000)
    assert ack(raw, addr, G, ps[0]).code == ResponseCode.SUCCESS
    again = _drain(raw, addr, G, "TP_METRICS", 2)  # two expired, delivered again
    assert len(again) == 2

    def sample(name):
        fam = next(f for f in c.call(_collect(c)) if f.name == name)
        return {dict(zip(fam.labels, labels))["consumer_group"]: v for labels, v in fam.samples
                if dict(zip(fam.labels, labels))["topic"] == "TP_METRICS"}

    assert sample("rocketmq_pop_receive_messages") == {G: 5}
    assert sample("rocketmq_pop_ack_messages") == {G: 1}
    assert sample("rocketmq_pop_revive_messages") == {G: 2}
    assert sample("rocketmq_pop_inflight_messages") == {G: 2}


async def _collect(c):
    return c.broker.metrics.collect()


def test_a_long_poll_whose_client_left_hands_nothing_out(make_cluster, raw):
    from tests.rawclient import RawClient
    c = make_cluster()
    addr = c.broker_addr
    create_topic(raw, addr, "TP_LEFT", queues=1)
    gone = RawClient("gone")
    gone.invoke_async(addr, RequestCode.POP_MESSAGE, {
        "consumerGroup": G, "topic": "TP_LEFT", "queueId": "-1", "maxMsgNums": "32", "invisibleTime": "60000",
        "pollTime": "20000", "bornTime": "0", "initMode": "0"})
    deadline = time.time() + 10
    while not c.broker.pull_hold_service.held_count() and time.time() < deadline:
        time.sleep(0.05)
    assert c.broker.pull_hold_service.held_count()
    gone.close()
    time.sleep(0.3)
    _send(raw, addr, "TP_LEFT", 1, queues=1)
    _, ps = pop(raw, addr, G, "TP_LEFT", poll_ms=3000)
    assert [p.body for p in ps] == [b"m0"] and c.broker.pop_service.inflight(G, "TP_LEFT") == 1
