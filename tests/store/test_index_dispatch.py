"""The index is built off the put path (IndexBuildService), RocketMQ's ReputMessageService way:
a put only queues work; queries, the checkpoint and shutdown see a complete index; a crash loses
only queued work, which recovery rebuilds from the commit log."""
import threading

from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_batch_items
from rmq_core.store import DefaultMessageStore, MessageExtBatch

from .conftest import msg
from .test_recovery import crash


def test_put_queues_index_work_instead_of_building_it(store, monkeypatch):
    built = []
    real = store.index_service.build_hashed

    def counting(records):
        records = list(records)
        built.extend(r[0] for r in records)
        real(records)

    monkeypatch.setattr(store.index_service, "build_hashed", counting)
    store.index_build_service.stop()  # hold the builder: work must stay queued
    for i in range(50):
        assert store.put_message(msg(body=b"b%d" % i, keys="k-%d" % i)).is_ok()
    assert built == [] and store.index_build_service.pending() == 50
    # a query drains the queue first: a put that returned is found
    found = store.query_message("TopicA", "k-49", 10, 0, 2**62)
    assert found.message_count == 1 and decode_messages(found.buffer)[0].body == b"b49"
    assert len(built) == 50 and store.index_build_service.pending() == 0


def test_builder_thread_indexes_without_a_query(store):
    s = store
    r = s.put_message(msg(body=b"x", keys="lonely"))
    assert r.is_ok()
    b = s.index_build_service
    for _ in range(500):
        if not b.pending() and s.index_service.indexed_phy_offset == r.append_result.wrote_offset:
            break
        threading.Event().wait(0.01)
    assert s.index_service.indexed_phy_offset == r.append_result.wrote_offset
    assert b.processed_timestamp == r.append_result.store_timestamp


def test_batches_are_indexed_from_their_entries(store):
    body = encode_batch_items([(0, b"i%d" % i, {"KEYS": "bk-%d" % i}) for i in range(20)])
    r = store.put_messages(MessageExtBatch(topic="TopicA", queue_id=0, body=body))
    assert r.is_ok() and r.append_result.msg_num == 20
    found = store.query_message("TopicA", "bk-17", 10, 0, 2**62)
    assert found.message_count == 1 and decode_messages(found.buffer)[0].body == b"i17"


def test_checkpoint_index_time_covers_only_what_is_indexed(store):
    s = store
    first = s.put_message(msg(body=b"a", keys="ka"))
    s._flush_consume_queues(0)
    assert s.checkpoint.index_msg_timestamp == first.append_result.store_timestamp
    s.index_build_service.stop()
    second = s.put_message(msg(body=b"b", keys="kb"))
    # the thorough flush drains the queue: then, and only then, the checkpoint moves on
    s._flush_consume_queues(0)
    assert s.index_build_service.pending() == 0
    assert s.checkpoint.index_msg_timestamp == second.append_result.store_timestamp


def test_crash_with_unbuilt_index_work_is_rebuilt_by_recovery(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    for i in range(30):
        assert s.put_message(msg(body=b"early%d" % i, keys="e-%d" % i)).is_ok()
    s._flush_consume_queues(0)  # checkpoint: indexed up to here
    s.index_build_service.stop()
    for i in range(30):
        assert s.put_message(msg(body=b"late%d" % i, keys="l-%d" % i)).is_ok()
    assert s.index_build_service.pending() == 30
    s.commit_log.flush(0)
    crash(s)  # the queued index work is lost with the process
    s2 = DefaultMessageStore(cfg)
    try:
        assert s2.load()
        for key, body in (("l-0", b"late0"), ("l-29", b"late29"), ("e-3", b"early3")):
            found = s2.query_message("TopicA", key, 10, 0, 2**62)
            assert found.message_count == 1 and decode_messages(found.buffer)[0].body == body
    finally:
        s2.shutdown()
