"""Pull bodies -> Arrow record batches of the "rmq" data source's schema.

rmq_core's native `decode_columns` writes each record's fields straight into Arrow-layout column
buffers; here they are wrapped (no copy) as pyarrow arrays.  pyarrow is imported by the caller's
process only (executors, and whoever reads this module).
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from rmq_core._native.record_columns import decode_columns
from rmq_core.message import MessageConst

# The `properties` column holds the user's properties: RocketMQ's own (TAGS, KEYS, UNIQ_KEY, WAIT,
# the broker's CLUSTER, ...) are columns of their own or internal.  (It is also the widest column
# Spark has to move: a shorter map is a faster scan.)
SYSTEM_PROPERTIES = tuple(sorted(MessageConst.SYSTEM_KEYS | {MessageConst.CLUSTER}))

# Every column of the source (documented in the README); Spark's Arrow form of them, exactly as
# PySpark checks them against each batch (timestamps in microseconds, UTC; map entries "key" not null).
COLUMNS = ("topic", "broker_name", "queue_id", "queue_offset", "msg_id", "tags", "keys", "body",
           "properties", "born_timestamp", "store_timestamp", "reconsume_times")
SCHEMA_DDL = ("topic string, broker_name string, queue_id int, queue_offset long, msg_id string, tags string, "
              "keys string, body binary, properties map<string,string>, born_timestamp timestamp, "
              "store_timestamp timestamp, reconsume_times int")
# The schema of a read: without option includeProperties (as Kafka's includeHeaders) no
# `properties` column, the widest one, so that only a query that asks for it pays for it.
DEFAULT_COLUMNS = tuple(c for c in COLUMNS if c != "properties")
_TS = pa.timestamp("us", tz="UTC")
_MAP = pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string()))
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("broker_name", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
    ("msg_id", pa.string()), ("tags", pa.string()), ("keys", pa.string()), ("body", pa.binary()),
    ("properties", _MAP), ("born_timestamp", _TS), ("store_timestamp", _TS), ("reconsume_times", pa.int32()),
])


def _var(arrow_type, rows, column) -> pa.Array:
    validity, offsets, data, nulls = column
    return pa.Array.from_buffers(arrow_type, rows,
                                 [pa.py_buffer(validity) if validity is not None else None,
                                  pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


def _fixed(arrow_type, rows, data) -> pa.Array:
    return pa.Array.from_buffers(arrow_type, rows, [None, pa.py_buffer(data)], null_count=0)


def schema_of(columns) -> "pa.Schema":
    """The Arrow schema of `columns` (names of COLUMNS, in the caller's order)."""
    return pa.schema([ARROW_SCHEMA.field(c) for c in columns])


def ddl_of(columns) -> str:
    """The DDL of `columns` (names of COLUMNS); a name that is not one is refused naming it."""
    parts = dict(p.split(" ", 1) for p in SCHEMA_DDL.replace("map<string,string>", "map<string;string>").split(", "))
    bad = [c for c in columns if c not in parts]
    if bad:
        from rmq_core.errors import IllegalArgumentError
        raise IllegalArgumentError(f"bad columns {', '.join(columns)!r}: {bad[0]!r} is not a column of the rmq source "
                                   f"(columns: {', '.join(COLUMNS)})")
    return ", ".join(f"{c} {parts[c].replace(';', ',')}" for c in columns)


def record_batch(body, broker_name: str, until_offset: int = -1, tags_set=None, columns=COLUMNS) -> pa.RecordBatch:
    """One pull body as a RecordBatch of `columns` (records at or past until_offset left out; with
    tags_set, only messages whose tags are exactly one of them: the broker filters by hash code).
    Only the selected columns are decoded (a column mask in the native decoder: a body not
    selected is not even inflated) and become Arrow arrays."""
    names = list(columns)
    filter_tags = bool(tags_set)
    if filter_tags and "tags" not in names:
        names.append("tags")  # needed for the exact check, dropped after it
    mask = 0
    for name in names:
        mask |= 1 << COLUMNS.index(name)  # decode_columns' COL_* bits follow COLUMNS
    c = decode_columns(body, broker_name, until_offset, SYSTEM_PROPERTIES, mask)
    n = c["rows"]

    def column(name):
        if name == "properties":
            entry_offsets, keys, values = c["properties"]
            entries = pa.StructArray.from_arrays([_var(pa.string(), len(keys[1]) // 4 - 1, keys),
                                                  _var(pa.string(), len(values[1]) // 4 - 1, values)],
                                                 fields=[_MAP.key_field, _MAP.item_field])
            return pa.Array.from_buffers(_MAP, n, [None, pa.py_buffer(entry_offsets)], children=[entries])
        t = ARROW_SCHEMA.field(name).type
        if name in ("queue_id", "queue_offset", "born_timestamp", "store_timestamp", "reconsume_times"):
            return _fixed(t, n, c[name])
        return _var(t, n, c[name])

    batch = pa.RecordBatch.from_arrays([column(name) for name in names], schema=schema_of(names))
    if filter_tags:
        import pyarrow.compute as pc
        keep = pc.is_in(batch.column("tags"), value_set=pa.array(sorted(tags_set), pa.string()))
        if not pc.all(keep).as_py():
            batch = batch.filter(keep)
        if len(names) != len(columns):
            batch = batch.select(list(columns))
    return batch


def read_batches(part, columns=COLUMNS) -> Iterator[pa.RecordBatch]:
    """The partition's messages as RecordBatches of `columns`, one per pull."""
    from spark_plugin.pull import pull_range, subscription_of

    sub = subscription_of(part.topic, part.expression, part.expression_type)
    tags_set = frozenset(sub.tags_set) if sub.is_tag and sub.tags_set else None
    for _, body in pull_range(part, decode=False):
        if body:
            batch = record_batch(body, part.broker_name, part.until_offset, tags_set, columns)
            if batch.num_rows:
                yield batch


__all__ = ["ARROW_SCHEMA", "COLUMNS", "DEFAULT_COLUMNS", "SCHEMA_DDL", "ddl_of", "schema_of", "record_batch", "read_batches"]
