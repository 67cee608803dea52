"""create_rdd / offset_ranges / commit_offsets / save_to_topic against two real broker processes."""
import pytest

import spark_plugin
from spark_plugin import OffsetRange
from tests.spark.conftest import create_topic, produce

PER_QUEUE = 300


@pytest.fixture(scope="module")
def topic(servers):
    create_topic(servers, "RddTopic", queues=2)
    sent = produce(servers.namesrv, "RddTopic", PER_QUEUE)
    return "RddTopic", sent


def test_partitions_are_keyed_by_broker_and_queue_and_hold_what_was_produced(spark, servers, topic):
    name, sent = topic
    ns = servers.namesrv
    rdd = spark_plugin.create_rdd(spark.sparkContext, ns, name)
    # two brokers that both have queues 0 and 1: four partitions, not two
    assert sorted((r.broker_name, r.queue_id) for r in rdd.offset_ranges) == sorted(sent)
    assert rdd.getNumPartitions() == 4
    per_partition = rdd.glom().map(
        lambda ms: sorted({(m.broker_name, m.queue_id) for m in ms}) + [[m.body for m in ms]]).collect()
    by_queue = {}
    for p in per_partition:
        (key,), bodies = p[:-1], p[-1]
        by_queue[key] = bodies
    assert by_queue == sent
    # count() sums the ranges (KafkaRDD's way) and agrees with what the partitions hold
    assert rdd.count() == sum(len(b) for b in sent.values()) == rdd.map(lambda m: 1).sum()
    m = rdd.first()
    assert (m.topic, m.tags, m.keys, m.properties["n"]) == (name, "TagA", "k0", "0")
    assert m.msg_id and m.born_timestamp > 0 and m.store_timestamp >= m.born_timestamp
    assert m.queue_offset == 0


def test_offset_ranges_empty_range_and_refusal_past_max(spark, servers, topic):
    name, _ = topic
    ns = servers.namesrv
    ranges = spark_plugin.offset_ranges(ns, name)
    assert all(r.from_offset == 0 and r.until_offset == PER_QUEUE for r in ranges)
    assert {r.until_offset for r in spark_plugin.offset_ranges(ns, name, start="latest")} == {PER_QUEUE}
    assert {r.from_offset for r in spark_plugin.offset_ranges(ns, name, start="latest")} == {PER_QUEUE}
    # a range of 10..20 of one queue, and an empty range of another
    a, b = ranges[0], ranges[1]
    picked = [OffsetRange(name, a.broker_name, a.queue_id, 10, 20), OffsetRange(name, b.broker_name, b.queue_id, 5, 5)]
    rdd = spark_plugin.create_rdd(spark.sparkContext, ns, name, offset_ranges=picked)
    got = rdd.map(lambda m: (m.broker_name, m.queue_id, m.queue_offset)).collect()
    assert got == [(a.broker_name, a.queue_id, o) for o in range(10, 20)]
    past = OffsetRange(name, a.broker_name, a.queue_id, 0, PER_QUEUE + 5)
    with pytest.raises(Exception, match=rf"\[0, {PER_QUEUE + 5}\) of queue {a.queue_id} of broker '{a.broker_name}'.*max offset {PER_QUEUE}"):
        spark_plugin.create_rdd(spark.sparkContext, ns, name, offset_ranges=[past])


def test_tag_and_sql92_filters_run_on_the_broker(spark, servers, topic):
    name, _ = topic
    ns = servers.namesrv
    sc = spark.sparkContext
    tags = spark_plugin.create_rdd(sc, ns, name, expression="TagA")
    assert tags.count() == 4 * PER_QUEUE // 2
    assert set(tags.map(lambda m: m.tags).collect()) == {"TagA"}
    sql = spark_plugin.create_rdd(sc, ns, name, expression="n < 10", expression_type="SQL92")
    assert sorted(sql.map(lambda m: int(m.properties["n"])).collect()) == sorted(list(range(10)) * 4)


def test_commit_offsets_moves_the_groups_broker_side_offsets(spark, servers, topic):
    name, _ = topic
    ns = servers.namesrv
    rdd = spark_plugin.create_rdd(spark.sparkContext, ns, name)
    spark_plugin.commit_offsets(ns, "SparkRddGroup", rdd.offset_ranges)
    from_group = spark_plugin.offset_ranges(ns, name, group="SparkRddGroup")
    assert {(r.broker_name, r.queue_id): r.from_offset for r in from_group} == \
        {(r.broker_name, r.queue_id): r.until_offset for r in rdd.offset_ranges}
    half = [OffsetRange(r.topic, r.broker_name, r.queue_id, 0, 100) for r in rdd.offset_ranges]
    spark_plugin.commit_offsets(ns, "SparkRddGroup", half)
    assert {r.from_offset for r in spark_plugin.offset_ranges(ns, name, group="SparkRddGroup")} == {100}


def test_save_to_topic_sends_messages_bytes_and_str(spark, servers, topic):
    name, sent = topic
    ns = servers.namesrv
    sc = spark.sparkContext
    create_topic(servers, "RddCopy", queues=2)
    rdd = spark_plugin.create_rdd(sc, ns, name, expression="TagB")
    spark_plugin.save_to_topic(rdd, ns, "RddCopy")
    spark_plugin.save_to_topic(sc.parallelize([b"raw-1", "text-2"], 2), ns, "RddCopy")
    copied = spark_plugin.create_rdd(sc, ns, "RddCopy")
    got = copied.map(lambda m: (m.body, m.tags, m.properties.get("n"))).collect()
    want_b = sorted(b for bodies in sent.values() for i, b in enumerate(bodies) if i % 2)
    assert sorted(b for b, t, _ in got if t == "TagB") == want_b
    assert sorted(b for b, t, _ in got if t is None) == [b"raw-1", b"text-2"]
    assert all(n is not None for _, t, n in got if t == "TagB")
