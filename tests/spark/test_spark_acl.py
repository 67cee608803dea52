"""The Spark plugin against a broker with aclEnable=true (a real `rmq namesrv` + `rmq broker` and
the local[2] session): options accessKey / secretKey for the RDD and the data source (batch,
streaming with consumerGroup, write) sign the driver's and the executors' requests; a wrong secret
or no account fails with the broker's remark."""
import pytest

import spark_plugin
from rmq_core import Message, Producer
from rmq_core.admin import AdminClient
from rmq_core.errors import IllegalArgumentError
from tests.servers import NamesrvAndBroker
from tests.spark.conftest import wait_until

AK, SK = "spark-app", "spark-secret-1"
ADMIN_AK, ADMIN_SK = "spark-admin", "spark-admin-secret"
TOPIC, OUT_TOPIC, N = "SparkAclTopic", "SparkAclOut", 60
PLAIN_ACL = f"""\
accounts:
  - accessKey: {ADMIN_AK}
    secretKey: {ADMIN_SK}
    admin: true
  - accessKey: {AK}
    secretKey: {SK}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=PUB|SUB
      - {OUT_TOPIC}=PUB|SUB
"""
CREDS = {"accessKey": AK, "secretKey": SK}


@pytest.fixture(scope="module")
def acl(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spark-acl")
    (tmp / "plain_acl.yml").write_text(PLAIN_ACL)
    cl = NamesrvAndBroker(tmp, broker_props={"aclEnable": "true", "plainAclFile": str(tmp / "plain_acl.yml"),
                                             "registerNameServerPeriod": "1000"})
    try:
        with AdminClient(cl.namesrv, access_key=ADMIN_AK, secret_key=ADMIN_SK) as a:
            for t in (TOPIC, OUT_TOPIC):
                a.create_or_update_topic(cl.broker_addrs[0], t, read_queue_nums=2, write_queue_nums=2)
            wait_until(lambda: {TOPIC, OUT_TOPIC} <= set(a.topic_list()), what="topics routed")
        with Producer("PG_SPARK_ACL", namesrv=cl.namesrv, access_key=AK, secret_key=SK) as p:
            p.send_batch([Message(TOPIC, f"m{i}".encode()) for i in range(N)])
        yield cl
    finally:
        cl.stop()


def test_rdd_reads_and_writes_with_the_account_and_fails_with_the_remark(spark, acl):
    ns, sc = acl.namesrv, spark.sparkContext
    rdd = spark_plugin.create_rdd(sc, ns, TOPIC, access_key=AK, secret_key=SK)
    # the executors' pulls are signed too: the broker refuses unsigned ones
    assert sorted(rdd.map(lambda m: bytes(m.body)).collect()) == sorted(f"m{i}".encode() for i in range(N))
    spark_plugin.save_to_topic(rdd, ns, OUT_TOPIC, access_key=AK, secret_key=SK)
    out = spark_plugin.create_rdd(sc, ns, OUT_TOPIC, access_key=AK, secret_key=SK)
    assert out.count() == N and len(out.collect()) == N
    spark_plugin.commit_offsets(ns, "GroupSparkRdd", rdd.offset_ranges, access_key=AK, secret_key=SK)
    ranges = spark_plugin.offset_ranges(ns, TOPIC, group="GroupSparkRdd", access_key=AK, secret_key=SK)
    assert sum(r.from_offset for r in ranges) == N

    with pytest.raises(Exception, match=f"Check signature failed for accessKey={AK}"):
        spark_plugin.create_rdd(sc, ns, TOPIC, access_key=AK, secret_key="not-the-secret")
    with pytest.raises(Exception, match="No accessKey is configured"):
        spark_plugin.create_rdd(sc, ns, TOPIC)
    with pytest.raises(IllegalArgumentError, match="option 'secretKey' is missing"):
        spark_plugin.create_rdd(sc, ns, TOPIC, access_key=AK)


def test_data_source_batch_stream_and_write_with_the_account(spark, acl, tmp_path):
    ns = acl.namesrv

    def read(**opts):
        r = spark.read.format("rmq").option("namesrv", ns).option("topic", TOPIC)
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()

    assert read(**CREDS).count() == N
    with pytest.raises(Exception, match=f"Check signature failed for accessKey={AK}"):
        read(accessKey=AK, secretKey="not-the-secret").count()

    # write: signed sends to a topic the account may PUB
    (read(**CREDS).select("body").write.format("rmq").option("namesrv", ns).option("topic", OUT_TOPIC)
     .option("accessKey", AK).option("secretKey", SK).mode("append").save())
    with AdminClient(ns, access_key=ADMIN_AK, secret_key=ADMIN_SK) as a:
        wait_until(lambda: sum(q.max_offset for q in a.topic_stats(OUT_TOPIC)) >= N, what="the written rows")

    # streaming, with the group's offsets committed (signed) after the batch
    sdf = (spark.readStream.format("rmq").option("namesrv", ns).option("topic", TOPIC)
           .option("startingOffsets", "earliest").option("consumerGroup", "GroupSparkStream")
           .option("accessKey", AK).option("secretKey", SK).load())
    q = (sdf.select("body").writeStream.format("memory").queryName("acl_stream")
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert spark.sql("select count(*) from acl_stream").collect()[0][0] == N

    def committed():
        try:
            return sum(r.from_offset for r in spark_plugin.offset_ranges(
                ns, TOPIC, group="GroupSparkStream", access_key=AK, secret_key=SK))
        except IllegalArgumentError:  # nothing committed yet
            return -1

    wait_until(lambda: committed() == N, what="the group's offsets")
