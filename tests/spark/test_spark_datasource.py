"""The "rmq" data source: batch read (schema, contents per queue, offsets options, tag pushdown
measured on the brokers), write, and every bad input failing at planning with its value named."""
import json
import time

import pytest

import spark_plugin
from rmq_core.message import java_string_hash
from rmq_core.remoting.codes import RequestCode
from tests.servers import free_port
from tests.spark.conftest import create_topic, produce

PER_QUEUE = 200


@pytest.fixture(scope="module")
def topic(servers):
    create_topic(servers, "DsTopic", queues=2)
    return "DsTopic", produce(servers.namesrv, "DsTopic", PER_QUEUE)


def rmq(spark, ns, topic, **options):
    r = spark.read.format("rmq").option("namesrv", ns).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def gets_on_brokers(servers) -> int:
    """Messages the brokers have handed out to pulls so far (their runtime stats)."""
    from tests.rawclient import RawClient

    raw = RawClient("stats")
    try:
        total = 0
        for addr in servers.broker_addrs:
            r = raw.invoke(addr, RequestCode.GET_BROKER_RUNTIME_INFO, {})
            total += int(json.loads(r.body)["table"]["msgGetTotalTodayNow"])
        return total
    finally:
        raw.close()


def test_batch_read_has_the_fixed_schema_and_every_message_per_queue(spark, servers, topic):
    name, sent = topic
    columns = [("topic", "string"), ("broker_name", "string"), ("queue_id", "int"), ("queue_offset", "bigint"),
               ("msg_id", "string"), ("tags", "string"), ("keys", "string"), ("body", "binary"),
               ("properties", "map<string,string>"), ("born_timestamp", "timestamp"), ("store_timestamp", "timestamp"),
               ("reconsume_times", "int")]
    default = rmq(spark, servers.namesrv, name)
    assert [(f.name, f.dataType.simpleString()) for f in default.schema.fields] == [c for c in columns if c[0] != "properties"]
    df = rmq(spark, servers.namesrv, name, includeProperties="true")  # properties: opt-in (Kafka's includeHeaders)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == columns
    assert rmq(spark, servers.namesrv, name, includeProperties="false").columns == default.columns
    rows = df.select("broker_name", "queue_id", "queue_offset", "body").collect()
    by_queue = {}
    for r in sorted(rows, key=lambda r: (r.broker_name, r.queue_id, r.queue_offset)):
        by_queue.setdefault((r.broker_name, r.queue_id), []).append(bytes(r.body))
    assert by_queue == sent
    first = df.filter("broker_name = 'broker-b' and queue_id = 1 and queue_offset = 3").collect()[0]
    assert (first.topic, first.tags, first.keys, first.properties["n"], first.reconsume_times) == \
        (name, "TagB", "k3", "3", 0)
    assert first.msg_id and first.born_timestamp <= first.store_timestamp
    assert df.rdd.getNumPartitions() == 4


def test_starting_and_ending_offsets_json_and_starting_timestamp(spark, servers, topic):
    name, _ = topic
    ns = servers.namesrv
    ending = {b: {"0": 20, "1": 0} for b in ("broker-a", "broker-b")}
    df = rmq(spark, ns, name, startingOffsets=json.dumps({"broker-a": {"0": 10}, "broker-b": {"0": -2}}),
             endingOffsets=json.dumps(ending))
    got = sorted((r.broker_name, r.queue_id, r.queue_offset) for r in df.select("broker_name", "queue_id", "queue_offset").collect())
    assert got == [("broker-a", 0, o) for o in range(10, 20)] + [("broker-b", 0, o) for o in range(20)]
    create_topic(servers, "DsTimeTopic", queues=1)
    produce(ns, "DsTimeTopic", 30)
    time.sleep(0.05)
    t = int(time.time() * 1000)
    time.sleep(0.05)
    produce(ns, "DsTimeTopic", 20, body=lambda mq, i: f"late-{mq.broker_name}-{i}".encode())
    late = rmq(spark, ns, "DsTimeTopic", startingTimestamp=str(t)).select("body").collect()
    assert sorted(bytes(r.body) for r in late) == sorted(f"late-{b}-{i}".encode() for b in ("broker-a", "broker-b") for i in range(20))


def test_tag_filters_are_pushed_to_the_brokers(spark, servers, topic):
    name, _ = topic
    ns = servers.namesrv
    before = gets_on_brokers(servers)
    assert len(rmq(spark, ns, name).select("body").collect()) == 4 * PER_QUEUE
    unfiltered = gets_on_brokers(servers) - before
    before = gets_on_brokers(servers)
    rows = rmq(spark, ns, name).filter("tags = 'TagA'").select("tags").collect()
    pushed = gets_on_brokers(servers) - before
    assert len(rows) == 4 * PER_QUEUE // 2 and {r.tags for r in rows} == {"TagA"}
    assert unfiltered == 4 * PER_QUEUE and pushed == 4 * PER_QUEUE // 2  # only matches left the brokers
    before = gets_on_brokers(servers)
    assert rmq(spark, ns, name).filter("tags in ('TagB', 'TagC')").count() == 4 * PER_QUEUE // 2
    assert gets_on_brokers(servers) - before == 4 * PER_QUEUE // 2
    # the expression option is the same broker-side filter; SQL92 too
    assert rmq(spark, ns, name, expression="TagB").count() == 4 * PER_QUEUE // 2
    assert rmq(spark, ns, name, expression="n >= 190", expressionType="SQL92").count() == 4 * 10


def test_write_sends_body_tags_keys_properties(spark, servers):
    ns = servers.namesrv
    create_topic(servers, "DsOut", queues=2)
    df = spark.createDataFrame([(f"hello-{i}", "TagW" if i % 2 else None, f"key{i}", {"p": str(i)}) for i in range(100)],
                               "body string, tags string, keys string, properties map<string,string>")
    df.write.format("rmq").option("namesrv", ns).option("topic", "DsOut").mode("append").save()
    spark.createDataFrame([(b"bin",)], "body binary").write.format("rmq").option("namesrv", ns) \
        .option("topic", "DsOut").mode("append").save()
    back = rmq(spark, ns, "DsOut", includeProperties="true").select("body", "tags", "keys", "properties").collect()
    assert sorted(bytes(r.body) for r in back) == sorted([f"hello-{i}".encode() for i in range(100)] + [b"bin"])
    one = next(r for r in back if bytes(r.body) == b"hello-7")
    assert (one.tags, one.keys, one.properties["p"]) == ("TagW", "key7", "7")
    # rows spread over the topic's queues as a producer's sends: keyed ones by their keys' hash ...
    queues = sorted({(r.broker_name, r.queue_id) for r in rmq(spark, ns, "DsOut").select("broker_name", "queue_id").collect()})
    assert len(queues) == 2 * len(servers.broker_addrs)
    keyed = rmq(spark, ns, "DsOut").filter("keys is not null").select("keys", "broker_name", "queue_id").collect()
    assert {r.keys: (r.broker_name, r.queue_id) for r in keyed} == {
        f"key{i}": queues[abs(java_string_hash(f"key{i}")) % len(queues)] for i in range(100)}
    # ... the others in turn, each task from its own first queue
    spark.createDataFrame([(f"plain-{i}",) for i in range(120)], "body string").repartition(2) \
        .write.format("rmq").option("namesrv", ns).option("topic", "DsOut").mode("append").save()
    plain = rmq(spark, ns, "DsOut").filter("body like 'plain-%'").groupBy("broker_name", "queue_id").count().collect()
    counts = sorted(r["count"] for r in plain)
    assert len(counts) == len(queues) and sum(counts) == 120 and counts[-1] - counts[0] <= 2, counts
    with pytest.raises(Exception, match="append-only"):
        df.write.format("rmq").option("namesrv", ns).option("topic", "DsOut").mode("overwrite").save()
    with pytest.raises(Exception, match=r"not \['other'\]"):
        spark.createDataFrame([("x", 1)], "body string, other int").write.format("rmq") \
            .option("namesrv", ns).option("topic", "DsOut").mode("append").save()
    with pytest.raises(Exception, match="column 'keys' must be string, not int"):
        spark.createDataFrame([("x", 1)], "body string, keys int").write.format("rmq") \
            .option("namesrv", ns).option("topic", "DsOut").mode("append").save()
    with pytest.raises(Exception, match=r"a row with a null body cannot be sent to DsOut: \{'body': None, 'keys': 'k'\}"):
        spark.createDataFrame([("x", "k"), (None, "k")], "body string, keys string").coalesce(1).write.format("rmq") \
            .option("namesrv", ns).option("topic", "DsOut").mode("append").save()


def test_a_batch_the_broker_refuses_fails_the_write_with_the_brokers_error(spark, servers):
    create_topic(servers, "DsRefused", queues=1)
    big = spark.createDataFrame([("x" * (2 << 20),)], "body string")  # over the brokers' maxMessageSize
    with pytest.raises(Exception) as info:
        big.write.format("rmq").option("namesrv", servers.namesrv).option("topic", "DsRefused").mode("append").save()
    text = str(info.value)
    assert "MQBrokerError" in text and ("maxMessageSize" in text or "too large" in text.lower()), text[-3000:]


@pytest.mark.parametrize("options, message", [
    ({"topic": "NoSuchTopic"}, "topic 'NoSuchTopic' does not exist"),
    ({"startingOffsets": "{broker-a: 1"}, r"malformed startingOffsets '\{broker-a: 1'"),
    ({"startingOffsets": '{"broker-a": {"0": -5}}'}, r"offset -5 of broker-a:0"),
    ({"startingOffsets": '{"broker-z": {"0": 1}}'}, r"queue 0 of broker 'broker-z'"),
    ({"endingOffsets": '{"broker-a": {"0": 100000}}'}, r"\[0, 100000\) of queue 0 of broker 'broker-a'.*max offset"),
    ({"startingOffsets": '{"broker-a": {"0": 50}}', "endingOffsets": '{"broker-a": {"0": 10}}'},
     "reversed offset range of queue 0 of broker 'broker-a'.*from 50 > until 10"),
    ({"expression": "a > ", "expressionType": "SQL92"}, r"a > "),
    ({"namesrv": None}, r"option 'namesrv'\) is missing"),
    ({"namesrv": "unreachable"}, "unreachable"),
    ({"startingTimestamp": "yesterday"}, "bad startingTimestamp 'yesterday'"),
    ({"failOnDataLoss": "maybe"}, "bad failOnDataLoss 'maybe'"),
    ({"includeProperties": "maybe"}, "bad includeProperties 'maybe': expected true or false"),
])
def test_bad_input_fails_at_planning_naming_the_value(spark, servers, topic, options, message):
    name, _ = topic
    opts = {"namesrv": servers.namesrv, "topic": name, **options}
    if opts["namesrv"] == "unreachable":
        opts["namesrv"] = f"127.0.0.1:{free_port()}"
        message = rf"name server '127.0.0.1:\d+' unreachable"
    r = spark.read.format("rmq")
    for k, v in opts.items():
        if v is not None:
            r = r.option(k, v)
    with pytest.raises(Exception, match=message) as info:
        r.load().count()
    assert "Py4JJavaError" not in type(info.value).__name__


def test_bad_input_of_the_rdd_api(spark, servers, topic):
    name, _ = topic
    ns = servers.namesrv
    sc = spark.sparkContext
    with pytest.raises(Exception, match="consumer group 'NoSuchGroup' has no committed offset"):
        spark_plugin.offset_ranges(ns, name, group="NoSuchGroup")
    with pytest.raises(Exception, match="OffsetRange.from_offset must be an int >= 0, got -1"):
        spark_plugin.OffsetRange(name, "broker-a", 0, -1, 5)
    with pytest.raises(Exception, match="reversed offset range .*until_offset 3 < from_offset 5"):
        spark_plugin.OffsetRange(name, "broker-a", 0, 5, 3)
    with pytest.raises(Exception, match="topic 'Nope' does not exist"):
        spark_plugin.create_rdd(sc, ns, "Nope")
    with pytest.raises(Exception, match="'b = '"):
        spark_plugin.create_rdd(sc, ns, name, expression="b = ", expression_type="SQL92")
    with pytest.raises(Exception, match="in-proc"):
        spark_plugin.create_rdd(sc, "inproc://x-namesrv", name)
