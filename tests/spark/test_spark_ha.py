"""Spark reading a topic whose master is gone: a master and its slave (`rmq broker` each), the
master SIGKILLed; the RDD and the data source read every message from the slave - whether the
job was planned before the kill (executors find the master unreachable) or after it (the route
has only the slave)."""
import pytest

import spark_plugin
from tests.broker.ha_group import HAGroup, wait_replicated
from tests.broker.test_ha_failover import create_topic
from tests.client.conftest import wait_until
from tests.rawclient import RawClient
from tests.spark.conftest import produce

TOPIC = "HaFailoverTopic"


@pytest.fixture
def replicated(tmp_path):
    g = HAGroup(tmp_path)
    raw = RawClient()
    try:
        g.start_master()
        g.start_slave()
        create_topic(raw, g.master_addr)
        sent = produce(g.namesrv, TOPIC, 50)
        wait_replicated(g.master_store, g.slave_store)
        yield g, raw, sent
    finally:
        raw.close()
        g.stop()


def _kill_master(g, raw):
    g.master.kill()
    wait_until(lambda: len(raw.route(g.namesrv, TOPIC)[1]["brokerDatas"][0]["brokerAddrs"]) == 1, 30,
               what="the name server dropping the master")


def test_rdd_planned_before_the_kill_reads_from_the_slave(spark, replicated):
    g, raw, sent = replicated
    rdd = spark_plugin.create_rdd(spark.sparkContext, g.namesrv, TOPIC)  # partitions name the master
    _kill_master(g, raw)
    got = rdd.map(lambda m: ((m.broker_name, m.queue_id), m.body)).groupByKey().mapValues(list).collect()
    assert {k: sorted(v) for k, v in got} == {k: sorted(v) for k, v in sent.items()}


def test_rdd_and_data_source_with_only_the_slave_in_the_route(spark, replicated):
    g, raw, sent = replicated
    _kill_master(g, raw)
    rdd = spark_plugin.create_rdd(spark.sparkContext, g.namesrv, TOPIC)
    assert rdd.count() == sum(len(v) for v in sent.values())
    df = spark.read.format("rmq").option("namesrv", g.namesrv).option("topic", TOPIC).load()
    assert sorted(bytes(r.body) for r in df.select("body").collect()) == sorted(b for v in sent.values() for b in v)
