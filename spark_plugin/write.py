"""What an executor does when writing: turn elements (or the columns of Arrow record batches, the
data source's writer) into Messages and send them in batches.

One Producer per executor process and name server (`producer_for`), kept across tasks and shut
down at exit.  Rows spread over the topic's writable queues as a producer's sends do: a message
with keys goes to the queue its keys hash to (SelectMessageQueueByHash, so one key's messages keep
their order in one queue), any other to the next queue in turn, each task starting at a random
queue.  Each queue's messages leave through `Producer.send_batch` (one SEND_BATCH_MESSAGE per
batch, encoded natively), at most BATCH_MESSAGES messages or BATCH_BYTES of bodies at a time; a
batch the broker refuses raises its error, which fails the Spark task (and Spark retries the task).
Nothing here imports pyspark.
"""
from __future__ import annotations

import atexit
import os
import random
import threading
from typing import Iterable

from rmq_core.errors import IllegalArgumentError, MQBrokerError
from rmq_core.client.selector import SelectMessageQueueByHash
from rmq_core.message import Message, MessageConst

WRITER_GROUP = "SPARK_RMQ_WRITER"
BATCH_MESSAGES = 256
BATCH_BYTES = 1024 * 1024

_producers: dict = {}
_lock = threading.Lock()


def producer_for(namesrv: str, account=None):
    """This process's producer for `namesrv` and ACL account (an offsets.Account or None), started
    on first use."""
    key = (os.getpid(), namesrv, account)
    with _lock:
        p = _producers.get(key)
        if p is None:
            from rmq_core.client.producer import Producer
            from spark_plugin.offsets import account_kwargs
            p = Producer(WRITER_GROUP, namesrv=namesrv, **account_kwargs(account))
            p.start()
            if not _producers:
                atexit.register(_shutdown_all)
            _producers[key] = p
        return p


def _shutdown_all() -> None:
    with _lock:
        producers = [p for (pid, *_), p in _producers.items() if pid == os.getpid()]
        _producers.clear()
    for p in producers:
        try:
            p.shutdown()
        except Exception:
            pass


def _user_properties(props) -> dict:
    # a received message's properties carry the system ones (TAGS, UNIQ_KEY, ...): not re-sent
    return {k: v for k, v in (props or {}).items() if k not in MessageConst.SYSTEM_KEYS}


def to_message(topic: str, item) -> Message:
    """A Message for `topic` from a Message, a received MessageExt, bytes or str."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return Message(topic, bytes(item))
    if isinstance(item, str):
        return Message(topic, item.encode("utf-8"))
    body = getattr(item, "body", None)
    if body is None:
        raise IllegalArgumentError(f"cannot send {type(item).__name__} {item!r:.80} to {topic}: expected a Message, "
                                   "MessageExt, bytes or str")
    return Message(topic, body, tags=getattr(item, "tags", None), keys=getattr(item, "keys", None),
                   properties=_user_properties(getattr(item, "properties", None)))


def messages_of_batch(topic: str, batch) -> list[Message]:
    """The Messages for `topic` of an Arrow RecordBatch (what PySpark's Arrow writer hands a task;
    the writer checked its columns): `body` (binary or string), optionally `tags`, `keys` and
    `properties` (map<string,string>), each column turned into Python values at once."""
    import pyarrow as pa

    names = batch.schema.names

    def values(name):
        column = batch.column(names.index(name))
        if name == "body" and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            # the same bytes (UTF-8) read as binary: no copy, and no str per row
            column = column.view(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
        return column.to_pylist()

    bodies = values("body")
    if None in bodies:
        row = batch.slice(bodies.index(None), 1).to_pylist()[0]
        raise IllegalArgumentError(f"a row with a null body cannot be sent to {topic}: {row!r:.200}")
    tags, keys, props = (values(n) if n in names else [None] * len(bodies) for n in ("tags", "keys", "properties"))
    return [Message(topic, body, tags=t, keys=k, properties=p or ())
            for body, t, k, p in zip(bodies, tags, keys, props)]


def send_all(namesrv: str, topic: str, messages: Iterable[Message], account=None) -> int:
    """Send every message, spread over the topic's queues, in per-queue batches (signed with
    `account` when given); returns how many were sent."""
    producer = producer_for(namesrv, account)
    queues = producer.fetch_publish_message_queues(topic)
    by_keys = SelectMessageQueueByHash().select
    turn = random.randrange(len(queues))
    batches: dict = {}  # id(queue) -> [queue, messages, body bytes] (by id: a MessageQueue's hash is slow)
    sent = 0
    for m in messages:
        if m.keys:
            mq = by_keys(queues, m, None)
        else:
            mq = queues[turn]
            turn = (turn + 1) % len(queues)
        entry = batches.get(id(mq))
        if entry is None:
            entry = batches[id(mq)] = [mq, [], 0]
        batch = entry[1]
        batch.append(m)
        entry[2] += len(m.body)
        if len(batch) >= BATCH_MESSAGES or entry[2] >= BATCH_BYTES:
            sent += _send(producer, topic, mq, batch)
            entry[1], entry[2] = [], 0
    for mq, batch, _ in batches.values():
        if batch:
            sent += _send(producer, topic, mq, batch)
    return sent


def _send(producer, topic: str, mq, batch: list) -> int:
    result = producer.send_batch(batch, queue=mq)
    if result.status.value != "SEND_OK":
        raise MQBrokerError(-1, f"batch of {len(batch)} messages to {mq}: {result.status.value}", "broker")
    return len(batch)


__all__ = ["WRITER_GROUP", "producer_for", "send_all", "to_message", "messages_of_batch"]
