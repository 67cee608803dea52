"""A streaming query's `consumerGroup` offsets on the brokers reach the end of what the query has
durably done: while it idles after a producer stopped, after it is stopped, and after an
availableNow run that reads everything in one batch."""
import threading
import time

import spark_plugin
from rmq_core import Message, Producer
from spark_plugin.offsets import QueueAdmin
from tests.spark.conftest import create_topic, produce, wait_until


def group_offsets(ns, topic, group):
    return {(r.broker_name, r.queue_id): r.from_offset for r in spark_plugin.offset_ranges(ns, topic, group=group)}


def topic_end(ns, topic):
    admin = QueueAdmin(ns)
    try:
        queues, _ = admin.queues(topic)
        return {(mq.broker_name, mq.queue_id): admin.max_offset(mq) for mq in queues}
    finally:
        admin.close()


def stream(spark, ns, topic, group, tmp_path, name, **trigger):
    sdf = (spark.readStream.format("rmq").option("namesrv", ns).option("topic", topic)
           .option("startingOffsets", "earliest").option("consumerGroup", group).load())
    return (sdf.select("body").writeStream.format("parquet").option("path", str(tmp_path / name))
            .option("checkpointLocation", str(tmp_path / f"{name}-checkpoint")).trigger(**trigger).start())


def test_group_offsets_reach_the_end_while_idle_and_after_stop(spark, servers, tmp_path):
    ns, topic, group = servers.namesrv, "StreamGroupIdle", "SG_IDLE"
    create_topic(servers, topic, queues=2)
    stop = threading.Event()

    def producing():
        with Producer("PG_stream_idle", namesrv=ns) as p:
            i = 0
            while not stop.is_set() and i < 600:
                p.send(Message(topic, f"i-{i}".encode()))
                i += 1
                time.sleep(0.005)

    t = threading.Thread(target=producing)
    t.start()
    q = stream(spark, ns, topic, group, tmp_path, "idle", processingTime="300 milliseconds")
    try:
        wait_until(lambda: sum(p["numInputRows"] for p in q.recentProgress) > 0, timeout=60, what="a first batch")
        stop.set()
        t.join(30)
        end = topic_end(ns, topic)
        # the producer is done and the query idles: the group is at the topic's end, not a batch short
        wait_until(lambda: group_offsets(ns, topic, group) == end, timeout=60,
                   what=f"the group at the end {end} while the query idles")
    finally:
        stop.set()
        q.stop()
    produce(ns, topic, 5)  # nothing reads these: the stopped query's offsets stay where it ended
    assert group_offsets(ns, topic, group) == end


def test_available_now_commits_the_group(spark, servers, tmp_path):
    ns, topic, group = servers.namesrv, "StreamGroupNow", "SG_NOW"
    create_topic(servers, topic, queues=2)
    produce(ns, topic, 40)
    end = topic_end(ns, topic)
    q = stream(spark, ns, topic, group, tmp_path, "now", availableNow=True)
    assert q.awaitTermination(120)
    assert q.exception() is None
    assert sum(p["numInputRows"] for p in q.recentProgress) == sum(end.values())
    assert group_offsets(ns, topic, group) == end
    # a second availableNow run from the checkpoint reads only what came since, and moves the group on
    produce(ns, topic, 3)
    end2 = topic_end(ns, topic)
    q = stream(spark, ns, topic, group, tmp_path, "now", availableNow=True)
    assert q.awaitTermination(120)
    assert sum(p["numInputRows"] for p in q.recentProgress) == sum(end2.values()) - sum(end.values())
    assert group_offsets(ns, topic, group) == end2
