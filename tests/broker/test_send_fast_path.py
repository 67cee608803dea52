"""The send processor's fast path (a plain send to a topic checked before) keeps every check of the
full path: a change to the topic table or to the broker's permission takes effect on the next send,
and special messages (delay, timer, transaction, batch, retry) still take their own routes."""
import time

import pytest
from hypothesis import given, settings, strategies as st

from rmq_core._native.frame import header_ints
from rmq_core.broker.processors.send import SendMessageProcessor
from rmq_core.codec import decode_messages
from rmq_core.message import PermName
from rmq_core.remoting.codes import RequestCode, ResponseCode

V2 = RequestCode.SEND_MESSAGE_V2


def _send_processor(cluster) -> SendMessageProcessor:
    entry = cluster.broker.servers[0]._table._processors[int(V2)]
    return entry[1].__self__


def _update_topic(raw, addr, topic, read, write, perm=6):
    r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                   {"topic": topic, "readQueueNums": str(read), "writeQueueNums": str(write), "perm": str(perm)})
    assert r.code == 0, r.remark


@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, V2])
def test_fast_path_answers_like_the_full_path(cluster, raw, code):
    addr = cluster.broker_addr
    first = raw.send(addr, "FastT", b"one", tags="A", queue_id=1, code=code)  # full path: auto-create, check
    assert first.code == 0, first.remark
    assert "FastT" in _send_processor(cluster)._send_topics
    second = raw.send(addr, "FastT", b"two", tags="B", keys="k2", queue_id=1, props={"p": "v"}, code=code)
    assert second.code == 0, second.remark
    assert set(second.ext_fields) == set(first.ext_fields) == {"msgId", "queueId", "queueOffset", "MSG_REGION", "TRACE_ON"}
    assert (second.ext_fields["queueId"], second.ext_fields["queueOffset"]) == ("1", "1")
    assert second.ext_fields["MSG_REGION"] == "DefaultRegion" and second.ext_fields["TRACE_ON"] == "true"
    msgs = decode_messages(raw.pull(addr, "FastT", 1, 0).body)
    assert [m.body for m in msgs] == [b"one", b"two"]
    assert msgs[1].tags == "B" and msgs[1].keys == "k2" and msgs[1].properties["p"] == "v"
    assert msgs[1].properties["CLUSTER"] == cluster.broker_config.broker_cluster_name
    assert msgs[1].offset_msg_id == second.ext_fields["msgId"]
    assert msgs[1].born_host.startswith("127.0.0.1:")
    stats = cluster.broker.stats
    assert stats.put_nums["FastT"] == 2 and stats.put_size["FastT"] > 0


def test_any_queue_when_queue_id_is_negative(cluster, raw):
    addr = cluster.broker_addr
    assert raw.send(addr, "AnyQ", b"x", queue_id=0).code == 0
    queues = {raw.send(addr, "AnyQ", b"x", queue_id=-1).ext_fields["queueId"] for _ in range(40)}
    assert queues <= {"0", "1", "2", "3"} and len(queues) > 1


def test_topic_changes_reach_the_next_send(cluster, raw):
    addr = cluster.broker_addr
    assert raw.send(addr, "Changing", b"x", queue_id=3).code == 0
    _update_topic(raw, addr, "Changing", 2, 2)  # fewer queues: queue 3 is now out of range
    r = raw.send(addr, "Changing", b"x", queue_id=3)
    assert r.code == ResponseCode.SYSTEM_ERROR and "queueId[3] is illegal" in r.remark
    assert raw.send(addr, "Changing", b"x", queue_id=1).code == 0
    _update_topic(raw, addr, "Changing", 2, 2, perm=PermName.PERM_READ)  # read-only topic
    r = raw.send(addr, "Changing", b"x", queue_id=1)
    assert r.code == ResponseCode.NO_PERMISSION and "Changing" in r.remark
    _update_topic(raw, addr, "Changing", 2, 2)
    assert raw.send(addr, "Changing", b"x", queue_id=1).code == 0


def test_deleted_topic_is_not_sent_to_without_auto_create(make_cluster, raw):
    cluster = make_cluster({"autoCreateTopicEnable": "false"})
    addr = cluster.broker_addr
    _update_topic(raw, addr, "Gone", 1, 1)
    assert raw.send(addr, "Gone", b"x").code == 0
    assert raw.send(addr, "Gone", b"x").code == 0  # from the fast path
    r = raw.invoke(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Gone"})
    assert r.code == 0, r.remark
    r = raw.send(addr, "Gone", b"x")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and "Gone" in r.remark


def test_broker_permission_change_reaches_the_next_send(cluster, raw):
    addr = cluster.broker_addr
    assert raw.send(addr, "Perm", b"x").code == 0
    assert raw.send(addr, "Perm", b"x").code == 0
    cluster.broker_config.broker_permission = PermName.PERM_READ
    try:
        r = raw.send(addr, "Perm", b"x")
        assert r.code == ResponseCode.NO_PERMISSION and "forbidden" in r.remark
    finally:
        cluster.broker_config.broker_permission = PermName.PERM_READ | PermName.PERM_WRITE
    assert raw.send(addr, "Perm", b"x").code == 0


def test_bad_header_values_after_the_topic_was_checked(cluster, raw):
    addr = cluster.broker_addr
    assert raw.send(addr, "BadHdr", b"x", code=V2).code == 0
    ext = {"a": "PG", "b": "BadHdr", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "0", "h": "0",
           "i": "", "j": "0", "k": "false", "m": "false"}
    r = raw.invoke(addr, V2, {**ext, "e": "zero"}, b"x")
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "'e'" in r.remark and "zero" in r.remark
    r = raw.invoke(addr, V2, {**ext, "l": "many"}, b"x")
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "'l'" in r.remark
    # What int() accepts the full path accepts too: " 2" is queue 2.
    r = raw.invoke(addr, V2, {**ext, "e": " 2"}, b"x")
    assert r.code == 0 and r.ext_fields["queueId"] == "2"
    r = raw.invoke(addr, V2, {**ext, "g": ""}, b"x")  # no born timestamp: now
    assert r.code == 0
    msg = decode_messages(raw.pull(addr, "BadHdr", 0, int(r.ext_fields["queueOffset"])).body)[0]
    assert abs(msg.born_timestamp - time.time() * 1000) < 60_000


def test_delay_and_transaction_sends_still_take_their_routes(cluster, raw):
    addr = cluster.broker_addr
    assert raw.send(addr, "Special", b"plain").code == 0
    r = raw.send(addr, "Special", b"later", props={"DELAY": "1"})
    assert r.code == 0
    assert raw.pull(addr, "Special", 0, 1).code == ResponseCode.PULL_NOT_FOUND  # held by the schedule topic
    r = raw.send(addr, "Special", b"half", sys_flag=0x4, props={"TRAN_MSG": "true", "PGROUP": "PG_RAW"})
    assert r.code == 0
    assert raw.pull(addr, "Special", 0, 1).code == ResponseCode.PULL_NOT_FOUND  # a half is invisible
    # A property value that merely mentions a special key is a plain message.
    r = raw.send(addr, "Special", b"mention", props={"note": "DELAY TIMER_ TRAN_MSG"})
    assert r.code == 0 and r.ext_fields["queueOffset"] == "1"
    cluster.broker_config.reject_transaction_message = True
    try:
        r = raw.send(addr, "Special", b"half", sys_flag=0x4, props={"TRAN_MSG": "true", "PGROUP": "PG_RAW"})
        assert r.code == ResponseCode.NO_PERMISSION
    finally:
        cluster.broker_config.reject_transaction_message = False


def test_retry_topic_sends_are_never_cached(cluster, raw):
    addr = cluster.broker_addr
    raw.heartbeat(addr, "cid-1", "CG_FAST", "SomeTopic")
    for _ in range(2):
        r = raw.send(addr, "%RETRY%CG_FAST", b"x", reconsume_times=1)
        assert r.code == 0, r.remark
    assert "%RETRY%CG_FAST" not in _send_processor(cluster)._send_topics
    r = raw.send(addr, "%RETRY%CG_FAST", b"x", reconsume_times=5, max_reconsume_times=2)
    assert r.code == 0
    assert raw.pull(addr, "%DLQ%CG_FAST", 0, 0).code == 0


# --- the native integer reader ----------------------------------------------------------------------
KEYS = ("a", "b", "c")
DEFAULTS = (4, -1, None)


def _python_ints(ext):
    """What SendHeader.parse's _int_or gives, or None when int() would refuse or is needed."""
    out = []
    for k, d in zip(KEYS, DEFAULTS):
        v = ext.get(k)
        if v is None or v == "":
            out.append(d)
        elif type(v) is int:
            out.append(v)
        else:
            out.append(int(v))
    return tuple(out)


def test_header_ints_examples():
    assert header_ints({}, KEYS, DEFAULTS) == (4, -1, None)
    assert header_ints({"a": "12", "b": "", "c": "-3"}, KEYS, DEFAULTS) == (12, -1, -3)
    assert header_ints({"a": 7, "b": "0007"}, KEYS, DEFAULTS) == (7, 7, None)
    assert header_ints({"a": "999999999999999999"}, KEYS, DEFAULTS)[0] == 999_999_999_999_999_999
    for declined in (" 1", "1 ", "+1", "1_0", "-", "x", "1.5", "١", "9" * 19, 1.5, True):
        assert header_ints({"b": declined}, KEYS, DEFAULTS) is None, declined
    with pytest.raises(ValueError, match="3 keys but 2 defaults"):
        header_ints({}, KEYS, (1, 2))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS + ("z",)),
                       st.one_of(st.integers(-10**20, 10**20).map(str), st.integers(-5, 5), st.text(max_size=6))))
def test_header_ints_agrees_with_int(ext):
    native = header_ints(ext, KEYS, DEFAULTS)
    try:
        expected = _python_ints(ext)
    except ValueError:
        assert native is None
        return
    assert native is None or native == expected
    if all(type(ext.get(k)) is int or (isinstance(ext.get(k), str) and ext[k].lstrip("-").isascii()
                                       and ext[k].lstrip("-").isdigit() and len(ext[k].lstrip("-")) <= 18
                                       and ext[k].count("-") <= 1 and not ext[k].endswith("-"))
           or ext.get(k) in (None, "") for k in KEYS):
        assert native == expected
