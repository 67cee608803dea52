"""Index build/query and allocation strategies, each beside a baseline measured in the same run.

* index build: IndexService.build_index (mmap'd RocketMQ IndexFile) vs a plain in-memory
  dict-of-lists keyed by `topic#key` (no persistence: the cheapest possible Python index).
* index query: walking the hash chain vs the dict lookup.
* allocate: one consumer's rebalance, 256 queues over 16 consumers, `sticky` vs `averagely`.
"""
import attrs
import pytest

from rmq_core.config import MessageStoreConfig
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
        cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path / str(next(counter))),
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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path_factory.mktemp("idx")), max_hash_slot_num=50_000,
                             max_index_num=200_000)
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
