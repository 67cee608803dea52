"""failOnDataLoss both ways after retention deleted commit-log segments of a real broker process."""
import json
import os
import time

import pytest

import spark_plugin
from spark_plugin import OffsetRange
from tests.servers import NamesrvAndBroker
from tests.spark.conftest import create_topic, produce, wait_until

TOPIC = "RetainedTopic"


@pytest.fixture(scope="module")
def retained(tmp_path_factory):
    """A broker with 128 KiB segments whose two oldest segments retention has deleted."""
    tmp = tmp_path_factory.mktemp("retention")
    cl = NamesrvAndBroker(tmp, brokers=1, broker_props={
        "registerNameServerPeriod": "1000", "mappedFileSizeCommitLog": str(128 * 1024), "fileReservedTime": "1",
        "deleteWhen": ";".join(f"{h:02d}" for h in range(24)), "cleanResourceInterval": "300"})
    try:
        create_topic(cl, TOPIC, queues=1)
        produce(cl.namesrv, TOPIC, 1500, body=lambda mq, i: b"%06d" % i + b"x" * 122)
        seg_dir = tmp / "store-broker-a" / "commitlog"
        old = time.time() - 3 * 3600
        for name in sorted(os.listdir(seg_dir))[:2]:  # older than fileReservedTime: deleted next round
            os.utime(seg_dir / name, (old, old))
        ranges = lambda: spark_plugin.offset_ranges(cl.namesrv, TOPIC)  # noqa: E731
        wait_until(lambda: ranges()[0].from_offset > 0, what="retention deleting the old segments")
        (r,) = ranges()
        yield cl, r.from_offset, r.until_offset
    finally:
        cl.stop()


def test_rdd_fails_naming_the_lost_offsets_or_continues(spark, retained):
    cl, lo, hi = retained
    sc = spark.sparkContext
    whole = [OffsetRange(TOPIC, "broker-a", 0, 0, hi)]
    with pytest.raises(Exception, match=rf"data loss in queue 0 of broker 'broker-a'.*offsets \[0, {lo}\) were deleted"):
        spark_plugin.create_rdd(sc, cl.namesrv, TOPIC, offset_ranges=whole)
    rdd = spark_plugin.create_rdd(sc, cl.namesrv, TOPIC, offset_ranges=whole, fail_on_data_loss=False)
    offsets = rdd.map(lambda m: m.queue_offset).collect()
    assert offsets == list(range(lo, hi))


def test_data_source_batch_and_stream_both_ways(spark, retained, tmp_path):
    cl, lo, hi = retained
    start = json.dumps({"broker-a": {"0": 0}})

    def batch(fail):
        return (spark.read.format("rmq").option("namesrv", cl.namesrv).option("topic", TOPIC)
                .option("startingOffsets", start).option("failOnDataLoss", fail).load())

    with pytest.raises(Exception, match=rf"offsets \[0, {lo}\) were deleted by retention"):
        batch("true").count()
    assert batch("false").count() == hi - lo

    def stream(fail, name):
        sdf = (spark.readStream.format("rmq").option("namesrv", cl.namesrv).option("topic", TOPIC)
               .option("startingOffsets", start).option("failOnDataLoss", fail).load())
        return (sdf.select("queue_offset").writeStream.format("memory").queryName(name)
                .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())

    q = stream("false", "kept")
    q.awaitTermination(60)
    assert q.exception() is None
    assert [r.queue_offset for r in spark.sql("select queue_offset from kept order by 1").collect()] == list(range(lo, hi))
    q = stream("true", "lost")
    with pytest.raises(Exception, match=rf"offsets \[0, {lo}\) were deleted by retention"):
        q.awaitTermination(60)
