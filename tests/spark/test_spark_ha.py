"""Spark reading a topic whose master is gone: a master and its slave (`rmq broker` each), the
master SIGKILLed; the RDD and the data source read every message from the slave - whether the
job was planned before the kill (executors find the master unreachable) or after it (the route
has only the slave)."""
import pytest

import spark_plugin
from tests.broker.ha_cluster import TOPIC, kill_master, running_group
from tests.broker.ha_group import wait_replicated
from tests.spark.conftest import produce


@pytest.fixture
def replicated(tmp_path):
    with running_group(tmp_path) as (g, raw):
        sent = produce(g.namesrv, TOPIC, 50)
        wait_replicated(g.master_store, g.slave_store)
        yield g, raw, sent


def test_rdds_and_data_source_read_everything_from_the_slave(spark, replicated):
    g, raw, sent = replicated
    planned_before = spark_plugin.create_rdd(spark.sparkContext, g.namesrv, TOPIC)  # partitions name the master
    kill_master(g, raw)
    got = planned_before.map(lambda m: ((m.broker_name, m.queue_id), m.body)).groupByKey().mapValues(list).collect()
    assert {k: sorted(v) for k, v in got} == {k: sorted(v) for k, v in sent.items()}

    # planned with only the slave in the route
    planned_after = spark_plugin.create_rdd(spark.sparkContext, g.namesrv, TOPIC)
    assert sorted(planned_after.map(lambda m: m.body).collect()) == sorted(b for v in sent.values() for b in v)
    df = spark.read.format("rmq").option("namesrv", g.namesrv).option("topic", TOPIC).load()
    assert sorted(bytes(r.body) for r in df.select("body").collect()) == sorted(b for v in sent.values() for b in v)
