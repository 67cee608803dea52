"""The native single put (SinglePutPath) must store exactly what the general path stores, and
step aside whenever its preconditions do not hold."""
import asyncio
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rmq_core.codec import encode_batch_body
from rmq_core.config import FlushDiskType
from rmq_core.message import java_string_hash, properties_to_string
from rmq_core.store import DefaultMessageStore, MessageExtBatch, MessageExtBrokerInner, PutMessageStatus
from rmq_core.store.types import record_fields

from .conftest import hold_python_rounds, make_config, msg


def _general_only(store: DefaultMessageStore) -> DefaultMessageStore:
    store._single_put.enabled = False
    store._fast_put = None
    return store


def _open(root, **kw) -> DefaultMessageStore:
    s = DefaultMessageStore(make_config(root, **kw))
    s.load()
    s.start()
    return s


_text = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, blacklist_characters="\x01\x02 "), max_size=12)
_messages = st.lists(st.tuples(
    st.sampled_from(["TopicA", "TopicB", "%RETRY%g"]),
    st.integers(0, 3),
    st.binary(max_size=300),
    st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "b"]), _text, max_size=4),
    st.integers(-2**31, 2**31 - 1),                       # flag
    st.sampled_from([0, 0x1, 0x2, 0x8]),                  # sys flag (commit-type tx kept)
    st.sampled_from([("127.0.0.1", 5555), ("10.1.2.3", 1), ("::1", 9876)]),
    st.sampled_from([None, 7, -5]),                       # explicit tags code
    st.booleans(),                                        # pre-encoded properties
), min_size=1, max_size=40)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=_messages)
def test_native_put_stores_what_the_general_path_stores(tmp_path_factory, items):
    fast = _open(tmp_path_factory.mktemp("fast"))
    slow = _general_only(_open(tmp_path_factory.mktemp("slow")))
    try:
        taken = 0
        for topic, qid, body, props, flag, sys_flag, born, tags_code, pre in items:
            kw = dict(topic=topic, queue_id=qid, body=body, flag=flag, sys_flag=sys_flag, born_host=born,
                      born_timestamp=1_700_000_000_000, tags_code=tags_code)
            if pre:
                kw["properties_bytes"] = properties_to_string(props).encode()
            else:
                kw["properties"] = props
            before = fast.put_message_count
            native_result = fast._single_put.put(MessageExtBrokerInner(**kw))
            if native_result is None:
                a = fast.put_message(MessageExtBrokerInner(**kw))
            else:
                taken += 1
                a, fut = native_result
                assert fut is None
                assert fast.put_message_count == before + 1
            b = slow.put_message(MessageExtBrokerInner(**kw))
            assert a.status is b.status is PutMessageStatus.PUT_OK
            ra, rb = a.append_result, b.append_result
            assert (ra.wrote_offset, ra.wrote_bytes, ra.msg_id, ra.logics_offset, ra.msg_num) == \
                   (rb.wrote_offset, rb.wrote_bytes, rb.msg_id, rb.logics_offset, rb.msg_num)
            fa = record_fields(fast.select_one_message_by_offset(ra.wrote_offset))
            fb = record_fields(slow.select_one_message_by_offset(rb.wrote_offset))
            assert fa["store_timestamp"] == ra.store_timestamp
            fa.pop("store_timestamp"), fb.pop("store_timestamp")
            assert fa == fb
            ca = fast.find_consume_queue(topic, qid).get_entry(ra.logics_offset)
            cb = slow.find_consume_queue(topic, qid).get_entry(rb.logics_offset)
            assert ca == cb
        # every first put to a queue (and from a new host) takes the general path; later ones not
        seen = set()
        expect_native = 0
        for topic, qid, *_rest, born, _tags, _pre in items:
            expect_native += (topic, qid) in seen and born in seen
            seen.add((topic, qid))
            seen.add(born)
        assert taken >= expect_native
        for topic in ("TopicA", "TopicB", "%RETRY%g"):
            for q in range(4):
                assert fast.get_max_offset_in_queue(topic, q) == slow.get_max_offset_in_queue(topic, q)
    finally:
        fast.shutdown()
        slow.shutdown()


def test_steady_state_puts_skip_the_general_path(store, monkeypatch):
    assert store.put_message(msg(body=b"first")).is_ok()  # creates the consume queue
    def general(*a, **k):
        raise AssertionError("the general append path was used")
    monkeypatch.setattr(store.commit_log, "append", general)
    arrived = []
    store.register_message_arriving_listener(lambda *a: arrived.append(a))
    for i in range(20):
        r, fut = store.put_message_nowait(msg(body=b"b%d" % i, tags="T"))
        assert r.is_ok() and fut is None and r.append_result.logics_offset == i + 1
    assert [a[2] for a in arrived] == list(range(2, 22))
    assert arrived[0][3] == java_string_hash("T")
    g = store.get_message("g", "TopicA", 0, 1, 32)
    assert g.message_count == 20


def test_segment_roll_and_new_queue_fall_back(store):
    # 64 KiB segments and 100-entry consume-queue files: 900 records of ~200 bytes roll both
    offsets = []
    for i in range(900):
        r = store.put_message(msg(queue_id=i % 3, body=b"x" * 100))
        assert r.is_ok()
        offsets.append(r.append_result.wrote_offset)
    assert len(store.commit_log.mapped_file_queue.mapped_files) > 1
    assert offsets == sorted(offsets)
    for q in range(3):
        assert store.get_max_offset_in_queue("TopicA", q) == 300
        assert len(store.find_consume_queue("TopicA", q).mapped_file_queue.mapped_files) == 3
    assert [r.append_result.logics_offset for r in [store.put_message(msg(queue_id=2))]] == [300]


def test_disk_full_and_shutdown_disable_the_native_path(store):
    assert store.put_message(msg()).is_ok()
    store.disk_usage = lambda path: 0.99
    store.check_disk_space()
    assert store._fast_put is None
    r = store.put_message(msg())
    assert r.status is PutMessageStatus.DISK_FULL and "full" in r.error
    store.disk_usage = lambda path: 0.10
    store.check_disk_space()
    assert store._fast_put is not None and store.put_message(msg()).is_ok()
    store.shutdown()
    assert store._single_put.put(msg()) is None
    assert store.put_message(msg()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_errors_still_come_from_the_general_path(store_factory):
    store = store_factory(max_message_size=1024)
    assert store.put_message(msg()).is_ok()
    r = store.put_message(msg(body=b"x" * 1024))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "exceeds maxMessageSize 1024" in r.error
    r = store.put_message(msg(topic="T" * 128))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "128 bytes" in r.error


def test_sync_flush_native_put_writes_through_the_descriptor_and_waits_for_group_commit(sync_store, monkeypatch):
    s = sync_store
    assert s.put_message(msg(body=b"first")).is_ok()  # creates the consume queue
    assert s._fast_put is not None
    monkeypatch.setattr(s.commit_log, "append", lambda *a, **k: pytest.fail("general path used"))
    rounds = s.commit_log.flush_service.rounds
    r, fut = s.put_message_nowait(msg(body=b"second"))
    assert r.is_ok() and fut.result(timeout=10) is PutMessageStatus.PUT_OK
    assert s.commit_log.mapped_file_queue.flushed_where >= r.append_result.wrote_offset + r.append_result.wrote_bytes
    assert s.commit_log.flush_service.rounds > rounds
    r2 = s.put_message(msg(body=b"third"))
    assert r2.is_ok() and s.commit_log.mapped_file_queue.flushed_where >= r2.append_result.wrote_offset
    g = s.get_message("g", "TopicA", 0, 0, 32)
    assert [record_fields(g.buffer[i:])["body"] for i in (0,)] == [b"first"] and g.message_count == 3


def test_one_group_commit_round_serves_every_put_queued_before_it(sync_store, monkeypatch):
    s = sync_store
    assert s.put_message(msg()).is_ok()
    gate, flushing = hold_python_rounds(s, monkeypatch)  # rounds through commit_log.flush, held
    first = s.put_message_nowait(msg(body=b"first"))[1]
    assert flushing.wait(10)  # the loop took round 1 and is flushing it
    futs = [s.put_message_nowait(msg(body=b"m%d" % i))[1] for i in range(20)]
    assert len({id(f) for f in futs}) == 1 and futs[0] is not first and not futs[0].done()
    gate.set()
    assert first.result(timeout=10) is PutMessageStatus.PUT_OK
    assert futs[0].result(timeout=10) is PutMessageStatus.PUT_OK


def test_blocking_sync_put_times_out_then_waits_correctly_again(store_factory, monkeypatch):
    # 1 s: the puts after the slow one must fit their flushes in it even on a loaded machine
    s = store_factory(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=1000)
    assert s.put_message(msg()).is_ok()
    gate = threading.Event()
    real_flush = s.commit_log.flush
    monkeypatch.setattr(s.commit_log, "flush", lambda least_pages=0: (gate.wait(10), real_flush(least_pages))[1])
    monkeypatch.setattr(s.commit_log.flush_service, "serve_natively", False)  # the slow flush above
    r = s.put_message(msg(body=b"slow"))
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and "syncFlushTimeout 1000 ms" in r.error
    assert r.append_result is not None and r.is_ok()  # stored, only not yet durable (RocketMQ isOk)
    gate.set()  # the late flush releases the timed-out waiter's old lock...
    monkeypatch.setattr(s.commit_log, "flush", real_flush)
    for i in range(5):  # ...which must not let this thread's next puts return early
        r = s.put_message(msg(body=b"n%d" % i))
        assert r.status is PutMessageStatus.PUT_OK
        assert s.commit_log.mapped_file_queue.flushed_where >= r.append_result.wrote_offset + r.append_result.wrote_bytes


def test_one_put_path_takes_messages_and_batches(store_factory):
    """put / put_nowait / put_async are one path: a message and a batch alike, in one queue's order,
    and the RocketMQ-named entry points are that path."""
    store = store_factory()
    assert store.put_message == store.put and store.put_messages == store.put
    assert store.put_message_nowait == store.put_nowait == store.put_messages_nowait
    batch = MessageExtBatch("TopicA", 0, encode_batch_body([(0, b"b%d" % i, {}) for i in range(3)]))
    assert store.put(msg(body=b"m0")).append_result.logics_offset == 0
    r, fut = store.put_nowait(batch)
    assert r.is_ok() and fut is None and r.append_result.logics_offset == 1 and r.append_result.msg_num == 3
    assert asyncio.run(store.put_async(msg(body=b"m4"))).append_result.logics_offset == 4
    got = store.get_message("g", "TopicA", 0, 0, 32)
    assert got.message_count == 5
