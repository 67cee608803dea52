"""Commit-log appends against real files: exact record bytes, segment roll-over, batches, limits."""
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_batch_items, encode_message_record
from rmq_core.errors import DiskFullError, IllegalArgumentError, MessageTooLargeError
from rmq_core.message import MessageConst, SysFlag, create_offset_msg_id, java_string_hash
from rmq_core.store import MessageExtBatch, MessageExtBrokerInner, PutMessageStatus
from rmq_core.store.types import record_fields

from .conftest import msg

BLANK_MAGIC = 0xCBD43194


def read_log(store) -> bytes:
    """All commit-log bytes up to the max offset, segment after segment."""
    out = []
    for mf in store.commit_log.mapped_file_queue.mapped_files:
        with open(mf.path, "rb") as f:
            out.append(f.read()[: mf.wrote_position])
    return b"".join(out)


def test_record_bytes_equal_the_reference_encoder(store):
    m = msg(body=b"seed-0", tags="TagA", keys="k1 k2", born_timestamp=1_700_000_000_123,
            born_host=("10.0.0.7", 40000), flag=7, reconsume_times=2, prepared_transaction_offset=0)
    r = store.put_message(m)
    assert r.status is PutMessageStatus.PUT_OK and r.is_ok()
    a = r.append_result
    raw = store.select_one_message_by_offset(a.wrote_offset)
    expected = encode_message_record(
        topic="TopicA", body=b"seed-0", queue_id=0, flag=7, queue_offset=0, commit_log_offset=a.wrote_offset,
        born_timestamp=1_700_000_000_123, born_host=("10.0.0.7", 40000), store_timestamp=a.store_timestamp,
        store_host=("127.0.0.1", 10911), reconsume_times=2, properties={"TAGS": "TagA", "KEYS": "k1 k2"})
    assert raw == expected
    assert a.wrote_bytes == len(expected)
    assert a.msg_id == create_offset_msg_id("127.0.0.1", 10911, a.wrote_offset)
    # the file on disk holds exactly these bytes at that offset
    assert read_log(store)[a.wrote_offset:a.wrote_offset + len(raw)] == raw


@settings(max_examples=60, deadline=None)
@given(body=st.binary(max_size=700), tag=st.text(min_size=1, max_size=12).filter(lambda t: "\x01" not in t and "\x02" not in t),
       queue_id=st.integers(0, 7), flag=st.integers(-2**31, 2**31 - 1))
def test_record_bytes_property(tmp_path_factory, body, tag, queue_id, flag):
    from rmq_core.store import DefaultMessageStore
    from .conftest import make_config

    with DefaultMessageStore(make_config(tmp_path_factory.mktemp("s"), message_index_enable=False)) as s:
        r = s.put_message(msg(queue_id=queue_id, body=body, tags=tag, flag=flag, born_timestamp=5))
        a = r.append_result
        expected = encode_message_record(
            topic="TopicA", body=body, queue_id=queue_id, flag=flag, queue_offset=0, commit_log_offset=0,
            born_timestamp=5, born_host=("127.0.0.1", 0), store_timestamp=a.store_timestamp,
            properties={"TAGS": tag})
        assert s.select_one_message_by_offset(0) == expected
        assert s.find_consume_queue("TopicA", queue_id).get_entry(0) == (0, len(expected), java_string_hash(tag))


def test_queue_offsets_are_per_queue_and_phys_offsets_contiguous(store):
    results = [store.put_message(msg(queue_id=i % 3, body=b"x" * i)) for i in range(30)]
    per_queue = {}
    pos = 0
    for i, r in enumerate(results):
        a = r.append_result
        assert a.logics_offset == per_queue.get(i % 3, 0)
        per_queue[i % 3] = a.logics_offset + 1
        assert a.wrote_offset == pos
        pos += a.wrote_bytes
    assert store.get_max_phy_offset() == pos
    assert [store.get_max_offset_in_queue("TopicA", q) for q in range(3)] == [10, 10, 10]


def test_segment_roll_over_writes_a_blank_record_and_never_straddles(store):
    seg = store.config.mapped_file_size_commit_log
    body = b"b" * 1000
    offsets = []
    while store.get_max_phy_offset() < 3 * seg:
        offsets.append(store.put_message(msg(body=body)).append_result)
    names = sorted(os.listdir(store.config.commit_log_dir))
    assert names[:4] == [f"{i * seg:020d}" for i in range(4)] or names[:3] == [f"{i * seg:020d}" for i in range(3)]
    for a in offsets:  # no record crosses a segment boundary
        assert a.wrote_offset // seg == (a.wrote_offset + a.wrote_bytes - 1) // seg
    # the end of segment 0 is a blank record: int32 remaining length + 0xCBD43194
    last_in_0 = max((a for a in offsets if a.wrote_offset < seg), key=lambda a: a.wrote_offset)
    blank_at = last_in_0.wrote_offset + last_in_0.wrote_bytes
    with open(os.path.join(store.config.commit_log_dir, names[0]), "rb") as f:
        f.seek(blank_at)
        size, magic = struct.unpack(">iI", f.read(8))
    assert magic == BLANK_MAGIC and size == seg - blank_at >= 8
    # the first record of segment 1 starts exactly at the boundary
    assert min(a.wrote_offset for a in offsets if a.wrote_offset >= seg) == seg
    # every record reads back whole
    for a in offsets:
        assert record_fields(store.select_one_message_by_offset(a.wrote_offset))["body"] == body


def test_batch_is_one_append_with_per_record_offsets(store):
    items = [(i, b"body-%d" % i, {"TAGS": f"T{i % 2}", "UNIQ_KEY": f"U{i}"}) for i in range(50)]
    store.put_message(msg(body=b"first"))  # queue offset 0 taken
    r = store.put_messages(MessageExtBatch("TopicA", 0, encode_batch_items(items), born_timestamp=9,
                                           extra_properties=b"CLUSTER\x01c1\x02"))
    assert r.is_ok(), r.error
    a = r.append_result
    assert a.msg_num == 50 and a.logics_offset == 1
    assert a.queue_offsets == tuple(range(1, 51))
    assert len(a.phys_offsets) == 50 and a.phys_offsets[0] == a.wrote_offset
    assert a.msg_id.split(",") == [create_offset_msg_id("127.0.0.1", 10911, p) for p in a.phys_offsets]
    for i, p in enumerate(a.phys_offsets):
        raw = store.select_one_message_by_offset(p)
        expected = encode_message_record(
            topic="TopicA", body=b"body-%d" % i, queue_id=0, flag=i, queue_offset=1 + i, commit_log_offset=p,
            born_timestamp=9, store_timestamp=a.store_timestamp,
            properties=f"TAGS\x01T{i % 2}\x02UNIQ_KEY\x01U{i}\x02CLUSTER\x01c1\x02".encode())
        assert raw == expected
        assert store.find_consume_queue("TopicA", 0).get_entry(1 + i) == (p, len(raw), java_string_hash(f"T{i % 2}"))


def test_batch_spanning_a_segment_boundary(store):
    seg = store.config.mapped_file_size_commit_log
    items = [(0, b"z" * 500, {"TAGS": "A"}) for _ in range(300)]  # ~190 KB: crosses several segments
    r = store.put_messages(MessageExtBatch("TopicA", 1, encode_batch_items(items)))
    assert r.is_ok()
    a = r.append_result
    assert len(set(p // seg for p in a.phys_offsets)) >= 3
    sizes = [store.commit_log.record_size_at(p) for p in a.phys_offsets]
    for p, n in zip(a.phys_offsets, sizes):
        assert p // seg == (p + n - 1) // seg
    g = store.get_message("g", "TopicA", 1, 0, 32)
    assert [m.queue_offset for m in decode_messages(g.buffer)] == list(range(32))


def test_message_too_large_is_refused_with_a_clear_error(store_factory):
    s = store_factory(max_message_size=1024)
    r = s.put_message(msg(body=b"x" * 2000))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and not r.is_ok()
    assert r.error == f"message size {91 + 2000 + 6} bytes exceeds maxMessageSize 1024 bytes"
    with pytest.raises(MessageTooLargeError, match="exceeds maxMessageSize 1024 bytes"):
        s.put_message_or_raise(msg(body=b"x" * 2000))
    items = [(0, b"x" * 10, {}), (0, b"y" * 2000, {})]
    r = s.put_messages(MessageExtBatch("TopicA", 0, encode_batch_items(items)))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "exceeds maxMessageSize 1024" in r.error
    assert s.get_max_phy_offset() == 0  # nothing of the refused batch was written


def test_topic_and_properties_limits_name_the_value(store):
    r = store.put_message(msg(topic="T" * 128))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "128 bytes" in r.error and "TTTT" in r.error
    r = store.put_message(MessageExtBrokerInner("TopicA", 0, b"x", properties_bytes=b"a\x01" + b"v" * 32800 + b"\x02"))
    assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED and "32803 bytes" in r.error
    with pytest.raises(IllegalArgumentError, match="32803 bytes"):
        store.put_message_or_raise(MessageExtBrokerInner("TopicA", 0, b"x", properties_bytes=b"a\x01" + b"v" * 32800 + b"\x02"))


def test_malformed_batch_body_is_refused(store):
    good = encode_batch_items([(0, b"abc", {"TAGS": "A"})])
    r = store.put_messages(MessageExtBatch("TopicA", 0, good[:-3]))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "runs past the end" in r.error
    bad_total = struct.pack(">i", 999) + good[4:]
    r = store.put_messages(MessageExtBatch("TopicA", 0, bad_total))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "total size 999" in r.error
    assert store.get_max_phy_offset() == 0


def test_prepared_transaction_records_get_no_queue_entry(store):
    r = store.put_message(msg(sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE))
    assert r.is_ok() and r.append_result.logics_offset == 0
    assert store.get_max_offset_in_queue("TopicA", 0) == 0
    r = store.put_message(msg(sys_flag=SysFlag.TRANSACTION_COMMIT_TYPE))
    assert store.get_max_offset_in_queue("TopicA", 0) == 1


def test_ipv6_hosts_set_the_sys_flag_bits(store):
    r = store.put_message(msg(born_host=("::1", 5000), store_host=("fe80::1", 10911)))
    raw = store.select_one_message_by_offset(r.append_result.wrote_offset)
    f = record_fields(raw)
    assert f["sys_flag"] & 0x30 == 0x30
    assert decode_messages(raw)[0].born_host == "[::1]:5000" or "::1" in str(decode_messages(raw)[0].born_host)


def test_look_message_by_offset_decodes(store):
    r = store.put_message(msg(body=b"hello", tags="TagA", keys="K"))
    m = store.look_message_by_offset(r.append_result.wrote_offset)
    assert m.body == b"hello" and m.topic == "TopicA" and m.tags == "TagA"
    assert m.commit_log_offset == r.append_result.wrote_offset
    assert store.look_message_by_offset(10**9) is None
    assert store.select_one_message_by_offset(3) is None  # not a record start


def test_put_before_start_and_after_shutdown_is_refused(config_factory):
    from rmq_core.store import DefaultMessageStore

    s = DefaultMessageStore(config_factory())
    s.load()
    assert s.put_message(msg()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    s.start()
    assert s.put_message(msg()).is_ok()
    s.shutdown()
    r = s.put_message(msg())
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "shut down" in r.error


def test_schedule_topic_tags_code_is_the_delivery_time(store):
    props = {"DELAY": "3", "REAL_TOPIC": "TopicA", "REAL_QID": "0"}
    r = store.put_message(MessageExtBrokerInner("SCHEDULE_TOPIC_XXXX", 2, b"x", properties=props))
    a = r.append_result
    assert store.find_consume_queue("SCHEDULE_TOPIC_XXXX", 2).get_entry(0)[2] == a.store_timestamp + 10_000
    r = store.put_message(MessageExtBrokerInner("SCHEDULE_TOPIC_XXXX", 2, b"x", properties=props, tags_code=42))
    assert store.find_consume_queue("SCHEDULE_TOPIC_XXXX", 2).get_entry(1)[2] == 42


def test_concurrent_single_and_batch_puts_keep_queues_dense_and_ordered(store):
    """Batches are encoded into reserved space outside the put lock while single puts go on:
    publication in ticket order keeps every queue dense, in commit-log order, and each entry
    pointing at its own complete record."""
    import random
    import threading

    def worker(w):
        rnd = random.Random(w)
        for k in range(40):
            q = rnd.randrange(2)
            if rnd.random() < 0.5:
                items = [(0, b"w%d-%d-%d" % (w, k, i) * rnd.randint(1, 30), {"TAGS": "B"}) for i in range(rnd.randint(1, 40))]
                assert store.put_messages(MessageExtBatch("TopicA", q, encode_batch_items(items))).is_ok()
            else:
                assert store.put_message(msg(queue_id=q, body=b"s%d-%d" % (w, k), tags="S")).is_ok()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q in range(2):
        n = store.get_max_offset_in_queue("TopicA", q)
        last_phys = -1
        for off in range(n):
            phys, size, _ = store.find_consume_queue("TopicA", q).get_entry(off)
            raw = store.select_one_message_by_offset(phys, size)
            f = record_fields(raw)
            assert (f["queue_id"], f["queue_offset"], f["commit_log_offset"]) == (q, off, phys)
            assert phys > last_phys  # queue order is commit-log order
            last_phys = phys
