"""Pull-side scan with filters (issue 5): entries/s through get_message over one queue of N
entries at 1% selectivity — unfiltered (baseline), tag filter, SQL92 without and with the bloom
prefilter — and how many SQL evaluations the bloom saved."""
import pytest

from rmq_core.broker.consumer_filter_manager import CalcBitMapDispatcher, ConsumerFilterManager
from tests.codec_oracle import encode_batch_items
from rmq_core.config import BrokerConfig, MessageStoreConfig
from tests.servers import KEEP_DATA
from rmq_core.filtering import MATCH_ALL
from rmq_core.plugins import get_filter_factory
from rmq_core.store import DefaultMessageStore, MessageExtBatch

N = 100_000
TOPIC = "BenchFilter"
SQL = "a = 7"  # 1 in 100 messages


class Counting:
    """Wraps a filter to count commit-log (SQL) evaluations."""

    def __init__(self, inner):
        self.inner = inner
        self.tag_codes = inner.tag_codes
        self.bloom_bits = inner.bloom_bits
        self.bloom_bit_num = getattr(inner, "bloom_bit_num", 0)
        self.bloom_born_time = getattr(inner, "bloom_born_time", -1)
        self.needs_commit_log_check = inner.needs_commit_log_check
        self.evaluations = 0

    def is_matched_by_commit_log(self, props):
        self.evaluations += 1
        return self.inner.is_matched_by_commit_log(props)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-filter")
    bc = BrokerConfig(enable_property_filter=True, enable_calc_filter_bit_map=True)
    sc = MessageStoreConfig.from_properties(KEEP_DATA, store_path_root_dir=str(root),
                                            mapped_file_size_commit_log=256 * 1024 * 1024,
                                            enable_consume_queue_ext=True, message_index_enable=False)
    fm = ConsumerFilterManager(bc, sc)
    fm.register(TOPIC, "G_BLOOM", SQL, "SQL92", 1)
    s = DefaultMessageStore(sc)
    s.add_dispatcher(CalcBitMapDispatcher(fm))
    s.load()
    s.start()
    for base in range(0, N, 1000):
        body = encode_batch_items([(0, b"x" * 64, {"a": str(i % 100), "TAGS": "TagHit" if i % 100 == 7 else "TagMiss"})
                                  for i in range(base, base + 1000)])
        assert s.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0, body=body)).is_ok()
    yield s, fm
    s.shutdown()


def _scan(s, mf):
    offset, found = 0, 0
    while offset < N:
        r = s.get_message("G", TOPIC, 0, offset, 32, mf)
        found += r.message_count
        if r.next_begin_offset <= offset:
            break
        offset = r.next_begin_offset
    return found


def _run(benchmark, s, make_filter, expect):
    holder = {}

    def once():
        holder["mf"] = make_filter()
        return _scan(s, holder["mf"])

    found = benchmark.pedantic(once, rounds=3, warmup_rounds=1)
    assert found == expect
    benchmark.extra_info["entries_per_s"] = round(N / benchmark.stats.stats.median)
    mf = holder["mf"]
    if isinstance(mf, Counting):
        benchmark.extra_info["sql_evaluations"] = mf.evaluations
        benchmark.extra_info["sql_evaluations_saved"] = N - mf.evaluations


@pytest.mark.benchmark(group="pull-filter-scan")
def test_scan_baseline_unfiltered(benchmark, store):
    s, _ = store
    _run(benchmark, s, lambda: MATCH_ALL, N)


@pytest.mark.benchmark(group="pull-filter-scan")
def test_scan_tag_filter(benchmark, store):
    s, _ = store
    _run(benchmark, s, lambda: get_filter_factory("TAG")("TagHit"), N // 100)


@pytest.mark.benchmark(group="pull-filter-scan")
def test_scan_sql92_without_bloom(benchmark, store):
    s, _ = store
    _run(benchmark, s, lambda: Counting(get_filter_factory("SQL92")(SQL)), N // 100)


@pytest.mark.benchmark(group="pull-filter-scan")
def test_scan_sql92_with_bloom(benchmark, store):
    s, fm = store
    mf = fm.build_message_filter("G_BLOOM", TOPIC, "SQL92", SQL, 1)
    assert mf.bloom_bits is not None
    _run(benchmark, s, lambda: Counting(mf), N // 100)
