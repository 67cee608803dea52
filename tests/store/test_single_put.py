"""The one put path (DefaultMessageStore.put_nowait -> CommitLog.put_message -> the put_record
kernel) for a single message: every message stores exactly the record RocketMQ writes, in every
state of the log and its queues (first put, rolls, SYNC_FLUSH, a batch in flight)."""
import asyncio
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.codec_oracle import encode_batch_items, encode_message_record
from rmq_core.config import FlushDiskType
from rmq_core.message import java_string_hash, properties_to_bytes, string_to_properties
from rmq_core.store import DefaultMessageStore, MessageExtBatch, MessageExtBrokerInner, PutMessageStatus
from rmq_core.store.types import encode_host, record_fields

from .conftest import hold_python_rounds, make_config, msg


def _open(root, store_host=("127.0.0.1", 10911), **kw) -> DefaultMessageStore:
    s = DefaultMessageStore(make_config(root, **kw), store_host)
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
@given(items=_messages, store_host=st.sampled_from([("127.0.0.1", 10911), ("::1", 10911)]),
       flush=st.sampled_from([FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH]))
def test_every_put_stores_the_record_rocketmq_writes(tmp_path_factory, items, store_host, flush):
    """Byte for byte the record of the codec's oracle (encode_message_record) at the offsets the
    put answered, and the consume-queue entry (offset, size, tag code) pointing at it - through
    the mapping and through the descriptor (SYNC_FLUSH), for an IPv4 and an IPv6 store host."""
    store = _open(tmp_path_factory.mktemp("one"), store_host, flush_disk_type=flush,
                  mapped_file_size_commit_log=8 * 1024)  # rolls often
    try:
        next_qoff = {}
        for topic, qid, body, props, flag, sys_flag, born, tags_code, pre in items:
            kw = dict(topic=topic, queue_id=qid, body=body, flag=flag, sys_flag=sys_flag, born_host=born,
                      born_timestamp=1_700_000_000_000, tags_code=tags_code)
            props_b = properties_to_bytes(props)
            if pre:
                kw["properties_bytes"] = props_b
            else:
                kw["properties"] = props
            before = store.put_message_count
            r = store.put_message(MessageExtBrokerInner(**kw))
            assert r.status is PutMessageStatus.PUT_OK and store.put_message_count == before + 1
            a = r.append_result
            assert a.logics_offset == next_qoff.get((topic, qid), 0) and a.msg_num == 1
            next_qoff[(topic, qid)] = a.logics_offset + 1
            want = encode_message_record(
                topic=topic, body=body, queue_id=qid, flag=flag, queue_offset=a.logics_offset,
                commit_log_offset=a.wrote_offset, sys_flag=sys_flag, born_timestamp=1_700_000_000_000, born_host=born,
                store_timestamp=a.store_timestamp, store_host=store.store_host, properties=props_b)
            assert store.select_one_message_by_offset(a.wrote_offset) == want and a.wrote_bytes == len(want)
            assert a.msg_id == (encode_host(store.store_host)[0] + a.wrote_offset.to_bytes(8, "big")).hex().upper()
            tags = tags_code_of(props_b) if tags_code is None else tags_code
            assert store.find_consume_queue(topic, qid).get_entry(a.logics_offset) == (a.wrote_offset, len(want), tags)
        for (topic, qid), n in next_qoff.items():
            assert store.get_max_offset_in_queue(topic, qid) == n
    finally:
        store.shutdown()


def test_a_failed_write_is_answered_and_leaves_no_trace(sync_store):
    """A record the descriptor refuses (SYNC_FLUSH pwrite): the put answers with the reason and
    no position moved, so the next put takes the same place."""
    import os

    s = sync_store
    assert s.put_message(msg(body=b"first")).is_ok()
    mf = s.commit_log.mapped_file_queue.mapped_files[-1]
    good_fd, read_only = mf.fd, os.open(mf.path, os.O_RDONLY)
    end = s.get_max_phy_offset()
    try:
        mf.fd = read_only
        r = s.put_message(msg(body=b"refused"))
    finally:
        mf.fd = good_fd
        os.close(read_only)
    assert r.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED and "commit log write failed" in r.error
    assert s.get_max_phy_offset() == end and s.get_max_offset_in_queue("TopicA", 0) == 1
    r = s.put_message(msg(body=b"second"))
    assert r.is_ok() and r.append_result.wrote_offset == end and r.append_result.logics_offset == 1


def tags_code_of(props_b: bytes) -> int:
    tags = string_to_properties(props_b).get("TAGS")
    return java_string_hash(tags) if tags else 0


def test_puts_keep_queue_order_and_notify_listeners(store):
    assert store.put_message(msg(body=b"first")).is_ok()
    arrived = []
    store.register_message_arriving_listener(lambda *a: arrived.append(a))
    for i in range(20):
        r, fut = store.put_message_nowait(msg(body=b"b%d" % i, tags="T"))
        assert r.is_ok() and fut is None and r.append_result.logics_offset == i + 1
    assert [a[2] for a in arrived] == list(range(2, 22))
    assert arrived[0][3] == java_string_hash("T")
    g = store.get_message("g", "TopicA", 0, 1, 32)
    assert g.message_count == 20


def test_a_put_while_a_batch_is_published_waits_for_it(store, monkeypatch):
    """A batch is encoded after the put lock, then published: a single put taken meanwhile gets
    the next queue offset at once, but its queue entry (and its dispatch) come after the batch's."""
    assert store.put_message(msg(body=b"m0")).is_ok()
    encoding, release = threading.Event(), threading.Event()
    from rmq_core.store import commit_log as commit_log_module

    real = commit_log_module.commit_log_native.encode_batch_into

    def slow_encode(*a):
        encoding.set()
        assert release.wait(10)
        return real(*a)

    monkeypatch.setattr(commit_log_module.commit_log_native, "encode_batch_into", slow_encode)
    batch = MessageExtBatch("TopicA", 0, encode_batch_items([(0, b"b%d" % i, {}) for i in range(3)]))
    cl = store.commit_log
    first_ticket = cl._next_ticket
    answers = {}
    t = threading.Thread(target=lambda: answers.setdefault("batch", store.put(batch)))
    t.start()
    assert encoding.wait(10)
    single = {}
    t2 = threading.Thread(target=lambda: single.setdefault("r", store.put_message(msg(body=b"m4"))))
    t2.start()
    deadline = time.monotonic() + 10
    while cl._next_ticket != first_ticket + 2:  # the message took the ticket after the batch's
        assert time.monotonic() < deadline, "the put never got past the put lock"
        time.sleep(0.001)
    assert store.get_max_offset_in_queue("TopicA", 0) == 1  # neither entry is visible yet
    release.set()
    t.join(10)
    t2.join(10)
    assert answers["batch"].append_result.logics_offset == 1 and single["r"].append_result.logics_offset == 4
    got = store.get_message("g", "TopicA", 0, 0, 32)
    assert got.message_count == 5
    assert [record_fields(got.buffer[p:])["body"] for p in _positions(got)] == [b"m0", b"b0", b"b1", b"b2", b"m4"]


def _positions(got):
    pos, out = 0, []
    while pos < len(got.buffer):
        out.append(pos)
        pos += record_fields(got.buffer[pos:])["total_size"]
    return out


def test_segment_and_consume_queue_rolls(store):
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


def test_disk_full_and_shutdown_refuse_puts(store):
    assert store.put_message(msg()).is_ok()
    store.disk_usage = lambda path: 0.99
    store.check_disk_space()
    r = store.put_message(msg())
    assert r.status is PutMessageStatus.DISK_FULL and "full" in r.error
    store.disk_usage = lambda path: 0.10
    store.check_disk_space()
    assert store.put_message(msg()).is_ok()
    store.shutdown()
    assert store.put_message(msg()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_bad_messages_are_refused_naming_the_value(store_factory):
    store = store_factory(max_message_size=1024)
    assert store.put_message(msg()).is_ok()
    r = store.put_message(msg(body=b"x" * 1024))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "exceeds maxMessageSize 1024" in r.error
    r = store.put_message(msg(topic="T" * 128))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "128 bytes" in r.error


def test_sync_flush_put_writes_through_the_descriptor_and_waits_for_group_commit(sync_store):
    s = sync_store
    assert s.put_message(msg(body=b"first")).is_ok()  # creates the consume queue
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
    batch = MessageExtBatch("TopicA", 0, encode_batch_items([(0, b"b%d" % i, {}) for i in range(3)]))
    assert store.put(msg(body=b"m0")).append_result.logics_offset == 0
    r, fut = store.put_nowait(batch)
    assert r.is_ok() and fut is None and r.append_result.logics_offset == 1 and r.append_result.msg_num == 3
    assert asyncio.run(store.put_async(msg(body=b"m4"))).append_result.logics_offset == 4
    got = store.get_message("g", "TopicA", 0, 0, 32)
    assert got.message_count == 5
