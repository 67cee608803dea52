"""Consume queues and get_message: file roll-over, every status, filters, limits, lookups."""
import os
import struct
import time

import pytest

from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_batch_items
from rmq_core.filtering import MessageFilter
from rmq_core.message import java_string_hash
from rmq_core.store import GetMessageStatus as S
from rmq_core.store import MessageExtBatch
from rmq_core.store.message_store import MAX_SCAN_ENTRIES_PER_GET

from .conftest import msg


class TagFilter(MessageFilter):
    def __init__(self, *tags):
        self.tag_codes = frozenset(java_string_hash(t) for t in tags)


class PropFilter(MessageFilter):
    needs_commit_log_check = True

    def __init__(self, key, value):
        self.key, self.value = key, value

    def is_matched_by_commit_log(self, properties):
        return properties.get(self.key) == self.value


def fill(store, n, queue_id=0, tag_of=lambda i: "TagA", topic="TopicA"):
    items = [(0, b"m%d" % i, {"TAGS": tag_of(i), "I": str(i)}) for i in range(n)]
    for k in range(0, n, 500):
        assert store.put_messages(MessageExtBatch(topic, queue_id, encode_batch_items(items[k:k + 500]))).is_ok()


def test_entries_are_20_bytes_and_files_roll_over(store):
    fill(store, 250)
    cq_dir = os.path.join(store.config.consume_queue_dir, "TopicA", "0")
    names = sorted(os.listdir(cq_dir))
    assert names == [f"{i * 2000:020d}" for i in range(3)]  # 100 entries per file in the tests
    with open(os.path.join(cq_dir, names[1]), "rb") as f:
        raw = f.read(20)
    phys, size, tags = struct.unpack(">qiq", raw)
    assert tags == java_string_hash("TagA")
    assert decode_messages(store.select_one_message_by_offset(phys, size))[0].queue_offset == 100
    assert store.get_commit_log_offset_in_queue("TopicA", 0, 100) == phys
    # pulls read across file boundaries call after call
    bodies, off = [], 0
    while True:
        g = store.get_message("g", "TopicA", 0, off, 32)
        if g.status is not S.FOUND:
            break
        assert g.queue_offsets == list(range(off, off + g.message_count))
        bodies += [m.body for m in decode_messages(g.buffer)]
        off = g.next_begin_offset
    assert bodies == [b"m%d" % i for i in range(250)]
    assert g.status is S.OFFSET_OVERFLOW_ONE and g.next_begin_offset == 250


def test_found_returns_raw_records_and_next_offset(store):
    fill(store, 10)
    g = store.get_message("g", "TopicA", 0, 3, 4)
    assert g.status is S.FOUND and g.message_count == 4 and g.next_begin_offset == 7
    assert g.min_offset == 0 and g.max_offset == 10 and g.queue_offsets == [3, 4, 5, 6]
    expected = b"".join(store.select_one_message_by_offset(store.get_commit_log_offset_in_queue("TopicA", 0, q))
                        for q in range(3, 7))
    assert g.buffer == expected and g.buffer_total_size == len(expected)


def test_statuses_at_the_edges(store):
    assert store.get_message("g", "Nope", 0, 0, 32).status is S.NO_MATCHED_LOGIC_QUEUE
    store.find_consume_queue("TopicA", 5)
    g = store.get_message("g", "TopicA", 5, 3, 32)
    assert (g.status, g.next_begin_offset) == (S.NO_MESSAGE_IN_QUEUE, 0)
    fill(store, 10)
    g = store.get_message("g", "TopicA", 0, 10, 32)
    assert (g.status, g.next_begin_offset) == (S.OFFSET_OVERFLOW_ONE, 10)
    g = store.get_message("g", "TopicA", 0, 15, 32)
    assert (g.status, g.next_begin_offset, g.max_offset) == (S.OFFSET_OVERFLOW_BADLY, 10, 10)


def test_no_matched_message_advances_past_the_scanned_entries(store):
    fill(store, 50, tag_of=lambda i: "TagA")
    g = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("TagB"))
    assert (g.status, g.next_begin_offset, g.message_count) == (S.NO_MATCHED_MESSAGE, 50, 0)


def test_tag_filter_returns_only_matches(store):
    fill(store, 300, tag_of=lambda i: "T%d" % (i % 10))
    g = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("T3"))
    assert g.status is S.FOUND and g.queue_offsets == [3, 13, 23, 33, 43, 53, 63, 73, 83, 93]
    assert g.next_begin_offset == 100  # the scan stops at the end of the first consume-queue file
    assert all(m.tags == "T3" for m in decode_messages(g.buffer))
    many = TagFilter(*["T%d" % i for i in (1, 3)] + ["X%d" % i for i in range(20)])  # the bsearch path
    g = store.get_message("g", "TopicA", 0, 0, 32, many)
    assert g.queue_offsets[:6] == [1, 3, 11, 13, 21, 23]


def test_commit_log_check_filter(store):
    fill(store, 40)
    g = store.get_message("g", "TopicA", 0, 0, 32, PropFilter("I", "7"))
    assert g.status is S.FOUND and g.queue_offsets == [7]
    g = store.get_message("g", "TopicA", 0, 0, 32, PropFilter("I", "none"))
    assert g.status is S.NO_MATCHED_MESSAGE


def test_transfer_limits(store_factory):
    s = store_factory(max_transfer_count_on_message_in_memory=5)
    fill(s, 50)
    g = s.get_message("g", "TopicA", 0, 0, 32)
    assert g.message_count == 5 and g.next_begin_offset == 5
    size = len(s.select_one_message_by_offset(0))
    g = s.get_message("g", "TopicA", 0, 0, 32, max_total_bytes=size * 3 + 1)
    assert g.message_count == 3 and g.next_begin_offset == 3
    g = s.get_message("g", "TopicA", 0, 0, 32, max_total_bytes=1)  # the first record always goes
    assert g.message_count == 1


def test_scan_is_bounded_for_a_rare_tag(store_factory):
    s = store_factory(mapped_file_size_consume_queue=300_000 * 20)
    n = MAX_SCAN_ENTRIES_PER_GET + 2000
    fill(s, n, tag_of=lambda i: "rare" if i == n - 1 else "common")
    g = s.get_message("g", "TopicA", 0, 0, 32, TagFilter("rare"))
    assert (g.status, g.next_begin_offset) == (S.NO_MATCHED_MESSAGE, MAX_SCAN_ENTRIES_PER_GET)
    g = s.get_message("g", "TopicA", 0, g.next_begin_offset, 32, TagFilter("rare"))
    assert g.status is S.FOUND and g.queue_offsets == [n - 1]


def test_offset_too_small_and_message_was_removing_after_retention(store):
    fill(store, 1500, queue_id=0)
    seg = store.config.mapped_file_size_commit_log
    assert store.get_max_phy_offset() > 2 * seg
    # delete the oldest commit-log segment only (the consume queue is not trimmed yet)
    store.commit_log.mapped_file_queue.delete_expired_files_by_time(0, clean_immediately=True, max_batch=1)
    g = store.get_message("g", "TopicA", 0, 0, 8)
    assert g.status is S.MESSAGE_WAS_REMOVING
    # retention then trims the consume queue: offset 0 is now too small
    store.clean_consume_queues()
    min_off = store.get_min_offset_in_queue("TopicA", 0)
    assert min_off > 0
    assert store.get_commit_log_offset_in_queue("TopicA", 0, min_off) >= seg
    g = store.get_message("g", "TopicA", 0, 0, 8)
    assert (g.status, g.next_begin_offset, g.min_offset) == (S.OFFSET_TOO_SMALL, min_off, min_off)
    g = store.get_message("g", "TopicA", 0, min_off, 8)
    assert g.status is S.FOUND and g.queue_offsets[0] == min_off


def test_offset_found_null_when_the_consume_queue_file_is_gone(store):
    fill(store, 250)
    cq = store.find_consume_queue("TopicA", 0)
    cq.mapped_file_queue.delete_files_before(1)  # as a concurrent cleaner would
    g = store.get_message("g", "TopicA", 0, 10, 8)
    assert (g.status, g.next_begin_offset) == (S.OFFSET_FOUND_NULL, 100)


def test_time_lookups(store):
    t0 = int(time.time() * 1000)
    fill(store, 5)
    time.sleep(0.02)
    t1 = int(time.time() * 1000)
    fill(store, 5)
    assert store.get_offset_in_queue_by_time("TopicA", 0, t0 - 1000) == 0
    assert store.get_offset_in_queue_by_time("TopicA", 0, t1) == 5
    assert store.get_offset_in_queue_by_time("TopicA", 0, t1 + 60_000) == 10
    early = store.get_earliest_message_time("TopicA", 0)
    assert t0 <= early < t1
    assert store.get_message_store_timestamp("TopicA", 0, 7) >= t1
    assert store.get_earliest_message_time("Nope", 0) == -1
    assert store.get_min_offset_in_queue("TopicA", 0) == 0 and store.get_max_offset_in_queue("TopicA", 0) == 10


def test_consume_queue_table_and_delete_topics(store):
    fill(store, 3, queue_id=0, topic="T1")
    fill(store, 3, queue_id=2, topic="T2")
    table = store.get_consume_queue_table()
    assert set(table) == {"T1", "T2"} and set(table["T2"]) == {2}
    store.delete_topics({"T1"})
    assert set(store.get_consume_queue_table()) == {"T2"}
    assert not os.path.exists(os.path.join(store.config.consume_queue_dir, "T1"))
    assert store.get_message("g", "T1", 0, 0, 1).status is S.NO_MATCHED_LOGIC_QUEUE
    assert store.put_message(msg(topic="T1")).append_result.logics_offset == 0


def test_arriving_listener_once_per_put_and_dispatchers(store):
    calls, reqs = [], []
    store.register_message_arriving_listener(lambda *a: calls.append(a))

    class D:
        def dispatch(self, req):
            reqs.append((req.topic, req.queue_id, req.consume_queue_offset, req.keys, req.commit_log_offset))

    store.add_dispatcher(D())
    r = store.put_message(msg(tags="TagA", keys="k0"))
    assert calls == [("TopicA", 0, 1, java_string_hash("TagA"), r.append_result.store_timestamp,
                      b"TAGS\x01TagA\x02KEYS\x01k0\x02")]
    fill(store, 3)
    assert len(calls) == 2 and calls[1][2] == 4  # one call for the batch, max offset after it
    assert [r[2] for r in reqs] == [0, 1, 2, 3] and reqs[0][3] == "k0"
    assert reqs[0][4] == r.append_result.wrote_offset


def test_query_message_by_key(store):
    store.put_message(msg(keys="order-1 order-2", body=b"a"))
    store.put_message(msg(keys="order-2", body=b"b"))
    store.put_message(msg(topic="Other", keys="order-2", body=b"c"))
    found = store.query_message("TopicA", "order-2", 32, 0, 2**62)
    assert sorted(m.body for m in decode_messages(found.buffer)) == [b"a", b"b"]
    assert store.query_message("TopicA", "nope", 32, 0, 2**62).message_count == 0


def test_batch_sent_records_come_as_views_of_the_mapped_log(store):
    # two batches of one queue with another queue's batch between them: two runs of adjacent records
    fill(store, 40, queue_id=0)
    fill(store, 10, queue_id=1)
    fill(store, 40, queue_id=0, tag_of=lambda i: "TagB")
    g = store.get_message("g", "TopicA", 0, 5, 60, max_transfer_count=60)
    assert g.status is S.FOUND and g.message_count == 60
    parts = g.message_buffer_list
    assert [type(p) for p in parts] == [memoryview, memoryview] and all(p.readonly for p in parts)
    expected = b"".join(store.select_one_message_by_offset(store.get_commit_log_offset_in_queue("TopicA", 0, q))
                        for q in range(5, 65))
    assert g.buffer_total_size == len(expected) and b"".join(parts) == expected
    assert g.queue_offsets == list(range(5, 65))
    assert g.buffer == expected and g.message_buffer_list == [expected]  # joined once, the views let go


def test_scattered_matches_are_copied_into_one_body(store):
    fill(store, 100, tag_of=lambda i: "TagA" if i % 2 else "TagB")
    g = store.get_message("g", "TopicA", 0, 0, 100, TagFilter("TagA"), max_transfer_count=100)
    assert g.status is S.FOUND and g.message_count == 50
    assert len(g.message_buffer_list) == 1 and type(g.message_buffer_list[0]) is bytes
    assert [m.body for m in decode_messages(g.buffer)] == [b"m%d" % i for i in range(1, 100, 2)]
    assert g.queue_offsets == list(range(1, 100, 2))


def test_shutdown_with_a_result_still_viewing_the_log(store_factory, config_factory):
    """A pull answer waiting for a slow consumer holds views of the log: closing the store leaves
    that mapping to the views (no BufferError), and they still read the records."""
    store = store_factory()
    fill(store, 20)
    g = store.get_message("g", "TopicA", 0, 0, 20)
    expected = b"".join(store.select_one_message_by_offset(store.get_commit_log_offset_in_queue("TopicA", 0, q))
                        for q in range(20))
    assert type(g.message_buffer_list[0]) is memoryview
    store.shutdown()
    assert b"".join(g.message_buffer_list) == expected
    assert [m.body for m in decode_messages(g.buffer)] == [b"m%d" % i for i in range(20)]
