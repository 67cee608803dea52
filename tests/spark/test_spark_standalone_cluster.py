"""The "rmq" data source on a real Spark standalone cluster: a master and a worker on 127.0.0.1,
started with pyspark's own bin/spark-class, executors in their own JVMs and Python workers, two
rmq brokers; the JVM reader (when built) on the session through spark.jars, which the executors
load it from.  A streaming query's consumerGroup offsets reach the topic's end while it idles
after the producer stopped, stay there once it is stopped, and an availableNow run commits them."""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.servers import free_port
from tests.spark.conftest import wait_until

pyspark = pytest.importorskip("pyspark")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StandaloneCluster:
    """`spark-class ...deploy.master.Master` + one `...deploy.worker.Worker` (2 cores), on loopback."""

    def __init__(self, tmp_path):
        self.home = os.path.dirname(pyspark.__file__)
        self.env = {**os.environ, "SPARK_HOME": self.home, "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable,
                    "SPARK_WORKER_DIR": str(tmp_path / "work"), "SPARK_LOG_DIR": str(tmp_path / "logs")}
        port = free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self.logs = {n: open(tmp_path / f"{n}.log", "w+") for n in ("master", "worker")}
        self.procs = [self._spark_class("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                        "--port", str(port), "--webui-port", str(free_port()))]
        self.procs.append(self._spark_class("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                            "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()),
                                            self.url))
        wait_until(lambda: "Registering worker" in self.log("master"), timeout=120, interval=0.5,
                   what="the worker registered with the master")

    def _spark_class(self, name, *args):
        return subprocess.Popen([os.path.join(self.home, "bin", "spark-class"), *args], stdout=self.logs[name],
                                stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def log(self, name) -> str:
        f = self.logs[name]
        f.flush()
        with open(f.name) as r:
            return r.read()

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self.logs.values():
            f.close()


DRIVER = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    from pyspark.sql import SparkSession
    import spark_plugin
    from rmq_core import Message, Producer
    from tests.spark.conftest import create_topic, produce, wait_until
    from tests.spark.test_spark_stream_group import group_offsets, stream, topic_end

    master, ns, tmp = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    builder = SparkSession.builder
    if spark_plugin.jar_path():  # the JVM reader: the executors load it from spark.jars
        builder = builder.config("spark.jars", spark_plugin.jar_path())
    spark = (builder.master(master).appName("rmq-standalone")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.executor.memory", "1g")
             .config("spark.sql.streaming.pollingDelay", "100ms").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_plugin.register(spark)
    from spark_plugin.datasource import jvm_reader_loaded
    assert jvm_reader_loaded(spark) == (spark_plugin.jar_path() is not None)

    class Servers:  # what create_topic needs
        namesrv = ns
        broker_addrs = sys.argv[4:]

    topic, group = "StandaloneStream", "SG_STANDALONE"
    create_topic(Servers, topic, queues=2)
    stop = threading.Event()

    def producing():
        with Producer("PG_standalone", namesrv=ns) as p:
            for i in range(800):
                if stop.is_set():
                    break
                p.send(Message(topic, f"s-{i}".encode()))
                time.sleep(0.004)

    t = threading.Thread(target=producing)
    t.start()
    q = stream(spark, ns, topic, group, tmp, "standalone", processingTime="300 milliseconds")
    wait_until(lambda: sum(p["numInputRows"] for p in q.recentProgress) > 0, timeout=120, what="a first batch")
    t.join(60)
    end = topic_end(ns, topic)
    wait_until(lambda: group_offsets(ns, topic, group) == end, timeout=90, what=f"group at {end} while idle")
    q.stop()
    rows = spark.read.parquet(str(tmp / "standalone")).count()
    assert rows == sum(end.values()), (rows, end)
    batch = spark.read.format("rmq").option("namesrv", ns).option("topic", topic).load()
    assert sorted(bytes(r.body) for r in batch.select("body").collect()) == sorted(
        f"s-{i}".encode() for i in range(sum(end.values())))
    produce(ns, topic, 4)
    assert group_offsets(ns, topic, group) == end  # a stopped query moves nothing

    topic2, group2 = "StandaloneNow", "SG_STANDALONE_NOW"
    create_topic(Servers, topic2, queues=2)
    produce(ns, topic2, 25)
    end2 = topic_end(ns, topic2)
    q = stream(spark, ns, topic2, group2, tmp, "standalone-now", availableNow=True)
    assert q.awaitTermination(180) and q.exception() is None
    assert group_offsets(ns, topic2, group2) == end2, (group_offsets(ns, topic2, group2), end2)
    spark.stop()
    print("STANDALONE-OK", sum(end.values()), sum(end2.values()))
""")


@pytest.mark.slow  # (two JVMs of a cluster and an application's: ~40 s; local[2] sessions cover the logic by default)
def test_streaming_group_offsets_on_a_standalone_cluster(servers, tmp_path):
    cluster = StandaloneCluster(tmp_path)
    try:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
        out = subprocess.run([sys.executable, "-c", DRIVER, cluster.url, servers.namesrv, str(tmp_path),
                              *servers.broker_addrs], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0 and "STANDALONE-OK" in out.stdout, (out.stdout[-3000:] + out.stderr[-5000:])
        # the reads ran on the cluster's executor, not in the driver
        assert "Launching executor" in cluster.log("master") or "Asked to launch executor" in cluster.log("worker")
    finally:
        cluster.stop()
