"""SQL92 and tag filters evaluated at the broker, with and without the bloom prefilter."""
import pytest

from rmq_core.codec import decode_messages
from rmq_core.remoting.codes import ResponseCode


def _pull_all(raw, addr, topic, group, sub, etype, queue_id=0):
    out, offset = [], 0
    for _ in range(1000):
        r = raw.pull(addr, topic, queue_id, offset, group=group, sub=sub, expression_type=etype)
        if r.code == ResponseCode.SUCCESS:
            out += decode_messages(r.body)
        elif r.code != ResponseCode.PULL_RETRY_IMMEDIATELY:
            break
        offset = int(r.ext_fields["nextBeginOffset"])
    return out


@pytest.mark.parametrize("bloom", [False, True], ids=["sql-only", "bloom"])
def test_sql_group_and_tag_group_each_get_their_own(make_cluster, raw, bloom):
    c = make_cluster({"enablePropertyFilter": "true", "enableCalcFilterBitMap": str(bloom).lower()})
    addr = c.broker_addr
    assert raw.heartbeat(addr, "c-sql", "G_SQL", "T_F", sub="a BETWEEN 3 AND 5", expression_type="SQL92").code == 0
    assert raw.heartbeat(addr, "c-tag", "G_TAG", "T_F", sub="TagA").code == 0
    for i in range(60):
        props = {"b": "x"} if i % 7 == 0 else {"a": str(i % 10)}
        assert raw.send(addr, "T_F", f"m{i}".encode(), tags="TagA" if i % 2 == 0 else "TagB", queue_id=0,
                        props=props).code == 0
    got = _pull_all(raw, addr, "T_F", "G_SQL", "a BETWEEN 3 AND 5", "SQL92")
    want = [f"m{i}".encode() for i in range(60) if i % 7 != 0 and 3 <= i % 10 <= 5]
    assert [m.body for m in got] == want
    got = _pull_all(raw, addr, "T_F", "G_TAG", "TagA", "TAG")
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(0, 60, 2)]
    from rmq_core.common.subscription import SubscriptionData
    mf = c.broker.build_message_filter("G_SQL", SubscriptionData.build("T_F", "a BETWEEN 3 AND 5", "SQL92"))
    assert (mf.bloom_bits is not None) == bloom  # with bit maps on, the scan tests bloom bits first
    if bloom:
        data = c.broker.filter_manager.get("T_F", "G_SQL")
        assert data is not None and data.expression == "a BETWEEN 3 AND 5"
        # every stored entry carries a bit map in the consume-queue ext
        cq = c.broker.store.consume_queue_table["T_F"][0]
        assert cq.ext is not None


def test_bloom_never_skips_messages_stored_before_the_group_registered(make_cluster, raw):
    c = make_cluster({"enablePropertyFilter": "true", "enableCalcFilterBitMap": "true"})
    addr = c.broker_addr
    for i in range(20):  # stored before any SQL92 subscription exists: no bits for G_LATE
        raw.send(addr, "T_LATE", f"early{i}".encode(), queue_id=0, props={"a": str(i)})
    assert raw.heartbeat(addr, "c-late", "G_LATE", "T_LATE", sub="a >= 15", expression_type="SQL92").code == 0
    for i in range(20, 30):
        raw.send(addr, "T_LATE", f"late{i}".encode(), queue_id=0, props={"a": str(i)})
    got = [m.body for m in _pull_all(raw, addr, "T_LATE", "G_LATE", "a >= 15", "SQL92")]
    assert got == [f"early{i}".encode() for i in range(15, 20)] + [f"late{i}".encode() for i in range(20, 30)]
    # a changed expression must not trust the bits of the old one
    assert raw.heartbeat(addr, "c-late", "G_LATE", "T_LATE", sub="a < 3", expression_type="SQL92").code == 0
    got = [m.body for m in _pull_all(raw, addr, "T_LATE", "G_LATE", "a < 3", "SQL92")]
    assert got == [f"early{i}".encode() for i in range(3)]


def test_sql_type_mismatch_and_missing_property_are_not_delivered(make_cluster, raw):
    c = make_cluster({"enablePropertyFilter": "true"})
    addr = c.broker_addr
    for v in ("7", "seven", None, "4"):
        raw.send(addr, "T_MIS", f"v={v}".encode(), queue_id=0, props={"a": v} if v is not None else {})
    got = [m.body for m in _pull_all(raw, addr, "T_MIS", "G_MIS", "a > 5", "SQL92")]
    assert got == [b"v=7"]


def test_bad_sql_at_pull_gets_parse_failed_with_position(cluster, raw):
    raw.send(cluster.broker_addr, "T_BADSQL", b"x", queue_id=0)
    r = raw.pull(cluster.broker_addr, "T_BADSQL", 0, 0, group="G_BAD", sub="a BETWEEN 1", expression_type="SQL92")
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "position" in r.remark


def test_unknown_expression_type_is_named(cluster, raw):
    r = raw.heartbeat(cluster.broker_addr, "c-x", "G_X", "T_X", sub="a", expression_type="JSONPATH")
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "JSONPATH" in r.remark
