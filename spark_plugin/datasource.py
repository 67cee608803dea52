"""The "rmq" Spark Python data source: batch read, streaming read, write.

    spark_plugin.register(spark)
    spark.read.format("rmq").option("namesrv", ns).option("topic", "TopicA").load()
    spark.readStream.format("rmq").option("namesrv", ns).option("topic", "TopicA").load()
    df.write.format("rmq").option("namesrv", ns).option("topic", "TopicB").mode("append").save()

Planning (options, routes, offsets) happens in Spark's planner process on the driver, so bad input
fails there with one error naming the value; executors only pull their partition (pull.py) and
decode it into Arrow record batches (arrow.py).  Streaming offsets are {"broker": {"queue id":
offset}}; with `consumerGroup`, each committed micro-batch's end offsets are also written as that
group's broker-side consumer offsets.
"""
from __future__ import annotations

import logging

import attrs
from pyspark.sql.datasource import (
    DataSource, DataSourceArrowWriter, DataSourceReader, DataSourceStreamReader, InputPartition, WriterCommitMessage,
)

try:  # filter pushdown came with PySpark 4.1
    from pyspark.sql.datasource import EqualTo, In
except ImportError:  # pragma: no cover - PySpark 4.0
    EqualTo = In = ()
try:  # without it Spark wraps the source for availableNow and never asks it again after the last batch
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - PySpark 4.0
    SupportsTriggerAvailableNow = object

from rmq_core.errors import IllegalArgumentError, MQClientError
from rmq_core.message import MessageQueue

from spark_plugin.arrow import COLUMNS, DEFAULT_COLUMNS, SCHEMA_DDL
from spark_plugin.offsets import (
    EARLIEST, Account, LATEST, QueueAdmin, check_data_loss, parse_positions, positions_from_json, positions_to_json,
    split_by_backlog,
)
from spark_plugin.pull import QueueRead, subscription_of
from spark_plugin.rdd import check_namesrv, plan_reads

log = logging.getLogger("rmq.spark")

_OPTIONS = {"namesrv", "topic", "expression", "expressiontype", "startingoffsets", "endingoffsets",
            "startingtimestamp", "failondataloss", "maxrecordsperbatch", "consumergroup", "accesskey", "secretkey",
            "columns", "maxrecordsperpartition", "includeproperties"}
# Spark's type names of the fixed schema's columns (a user schema must keep them)
_SPARK_TYPES = {"topic": "string", "broker_name": "string", "queue_id": "int", "queue_offset": "bigint",
                "msg_id": "string", "tags": "string", "keys": "string", "body": "binary",
                "properties": "map<string,string>", "born_timestamp": "timestamp", "store_timestamp": "timestamp",
                "reconsume_times": "int"}
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000


def flag(opts: dict, name: str, default: bool) -> bool:
    """The true/false option `name` of `opts` (keys lower-cased); another value is refused naming it."""
    text = opts.get(name.lower())
    if text is None:
        return default
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise IllegalArgumentError(f"bad {name} {text!r}: expected true or false")
    return value == "true"


def read_columns(options) -> tuple:
    """The columns of a read without a user schema: option `columns` ("body, queue_offset"), else
    every column, `properties` only with includeProperties=true."""
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    include = flag(opts, "includeProperties", False)
    text = opts.get("columns")
    if text is None:
        return COLUMNS if include else DEFAULT_COLUMNS
    return tuple(c.strip() for c in str(text).split(","))


def columns_of(schema) -> tuple:
    """The columns a read decodes: the fields of the schema Spark reads with (the fixed one, option
    `columns`' or the user's), each a column of the fixed schema with its type."""
    out = []
    for f in schema.fields:
        t = f.dataType.simpleString()
        if _SPARK_TYPES.get(f.name) != t:
            raise IllegalArgumentError(f"bad schema: column '{f.name} {t}' is not a column of the rmq source "
                                       f"({SCHEMA_DDL})")
        out.append(f.name)
    return tuple(out)


class ReadOptions:
    """The read options, checked at once (each bad one named with its value)."""

    def __init__(self, options, streaming: bool):
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        unknown = sorted(set(opts) - _OPTIONS - {"path"})
        if unknown:
            raise IllegalArgumentError(f"unknown option(s) of the rmq source: {unknown} (known: {sorted(_OPTIONS)})")
        self.namesrv = check_namesrv(opts.get("namesrv"))
        self.topic = opts.get("topic")
        if not self.topic:
            raise IllegalArgumentError("the rmq source needs option 'topic'")
        self.expression_type = (opts.get("expressiontype") or "TAG").upper()
        self.expression = opts.get("expression") or "*"
        subscription_of(self.topic, self.expression, self.expression_type)
        self.starting = parse_positions(opts.get("startingoffsets"), "startingOffsets")
        self.ending = parse_positions(opts.get("endingoffsets"), "endingOffsets")
        if streaming and self.ending is not None:
            raise IllegalArgumentError("endingOffsets is a batch option; a streaming query reads on")
        ts = opts.get("startingtimestamp")
        self.starting_timestamp = None
        if ts is not None:
            try:
                self.starting_timestamp = int(ts)
                if self.starting_timestamp < 0:
                    raise ValueError
            except ValueError:
                raise IllegalArgumentError(f"bad startingTimestamp {ts!r}: expected epoch milliseconds >= 0") from None
            if self.starting is not None:
                raise IllegalArgumentError("give startingOffsets or startingTimestamp, not both")
        self.fail_on_data_loss = flag(opts, "failOnDataLoss", True)
        flag(opts, "includeProperties", False)  # (it shapes the schema; checked here too under a user schema)
        mr = opts.get("maxrecordsperbatch")
        self.max_records_per_batch = None
        if mr is not None:
            try:
                self.max_records_per_batch = int(mr)
                if self.max_records_per_batch <= 0:
                    raise ValueError
            except ValueError:
                raise IllegalArgumentError(f"bad maxRecordsPerBatch {mr!r}: expected an integer > 0") from None
        self.consumer_group = opts.get("consumergroup")
        self.account = Account.of(opts.get("accesskey"), opts.get("secretkey"))
        mp = opts.get("maxrecordsperpartition")
        self.max_records_per_partition = DEFAULT_MAX_RECORDS_PER_PARTITION
        if mp is not None:
            try:
                self.max_records_per_partition = int(mp)
                if self.max_records_per_partition <= 0:
                    raise ValueError
            except ValueError:
                raise IllegalArgumentError(f"bad maxRecordsPerPartition {mp!r}: expected an integer > 0") from None

    def start_spec(self):
        if self.starting_timestamp is not None:
            return self.starting_timestamp
        return self.starting

    @staticmethod
    def _as_bound(positions):
        if positions is None:
            return None
        if positions == EARLIEST:
            return "earliest"
        if positions == LATEST:
            return "latest"
        return positions_to_json(positions)


class RmqPartition(InputPartition):
    """One (broker, queue) range: `value` is its QueueRead."""


# --- batch -------------------------------------------------------------------------------------------
class RmqBatchReader(DataSourceReader):
    def __init__(self, options, columns=COLUMNS):
        self.opts = ReadOptions(options, streaming=False)
        self.columns = columns  # the columns decoded (the schema Spark reads with)
        self.tags = None  # tags pushed down by pushFilters (None: no tag filter pushed)

    def _expression(self):
        if self.tags is None:
            return self.opts.expression
        return " || ".join(sorted(self.tags))

    def partitions(self):
        o = self.opts
        if self.tags is not None and not self.tags:
            return []  # the pushed filters cannot all hold: nothing to read
        start = ReadOptions._as_bound(o.starting) if o.starting_timestamp is None else o.starting_timestamp
        reads, _ = plan_reads(o.namesrv, o.topic, None, expression=self._expression(),
                              expression_type=o.expression_type, fail_on_data_loss=o.fail_on_data_loss,
                              start=start, end=ReadOptions._as_bound(o.ending), account=o.account)
        # one partition per queue range, large ranges split (as the JVM reader splits them)
        step = o.max_records_per_partition
        return [RmqPartition(attrs.evolve(r, from_offset=s, until_offset=min(r.until_offset, s + step)))
                for r in reads for s in range(r.from_offset, r.until_offset, step)]

    def read(self, partition):
        from spark_plugin.arrow import read_batches
        yield from read_batches(partition.value, self.columns)


class RmqFilteringBatchReader(RmqBatchReader):
    """The batch reader with pushFilters: `tags = 'X'` and `tags IN (...)` become the broker's tag
    filter (used when spark.sql.python.filterPushdown.enabled is on; PySpark refuses a reader with
    pushFilters otherwise)."""

    def pushFilters(self, filters):
        from rmq_core.message import split_tags
        tag_expression = self.opts.expression_type == "TAG"
        for f in filters:
            values = None
            if isinstance(f, EqualTo) and f.attribute == ("tags",) and isinstance(f.value, str):
                values = {f.value}
            elif isinstance(f, In) and f.attribute == ("tags",) and all(isinstance(v, str) for v in f.value):
                values = set(f.value)
            if values is None or not tag_expression or any("||" in v or not v.strip() for v in values):
                yield f
                continue
            if self.tags is None:
                own = split_tags(self.opts.expression)
                self.tags = set(own) if own else None
            self.tags = values if self.tags is None else self.tags & values


# --- streaming -----------------------------------------------------------------------------------------
class RmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """With `consumerGroup`, the group's broker-side offsets follow what the query has durably
    done: Spark asks for the next batch's end (latestOffset) with `start` = the end of the last
    batch it committed to its checkpoint, after every batch and again at every trigger while idle,
    so that `start` is written then (and Spark's own commit() of the batch before is kept too).
    Under availableNow the reader stops at the offsets of the moment the query started
    (prepareForTriggerAvailableNow), and Spark asks once more after the last batch."""

    def __init__(self, options, columns=COLUMNS):
        self.opts = ReadOptions(options, streaming=True)
        self.columns = columns
        self._admin = None
        self._committed = {}  # (broker, queue id) -> the group offset this reader last wrote
        self._target = None  # availableNow: the positions the query ends at

    def __getstate__(self):  # sent to executors for read(): the driver's client stays here
        state = dict(self.__dict__)
        state["_admin"] = None
        return state

    @property
    def admin(self) -> QueueAdmin:
        if self._admin is None:
            self._admin = QueueAdmin(self.opts.namesrv, self.opts.account)
        return self._admin

    def _queues(self):
        queues, self._addrs = self.admin.queues(self.opts.topic)
        return queues

    def initialOffset(self):
        from spark_plugin.offsets import offset_ranges
        o = self.opts
        start = o.start_spec()
        if start is None:
            start = LATEST  # as Kafka's source: a new query reads what arrives from now on
        bound = start if isinstance(start, int) and start >= 0 else ReadOptions._as_bound(start)
        ranges = offset_ranges(o.namesrv, o.topic, start=bound, admin=self.admin)
        initial = {(r.broker_name, r.queue_id): r.from_offset for r in ranges}
        self._committed.update(initial)  # a new query's start is no progress to write over the group's
        return positions_to_json(initial)

    def latestOffset(self, start=None, limit=None):
        """The end of the next micro-batch: every queue's max offset (new queues and brokers
        included), or, under a ReadMaxRows limit (maxRecordsPerBatch), that many messages split
        across the queues by backlog.  (PySpark before 4.2 calls it without arguments.)"""
        queues = self._queues()
        latest = {(mq.broker_name, mq.queue_id): self.admin.max_offset(mq) for mq in queues}
        if start is None:
            return positions_to_json(latest)
        begin = positions_from_json(start)
        self._commit_group(begin)  # every batch before `start` is in the checkpoint
        if self._target is not None:  # availableNow: nothing past the target (new queues none at all)
            latest = {key: min(off, self._target[key]) if key in self._target else begin.get(key, 0)
                      for key, off in latest.items()}
        max_rows = getattr(limit, "max_rows", None)  # ReadMaxRows; ReadAllAvailable has none
        end = dict(begin)  # a queue that left the route keeps its position
        backlog = {}
        for mq in queues:
            key = (mq.broker_name, mq.queue_id)
            frm = begin.get(key)
            if frm is None:  # a new queue (or broker): from its earliest offset
                frm = self.admin.min_offset(mq)
            backlog[key] = (frm, max(0, latest[key] - frm))
        for key, count in split_by_backlog({k: b for k, (_, b) in backlog.items()}, max_rows).items():
            end[key] = backlog[key][0] + count
        return positions_to_json(end)

    def prepareForTriggerAvailableNow(self):
        self._target = {(mq.broker_name, mq.queue_id): self.admin.max_offset(mq) for mq in self._queues()}

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        n = self.opts.max_records_per_batch
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def partitions(self, start, end):
        o = self.opts
        begin = positions_from_json(start)
        stop = positions_from_json(end)
        queues = {(mq.broker_name, mq.queue_id): mq for mq in self._queues()}
        out = []
        for key, until in sorted(stop.items()):
            mq = queues.get(key) or MessageQueue(o.topic, key[0], key[1])
            frm = begin.get(key)
            if frm is None:
                frm = self.admin.min_offset(mq)
            if until <= frm:
                continue
            if key[0] not in self._addrs:
                raise MQClientError(f"broker {key[0]!r} left the route of topic {o.topic!r}: cannot read "
                                    f"[{frm}, {until}) of its queue {key[1]} (restart the query once it is back)")
            frm = check_data_loss(mq, frm, until, self.admin.min_offset(mq), o.fail_on_data_loss)
            if until <= frm:
                continue
            out.append(RmqPartition(QueueRead(o.topic, key[0], key[1], frm, until,
                                              tuple(sorted(self._addrs[key[0]].items())), o.expression,
                                              o.expression_type, o.fail_on_data_loss, o.account)))
        return out

    def read(self, partition):
        from spark_plugin.arrow import read_batches
        yield from read_batches(partition.value, self.columns)

    def commit(self, end):
        self._commit_group(positions_from_json(end))

    def _commit_group(self, positions) -> None:
        """Write `positions` (all done by the query) as the group's offsets, each queue only when
        it moved since this reader last wrote it."""
        group = self.opts.consumer_group
        if not group:
            return
        for (broker, qid), off in positions.items():
            if self._committed.get((broker, qid)) != off:
                self.admin.commit_offset(group, MessageQueue(self.opts.topic, broker, qid), off)
                self._committed[(broker, qid)] = off

    def stop(self):
        if self._admin is not None:
            self._admin.close()
            self._admin = None


# --- write ---------------------------------------------------------------------------------------------
# the columns the writer takes, with their Spark types
_WRITE_COLUMNS = {"body": ("binary", "string"), "tags": ("string",), "keys": ("string",),
                  "properties": ("map<string,string>",)}


class RmqCommitMessage(WriterCommitMessage):
    def __init__(self, sent: int):
        self.sent = sent


class RmqWriter(DataSourceArrowWriter):
    """Each task gets its rows as Arrow record batches (PySpark's Arrow writer): the Messages are
    made from whole columns (write.messages_of_batch), with no Row per message."""

    def __init__(self, options, schema):
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        self.namesrv = check_namesrv(opts.get("namesrv"))
        self.topic = opts.get("topic")
        if not self.topic:
            raise IllegalArgumentError("the rmq sink needs option 'topic'")
        self.account = Account.of(opts.get("accesskey"), opts.get("secretkey"))
        names = [f.name for f in schema.fields]
        if "body" not in names:
            raise IllegalArgumentError(f"the rmq sink needs a 'body' column (binary or string); columns: {names}")
        extra = [n for n in names if n not in _WRITE_COLUMNS]
        if extra:
            raise IllegalArgumentError(f"the rmq sink writes columns body, tags, keys, properties; not {extra}")
        for f in schema.fields:
            t = f.dataType.simpleString()
            if t not in _WRITE_COLUMNS[f.name]:
                raise IllegalArgumentError(f"the rmq sink's column '{f.name}' must be {' or '.join(_WRITE_COLUMNS[f.name])}, "
                                           f"not {t}")

    def write(self, iterator):
        from spark_plugin.write import messages_of_batch, send_all

        messages = (m for batch in iterator for m in messages_of_batch(self.topic, batch))
        return RmqCommitMessage(send_all(self.namesrv, self.topic, messages, self.account))


# --- the source ----------------------------------------------------------------------------------------
class RmqDataSource(DataSource):
    """Spark data source "rmq" over a topic's queues (columns: see arrow.SCHEMA_DDL; `properties`
    with option includeProperties=true, or when a user schema or option `columns` names it)."""

    @classmethod
    def name(cls):
        return "rmq"

    def schema(self):
        from spark_plugin.arrow import ddl_of
        return ddl_of(read_columns(self.options))

    def reader(self, schema):
        return RmqBatchReader(self.options, columns_of(schema))

    def streamReader(self, schema):
        return RmqStreamReader(self.options, columns_of(schema))

    def writer(self, schema, overwrite):
        if overwrite:
            raise IllegalArgumentError("a topic is append-only: use mode('append') with the rmq sink")
        return RmqWriter(self.options, schema)


class RmqFilteringDataSource(RmqDataSource):
    """"rmq" with tag filters pushed to the broker (spark.sql.python.filterPushdown.enabled)."""

    def reader(self, schema):
        return RmqFilteringBatchReader(self.options, columns_of(schema))


class RmqPythonDataSource(RmqDataSource):
    """The Python source under the name "rmq_python": what the JVM "rmq" hands writes and
    streaming reads to, and a name that always means the Python source."""

    @classmethod
    def name(cls):
        return PYTHON_NAME


class RmqPythonFilteringDataSource(RmqFilteringDataSource):
    @classmethod
    def name(cls):
        return PYTHON_NAME


PYTHON_NAME = "rmq_python"
JVM_PROVIDER = "rmq.spark.RmqTableProvider"


def jvm_reader_loaded(spark) -> bool:
    """True when the session's driver can load the JVM reader (its jar in spark.jars); never in
    Spark Connect, whose client has no JVM."""
    try:
        jvm = spark._jvm
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName(JVM_PROVIDER, False, loader)
        return True
    except Exception:
        return False


def register(spark) -> None:
    """Register the Python source as "rmq_python", and as "rmq" unless the session has the JVM
    reader (Spark refuses a short name both a JVM DataSourceRegister and a Python source claim).
    The filter-pushing reader when spark.sql.python.filterPushdown.enabled is on at this moment."""
    enabled = str(spark.conf.get("spark.sql.python.filterPushdown.enabled", "false")).lower() == "true"
    spark.dataSource.register(RmqPythonFilteringDataSource if enabled else RmqPythonDataSource)
    if not jvm_reader_loaded(spark):
        spark.dataSource.register(RmqFilteringDataSource if enabled else RmqDataSource)


__all__ = ["RmqDataSource", "RmqFilteringDataSource", "RmqPythonDataSource", "register", "jvm_reader_loaded", "COLUMNS"]
