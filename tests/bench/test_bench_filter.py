"""Filter benchmarks, each beside a baseline measured in the same run.

* SQL92 evaluation: the compiled `a BETWEEN 3 AND 5 AND b = 'x'` over property dicts vs a
  hand-written Python lambda doing the same test (the floor for any Python evaluator).
* bloom is_hit: testing a group's k bits in a per-message bit map vs what a candidate without
  the prefilter costs the broker: decoding the record's properties and evaluating the SQL92
  expression (reading the record from the commit log comes on top and is not counted).
* bit map at dispatch: calc_bit_map for 4 registered groups vs evaluating their 4 compiled
  filters directly (the overhead of building the map).
(The pull-side consume-queue scan with bloom bits is measured with the store after broker
integration.)
"""
import random

import pytest

from rmq_core.broker.consumer_filter_manager import ConsumerFilterManager
from rmq_core.config import BrokerConfig
from rmq_core.message import properties_to_bytes, string_to_properties
from rmq_core.bloom import BloomFilter
from rmq_plugins.filter.sql92 import compile_sql92

EXPRESSION = "a BETWEEN 3 AND 5 AND b = 'x'"
N = 1000

_rnd = random.Random(7)
PROPS = [
    {"a": str(_rnd.randint(0, 9)), "b": _rnd.choice("xyz"), "TAGS": "TagA", "KEYS": f"k{i}", "UNIQ_KEY": f"u{i}"}
    for i in range(N)
]
for _p in PROPS[::10]:
    del _p["a"]  # some messages lack the property


def _lambda_filter(p):
    a = p.get("a")
    return a is not None and 3 <= int(a) <= 5 and p.get("b") == "x"


def _count(fn, props):
    n = 0
    for p in props:
        if fn(p):
            n += 1
    return n


def test_compiled_and_lambda_agree():
    f = compile_sql92(EXPRESSION)
    assert [f.is_matched_by_commit_log(p) for p in PROPS] == [_lambda_filter(p) for p in PROPS]


@pytest.mark.benchmark(group="filter-sql92-eval")
def test_sql92_eval_baseline_lambda(benchmark):
    benchmark.extra_info["evaluations_per_round"] = N
    assert benchmark(_count, _lambda_filter, PROPS) > 0


@pytest.mark.benchmark(group="filter-sql92-eval")
def test_sql92_eval_compiled(benchmark):
    f = compile_sql92(EXPRESSION)
    benchmark.extra_info["evaluations_per_round"] = N
    assert benchmark(_count, f.is_matched_by_commit_log, PROPS) == _count(_lambda_filter, PROPS)


def _bit_maps():
    bf = BloomFilter(32, 20)
    maps = []
    for i, p in enumerate(PROPS):
        bitmap = bf.new_bitmap()
        for g in range(4):
            if (i + g) % 3 == 0:
                bf.hash_to(bf.generate(f"G{g}#T"), bitmap)
        maps.append(bytes(bitmap))
    return bf, maps


@pytest.mark.benchmark(group="filter-bloom-is-hit")
def test_bloom_is_hit_baseline_decode_and_sql92_eval(benchmark):
    f = compile_sql92(EXPRESSION)
    raw = [properties_to_bytes(p) for p in PROPS]  # as stored in the record
    matches = f.is_matched_by_commit_log
    benchmark.extra_info["tests_per_round"] = N
    benchmark(_count, lambda b: matches(string_to_properties(b)), raw)


@pytest.mark.benchmark(group="filter-bloom-is-hit")
def test_bloom_is_hit(benchmark):
    bf, maps = _bit_maps()
    data = bf.generate("G0#T")
    is_hit = bf.is_hit
    benchmark.extra_info["tests_per_round"] = N
    hits = benchmark(_count, lambda m: is_hit(data, m), maps)
    assert 0 < hits < N


@pytest.mark.benchmark(group="filter-bloom-is-hit")
def test_bloom_contract_twin(benchmark):
    """MessageFilter.is_matched_by_consume_queue, the pure-Python twin of the store's native test."""
    m = ConsumerFilterManager(BrokerConfig(enable_property_filter=True, enable_calc_filter_bit_map=True))
    m.register("T", "G0", EXPRESSION, "SQL92", 1)
    f = m.build_message_filter("G0", "T", "SQL92", EXPRESSION, 1)
    _, maps = _bit_maps()
    t = f.bloom_born_time + 1
    test = f.is_matched_by_consume_queue
    benchmark.extra_info["tests_per_round"] = N
    benchmark(_count, lambda bm: test(0, bm, t), maps)


def _manager_with_groups():
    m = ConsumerFilterManager(BrokerConfig(enable_property_filter=True, enable_calc_filter_bit_map=True))
    exprs = [EXPRESSION, "a > 7", "b IN ('y', 'z')", "TAGS = 'TagA' AND a IS NOT NULL"]
    for g, e in enumerate(exprs):
        m.register("T", f"G{g}", e, "SQL92", 1)
    return m, [compile_sql92(e) for e in exprs]


@pytest.mark.benchmark(group="filter-calc-bit-map")
def test_calc_bit_map_baseline_eval_4_filters(benchmark):
    _, filters = _manager_with_groups()

    def run():
        for p in PROPS:
            for f in filters:
                f.is_matched_by_commit_log(p)

    benchmark.extra_info["messages_per_round"] = N
    benchmark(run)


@pytest.mark.benchmark(group="filter-calc-bit-map")
def test_calc_bit_map_4_groups(benchmark):
    m, _ = _manager_with_groups()
    calc = m.calc_bit_map

    def run():
        for i, p in enumerate(PROPS):
            calc("T", p, i)

    benchmark.extra_info["messages_per_round"] = N
    benchmark(run)
