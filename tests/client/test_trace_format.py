"""Message trace records in RocketMQ 4.x's text format (TraceDataEncoder): a record laid out
field by field as the Java encoder writes it decodes, and ours encode to those same bytes."""
from __future__ import annotations

from hypothesis import given, strategies as st

from rmq_core.client.trace import (
    ConsumeReturnType, MessageType, TraceBean, TraceContext, TraceType, TraceView, decode, encode,
)
from rmq_core._native.trace import TraceBuffer
from rmq_core.client.trace import message_type_of
from rmq_core.message import Message, MessageExt, MessageQueue, SendResult, SendStatus

C, F = "\x01", "\x02"
MSG_ID = "7F0000010D5818B4AAC2795B82A70000"
OFFSET_ID = "7F00000100002A9F0000000000000A2C"

# as Java's TraceDataEncoder.encoderFromContextBean builds them (4.9.7): fields joined by \x01,
# each record closed by \x02, a null String written "null"
JAVA_PUB = C.join(["Pub", "1700000000123", "DefaultRegion", "PG_ORDERS", "Orders", MSG_ID, "TagA", "order-1 order-2",
                   "127.0.0.1:10911", "42", "3", "0", OFFSET_ID, "true"]) + F
JAVA_SUB_BEFORE = C.join(["SubBefore", "1700000000500", "DefaultRegion", "CG_BILLING", "7F0000010D58REQ", MSG_ID,
                          "0", "order-1 order-2"]) + F
JAVA_SUB_AFTER = C.join(["SubAfter", "7F0000010D58REQ", MSG_ID, "12", "false", "order-1 order-2", "4",
                         "1700000000500", "CG_BILLING"]) + F
# EndTransactionTraceHookImpl's record: msgType Trans_msg_Commit (2), the transaction id, the
# LocalTransactionState's name, fromTransactionCheck
JAVA_END_TX = C.join(["EndTransaction", "1700000000700", "DefaultRegion", "PG_TX", "Orders", MSG_ID, "TagA", "null",
                      "127.0.0.1:10911", "2", "7F0000010D5818B4AAC2795B82A7TXID", "ROLLBACK_MESSAGE", "true"]) + F
# a Pub of a message without tags or keys (Java appends null as "null")
JAVA_PUB_NULLS = C.join(["Pub", "1700000000999", "DefaultRegion", "PG", "T", MSG_ID, "null", "null",
                         "127.0.0.1:10911", "1", "0", "3", OFFSET_ID, "false"]) + F


def test_java_records_decode():
    pub, before, after, bare = decode(JAVA_PUB + JAVA_SUB_BEFORE + JAVA_SUB_AFTER + JAVA_PUB_NULLS)
    assert pub.trace_type is TraceType.Pub and pub.timestamp == 1700000000123 and pub.group_name == "PG_ORDERS"
    b = pub.beans[0]
    assert (b.topic, b.msg_id, b.tags, b.keys, b.store_host, b.body_length, b.offset_msg_id) == (
        "Orders", MSG_ID, "TagA", "order-1 order-2", "127.0.0.1:10911", 42, OFFSET_ID)
    assert pub.cost_time == 3 and pub.success and b.msg_type is MessageType.Normal_Msg
    assert before.trace_type is TraceType.SubBefore and before.group_name == "CG_BILLING"
    assert before.request_id == "7F0000010D58REQ" and before.beans[0].msg_id == MSG_ID
    assert after.trace_type is TraceType.SubAfter and after.request_id == before.request_id
    assert (after.cost_time, after.success, after.context_code, after.timestamp, after.group_name) == (
        12, False, ConsumeReturnType.FAILED, 1700000000500, "CG_BILLING")
    assert bare.beans[0].tags == "" and bare.beans[0].keys == "" and not bare.success
    assert bare.beans[0].msg_type is MessageType.Delay_Msg


def test_old_pub_layout_and_end_transaction_decode():
    # a 13-field Pub (before offsetMsgId was added) and an EndTransaction record are read as Java reads them
    old = C.join(["Pub", "1", "r", "PG", "T", MSG_ID, "t", "k", "h:1", "1", "2", "0", "true"]) + F
    pub, end = decode(old + JAVA_END_TX)
    assert pub.success and pub.beans[0].offset_msg_id == ""
    assert end.trace_type is TraceType.EndTransaction and (end.timestamp, end.group_name) == (1700000000700, "PG_TX")
    b = end.beans[0]
    assert (b.topic, b.msg_id, b.tags, b.keys, b.store_host, b.msg_type) == (
        "Orders", MSG_ID, "TagA", "", "127.0.0.1:10911", MessageType.Trans_msg_Commit)
    assert (b.transaction_id, b.transaction_state, b.from_transaction_check) == (
        "7F0000010D5818B4AAC2795B82A7TXID", "ROLLBACK_MESSAGE", True)
    view, = TraceView.from_trace_message(MSG_ID, MessageExt(topic="RMQ_SYS_TRACE_TOPIC", body=JAVA_END_TX.encode(),
                                                             born_host="10.0.0.7:5555"))
    assert (view.type, view.status, view.from_transaction_check) == ("EndTransaction", "ROLLBACK_MESSAGE", True)


def test_encode_is_byte_for_byte_java():
    pub = TraceContext(TraceType.Pub, 1700000000123, "DefaultRegion", "PG_ORDERS", cost_time=3, beans=[TraceBean(
        topic="Orders", msg_id=MSG_ID, offset_msg_id=OFFSET_ID, tags="TagA", keys="order-1 order-2",
        store_host="127.0.0.1:10911", body_length=42)])
    data, keys = encode(pub)
    assert data == JAVA_PUB
    assert keys == [MSG_ID, "order-1", "order-2"]  # what the index finds the trace message by
    before = TraceContext(TraceType.SubBefore, 1700000000500, "DefaultRegion", "CG_BILLING",
                          request_id="7F0000010D58REQ", beans=[TraceBean(msg_id=MSG_ID, keys="order-1 order-2")])
    assert encode(before)[0] == JAVA_SUB_BEFORE
    after = TraceContext(TraceType.SubAfter, 1700000000500, "DefaultRegion", "CG_BILLING", cost_time=12,
                         success=False, request_id="7F0000010D58REQ", context_code=ConsumeReturnType.FAILED,
                         beans=[TraceBean(msg_id=MSG_ID, keys="order-1 order-2")])
    assert encode(after)[0] == JAVA_SUB_AFTER
    bare = TraceContext(TraceType.Pub, 1700000000999, "DefaultRegion", "PG", success=False, beans=[TraceBean(
        topic="T", msg_id=MSG_ID, offset_msg_id=OFFSET_ID, tags=None, keys=None, store_host="127.0.0.1:10911",
        body_length=1, msg_type=MessageType.Delay_Msg)])
    assert encode(bare) == (JAVA_PUB_NULLS, [MSG_ID])
    end = TraceContext(TraceType.EndTransaction, 1700000000700, "DefaultRegion", "PG_TX", beans=[TraceBean(
        topic="Orders", msg_id=MSG_ID, tags="TagA", keys=None, store_host="127.0.0.1:10911",
        msg_type=MessageType.Trans_msg_Commit, transaction_id="7F0000010D5818B4AAC2795B82A7TXID",
        transaction_state="ROLLBACK_MESSAGE", from_transaction_check=True)])
    assert encode(end) == (JAVA_END_TX, [MSG_ID])


def test_trace_view_keeps_only_the_asked_message():
    other = JAVA_PUB.replace(MSG_ID, "7F0000010D5818B4AAC2795B82A70001")
    m = MessageExt(topic="RMQ_SYS_TRACE_TOPIC", body=(JAVA_PUB + other + JAVA_SUB_AFTER).encode(),
                   born_host="10.0.0.7:5555")
    views = TraceView.from_trace_message(MSG_ID, m)
    assert [v.type for v in views] == ["Pub", "SubAfter"]
    assert views[0].client_host == "10.0.0.7:5555" and views[1].status == "failed"


# ("null" is how the format writes a null string: it reads back as none)
_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)), min_size=1,
                max_size=12).filter(lambda t: t != "null")


@given(group=_text, topic=_text, tags=_text, keys=st.lists(_text, min_size=1, max_size=3), ts=st.integers(0, 2**62),
       cost=st.integers(0, 2**31 - 1), ok=st.booleans())
def test_round_trip(group, topic, tags, keys, ts, cost, ok):
    pub = TraceContext(TraceType.Pub, ts, "DefaultRegion", group, cost_time=cost, success=ok, beans=[TraceBean(
        topic=topic, msg_id=MSG_ID, offset_msg_id=OFFSET_ID, tags=tags, keys=" ".join(keys), store_host="h:1",
        body_length=7)])
    (back,) = decode(encode(pub)[0])
    assert back == pub


@given(keyed=st.lists(st.tuples(st.sampled_from([MSG_ID, OFFSET_ID, "7F0000010D5818B4AAC2795B82A70001"]),
                                st.one_of(st.none(), st.lists(st.sampled_from(["order-1", "ü", "k", "order-10", ""]),
                                                              max_size=3).map(" ".join))),
                      min_size=1, max_size=40))
def test_segment_keys_each_once_in_order(keyed):
    """A trace message's KEYS: every record's message id and keys, each once, first seen first
    (AsyncTraceDispatcher's key set), space separated, whatever repeats or is empty."""
    buf = TraceBuffer(1000, lambda: None, "PG", "RMQ_SYS_TRACE_TOPIC", 0.0, None, None, 1 << 20, 1 << 20)
    for msg_id, keys in keyed:
        buf.add("r\x02", msg_id, keys)
    (segment,) = buf.take(0.0, True)
    want = {}
    for msg_id, keys in keyed:
        want.update((k, None) for k in [msg_id, *(keys or "").split(" ")] if k)
    assert segment.keys == " ".join(want)


def test_buffer_bounds_waiting_records_and_waiting_trace_messages_apart():
    """`capacity` bounds what waits outside full segments (Java's context queue); full segments
    (trace messages waiting to be sent) are bounded by max_ready: a worker late by a few trace
    messages loses nothing, one that does not come loses what comes after max_ready of them."""
    wakes = []
    buf = TraceBuffer(4, lambda: wakes.append(len(wakes)), "PG", "RMQ_SYS_TRACE_TOPIC", 0.0, SendStatus.SEND_OK,
                      message_type_of, 200, 1 << 20, 3)  # (a Pub record is ~150 bytes: two fill a segment)
    result = SendResult(SendStatus.SEND_OK, MSG_ID, OFFSET_ID, MessageQueue("T", "broker-a", 0), 7)
    context = (Message("T", b"body"), MSG_ID, "ASYNC", None, "127.0.0.1:10911", 3.0, 0.0, None)
    kept = sum(buf.offer_pub(context, result) for _ in range(30))
    assert kept == 3 * 2 and buf.discarded == 24  # three full segments waiting: the rest dropped
    assert len(buf.ready) == 3 and len(buf) == 6 and wakes
    assert [s.count for s in buf.take(0.0, True)] == [2, 2, 2] and len(buf) == 0
    # a worker keeping up: the capacity bounds only the records outside full segments
    kept = sum(buf.offer_pub(context, result) for _ in range(5))
    assert kept == 5 and len(buf.ready) == 2 and len(buf) == 5
    small = TraceBuffer(4, lambda: None, "PG", "RMQ_SYS_TRACE_TOPIC", 0.0, SendStatus.SEND_OK, message_type_of,
                        1 << 20, 1 << 20, 3)
    assert sum(small.offer_pub(context, result) for _ in range(10)) == 4 and small.discarded == 6
