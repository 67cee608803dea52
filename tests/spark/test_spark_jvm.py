"""The JVM reader of format("rmq") (rmq-spark.jar on the session through spark.jars): reads exact
against what was sent (plain and compressed bodies, properties, a tag filter), the same rows as the
Python source ("rmq_python") over the same topic, column pruning and pushed filters in the plan,
and one record format decoded alike by the Java and the native decoder (golden pull bodies)."""
import base64
import datetime
import json
import os

import pytest

import spark_plugin
from tests.spark.conftest import create_topic

pytestmark = pytest.mark.skipif(spark_plugin.jar_path() is None, reason="rmq-spark.jar not built (no JDK at build time)")

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
TOPIC = "JvmTopic"
PER_QUEUE = 60


def read(spark, fmt, ns, topic=TOPIC, **options):
    r = spark.read.format(fmt).option("namesrv", ns).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.fixture(scope="module")
def sent(servers):
    """Per queue: small plain bodies, bodies over the compression threshold (LZ4 from one
    producer, zlib from another), user properties, two tags; {(broker, qid, offset): Message}."""
    from rmq_core import Message, Producer

    create_topic(servers, TOPIC, queues=2)
    out = {}
    for kind in ("lz4", "zlib"):
        with Producer(f"PG_jvm_{kind}", namesrv=servers.namesrv, compress_type=kind) as p:
            for mq in p.fetch_publish_message_queues(TOPIC):
                msgs = []
                for i in range(PER_QUEUE // 2):
                    big = i % 5 == 0
                    body = (b"%s-%s-%d-" % (mq.broker_name.encode(), kind.encode(), i)) * (600 if big else 1)
                    msgs.append(Message(TOPIC, body, tags="TagA" if i % 2 else "TagB", keys=f"k{i}",
                                        properties={"kind": kind, "n": str(i)}))
                for m in msgs:
                    p.send(m, queue=mq)
                base = len([k for k in out if k[:2] == (mq.broker_name, mq.queue_id)])
                for i, m in enumerate(msgs):
                    out[(mq.broker_name, mq.queue_id, base + i)] = m
    return out


def test_format_rmq_is_the_jvm_reader_and_reads_exactly_what_was_sent(spark, servers, sent):
    from spark_plugin.datasource import jvm_reader_loaded
    assert jvm_reader_loaded(spark)
    assert "properties" not in read(spark, "rmq", servers.namesrv).columns  # opt-in, as Kafka's headers
    df = read(spark, "rmq", servers.namesrv, includeProperties="true")
    rows = df.collect()
    assert len(rows) == len(sent)
    for r in rows:
        m = sent[(r.broker_name, r.queue_id, r.queue_offset)]
        assert (r.topic, bytes(r.body), r.tags, r.keys, r.properties) == (TOPIC, m.body, m.tags, m.keys, m.properties)
        assert r.msg_id and r.reconsume_times == 0 and r.born_timestamp <= r.store_timestamp
    assert any(len(m.body) > 4096 for m in sent.values())  # compressed on the wire (LZ4 and zlib)
    tagged = read(spark, "rmq", servers.namesrv).filter("tags = 'TagA'").select("queue_offset", "tags", "body").collect()
    assert sorted(bytes(r.body) for r in tagged) == sorted(m.body for m in sent.values() if m.tags == "TagA")


def test_the_jvm_and_the_python_source_give_the_same_rows(spark, servers, sent):
    ns = servers.namesrv

    def rows(fmt, **options):
        df = read(spark, fmt, ns, **options)
        return sorted(tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else
                            tuple(sorted(v.items())) if isinstance(v, dict) else v for v in r) for r in df.collect())

    ending = json.dumps({"broker-a": {"0": 20, "1": 50}, "broker-b": {"0": 7}})
    for options in ({}, {"includeProperties": "true"}, {"columns": "properties, queue_offset"},
                    {"startingOffsets": json.dumps({"broker-a": {"0": 5}}), "endingOffsets": ending,
                     "expression": "TagB", "includeProperties": "TRUE"}):
        assert read(spark, "rmq", ns, **options).schema == read(spark, "rmq_python", ns, **options).schema, options
        assert rows("rmq", **options) == rows("rmq_python", **options), options
    # a user schema naming `properties` reads it without the option
    by_schema = {fmt: sorted((r.queue_offset, tuple(sorted(r.properties.items())))
                             for r in spark.read.format(fmt).schema("queue_offset long, properties map<string,string>")
                             .option("namesrv", ns).option("topic", TOPIC).load().collect())
                 for fmt in ("rmq", "rmq_python")}
    assert by_schema["rmq"] == by_schema["rmq_python"] and len(by_schema["rmq"]) == len(sent)
    assert all(dict(p)["n"] for _, p in by_schema["rmq"])


def test_column_pruning_and_pushed_filters_show_in_the_plan(spark, servers, sent):
    df = read(spark, "rmq", servers.namesrv).select("topic", "queue_offset").filter("queue_id = 1 and queue_offset >= 10")
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "columns=[topic, queue_offset, queue_id]" in plan or "columns=[topic, queue_id, queue_offset]" in plan, plan
    assert "queueIds=[1]" in plan and "offsets=[10, " in plan, plan
    from tests.spark.test_spark_datasource import gets_on_brokers
    before = gets_on_brokers(servers)
    got = df.collect()
    assert sorted((r.topic, r.queue_offset) for r in got) == sorted(
        (TOPIC, k[2]) for k in sent if k[1] == 1 and k[2] >= 10)
    assert read(spark, "rmq", servers.namesrv).count() == len(sent)
    assert gets_on_brokers(servers) == before  # offsets only, unfiltered: the ranges are the rows, nothing pulled
    assert read(spark, "rmq", servers.namesrv, columns="body, queue_offset").columns == ["body", "queue_offset"]
    narrowed = spark.read.format("rmq").schema("queue_offset long, tags string").option("namesrv", servers.namesrv) \
        .option("topic", TOPIC).load()
    assert narrowed.filter("tags = 'TagB'").count() == sum(1 for m in sent.values() if m.tags == "TagB")


@pytest.mark.parametrize("fmt", ["rmq", "rmq_python"])
def test_bad_columns_schema_and_include_properties_are_named_alike(spark, servers, fmt):
    ns = servers.namesrv
    with pytest.raises(Exception, match="'nope' is not a column of the rmq source"):
        read(spark, fmt, ns, columns="body, nope").count()
    with pytest.raises(Exception, match="column 'body string' is not a column of the rmq source"):
        spark.read.format(fmt).schema("body string").option("namesrv", ns).option("topic", TOPIC).load().count()
    with pytest.raises(Exception, match="bad includeProperties 'yes': expected true or false"):
        read(spark, fmt, ns, includeProperties="yes").count()
    with pytest.raises(Exception, match="bad includeProperties '1': expected true or false"):  # under a user schema
        spark.read.format(fmt).schema("body binary").option("namesrv", ns).option("topic", TOPIC) \
            .option("includeProperties", "1").load().count()


@pytest.mark.parametrize("name", ["plain", "lz4", "zlib", "properties", "ipv6", "batch", "torn_tail"])
@pytest.mark.parametrize("include_properties", [False, True])
def test_golden_pull_bodies_decode_alike_in_java_and_native(spark, name, include_properties):
    """The columns of a default read (no `properties`) and of one with includeProperties, decoded
    from the same bytes by the Java decoder and the native one (topic and broker_name are constants)."""
    from rmq_core._native.record_columns import decode_columns
    from rmq_core.errors import MessageDecodeError
    from spark_plugin.arrow import COLUMNS, DEFAULT_COLUMNS, SYSTEM_PROPERTIES, record_batch

    columns = [c for c in (COLUMNS if include_properties else DEFAULT_COLUMNS) if c not in ("topic", "broker_name")]
    assert ("properties" in columns) == include_properties
    with open(os.path.join(GOLDEN, f"{name}.bin"), "rb") as f:
        body = f.read()
    java = json.loads(spark._jvm.rmq.spark.Golden.decode(bytearray(body), -1, ", ".join(columns)))
    try:
        decode_columns(body, "broker-g", -1, SYSTEM_PROPERTIES)
    except MessageDecodeError as e:
        assert java == {"error": e.reason, "offset": e.offset}
        assert name == "torn_tail"
        return
    assert name != "torn_tail"
    batch = record_batch(body, "broker-g", columns=columns).to_pydict()
    assert list(batch) == columns and all(list(r) == columns for r in java)
    assert len(java) == len(batch["queue_offset"]) > 0
    for column in ("queue_id", "queue_offset", "msg_id", "tags", "keys", "reconsume_times"):
        assert [r[column] for r in java] == batch[column], column
    assert [base64.b64decode(r["body"]) for r in java] == batch["body"]
    if include_properties:
        assert [[tuple(kv) for kv in r["properties"]] for r in java] == batch["properties"]
        assert name != "properties" or any(batch["properties"])
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    for column in ("born_timestamp", "store_timestamp"):
        assert [r[column] for r in java] == [(t - epoch) // datetime.timedelta(microseconds=1) for t in batch[column]]
