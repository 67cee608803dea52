"""format("rmq") without the JVM reader: in a local[2] session without rmq-spark.jar and in a Spark
Connect session (whose client has no JVM), `register` makes "rmq" the Python source, which reads
the same schema and rows as the JVM reader of this process's session.  Each runs in a subprocess
(tests/spark/fallback_read.py): every session of one process shares one JVM, and this one has the jar."""
import json
import os
import subprocess
import sys

import pytest

import spark_plugin
from tests.spark.conftest import create_topic, produce
from tests.spark.fallback_read import read_all

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPIC = "FallbackTopic"
READS = [
    {"options": {}},
    {"options": {"includeProperties": "true", "endingOffsets": json.dumps({"broker-a": {"0": 7}})},
     "filter": "tags = 'TagA'"},
    {"options": {"columns": "queue_offset, properties, body", "expression": "TagB"}},
]


@pytest.fixture(scope="module")
def topic(servers):
    create_topic(servers, TOPIC, queues=2)
    produce(servers.namesrv, TOPIC, 15)
    return TOPIC


def assert_reads_as_this_session(spark, servers, session_module, *flags):
    """Run the reads in a subprocess (`flags` for fallback_read) while this session makes them too
    (the JVM reader, with the jar), and compare."""
    child = subprocess.Popen([sys.executable, "-m", "tests.spark.fallback_read", servers.namesrv, TOPIC,
                              json.dumps(READS), *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        here = read_all(spark, servers.namesrv, TOPIC, READS)
        out, err = child.communicate(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err[-5000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["session"], result["jvm_reader"]) == (session_module, False)
    assert [r["schema"] for r in result["reads"]] == [r["schema"] for r in here]
    assert "properties" not in here[0]["schema"] and "properties" in here[1]["schema"]
    for got, want in zip(result["reads"], here):
        assert got["rows"] == want["rows"] and want["rows"]
    assert len(here[0]["rows"]) == 4 * 15


@pytest.mark.slow  # a second Spark JVM and its Python workers: 24-62 s on 2 shared cores
@pytest.mark.skipif(spark_plugin.jar_path() is None, reason="rmq-spark.jar not built: every session reads in Python")
def test_a_session_without_the_jar_reads_rmq_through_the_python_source(spark, servers, topic):
    from spark_plugin.datasource import jvm_reader_loaded
    assert jvm_reader_loaded(spark)  # this process's session: "rmq" is the JVM reader
    assert_reads_as_this_session(spark, servers, "pyspark.sql.session")


@pytest.mark.slow  # a local Connect server in a second JVM: 49-81 s
def test_spark_connect_reads_rmq_through_the_python_source(spark, servers, topic):
    """Over Spark Connect (the extra spark-connect) register() sends the Python source to the server
    (spark.dataSource.register) and "rmq" is the Python source there."""
    assert_reads_as_this_session(spark, servers, "pyspark.sql.connect.session", "--connect")
