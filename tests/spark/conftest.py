"""A real local Spark session (local[2], on loopback) and real `rmq namesrv` + two `rmq broker`
processes over TCP, shared by the Spark tests (one Spark session per test run keeps them fast)."""
import os
import sys
import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rmq_core.remoting.codes import RequestCode  # noqa: E402
from tests.servers import NamesrvAndBroker  # noqa: E402

# maxMessageSize 1 MiB: under the producer's own 4 MiB limit, so the broker is the one refusing
BROKER_PROPS = {"enablePropertyFilter": "true", "registerNameServerPeriod": "1000", "maxMessageSize": str(1 << 20)}


def wait_until(pred, timeout=30.0, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def spark_session(app="rmq-tests", jar=True, remote=False):
    """A local[2] Spark session on loopback whose Python workers run this interpreter (with rmq
    and this checkout importable), with the "rmq" data source registered: the JVM reader
    (spark.jars) when rmq-spark.jar is built and `jar`, with the Python source as "rmq_python"
    beside it.  remote: a Spark Connect session to a local Connect server (remote("local[2]"))."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # (tests.* in the workers)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession

    import spark_plugin
    builder = SparkSession.builder
    if spark_plugin.jar_path() and jar:
        builder = builder.config("spark.jars", spark_plugin.jar_path())
    builder = builder.remote("local[2]") if remote else builder.master("local[2]")
    session = (builder.appName(app)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.sql.streaming.pollingDelay", "100ms")
               .getOrCreate())
    if not remote:  # (a Connect client has no SparkContext)
        session.sparkContext.setLogLevel("ERROR")
    spark_plugin.register(session)
    return session


@pytest.fixture(scope="session")
def spark():
    session = spark_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def servers(tmp_path_factory):
    cl = NamesrvAndBroker(tmp_path_factory.mktemp("spark-cluster"), brokers=2, broker_props=BROKER_PROPS)
    yield cl
    cl.stop()


def create_topic(servers, topic, queues=2, brokers=None):
    """`topic` with `queues` queues on each broker (all by default), routed by the name server."""
    from tests.rawclient import RawClient

    raw = RawClient("spark-topic")
    try:
        addrs = servers.broker_addrs if brokers is None else [servers.broker_addrs[i] for i in brokers]
        for addr in addrs:
            r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                           {"topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues), "perm": "6"})
            assert r.code == 0, r.remark

        def routed():
            resp = raw.route(servers.namesrv, topic)
            return resp[0].code == 0 and resp[1] is not None and len(resp[1]["queueDatas"]) == len(addrs)

        wait_until(routed, what=f"route of {topic}")
    finally:
        raw.close()


def produce(namesrv, topic, per_queue, body=lambda mq, i: f"{mq.broker_name}-{mq.queue_id}-{i}".encode(),
            tags=lambda i: "TagA" if i % 2 == 0 else "TagB", props=lambda i: {"n": str(i)}):
    """Send `per_queue` messages into each queue of `topic` (in batches); returns {(broker, qid): [bodies]}."""
    from rmq_core import Message, Producer

    sent = {}
    with Producer(f"PG_{topic}", namesrv=namesrv) as p:
        queues = p.fetch_publish_message_queues(topic)
        assert queues, f"no queues of {topic}"
        for mq in queues:
            msgs = [Message(topic, body(mq, i), tags=tags(i), keys=f"k{i}", properties=props(i))
                    for i in range(per_queue)]
            for j in range(0, len(msgs), 200):
                p.send_batch(msgs[j:j + 200], queue=mq)
            sent[(mq.broker_name, mq.queue_id)] = [m.body for m in msgs]
    return sent
