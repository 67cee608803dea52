"""No setting is accepted and then ignored: every key a broker or name server accepts is read by
the code that acts on it (walked over all of them), and the ones RocketMQ has that rmq cannot do
the same way are refused naming why.  The four found ignored, against a real broker:
filterSupportRetry, maxTransfer*OnMessageInDisk, transferMsgByHeap, traceTopicEnable at run time."""
from __future__ import annotations

import collections
import pathlib
import re

import attrs
import pytest

from rmq_core.admin import AdminClient
from rmq_core.admin.client import AdminError
from rmq_core.codec import decode_messages
from rmq_core.config import BrokerConfig, MessageStoreConfig, NamesrvConfig, load_broker_conf
from rmq_core.errors import ConfigError
from rmq_core.remoting.codes import ResponseCode

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _other_value(f) -> str:
    return "false" if f.default is True else "true" if f.default is False else str((f.default or 0) + 1000)


def test_every_accepted_key_is_read_where_it_acts():
    """Each config field is read somewhere besides its own definition (a service, a property of the
    config that one reads), or any value but RocketMQ's default is refused: a key that nothing
    reads would be accepted and ignored."""
    sources = [p for d in ("rmq_core", "plugins") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".pyx")]
    names = collections.Counter(re.findall(r"\w+", "\n".join(p.read_text() for p in sources)))
    ignored = []
    for cls in (BrokerConfig, MessageStoreConfig, NamesrvConfig):
        for f in attrs.fields(cls):
            if "key" not in f.metadata or names[f.name] >= 2:
                continue
            try:
                cls.from_properties({f.metadata["key"]: _other_value(f)})
            except ConfigError:
                continue  # refused, naming why (test_what_rmq_cannot_do_is_refused_naming_why)
            ignored.append(f.metadata["key"])
    assert ignored == []


@pytest.mark.parametrize("key,value,default,why", [
    ("transferMsgByHeap", "false", "true", "transferMsgByHeap=false (RocketMQ's zero-copy transfer of a pull's messages "
                                           "from the mapped commit log) is not supported"),
    ("mappedFileSizeConsumeQueueExt", "1000", str(48 * 1024 * 1024),
     "mappedFileSizeConsumeQueueExt=1000 is not supported: rmq keeps one consume-queue ext file of filter bit maps "
     "beside each consume-queue file"),
])
def test_what_rmq_cannot_do_is_refused_naming_why(make_cluster, key, value, default, why):
    with pytest.raises(ConfigError, match=re.escape(why)):
        load_broker_conf({key: value})
    load_broker_conf({key: default})  # RocketMQ's default (a broker.conf copied from RocketMQ's) is fine
    c = make_cluster()
    with AdminClient(c.tcp_namesrv) as admin:
        with pytest.raises(AdminError, match=re.escape(why)):
            admin.update_broker_config(c.broker_addr, {key: value})


def test_trace_topic_enable_takes_effect_after_a_restart_as_in_rocketmq(tmp_path):
    from rmq_core.embedded import Cluster
    from tests.broker.conftest import SMALL

    c = Cluster(str(tmp_path / "store"), dict(SMALL))
    c.start()
    try:
        with AdminClient(c.tcp_namesrv) as admin:
            later = admin.update_broker_config(c.broker_addr, {"traceTopicEnable": "true"})
        assert later and "restart" in later
        assert c.broker.topic_manager.select("RMQ_SYS_TRACE_TOPIC") is None
    finally:
        c.stop()
    c = Cluster(str(tmp_path / "store"), dict(SMALL))  # the persisted change, in effect now
    c.start()
    try:
        assert c.broker.topic_manager.select("RMQ_SYS_TRACE_TOPIC") is not None
    finally:
        c.stop()


def _pulled(raw, addr, topic, offset=0, group="CG_DISK", **kw):
    r = raw.pull(addr, topic, 0, offset, group=group, **kw)
    return decode_messages(r.body) if r.code == ResponseCode.SUCCESS else [], r


def test_a_pull_of_messages_no_longer_in_memory_takes_the_in_disk_caps(make_cluster, raw):
    # accessMessageInMemoryMaxRatio=0: every message but the newest byte counts as no longer in memory
    c = make_cluster({"accessMessageInMemoryMaxRatio": "0", "maxTransferCountOnMessageInDisk": "3"})
    addr = c.broker_addr
    for i in range(10):
        assert raw.send(addr, "TopicDisk", b"m%d" % i, queue_id=0).code == ResponseCode.SUCCESS
    msgs, r = _pulled(raw, addr, "TopicDisk")
    assert [m.body for m in msgs] == [b"m0", b"m1", b"m2"] and r.ext_fields["nextBeginOffset"] == "3"
    with AdminClient(c.tcp_namesrv) as admin:
        admin.update_broker_config(addr, {"maxTransferCountOnMessageInDisk": "5"})  # at run time
        assert len(_pulled(raw, addr, "TopicDisk", 3)[0]) == 5
        admin.update_broker_config(addr, {"maxTransferBytesOnMessageInDisk": "1"})  # the first always goes
        assert len(_pulled(raw, addr, "TopicDisk")[0]) == 1
        admin.update_broker_config(addr, {"accessMessageInMemoryMaxRatio": "40"})  # in memory: its caps
        assert len(_pulled(raw, addr, "TopicDisk")[0]) == 10


@pytest.mark.parametrize("filter_support_retry", [True, False])
def test_filter_support_retry_applies_the_groups_expression_to_its_retry_topic(make_cluster, raw,
                                                                                filter_support_retry):
    """A group subscribing TopicSql with 'a > 5' pulls its %RETRY% topic: with filterSupportRetry the
    retry messages of TopicSql are filtered by that expression (RocketMQ's
    ExpressionForRetryMessageFilter), without it they all come."""
    c = make_cluster({"filterSupportRetry": str(filter_support_retry).lower()})
    addr, group, retry = c.broker_addr, "CG_RETRY_SQL", "%RETRY%CG_RETRY_SQL"
    assert raw.heartbeat(addr, "10.0.0.7@retry", group, "TopicSql", sub="a > 5",
                         expression_type="SQL92").code == ResponseCode.SUCCESS
    for a in (1, 7, 3, 9):
        assert raw.send(addr, retry, b"a=%d" % a, props={"a": str(a), "RETRY_TOPIC": "TopicSql"}).code == 0
    assert raw.send(addr, retry, b"other", props={"a": "1", "RETRY_TOPIC": "TopicTagged"}).code == 0
    msgs, _ = _pulled(raw, addr, retry, group=group)
    expected = [b"a=7", b"a=9", b"other"] if filter_support_retry else [b"a=1", b"a=7", b"a=3", b"a=9", b"other"]
    assert [m.body for m in msgs] == expected
