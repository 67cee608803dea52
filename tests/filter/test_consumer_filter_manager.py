"""ConsumerFilterManager: registration rules, bit maps at dispatch, the pull-side filter, persistence.

The central property: the bloom prefilter never skips a message that matches the subscription,
whatever the order of registrations, expression changes and stores.
"""
import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from rmq_core.broker.consumer_filter_manager import (
    DEAD_FILTER_RETENTION_MS,
    BloomMessageFilter,
    CalcBitMapDispatcher,
    ConsumerFilterManager,
    PropertyFilterDisabledError,
)
from rmq_core.config import BrokerConfig, MessageStoreConfig
from rmq_core.errors import ConfigError, FilterExpressionError
from rmq_core.message import java_string_hash
from rmq_plugins.filter.sql92 import Sql92MessageFilter
from rmq_plugins.filter.tag import TagMessageFilter


class Clock:
    """A millisecond clock the test moves by hand."""

    def __init__(self, now: int = 1_700_000_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now

    def tick(self, ms: int = 1) -> int:
        self.now += ms
        return self.now


def make_manager(tmp_path=None, clock=None, **broker_settings):
    settings_ = dict(enable_property_filter=True, enable_calc_filter_bit_map=True)
    settings_.update(broker_settings)
    broker = BrokerConfig(**settings_)
    store = MessageStoreConfig(store_path_root_dir=str(tmp_path)) if tmp_path is not None else None
    return ConsumerFilterManager(broker, store, clock=clock or Clock())


# --- registration -------------------------------------------------------------------------------------
def test_register_and_versions_follow_rocketmq():
    clock = Clock()
    m = make_manager(clock=clock)
    assert not m.register("T", "G", "*", "TAG", 1)  # tag subscriptions are not kept
    assert not m.register("T", "G", "", "SQL92", 1)
    assert m.register("T", "G", "a > 1", "SQL92", 10)
    first = m.get("T", "G")
    assert first.expression == "a > 1" and first.client_version == 10 and not first.is_dead()
    assert isinstance(first.compiled, Sql92MessageFilter)
    assert first.bloom_filter_data == m.bloom_filter.generate("G#T")
    # an older version never replaces a newer one
    clock.tick(5)
    assert not m.register("T", "G", "a > 2", "SQL92", 9)
    assert m.get("T", "G") is first
    # same expression, newer version: kept, version updated, not re-born
    assert m.register("T", "G", "a > 1", "SQL92", 11)
    assert m.get("T", "G") is first and first.client_version == 11
    # changed expression: a new data, re-born now
    clock.tick(5)
    assert m.register("T", "G", "a > 2", "sql92", 12)
    second = m.get("T", "G")
    assert second is not first and second.expression == "a > 2" and second.born_time == clock.now
    # a new expression that does not compile drops the old one (the client reports the error)
    assert not m.register("T", "G", "a >", "SQL92", 13)
    assert m.get("T", "G") is None
    assert not m.register("T", "G2", "(", "SQL92", 1)
    assert m.get_by_topic("T") == []


def test_register_group_kills_dropped_topics_and_unregister_kills_all():
    clock = Clock()
    m = make_manager(clock=clock)
    m.register_group("G", [("T1", "SQL92", "a = 1", 1), ("T2", "SQL92", "b = 1", 1), ("T3", "TAG", "*", 1)])
    assert {d.topic for d in m.get_by_group("G")} == {"T1", "T2"}
    clock.tick()
    m.register_group("G", [("T1", "SQL92", "a = 1", 2)])
    assert not m.get("T1", "G").is_dead() and m.get("T2", "G").is_dead()
    m.unregister("G")
    assert m.get("T1", "G").is_dead()
    # the same version re-registering revives it
    assert m.register("T1", "G", "a = 1", "SQL92", 2)
    assert not m.get("T1", "G").is_dead()


def test_objects_with_subscription_fields_are_accepted():
    class Sub:
        topic, expression_type, sub_string, sub_version = "T", "SQL92", "a = 1", 3

    m = make_manager()
    m.register_group("G", [Sub()])
    assert m.get("T", "G").client_version == 3


def test_dead_filters_are_cleaned_after_a_day():
    clock = Clock()
    m = make_manager(clock=clock)
    m.register("T", "G", "a = 1", "SQL92", 1)
    m.unregister("G")
    clock.tick(DEAD_FILTER_RETENTION_MS - 1)
    m.clean()
    assert m.get("T", "G") is not None
    clock.tick(1)
    m.clean()
    assert m.get("T", "G") is None and m.get_by_topic("T") == []


def test_unknown_expression_type_is_not_registered():
    m = make_manager()
    assert not m.register("T", "G", "x", "NO_SUCH_TYPE", 1)


# --- dispatch side --------------------------------------------------------------------------------------
def test_bit_map_sets_the_bits_of_matching_groups_only():
    m = make_manager()
    m.register("T", "G1", "a > 5", "SQL92", 1)
    m.register("T", "G2", "b = 'x'", "SQL92", 1)
    bf = m.bloom_filter
    bitmap = m.calc_bit_map("T", {"a": "6", "b": "y"}, 0)
    assert len(bitmap) == bf.m // 8
    assert bf.is_hit(m.get("T", "G1").bloom_filter_data, bitmap)
    expected = bf.new_bitmap()
    bf.hash_to(m.get("T", "G1").bloom_filter_data, expected)
    assert bitmap == bytes(expected)  # exactly G1's bits
    assert m.calc_bit_map("T", {}, 0) == bytes(bf.m // 8)  # nobody matches: an all-zero map
    assert m.calc_bit_map("OTHER", {"a": "6"}, 0) is None  # no expression subscription: no map


def test_bit_maps_are_off_unless_enabled():
    m = make_manager(enable_calc_filter_bit_map=False)
    m.register("T", "G", "a > 5", "SQL92", 1)
    assert m.calc_bit_map("T", {"a": "6"}, 0) is None
    f = m.build_message_filter("G", "T", "SQL92", "a > 5", 1)
    assert f.bloom_bits is None and f.needs_commit_log_check


def test_dispatcher_sets_the_request_bit_map():
    class Request:
        topic, properties, store_timestamp, bit_map = "T", {"a": "9"}, 5, None

    m = make_manager()
    m.register("T", "G", "a > 5", "SQL92", 1)
    req = Request()
    CalcBitMapDispatcher(m).dispatch(req)
    assert m.bloom_filter.is_hit(m.get("T", "G").bloom_filter_data, req.bit_map)


def test_store_config_gets_the_bit_map_length(tmp_path):
    store = MessageStoreConfig(store_path_root_dir=str(tmp_path))
    m = ConsumerFilterManager(BrokerConfig(expect_consumer_num_use_filter=64), store)
    assert store.bit_map_length_consume_queue_ext == m.bloom_filter.m == 216
    assert m.config_path == os.path.join(str(tmp_path), "config", "consumerFilter.json")


# --- pull side ------------------------------------------------------------------------------------------
def test_pull_filter_for_tags_is_the_tag_filter():
    m = make_manager(enable_property_filter=False)
    f = m.build_message_filter("G", "T", "TAG", "TagA || TagB", 1)
    assert isinstance(f, TagMessageFilter) and f.tag_codes == {java_string_hash("TagA"), java_string_hash("TagB")}
    assert m.build_message_filter("G", "T", None, "*", 1).tag_codes is None


def test_sql92_on_a_broker_without_property_filter_names_the_setting():
    m = make_manager(enable_property_filter=False)
    with pytest.raises(PropertyFilterDisabledError) as ei:
        m.build_message_filter("G", "T", "SQL92", "a > 1", 1)
    message = str(ei.value)
    assert "enablePropertyFilter=true" in message and "broker.conf" in message and "SQL92" in message
    assert isinstance(ei.value, ConfigError)
    with pytest.raises(PropertyFilterDisabledError):
        m.check_expression_type_supported("sql92")
    m.check_expression_type_supported("TAG")


def test_malformed_expression_on_the_pull_path():
    m = make_manager()
    with pytest.raises(FilterExpressionError) as ei:
        m.build_message_filter("G", "T", "SQL92", "a BETWEEN 3", 1)
    assert ei.value.position == 11


def test_registered_subscription_gets_bloom_bits_and_born_time():
    clock = Clock()
    m = make_manager(clock=clock)
    m.register("T", "G", "a > 5", "SQL92", 1)
    data = m.get("T", "G")
    f = m.build_message_filter("G", "T", "SQL92", "a > 5", 1)
    assert isinstance(f, BloomMessageFilter)
    assert f.bloom_bits == data.bloom_filter_data.bit_pos and f.bloom_bit_num == m.bloom_filter.m
    assert f.bloom_born_time == data.born_time and f.needs_commit_log_check
    assert f.is_matched_by_commit_log({"a": "6"}) and not f.is_matched_by_commit_log({"a": "5"})
    # another expression than the registered one: no bloom test (its bits mean something else)
    g = m.build_message_filter("G", "T", "SQL92", "a > 6", 2)
    assert g.bloom_bits is None and g.needs_commit_log_check
    # an unregistered group: no bloom test either
    assert m.build_message_filter("H", "T", "SQL92", "a > 5", 1).bloom_bits is None


def test_prefilter_skips_non_matching_messages_stored_after_registration():
    clock = Clock()
    m = make_manager(clock=clock)
    m.register("T", "G", "a > 5", "SQL92", 1)
    f = m.build_message_filter("G", "T", "SQL92", "a > 5", 1)
    t = clock.tick()
    no = m.calc_bit_map("T", {"a": "1"}, t)
    yes = m.calc_bit_map("T", {"a": "9"}, t)
    assert not f.is_matched_by_consume_queue(0, no, t)  # skipped without reading the commit log
    assert f.is_matched_by_consume_queue(0, yes, t)
    # no store time known: cannot prove anything, candidate
    assert f.is_matched_by_consume_queue(0, no, None)
    # a bit map of another size (another bloom configuration): candidate
    assert f.is_matched_by_consume_queue(0, no + b"\x00", t)
    # no bit map at all: candidate
    assert f.is_matched_by_consume_queue(0, None, t)


def test_message_stored_before_a_late_subscriber_is_not_skipped():
    clock = Clock()
    m = make_manager(clock=clock)
    m.register("T", "EARLY", "b = 1", "SQL92", 1)
    t_old = clock.tick()
    old_map = m.calc_bit_map("T", {"a": "9", "b": "0"}, t_old)  # LATE's bits are not in it
    m.register("T", "LATE", "a > 5", "SQL92", 1)  # same millisecond as the message
    f = m.build_message_filter("LATE", "T", "SQL92", "a > 5", 1)
    assert not m.bloom_filter.is_hit(m.get("T", "LATE").bloom_filter_data, old_map)
    assert f.is_matched_by_consume_queue(0, old_map, t_old)  # born_time >= store time: candidate
    assert f.is_matched_by_commit_log({"a": "9", "b": "0"})


def test_born_time_never_precedes_a_seen_store_time_when_the_clock_steps_back():
    clock = Clock()
    m = make_manager(clock=clock)
    m.register("T", "EARLY", "b = 1", "SQL92", 1)
    future = clock.now + 60_000  # a message stamped by a clock that was ahead
    old_map = m.calc_bit_map("T", {"a": "9"}, future)
    m.register("T", "LATE", "a > 5", "SQL92", 1)
    assert m.get("T", "LATE").born_time >= future
    f = m.build_message_filter("LATE", "T", "SQL92", "a > 5", 1)
    assert f.is_matched_by_consume_queue(0, old_map, future)


# The property: random interleavings of registrations (with expression/version changes),
# unregistrations and stores; afterwards every message that matches a group's current
# subscription passes that group's prefilter.
EXPRESSIONS = ["a > 5", "a <= 5", "b = 'x'", "b IN ('x', 'y') AND a BETWEEN 1 AND 9", "c IS NULL", "TRUE"]
GROUPS = ["G1", "G2", "G3"]
PROPS = st.fixed_dictionaries(
    {},
    optional={
        "a": st.integers(min_value=-2, max_value=12).map(str) | st.just("abc"),
        "b": st.sampled_from(["x", "y", "z"]),
        "c": st.just("1"),
    },
)
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("register"), st.sampled_from(GROUPS), st.sampled_from(EXPRESSIONS), st.integers(0, 5)),
        st.tuples(st.just("unregister"), st.sampled_from(GROUPS)),
        st.tuples(st.just("store"), PROPS, st.integers(0, 2)),
        st.tuples(st.just("clean"), st.integers(0, 2)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(EVENTS, st.sampled_from([(32, 20), (2, 50), (1, 90)]))
def test_prefilter_never_skips_a_matching_message(events, sizing):
    clock = Clock()
    m = make_manager(clock=clock, expect_consumer_num_use_filter=sizing[0], max_error_rate_of_bloom_filter=sizing[1])
    stored = []  # (properties, bit map, store time)
    for event in events:
        if event[0] == "register":
            _, group, expression, version = event
            m.register("T", group, expression, "SQL92", version)
        elif event[0] == "unregister":
            m.unregister(event[1])
        elif event[0] == "store":
            _, props, advance = event
            t = clock.tick(advance)  # several messages may share a millisecond
            stored.append((props, m.calc_bit_map("T", props, t), t))
        else:
            clock.tick(event[1] * DEAD_FILTER_RETENTION_MS)
            m.clean()
    for group in GROUPS:
        for expression in EXPRESSIONS:  # whatever the pull asks for, registered or not
            f = m.build_message_filter(group, "T", "SQL92", expression, 99)
            for props, bitmap, t in stored:
                if f.is_matched_by_commit_log(props):
                    assert f.is_matched_by_consume_queue(0, bitmap, t), (group, expression, props)


# --- persistence ----------------------------------------------------------------------------------------
def test_persist_and_load_round_trip(tmp_path):
    clock = Clock()
    m = make_manager(tmp_path, clock=clock)
    m.register("T", "G", "a > 5", "SQL92", 7)
    m.register("T2", "H", "b = 'it''s'", "SQL92", 8)
    m.persist()
    path = m.config_path
    doc = json.loads(open(path, encoding="utf-8").read())
    g = doc["filterDataByTopic"]["T"]["groupFilterData"]["G"]
    assert g["expression"] == "a > 5" and g["expressionType"] == "SQL92" and g["clientVersion"] == 7
    assert g["bloomFilterData"]["bitNum"] == m.bloom_filter.m
    assert [p for p in os.listdir(os.path.dirname(path)) if ".tmp" in p] == []  # no temporary left

    clock.tick(1000)
    n = make_manager(tmp_path, clock=clock)
    assert n.load()
    d = n.get("T", "G")
    assert d.expression == "a > 5" and d.client_version == 7 and d.compiled.is_matched_by_commit_log({"a": "6"})
    # loaded subscriptions are dead until their consumers heartbeat, and re-born at load time
    assert d.is_dead() and d.born_time == clock.now
    assert n.get("T2", "H").compiled.is_matched_by_commit_log({"b": "it's"})
    assert n.register("T", "G", "a > 5", "SQL92", 7) and not n.get("T", "G").is_dead()


def test_load_ignores_data_of_another_bloom_configuration(tmp_path):
    m = make_manager(tmp_path)
    m.register("T", "G", "a > 5", "SQL92", 7)
    m.persist()
    n = make_manager(tmp_path, expect_consumer_num_use_filter=64)
    assert not n.load()
    assert n.get("T", "G") is None


def test_load_without_a_file_and_with_a_corrupt_file(tmp_path):
    m = make_manager(tmp_path)
    assert not m.load()
    os.makedirs(os.path.dirname(m.config_path), exist_ok=True)
    with open(m.config_path, "w") as f:
        f.write("{not json")
    with pytest.raises(ConfigError) as ei:
        m.load()
    assert "consumerFilter.json" in str(ei.value)


def test_persist_without_a_path_is_a_clear_error():
    with pytest.raises(ConfigError):
        make_manager().persist()


def test_persist_replaces_the_file_atomically(tmp_path):
    m = make_manager(tmp_path)
    m.register("T", "G", "a > 5", "SQL92", 1)
    m.persist()
    before = os.stat(m.config_path).st_ino
    m.register("T", "G", "a > 6", "SQL92", 2)
    m.persist()
    assert os.stat(m.config_path).st_ino != before  # a new file renamed over the old one
    n = make_manager(tmp_path)
    n.load()
    assert n.get("T", "G").expression == "a > 6"


def test_expression_change_does_not_trust_bits_of_the_old_expression():
    clock = Clock()
    m = make_manager(clock=clock)
    m.register("T", "G", "a > 5", "SQL92", 1)
    t1 = clock.tick()
    map_v1 = m.calc_bit_map("T", {"a": "1"}, t1)  # does not match v1: G's bits unset
    clock.tick()
    assert m.register("T", "G", "a < 5", "SQL92", 2)  # new version, new expression
    f = m.build_message_filter("G", "T", "SQL92", "a < 5", 2)
    assert f.bloom_born_time >= t1
    assert f.is_matched_by_consume_queue(0, map_v1, t1)  # matches v2: must not be skipped
    assert f.is_matched_by_commit_log({"a": "1"})
    t2 = clock.tick()
    assert not f.is_matched_by_consume_queue(0, m.calc_bit_map("T", {"a": "9"}, t2), t2)
    assert f.is_matched_by_consume_queue(0, m.calc_bit_map("T", {"a": "1"}, t2), t2)
    # a pull still carrying the old expression gets no bloom test at all
    assert m.build_message_filter("G", "T", "SQL92", "a > 5", 1).bloom_bits is None
