"""A property named twice: every reader takes the LAST pair (the Java broker's rule: its
MessageDecoder.string2messageProperties fills a HashMap in order).  The consume-queue tag code
written by each put route, the one the recovery scan rebuilds, the decoded record's tags and a
tag-filtered get must all agree on it."""
import os
import shutil

from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_batch_items
from rmq_core.store import GetMessageStatus as S
from rmq_core.store import MessageExtBatch, MessageExtBrokerInner, PutMessageStatus
from rmq_core.message import java_string_hash

from .test_consume_queue import TagFilter
from .test_recovery import crash

TWICE = b"TAGS\x01First\x02KEYS\x01k\x02TAGS\x01Second\x02"


def _cq_codes(store, topic, n):
    cq = store.find_consume_queue(topic, 0)
    return [cq.get_entry(i)[2] for i in range(n)]


def _agree(store, topic, n):
    want = java_string_hash("Second")
    assert _cq_codes(store, topic, n) == [want] * n
    g = store.get_message("g", topic, 0, 0, 32)
    assert [m.tags for m in decode_messages(g.buffer)] == ["Second"] * n
    assert [m.properties["TAGS"] for m in decode_messages(g.buffer)] == ["Second"] * n
    hit = store.get_message("g", topic, 0, 0, 32, TagFilter("Second"))
    assert hit.status is S.FOUND and hit.queue_offsets == list(range(n))
    miss = store.get_message("g", topic, 0, 0, 32, TagFilter("First"))
    assert miss.status is S.NO_MATCHED_MESSAGE and miss.message_count == 0


def test_tags_twice_last_wins_on_every_put_route_and_after_recovery(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    inner = dict(queue_id=0, body=b"x", properties_bytes=TWICE, born_timestamp=1_700_000_000_000)
    # a message: the first put to its queue and one after
    assert s.put_message(MessageExtBrokerInner(topic="Single", **inner)).is_ok()
    assert s.put_message(MessageExtBrokerInner(topic="Single", **inner)).is_ok()
    # a batch: the item names TAGS twice; and an item whose TAGS the extra properties repeat later
    body = encode_batch_items([(0, b"a", TWICE), (0, b"b", TWICE)])
    assert s.put(MessageExtBatch("Batch", 0, body)).is_ok()
    body = encode_batch_items([(0, b"c", {"TAGS": "First"}), (0, b"d", {})])
    assert s.put(MessageExtBatch("Extra", 0, body, extra_properties=b"TAGS\x01Second\x02")).is_ok()
    for topic in ("Single", "Batch", "Extra"):
        _agree(s, topic, 2)
    # the consume queues rebuilt from the log by the recovery scan
    crash(s)
    shutil.rmtree(cfg.consume_queue_dir)
    os.remove(cfg.checkpoint_file)
    s2 = store_factory(cfg)
    for topic in ("Single", "Batch", "Extra"):
        _agree(s2, topic, 2)


def test_a_property_that_would_not_read_back_is_refused_by_every_route(store):
    good = MessageExtBrokerInner(topic="T", queue_id=0, body=b"x", properties={"K": "v"})
    bad = MessageExtBrokerInner(topic="T", queue_id=0, body=b"x", properties={"K": "a\x02b"})
    assert store.put_message(good).is_ok()
    r = store.put_message(bad)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "'K'" in r.error and "separator" in r.error
    assert store.put_message(good).append_result.logics_offset == 1
