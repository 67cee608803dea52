"""Consume-queue ext: per-entry filter bit maps written by a dispatcher, tested by the native scan
(the SQL92 bloom prefilter), kept across restarts and rebuilt after a crash."""
import os
import shutil

from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_batch_items
from rmq_core.filtering import MessageFilter
from rmq_core.store import DefaultMessageStore, GetMessageStatus, MessageExtBatch

from .conftest import msg
from .test_recovery import crash


class BitMapDispatcher:
    """Sets bit (n % 8) of a 64-bit map for a message with property N=n; no map when N is absent."""

    def dispatch(self, req):
        n = req.properties.get("N")
        if n is None:
            req.bit_map = None
            return
        bm = bytearray(8)
        bit = int(n) % 8
        bm[bit >> 3] |= 1 << (bit & 7)
        req.bit_map = bytes(bm)


class BloomFilter(MessageFilter):
    def __init__(self, bits, bit_num=64, born_time=-1):
        self.bloom_bits = tuple(bits)
        self.bloom_bit_num = bit_num
        self.bloom_born_time = born_time


def ext_store(store_factory, **kw):
    s = store_factory(enable_consume_queue_ext=True, bit_map_length_consume_queue_ext=64, **kw)
    s.add_dispatcher(BitMapDispatcher())
    return s


def bodies(g):
    return [m.body for m in decode_messages(g.buffer)]


def test_bloom_bits_filter_in_the_scan(store_factory):
    s = ext_store(store_factory)
    for i in range(40):
        assert s.put_message(msg(body=b"m%d" % i, properties={"N": str(i)})).is_ok()
    g = s.get_message("g", "TopicA", 0, 0, 32, BloomFilter([3]))
    assert g.status is GetMessageStatus.FOUND
    assert bodies(g) == [b"m%d" % i for i in range(40) if i % 8 == 3]
    assert g.next_begin_offset == 40
    # the ext file sits beside the consume queue, one unit per entry
    ext = s.find_consume_queue("TopicA", 0).ext
    ts, bm = ext.get(11)
    assert bm == bytes([1 << 3, 0, 0, 0, 0, 0, 0, 0]) and ts == s.get_message_store_timestamp("TopicA", 0, 11)
    assert os.listdir(os.path.join(s.config.consume_queue_ext_dir, "TopicA", "0")) == [f"{0:020d}"]
    # the pure-Python twin agrees
    flt = BloomFilter([3])
    twin = [flt.is_matched_by_consume_queue(0, ext.get(i)[1], ext.get(i)[0]) for i in range(16)]
    assert twin == [i % 8 == 3 for i in range(16)]
    # a filter for "any size" (bit_num 0) tests the map too
    assert bodies(s.get_message("g", "TopicA", 0, 0, 32, BloomFilter([3], bit_num=0))) == bodies(g)


def test_entries_without_a_usable_map_stay_candidates(store_factory):
    s = ext_store(store_factory)
    s.put_message(msg(body=b"no-map"))  # dispatcher leaves no map
    s.put_message(msg(body=b"bit1", properties={"N": "1"}))
    g = s.get_message("g", "TopicA", 0, 0, 32, BloomFilter([3]))
    assert bodies(g) == [b"no-map"]
    # a filter sized for another map length: every entry is a candidate
    g = s.get_message("g", "TopicA", 0, 0, 32, BloomFilter([3], bit_num=128))
    assert bodies(g) == [b"no-map", b"bit1"]
    # a subscription born after the maps were computed cannot trust them
    later = s.get_message_store_timestamp("TopicA", 0, 1) + 1
    g = s.get_message("g", "TopicA", 0, 0, 32, BloomFilter([3], born_time=later))
    assert bodies(g) == [b"no-map", b"bit1"]


def test_batches_get_maps_and_maps_survive_restart_and_crash(store_factory, config_factory):
    cfg = config_factory(enable_consume_queue_ext=True, bit_map_length_consume_queue_ext=64)
    s = store_factory(cfg)
    s.add_dispatcher(BitMapDispatcher())
    items = [(0, b"b%d" % i, {"N": str(i)}) for i in range(250)]  # crosses consume-queue files
    assert s.put_messages(MessageExtBatch("TopicA", 0, encode_batch_items(items))).is_ok()
    want = lambda lo, hi: [b"b%d" % i for i in range(lo, hi) if i % 8 == 5]
    assert bodies(s.get_message("g", "TopicA", 0, 100, 32, BloomFilter([5]))) == want(100, 200)
    s.shutdown()
    s2 = store_factory(cfg)  # clean restart: the ext files are loaded
    assert bodies(s2.get_message("g", "TopicA", 0, 200, 32, BloomFilter([5]))) == want(200, 250)
    crash(s2)
    # lose the consume queues, their ext files and the checkpoint: all rebuilt from the log, with
    # the dispatcher registered before load() so re-dispatched records get their maps again
    shutil.rmtree(cfg.consume_queue_ext_dir)
    shutil.rmtree(cfg.consume_queue_dir)
    os.remove(cfg.checkpoint_file)
    s3 = DefaultMessageStore(cfg)
    s3.add_dispatcher(BitMapDispatcher())
    s3.load()
    s3.start()
    try:
        assert bodies(s3.get_message("g", "TopicA", 0, 0, 32, BloomFilter([5]))) == want(0, 100)
        assert s3.find_consume_queue("TopicA", 0).ext.get(205)[1] == bytes([1 << 5]) + bytes(7)
    finally:
        s3.shutdown()


def test_ext_files_follow_retention(store_factory):
    s = ext_store(store_factory)
    items = [(0, b"r" * 900, {"N": "1"}) for _ in range(60)]
    while s.get_max_phy_offset() < 4 * s.config.mapped_file_size_commit_log:
        assert s.put_messages(MessageExtBatch("TopicA", 0, encode_batch_items(items))).is_ok()
    ext_dir = os.path.join(s.config.consume_queue_ext_dir, "TopicA", "0")
    before = sorted(os.listdir(ext_dir))
    s.commit_log.mapped_file_queue.delete_expired_files_by_time(0, clean_immediately=True, max_batch=3)
    s.clean_consume_queues()
    cq_first = sorted(os.listdir(os.path.join(s.config.consume_queue_dir, "TopicA", "0")))[0]
    after = sorted(os.listdir(ext_dir))
    assert len(after) < len(before) and after[0] == cq_first
