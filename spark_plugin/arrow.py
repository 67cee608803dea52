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

# The fixed schema (documented in the README); Spark's Arrow form of it, exactly as PySpark checks
# it against each batch (timestamps in microseconds, UTC; map entries "key" not null).
COLUMNS = ("topic", "broker_name", "queue_id", "queue_offset", "msg_id", "tags", "keys", "body",
           "properties", "born_timestamp", "store_timestamp", "reconsume_times")
SCHEMA_DDL = ("topic string, broker_name string, queue_id int, queue_offset long, msg_id string, tags string, "
              "keys string, body binary, properties map<string,string>, born_timestamp timestamp, "
              "store_timestamp timestamp, reconsume_times int")
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


def record_batch(body, broker_name: str, until_offset: int = -1, tags_set=None) -> pa.RecordBatch:
    """One pull body as a RecordBatch (records at or past until_offset left out; with tags_set,
    only messages whose tags are exactly one of them: the broker filters by hash code)."""
    c = decode_columns(body, broker_name, until_offset, SYSTEM_PROPERTIES)
    n = c["rows"]
    entry_offsets, keys, values = c["properties"]
    entries = pa.StructArray.from_arrays([_var(pa.string(), len(keys[1]) // 4 - 1, keys),
                                          _var(pa.string(), len(values[1]) // 4 - 1, values)],
                                         fields=[_MAP.key_field, _MAP.item_field])
    properties = pa.Array.from_buffers(_MAP, n, [None, pa.py_buffer(entry_offsets)], children=[entries])
    batch = pa.RecordBatch.from_arrays([
        _var(pa.string(), n, c["topic"]), _var(pa.string(), n, c["broker_name"]),
        _fixed(pa.int32(), n, c["queue_id"]), _fixed(pa.int64(), n, c["queue_offset"]),
        _var(pa.string(), n, c["msg_id"]), _var(pa.string(), n, c["tags"]), _var(pa.string(), n, c["keys"]),
        _var(pa.binary(), n, c["body"]), properties,
        _fixed(_TS, n, c["born_timestamp"]), _fixed(_TS, n, c["store_timestamp"]),
        _fixed(pa.int32(), n, c["reconsume_times"]),
    ], schema=ARROW_SCHEMA)
    if tags_set:
        import pyarrow.compute as pc
        keep = pc.is_in(batch.column("tags"), value_set=pa.array(sorted(tags_set), pa.string()))
        if not pc.all(keep).as_py():
            batch = batch.filter(keep)
    return batch


def read_batches(part) -> Iterator[pa.RecordBatch]:
    """The partition's messages as RecordBatches, one per pull."""
    from spark_plugin.pull import pull_range, subscription_of

    sub = subscription_of(part.topic, part.expression, part.expression_type)
    tags_set = frozenset(sub.tags_set) if sub.is_tag and sub.tags_set else None
    for _, body in pull_range(part, decode=False):
        if body:
            batch = record_batch(body, part.broker_name, part.until_offset, tags_set)
            if batch.num_rows:
                yield batch


__all__ = ["ARROW_SCHEMA", "COLUMNS", "SCHEMA_DDL", "record_batch", "read_batches"]
