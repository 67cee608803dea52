"""Streaming reads of the "rmq" source into a Parquet sink: exactly once across a stop and a
restart from the checkpoint while a producer keeps writing; new queues and a new broker picked up;
maxRecordsPerBatch; consumerGroup offsets written on the brokers after each micro-batch; the
`properties` column only with includeProperties, through the JVM and the Python source."""
import json
import os
import threading
import time

import pytest

import spark_plugin
from rmq_core import Message, Producer
from tests.spark.conftest import create_topic, wait_until

TOPIC = "StreamTopic"
LIMIT = 400


def start_query(spark, ns, sink, checkpoint):
    sdf = (spark.readStream.format("rmq").option("namesrv", ns).option("topic", TOPIC)
           .option("startingOffsets", "earliest").option("maxRecordsPerBatch", str(LIMIT))
           .option("consumerGroup", "StreamGroup").load())
    return (sdf.select("broker_name", "queue_id", "queue_offset", "body").writeStream.format("parquet")
            .option("path", sink).option("checkpointLocation", checkpoint).trigger(processingTime="300 milliseconds")
            .start())


def rows_in(query) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def sink_rows(spark, sink):
    try:
        return spark.read.parquet(sink).collect()
    except Exception:  # nothing written yet
        return []


def test_exactly_once_across_restart_with_new_queues_and_brokers(spark, servers, tmp_path):
    ns = servers.namesrv
    create_topic(servers, TOPIC, queues=2, brokers=[0])  # broker-a only, at first
    sent: list[bytes] = []
    stop = threading.Event()

    def produce():
        with Producer("PG_stream", namesrv=ns, poll_name_server_interval=0.5) as p:
            i = 0
            while not stop.is_set():
                queues = p.fetch_publish_message_queues(TOPIC)  # (the topic grows meanwhile)
                batch = [Message(TOPIC, f"m-{i + j}".encode()) for j in range(10)]
                p.send_batch(batch, queue=queues[(i // 10) % len(queues)])
                sent.extend(m.body for m in batch)
                i += 10
                time.sleep(0.05)

    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        q = start_query(spark, ns, sink, checkpoint)
        wait_until(lambda: rows_in(q) >= 300, timeout=60, what="a first micro-batch")
        q.stop()
        first_run = rows_in(q)
        # meanwhile: a third queue on broker-a and the topic on broker-b too
        create_topic(servers, TOPIC, queues=3, brokers=[0])
        from tests.rawclient import RawClient
        from rmq_core.remoting.codes import RequestCode
        raw = RawClient("grow")
        try:
            r = raw.invoke(servers.broker_addrs[1], RequestCode.UPDATE_AND_CREATE_TOPIC,
                           {"topic": TOPIC, "readQueueNums": "2", "writeQueueNums": "2", "perm": "6"})
            assert r.code == 0, r.remark
            wait_until(lambda: len(raw.route(ns, TOPIC)[1]["queueDatas"]) == 2, what="the topic on broker-b")
        finally:
            raw.close()
        q = start_query(spark, ns, sink, checkpoint)  # restarted from its checkpoint
        n = len(sent)
        wait_until(lambda: len(sent) > n + 300, what="the producer writing into the grown topic")
        stop.set()
        producer.join(30)
        # (a batch the stop cut short is run again by the restarted query: >=, then the sink decides)
        wait_until(lambda: first_run + rows_in(q) >= len(sent), timeout=90, what="every message read")
        time.sleep(1.0)  # more triggers: nothing may arrive twice
        progress = q.recentProgress
        q.stop()
    finally:
        stop.set()
        producer.join(30)
    rows = sink_rows(spark, sink)
    assert len(rows) == len(sent)
    assert sorted(bytes(r.body) for r in rows) == sorted(sent)
    assert len({(r.broker_name, r.queue_id, r.queue_offset) for r in rows}) == len(rows)
    queues = {(r.broker_name, r.queue_id) for r in rows}
    assert ("broker-a", 2) in queues and any(b == "broker-b" for b, _ in queues)
    assert all(p["numInputRows"] <= LIMIT for p in progress)
    assert any(p["numInputRows"] > 0 for p in progress)
    # the group's broker-side offsets are the end offsets of the last committed micro-batch (written
    # when Spark asked for the batch after it, at the idle triggers before the stop)
    batches = {}
    for name in os.listdir(os.path.join(checkpoint, "offsets")):
        if name.isdigit():
            with open(os.path.join(checkpoint, "offsets", name)) as f:
                batches[int(name)] = json.loads(f.read().splitlines()[2])
    committed = sorted(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
    group = {(r.broker_name, r.queue_id): r.from_offset
             for r in spark_plugin.offset_ranges(ns, TOPIC, group="StreamGroup")}
    ends = [{(b, int(q)): o for b, qs in batches[i].items() for q, o in qs.items()} for i in committed[-1:]]
    assert any(all(group[k] == end.get(k, 0) for k in group) for end in ends), (group, ends)
    assert sum(group.values()) > 0


@pytest.mark.parametrize("fmt", ["rmq", "rmq_python"])
def test_a_stream_has_properties_only_when_asked(spark, servers, fmt):
    """As a batch read: no `properties` column by default, includeProperties=true adds it."""
    from tests.spark.conftest import produce

    ns, topic = servers.namesrv, f"StreamProps_{fmt}"
    create_topic(servers, topic, queues=1)
    produce(ns, topic, 10)

    def run(name, **options):
        sdf = spark.readStream.format(fmt).option("namesrv", ns).option("topic", topic) \
            .option("startingOffsets", "earliest")
        for k, v in options.items():
            sdf = sdf.option(k, v)
        sdf = sdf.load()
        q = sdf.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
        assert q.awaitTermination(120) and q.exception() is None
        return sdf.columns, spark.table(name).collect()

    columns, rows = run(f"plain_{fmt}")
    assert "properties" not in columns and len(rows) == 20
    columns, rows = run(f"props_{fmt}", includeProperties="true")
    assert "properties" in columns
    assert sorted(int(r.properties["n"]) for r in rows) == sorted(list(range(10)) * 2)
