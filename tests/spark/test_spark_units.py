"""spark_plugin without a Spark session: the native column decoder against decode_messages, the
light imports, one connection per broker per process, offsets JSON, the per-batch split."""
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from rmq_core import Message
from rmq_core.errors import IllegalArgumentError
from spark_plugin.offsets import EARLIEST, LATEST, parse_positions, positions_to_json, split_by_backlog


def _records(msgs, compress_over=None):
    """A pull body: the records a broker stores for `msgs` (encoded by the store's own encoder)."""
    import tempfile

    import rmq_core
    from rmq_core import Producer

    with tempfile.TemporaryDirectory() as d, rmq_core.standalone(store=d) as c:
        opts = {} if compress_over is None else {"compress_msg_body_over_howmuch": compress_over}
        with Producer("PG_units", namesrv=c.namesrv, **opts) as p:
            mq = p.fetch_publish_message_queues(msgs[0].topic)[0]
            for m in msgs:
                p.send(m, queue=mq)
        store = c.broker.store
        return store.get_message("g", mq.topic, mq.queue_id, 0, len(msgs), max_transfer_count=len(msgs),
                                 max_total_bytes=1 << 24).buffer


def test_decode_columns_agrees_with_decode_messages():
    pa = pytest.importorskip("pyarrow")
    from rmq_core.codec import decode_messages
    from spark_plugin.arrow import ARROW_SCHEMA, SYSTEM_PROPERTIES, record_batch

    msgs = [Message("UnitTopic", b"b%d" % i * (i + 1), tags=("T%d" % (i % 3)) if i % 4 else None,
                    keys=("k%d" % i) if i % 5 else None, properties={"n": str(i), "ü": "é"}) for i in range(40)]
    msgs.append(Message("UnitTopic", b"z" * 10000, tags="Big"))  # compressed by the producer
    body = _records(msgs, compress_over=4096)
    want = decode_messages(body, broker_name="broker-x")
    batch = record_batch(body, "broker-x")
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert len(rows) == len(want) == len(msgs)
    for row, m in zip(rows, want):
        assert (row["topic"], row["broker_name"], row["queue_id"], row["queue_offset"], row["msg_id"], row["tags"],
                row["keys"], row["body"], row["reconsume_times"]) == \
            (m.topic, "broker-x", m.queue_id, m.queue_offset, m.msg_id, m.tags, m.keys, m.body, m.reconsume_times)
        assert dict(row["properties"]) == {k: v for k, v in m.properties.items() if k not in SYSTEM_PROPERTIES}
        assert int(row["born_timestamp"].timestamp() * 1000) == m.born_timestamp
        assert int(row["store_timestamp"].timestamp() * 1000) == m.store_timestamp
    assert dict(rows[3]["properties"]) == {"n": "3", "ü": "é"}  # the user's properties only
    # until_offset leaves out the records at or past it; tags_set keeps exact matches only
    assert record_batch(body, "b", until_offset=10).column("queue_offset").to_pylist() == list(range(10))
    assert set(record_batch(body, "b", tags_set={"T1"}).column("tags").to_pylist()) == {"T1"}
    with pytest.raises(ValueError, match="magic code"):
        record_batch(b"\x00\x00\x00\x80" + b"\x00" * 124, "b")
    # a narrowed read decodes its columns only (the column mask): the same values, in its order
    narrow = record_batch(body, "broker-x", columns=("body", "queue_offset"))
    assert narrow.schema.names == ["body", "queue_offset"]
    assert narrow.to_pylist() == [{"body": r["body"], "queue_offset": r["queue_offset"]} for r in rows]
    from rmq_core._native.record_columns import COL_QUEUE_OFFSET, decode_columns
    c = decode_columns(body, "b", -1, SYSTEM_PROPERTIES, COL_QUEUE_OFFSET)
    assert c["rows"] == len(msgs) and c["body"][1] == b"\x00\x00\x00\x00"  # no body decoded (nor inflated)


def test_importing_rmq_core_and_spark_plugin_leaves_pyspark_alone():
    code = ("import sys, rmq_core, rmq_core.client.pull_consumer, spark_plugin, spark_plugin.rdd; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyarrow', 'py4j')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_partitions_of_one_process_share_one_connection_per_broker(servers):
    from spark_plugin.arrow import read_batches
    from spark_plugin.offsets import QueueAdmin
    from spark_plugin.pull import QueueRead, channel_pool, read_messages
    from tests.spark.conftest import create_topic, produce

    create_topic(servers, "ConnTopic", queues=3)
    produce(servers.namesrv, "ConnTopic", 50)
    with QueueAdmin(servers.namesrv) as admin:
        queues, addrs = admin.queues("ConnTopic")
    parts = [QueueRead("ConnTopic", mq.broker_name, mq.queue_id, 0, 50, tuple(addrs[mq.broker_name].items()))
             for mq in queues]
    assert len(parts) == 6
    assert sum(len(list(read_messages(p))) for p in parts) == 300
    assert sum(b.num_rows for p in parts for b in read_batches(p)) == 300
    pool = channel_pool()
    assert [pool.open_count(addrs[b][0]) for b in ("broker-a", "broker-b")] == [1, 1]


def test_positions_json():
    assert parse_positions("earliest") == EARLIEST and parse_positions(" latest ") == LATEST
    table = parse_positions('{"broker-a": {"0": 23, "1": -2}, "broker-b": {"0": -1}}')
    assert table == {("broker-a", 0): 23, ("broker-a", 1): -2, ("broker-b", 0): -1}
    assert parse_positions(positions_to_json(table)) == table
    for bad, msg in [("{", "malformed startingOffsets '\\{'"), ('{"a": 1}', "broker 'a' maps to 1"),
                     ('{"a": {"x": 1}}', "queue id 'x'"), ('{"a": {"0": -3}}', "offset -3 of a:0"),
                     ('[1]', "expected a JSON object")]:
        with pytest.raises(IllegalArgumentError, match=msg):
            parse_positions(bad)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.tuples(st.sampled_from("ab"), st.integers(0, 7)), st.integers(0, 10_000), max_size=12),
       st.integers(1, 5000))
def test_split_by_backlog_never_exceeds_the_limit_or_a_backlog(backlog, limit):
    shares = split_by_backlog(backlog, limit)
    assert shares.keys() == backlog.keys()
    assert all(0 <= shares[k] <= backlog[k] for k in backlog)
    assert sum(shares.values()) == min(limit, sum(backlog.values()))


def test_the_jar_is_built_wherever_a_jdk_is():
    """The JVM tests skip without rmq-spark.jar; on a machine with javac (every `make` set-up
    installs one) a missing jar is a broken build, not a reason to skip."""
    import shutil

    import spark_plugin

    if shutil.which("javac") is None:
        pytest.skip("no javac on this machine: the jar cannot be built here")
    assert spark_plugin.jar_path() is not None, "javac is here but spark_plugin/jvm/rmq-spark.jar was not built"
