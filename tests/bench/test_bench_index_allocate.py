"""Index build/query and allocation strategies, each beside a baseline measured in the same run.

* index build: IndexService.build_index (mmap'd RocketMQ IndexFile) vs a plain in-memory
  dict-of-lists keyed by `topic#key` (no persistence: the cheapest possible Python index).
* index query: walking the hash chain vs the dict lookup.
* index build of stored records (the broker's IndexBuildService): a batch of 8192 records with
  keys read from the commit log, and 8192 queued single puts, each natively (KeyRun: no Python
  object per record) beside the previous path (a Python item per record, then the list run).
* allocate: one consumer's rebalance, 256 queues over 16 consumers, `sticky` vs `averagely`.
"""
import mmap
import struct
from collections import deque

import attrs
import pytest
from tests.codec_oracle import encode_batch_items
from rmq_core.config import MessageStoreConfig
from tests.servers import KEEP_DATA
from rmq_core.message import MessageQueue
from rmq_core.plugins import get_allocate_strategy
from rmq_core.store.index import IndexService

T0 = 1_700_000_000_000
N_RECORDS = 2000


@attrs.define
class Req:
    topic: str
    keys: str | None
    uniq_key: str | None
    commit_log_offset: int
    store_timestamp: int
    sys_flag: int = 0


REQS = [Req("TopicTest", f"order-{i % 500} user-{i % 97}", f"7F000001{i:024X}", i * 300, T0 + i)
        for i in range(N_RECORDS)]


def _dict_index(reqs):
    idx = {}
    for r in reqs:
        for k in [r.uniq_key, *r.keys.split(" ")]:
            idx.setdefault(f"{r.topic}#{k}", []).append(r.commit_log_offset)
    return idx


@pytest.mark.benchmark(group="index-build")
def test_index_build_baseline_dict(benchmark):
    benchmark.extra_info["keys_per_round"] = 3 * N_RECORDS
    benchmark(_dict_index, REQS)


@pytest.mark.benchmark(group="index-build")
def test_index_build_index_service(benchmark, tmp_path):
    counter = iter(range(10**9))

    def setup():
        cfg = MessageStoreConfig.from_properties(KEEP_DATA, store_path_root_dir=str(tmp_path / str(next(counter))),
                                                 max_hash_slot_num=50_000, max_index_num=200_000)
        svc = IndexService(cfg)
        svc.load(True)
        return (svc,), {}

    def build(svc):
        for r in REQS:
            svc.build_index(r)
        svc.shutdown()

    benchmark.extra_info["keys_per_round"] = 3 * N_RECORDS
    benchmark.pedantic(build, setup=setup, rounds=8)


N_STORED = 8192


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A store holding N_STORED records with KEYS (two words) and UNIQ_KEY, put as batches of
    1024; its index builder is held, so the queued batch items are what the builder would get."""
    from rmq_core.store import DefaultMessageStore, MessageExtBatch
    cfg = MessageStoreConfig.from_properties(KEEP_DATA, store_path_root_dir=str(tmp_path_factory.mktemp("stored")),
                                             message_index_enable=True)
    store = DefaultMessageStore(cfg)
    assert store.load()
    store.start()
    store.index_build_service.stop()
    for b in range(N_STORED // 1024):
        items = [(0, b"x" * 128, {"KEYS": f"order-{b}-{i} user-{i % 97}", "UNIQ_KEY": f"7F0000010000{b:04X}{i:016X}"})
                 for i in range(1024)]
        assert store.put_messages(MessageExtBatch(topic="TopicTest", queue_id=0, body=encode_batch_items(items))).is_ok()
    batches = list(store.index_build_service._queue)
    store.index_build_service._queue.clear()
    # the same records as single-put items (topic, offset, store time, sys flag, properties)
    from rmq_core.store.index import _index_item
    singles = []
    for topic, entries, count in batches:
        for k in range(count):
            phys, size = struct.unpack_from(">qi", entries, k * 20)
            singles.append(_index_item(topic, phys, store.commit_log.get_data(phys, size), 0))
    yield store, batches, singles
    store.shutdown()


def _index_setup(tmp_path, store):
    from rmq_core.store.index import IndexBuildService
    counter = iter(range(10**9))

    def setup():
        cfg = MessageStoreConfig.from_properties(KEEP_DATA, store_path_root_dir=str(tmp_path / str(next(counter))),
                                                 max_hash_slot_num=50_000, max_index_num=200_000)
        svc = IndexService(cfg)
        svc.load(True)
        # fault the fresh file's pages in first: first-touch faults cost the same on every path
        # and, on a loaded VM, swamp what is measured here
        mm = svc._last_writable_file()._mm
        for pos in range(40, len(mm), mmap.PAGESIZE):
            mm[pos] = 0
        builder = IndexBuildService(store)
        builder.index_service = svc
        return (svc, builder), {}
    return setup


def _teardown(svc, builder):
    # outside the timing: the msync of a fresh index file is disk work, the same for every path
    assert sum(f.entry_count for f in svc.files) == 3 * N_STORED
    svc.shutdown()


def _run(benchmark, build, setup):
    benchmark.pedantic(build, setup=setup, teardown=_teardown, rounds=10, warmup_rounds=1)
    benchmark.extra_info["records_per_round"] = N_STORED
    benchmark.extra_info["records_per_s"] = round(N_STORED / benchmark.stats.stats.median)


@pytest.mark.benchmark(group="index-build-stored-batch")
def test_index_build_batch_native_span(benchmark, stored, tmp_path):
    store, batches, _ = stored

    def build(svc, builder):
        for item in batches:
            builder._build_entries(*item)
    _run(benchmark, build, _index_setup(tmp_path, store))


@pytest.mark.benchmark(group="index-build-stored-singles")
def test_index_build_singles_native_run(benchmark, stored, tmp_path):
    store, _, singles = stored

    def build(svc, builder):
        q = deque(singles)
        while q:
            builder._build_some(q)
    _run(benchmark, build, _index_setup(tmp_path, store))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cfg = MessageStoreConfig.from_properties(KEEP_DATA, store_path_root_dir=str(tmp_path_factory.mktemp("idx")),
                                             max_hash_slot_num=50_000, max_index_num=200_000)
    svc = IndexService(cfg)
    svc.load(True)
    for r in REQS:
        svc.build_index(r)
    yield svc, _dict_index(REQS)
    svc.shutdown()


@pytest.mark.benchmark(group="index-query")
def test_index_query_baseline_dict(benchmark, built):
    _, idx = built
    result = benchmark(lambda: idx.get("TopicTest#user-5", [])[::-1][:32])
    assert len(result) == 21


@pytest.mark.benchmark(group="index-query")
def test_index_query_index_service(benchmark, built):
    svc, _ = built
    result = benchmark(svc.query_offset, "TopicTest", "user-5", 32, 0, 2**62)
    assert len(result.phy_offsets) == 21


MQS = sorted(MessageQueue("TopicTest", f"broker-{b}", q) for b in "abcd" for q in range(64))
CIDS = sorted(f"10.0.0.{i}@{1000 + i}" for i in range(16))


@pytest.mark.benchmark(group="allocate-rebalance")
def test_allocate_baseline_averagely(benchmark):
    # one consumer's rebalance: what each consumer process computes every 20 s
    benchmark(get_allocate_strategy("averagely").allocate, "GID", CIDS[0], MQS, CIDS)


@pytest.mark.benchmark(group="allocate-rebalance")
def test_allocate_sticky_uncached(benchmark):
    from rmq_plugins.allocate.strategies import _sticky_assignment
    strategy = get_allocate_strategy("sticky")

    def run():
        _sticky_assignment.cache_clear()  # every consumer is a separate process in production
        return strategy.allocate("GID", CIDS[0], MQS, CIDS)
    benchmark(run)
