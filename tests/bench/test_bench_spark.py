"""Spark reading a topic: msgs/s into a DataFrame for a query that reads every body
(`sum(length(body))`, `count(*)`), beside Spark reading the same bodies from a Parquet file written
in the same run (the baseline), at 1,000,000 messages of 128 B.

Entries (group spark-read-1M):
* parquet_baseline: spark.read.parquet of the same bodies (written by Spark from the topic).
* arrow_memory_ceiling: a Python data source with the rmq schema whose read() yields the very
  Arrow batches the rmq source builds, from memory-mapped Arrow files: what any Python data
  source with this schema can reach here (PySpark moves every column to the JVM).
* rmq_source: the "rmq" data source as a user gets it (pulls of 1024 messages over TCP from a
  `rmq broker` process, native decode into Arrow columns); extra_info vs_ceiling.
* rmq_source_python_decode: the same source decoding each pull into MessageExt and building the
  Arrow columns from Python lists: what the native column decoder buys.
* rmq_rdd: create_rdd(...).map(len(body)).sum() (MessageExt per message).
* rmq_jvm: format("rmq") with rmq-spark.jar on the session (the columnar JVM reader, only `body`
  decoded; the broker is on this host, so its pulls are local reads: the records copied out of the
  broker's commit-log files); rmq_jvm_over_connection: the same with the broker's
  pullLocalReadEnable=false (every record over TCP, as for executors on other hosts); rmq_jvm_topic_offset: select(topic, queue_offset) through it (no body
  decoded, topic a constant column) against Parquet's same count; rmq_python_narrowed: the Python
  source with option columns=body against its full schema (rmq).
The session has the jar when it was built, so "rmq" is the JVM reader there and the Python source
entries read "rmq_python".

Writing a DataFrame of 200,000 rows (128 B bodies, generated in the JVM, two tasks) into a topic
(groups spark-write-200k: `body` only; spark-write-200k-all-columns: body, tags, keys, properties):
* write_row_baseline: the writer as it was, a DataSourceWriter that gets PySpark's Rows (PySpark
  turns each Arrow batch into Rows) and makes one Message per Row (write.to_message).
* write_arrow: format("rmq")'s writer, a DataSourceArrowWriter making the Messages from whole
  Arrow columns; extra_info vs_write_row_baseline.

Group spark-read-5M (slow-marked; `make bench` runs it): Parquet and the JVM reader (local reads
and over the connection) again over
5,000,000 messages, for how the cost grows with size: each 5M entry reports its seconds per query
and, with the same entry of the 1M group run before it in the same session, the fixed per-query
cost and the cost per further message (from the two sizes).
"""
import contextlib
import os
import time

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from tests.servers import NamesrvAndBroker  # noqa: E402

N = int(os.environ.get("RMQ_BENCH_SPARK_MESSAGES", 1_000_000))
N_LARGE = 5_000_000
QUEUES = 4
TOPIC = "SparkBench"
QUERY = ("sum(length(body)) as bytes", "count(*) as n")
_rates = {}
_seconds = {}  # (entry, messages) -> median seconds per query
_broker_of = {}  # name server -> its broker's address


def _topic_env(tmp, n):
    """A broker holding `n` messages of 128 B on TOPIC and a Spark session; yields (spark,
    name server, Parquet file of the same bodies, tmp)."""
    from rmq_core import Message, Producer
    from rmq_core.store import disk_usage_ratio
    from tests.spark.conftest import create_topic, spark_session

    # the store's default consume-queue file size (the test harness's small files would end a pull
    # every 6000 entries)
    cl = NamesrvAndBroker(tmp, brokers=1, broker_props={"registerNameServerPeriod": "1000",
                                                         "mappedFileSizeCommitLog": str(1024 * 1024 * 1024),
                                                         "mappedFileSizeConsumeQueue": str(300_000 * 20)})
    spark = spark_session("rmq-bench")
    try:
        create_topic(cl, TOPIC, queues=QUEUES)
        rnd = os.urandom(1 << 16)
        began = time.monotonic()
        with Producer("PG_spark_bench", namesrv=cl.namesrv) as p:
            queues = p.fetch_publish_message_queues(TOPIC)
            for start in range(0, n, 500):
                batch = [Message(TOPIC, b"%08d" % i + rnd[(i * 7) % 60000:(i * 7) % 60000 + 120])
                         for i in range(start, min(n, start + 500))]
                p.send_batch(batch, queue=queues[(start // 500) % len(queues)])
                if (start + 500) % 1_000_000 == 0:
                    print(f"{start + 500:,} of {n:,} messages sent ({time.monotonic() - began:.0f} s)", flush=True)
        ns = cl.namesrv
        _broker_of[ns] = cl.broker_addrs[0]
        # the broker builds its consume queues behind the commit log: wait until every message is
        # listed (a count of the whole topic is answered from the queues' offsets)
        deadline = time.monotonic() + 180
        while (listed := rmq(spark, ns, "rmq").count()) != n:
            assert time.monotonic() < deadline, (
                f"{listed} of {n} messages listed after 180 s (the disk holding the store is "
                f"{disk_usage_ratio(str(tmp)):.1%} used, reserved blocks counted as used)")
            time.sleep(0.5)
        print(f"{n:,} messages listed ({time.monotonic() - began:.0f} s)", flush=True)
        parquet = str(tmp / "bodies.parquet")
        # written by the JVM reader when the jar is built (the Python source takes minutes at 5M)
        rmq(spark, ns, "rmq").select("body", "topic", "queue_offset").write.parquet(parquet)
        yield spark, ns, parquet
    finally:
        spark.stop()
        cl.stop()


@pytest.fixture(scope="module")
def bench_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spark-bench")
    env = _topic_env(tmp, N)
    spark, ns, parquet = next(env)
    try:
        arrow_dir = tmp / "arrow"
        arrow_dir.mkdir()
        files = _arrow_files(ns, arrow_dir)
        # the comparison sources live in this test module, which Spark's workers cannot import by name
        import sys

        from pyspark import cloudpickle
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        spark.dataSource.register(ArrowMemorySource)
        spark.dataSource.register(PythonDecodeSource)
        yield spark, ns, parquet, files
    finally:
        env.close()


def rmq(spark, ns, fmt="rmq_python", **options):
    return spark.read.format(fmt).option("namesrv", ns).option("topic", TOPIC).options(**options).load()


def _arrow_files(ns, directory):
    """The rmq source's own batches of every queue, in Arrow IPC files (one per queue)."""
    from spark_plugin.arrow import ARROW_SCHEMA, read_batches
    from spark_plugin.rdd import plan_reads

    reads, _ = plan_reads(ns, TOPIC)
    files = []
    for r in reads:
        path = str(directory / f"{r.broker_name}-{r.queue_id}.arrow")
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, ARROW_SCHEMA) as w:
            for b in read_batches(r):
                w.write_batch(b)
        files.append(path)
    return files


# --- the comparison sources ----------------------------------------------------------------------
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402

from pyspark.sql.datasource import DataSourceWriter  # noqa: E402

from spark_plugin.datasource import RmqBatchReader, RmqCommitMessage, RmqDataSource, RmqWriter  # noqa: E402


class ArrowMemorySource(DataSource):
    """Yields stored Arrow batches of the rmq schema (option files: comma-separated paths)."""

    @classmethod
    def name(cls):
        return "rmq_arrow_memory"

    def schema(self):
        from spark_plugin.arrow import SCHEMA_DDL
        return SCHEMA_DDL

    def reader(self, schema):
        return _MemoryReader(self.options["files"].split(","))


class _MemoryReader(DataSourceReader):
    def __init__(self, files):
        self.files = files

    def partitions(self):
        return [InputPartition(f) for f in self.files]

    def read(self, partition):
        import pyarrow as pa
        reader = pa.ipc.open_file(pa.memory_map(partition.value))
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


class PythonDecodeSource(RmqDataSource):
    @classmethod
    def name(cls):
        return "rmq_python_decode"

    def reader(self, schema):
        return _PythonDecodeReader(self.options)


class _PythonDecodeReader(RmqBatchReader):
    """Every column decoded in Python, properties included (read with includeProperties=true)."""

    def read(self, partition):
        import pyarrow as pa

        from spark_plugin.arrow import ARROW_SCHEMA, SYSTEM_PROPERTIES
        from spark_plugin.pull import pull_range
        system = frozenset(SYSTEM_PROPERTIES)
        ts = pa.timestamp("us", tz="UTC")
        for result, _ in pull_range(partition.value, decode=True):
            ms = result.messages
            if not ms:
                continue
            yield pa.RecordBatch.from_arrays([
                pa.array([m.topic for m in ms], pa.string()), pa.array([m.broker_name for m in ms], pa.string()),
                pa.array([m.queue_id for m in ms], pa.int32()), pa.array([m.queue_offset for m in ms], pa.int64()),
                pa.array([m.msg_id for m in ms], pa.string()), pa.array([m.tags for m in ms], pa.string()),
                pa.array([m.keys for m in ms], pa.string()), pa.array([m.body for m in ms], pa.binary()),
                pa.array([[kv for kv in m.properties.items() if kv[0] not in system] for m in ms],
                         ARROW_SCHEMA.field("properties").type),
                pa.array([m.born_timestamp * 1000 for m in ms], pa.int64()).cast(ts),
                pa.array([m.store_timestamp * 1000 for m in ms], pa.int64()).cast(ts),
                pa.array([m.reconsume_times for m in ms], pa.int32()),
            ], schema=ARROW_SCHEMA)


class RowWriterSource(RmqDataSource):
    @classmethod
    def name(cls):
        return "rmq_row_writer"

    def writer(self, schema, overwrite):
        return _RowWriter(self.options, schema)


class _RowWriter(DataSourceWriter):
    def __init__(self, options, schema):
        self.sink = RmqWriter(options, schema)  # its options and checks

    def write(self, rows):
        from spark_plugin.write import send_all, to_message
        s = self.sink
        return RmqCommitMessage(send_all(s.namesrv, s.topic, (to_message(s.topic, r) for r in rows), s.account))


# --- the benchmarks ----------------------------------------------------------------------------------
def _run(benchmark, name, fn, rounds=3, vs="parquet", n=N):
    def once():
        row = fn()
        assert row["n"] == n, row
        return row

    once()  # warm-up: JVM code paths, Python workers
    row = benchmark.pedantic(once, rounds=rounds, iterations=1)
    seconds = benchmark.stats.stats.median
    rate = n / seconds
    benchmark.extra_info["records_per_s"] = rate
    _rates[name] = rate
    _seconds[name.removesuffix("_5m"), n] = seconds
    small = _seconds.get((name.removesuffix("_5m"), N))
    if n != N and small is not None:
        # two sizes, one line: seconds = fixed + messages * per_message
        per_message = (seconds - small) / (n - N)
        benchmark.extra_info["us_per_further_message"] = per_message * 1e6
        benchmark.extra_info["fixed_s_per_query"] = small - N * per_message
    if vs in _rates and vs != name and not name.startswith("parquet"):
        benchmark.extra_info[f"vs_{vs}"] = rate / _rates[vs]
    if "ceiling" in _rates and name not in ("parquet", "ceiling") and not name.startswith("write") and n == N:
        benchmark.extra_info["vs_ceiling"] = rate / _rates["ceiling"]
    print(f"\n{name}: {rate / 1e6:.2f} M msgs/s" + "".join(f", {k} {v:.2f}x" for k, v in benchmark.extra_info.items()
                                                      if k.startswith("vs_")))
    return row


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_parquet_baseline(benchmark, bench_env):
    spark, ns, parquet, files = bench_env
    _run(benchmark, "parquet", lambda: spark.read.parquet(parquet).selectExpr(*QUERY).collect()[0])


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_parquet_topic_offset(benchmark, bench_env):
    spark, ns, parquet, files = bench_env
    _run(benchmark, "parquet_topic_offset",
         lambda: spark.read.parquet(parquet).selectExpr("count(topic) as n", "max(queue_offset) as m").collect()[0])


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_rmq_jvm(benchmark, bench_env):
    import spark_plugin
    spark, ns, parquet, files = bench_env
    if spark_plugin.jar_path() is None:
        pytest.skip("rmq-spark.jar not built (no JDK at build time)")
    row = _run(benchmark, "jvm", lambda: rmq(spark, ns, "rmq").selectExpr(*QUERY).collect()[0])
    assert row["bytes"] == 128 * N


@contextlib.contextmanager
def _over_connection(ns):
    """The broker's pulls over the connection only (pullLocalReadEnable=false, a runtime key)."""
    from rmq_core.admin import AdminClient
    with AdminClient(ns) as admin:
        admin.update_broker_config(_broker_of[ns], {"pullLocalReadEnable": "false"})
        try:
            yield
        finally:
            admin.update_broker_config(_broker_of[ns], {"pullLocalReadEnable": "true"})


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_rmq_jvm_over_connection(benchmark, bench_env):
    import spark_plugin
    spark, ns, parquet, files = bench_env
    if spark_plugin.jar_path() is None:
        pytest.skip("rmq-spark.jar not built (no JDK at build time)")
    with _over_connection(ns):
        row = _run(benchmark, "jvm_over_connection", lambda: rmq(spark, ns, "rmq").selectExpr(*QUERY).collect()[0])
    assert row["bytes"] == 128 * N


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_rmq_jvm_topic_offset(benchmark, bench_env):
    import spark_plugin
    spark, ns, parquet, files = bench_env
    if spark_plugin.jar_path() is None:
        pytest.skip("rmq-spark.jar not built (no JDK at build time)")
    _run(benchmark, "jvm_topic_offset",
         lambda: rmq(spark, ns, "rmq").selectExpr("count(topic) as n", "max(queue_offset) as m").collect()[0],
         vs="parquet_topic_offset")


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_arrow_memory_ceiling(benchmark, bench_env):
    spark, ns, parquet, files = bench_env
    df = lambda: spark.read.format("rmq_arrow_memory").option("files", ",".join(files)).load()  # noqa: E731
    _run(benchmark, "ceiling", lambda: df().selectExpr(*QUERY).collect()[0])


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_rmq_source(benchmark, bench_env):
    spark, ns, parquet, files = bench_env
    row = _run(benchmark, "rmq", lambda: rmq(spark, ns).selectExpr(*QUERY).collect()[0])
    assert row["bytes"] == 128 * N


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_rmq_source_narrowed(benchmark, bench_env):
    spark, ns, parquet, files = bench_env
    df = lambda: spark.read.format("rmq_python").option("namesrv", ns).option("topic", TOPIC) \
        .option("columns", "body").load()  # noqa: E731
    _run(benchmark, "python_narrowed", lambda: df().selectExpr(*QUERY).collect()[0])


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_rmq_source_python_decode(benchmark, bench_env):
    spark, ns, parquet, files = bench_env
    _run(benchmark, "python_decode", lambda: rmq(spark, ns, "rmq_python_decode", includeProperties="true").selectExpr(*QUERY).collect()[0],
         rounds=2)


@pytest.mark.benchmark(group="spark-read-1M")
def test_spark_rmq_rdd(benchmark, bench_env):
    import spark_plugin
    spark, ns, parquet, files = bench_env
    sc = spark.sparkContext

    def run():
        rdd = spark_plugin.create_rdd(sc, ns, TOPIC)
        lengths = rdd.map(lambda m: len(m.body))
        return {"n": lengths.count(), "bytes": None}

    _run(benchmark, "rdd", run, rounds=2)


# --- writes ----------------------------------------------------------------------------------------------
WRITE_N = int(os.environ.get("RMQ_BENCH_SPARK_WRITE_ROWS", 200_000))
WRITE_TOPIC = "SparkWriteBench"
ALL_COLUMNS = ("body", "concat('Tag', id % 4) as tags", "concat('k', id % 1000) as keys",
               "map('n', cast(id as string), 'src', 'bench') as properties")


@pytest.fixture(scope="module")
def write_env(tmp_path_factory):
    import sys

    from pyspark import cloudpickle

    from tests.spark.conftest import create_topic, spark_session

    cl = NamesrvAndBroker(tmp_path_factory.mktemp("spark-write-bench"), brokers=1,
                          broker_props={"registerNameServerPeriod": "1000"})
    spark = spark_session("rmq-bench")
    try:
        create_topic(cl, WRITE_TOPIC, queues=QUEUES)
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        spark.dataSource.register(RowWriterSource)
        # bodies of 128 B made in the JVM (8 digits and 120 bytes of filler), in two tasks
        rows = spark.range(0, WRITE_N, numPartitions=2).selectExpr(
            "id", "cast(concat(lpad(cast(id as string), 8, '0'), repeat('x', 120)) as binary) as body")
        yield spark, cl.namesrv, rows
    finally:
        spark.stop()
        cl.stop()


def _topic_size(ns) -> int:
    from spark_plugin.offsets import QueueAdmin
    with QueueAdmin(ns) as admin:
        queues, _ = admin.queues(WRITE_TOPIC)
        return sum(admin.max_offset(mq) for mq in queues)


def _write(benchmark, write_env, fmt, columns, group_name):
    spark, ns, rows = write_env
    df = rows.selectExpr(*columns)

    def once():
        before = _topic_size(ns)
        df.write.format(fmt).option("namesrv", ns).option("topic", WRITE_TOPIC).mode("append").save()
        return {"n": _topic_size(ns) - before}

    _run(benchmark, group_name, once, vs=group_name.replace("write_arrow", "write_row_baseline"), n=WRITE_N)


@pytest.mark.benchmark(group="spark-write-200k")
def test_spark_write_row_baseline(benchmark, write_env):
    _write(benchmark, write_env, "rmq_row_writer", ("body",), "write_row_baseline")


@pytest.mark.benchmark(group="spark-write-200k")
def test_spark_write_arrow(benchmark, write_env):
    _write(benchmark, write_env, "rmq", ("body",), "write_arrow")


@pytest.mark.benchmark(group="spark-write-200k-all-columns")
def test_spark_write_all_columns_row_baseline(benchmark, write_env):
    _write(benchmark, write_env, "rmq_row_writer", ALL_COLUMNS, "write_row_baseline_all_columns")


@pytest.mark.benchmark(group="spark-write-200k-all-columns")
def test_spark_write_all_columns_arrow(benchmark, write_env):
    _write(benchmark, write_env, "rmq", ALL_COLUMNS, "write_arrow_all_columns")

# --- 5,000,000 messages: how the cost grows with size -------------------------------------------------
@pytest.fixture(scope="module")
def bench_env_5m(tmp_path_factory):
    import spark_plugin
    if spark_plugin.jar_path() is None:
        pytest.skip("rmq-spark.jar not built (no JDK at build time)")
    env = _topic_env(tmp_path_factory.mktemp("spark-bench-5m"), N_LARGE)
    try:
        yield next(env)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # (its module's fixture sends and lists 5,000,000 messages first)
@pytest.mark.benchmark(group="spark-read-5M")
def test_spark_parquet_baseline_5m(benchmark, bench_env_5m):
    spark, ns, parquet = bench_env_5m
    _run(benchmark, "parquet_5m", lambda: spark.read.parquet(parquet).selectExpr(*QUERY).collect()[0], n=N_LARGE)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # (its module's fixture sends and lists 5,000,000 messages first)
@pytest.mark.benchmark(group="spark-read-5M")
def test_spark_parquet_topic_offset_5m(benchmark, bench_env_5m):
    spark, ns, parquet = bench_env_5m
    _run(benchmark, "parquet_topic_offset_5m",
         lambda: spark.read.parquet(parquet).selectExpr("count(topic) as n", "max(queue_offset) as m").collect()[0],
         n=N_LARGE)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # (its module's fixture sends and lists 5,000,000 messages first)
@pytest.mark.benchmark(group="spark-read-5M")
def test_spark_rmq_jvm_5m(benchmark, bench_env_5m):
    spark, ns, parquet = bench_env_5m
    row = _run(benchmark, "jvm_5m", lambda: rmq(spark, ns, "rmq").selectExpr(*QUERY).collect()[0],
               vs="parquet_5m", n=N_LARGE)
    assert row["bytes"] == 128 * N_LARGE


@pytest.mark.slow
@pytest.mark.timeout(1200)  # (its module's fixture sends and lists 5,000,000 messages first)
@pytest.mark.benchmark(group="spark-read-5M")
def test_spark_rmq_jvm_over_connection_5m(benchmark, bench_env_5m):
    spark, ns, parquet = bench_env_5m
    with _over_connection(ns):
        row = _run(benchmark, "jvm_over_connection_5m", lambda: rmq(spark, ns, "rmq").selectExpr(*QUERY).collect()[0],
                   vs="parquet_5m", n=N_LARGE)
    assert row["bytes"] == 128 * N_LARGE


@pytest.mark.slow
@pytest.mark.timeout(1200)  # (its module's fixture sends and lists 5,000,000 messages first)
@pytest.mark.benchmark(group="spark-read-5M")
def test_spark_rmq_jvm_topic_offset_5m(benchmark, bench_env_5m):
    spark, ns, parquet = bench_env_5m
    _run(benchmark, "jvm_topic_offset_5m",
         lambda: rmq(spark, ns, "rmq").selectExpr("count(topic) as n", "max(queue_offset) as m").collect()[0],
         vs="parquet_topic_offset_5m", n=N_LARGE)
