"""Topics as RDDs (KafkaRDD's shape): one partition per (broker, queue) offset range, pulled by the
executor that runs it; and RDDs written back to a topic with batched sends."""
from __future__ import annotations

import functools

from rmq_core.errors import IllegalArgumentError
from rmq_core.message import MessageQueue

from spark_plugin import offsets as _offsets
from spark_plugin.offsets import Account, OffsetRange, QueueAdmin, check_data_loss, check_range
from spark_plugin.pull import QueueRead, read_messages, subscription_of


def check_namesrv(namesrv) -> str:
    """Executors reach the name server over TCP: an embedded cluster's in-proc address is refused."""
    if not namesrv or not isinstance(namesrv, str):
        raise IllegalArgumentError(f"the name server address (option 'namesrv') is missing: got {namesrv!r}")
    if namesrv.startswith("inproc://"):
        raise IllegalArgumentError(f"name server {namesrv!r} is in-proc, which Spark's executors cannot reach: "
                                   "pass the TCP address (cluster.tcp_namesrv)")
    return namesrv


def plan_reads(namesrv: str, topic: str, ranges=None, *, expression: str | None = "*",
               expression_type: str | None = "TAG", fail_on_data_loss: bool = True, start=None, end=None,
               group: str | None = None, account: Account | None = None) -> tuple[list[QueueRead], list[OffsetRange]]:
    """The partitions reading `ranges` (default: every queue, start..end) of `topic`: each range
    checked against its queue (past the max offset: refused; below the min offset: data loss).
    With `account`, the planning calls and the partitions' pulls are signed with it."""
    check_namesrv(namesrv)
    subscription_of(topic, expression, expression_type)  # a malformed expression fails here
    with QueueAdmin(namesrv, account) as admin:
        queues, addrs = admin.queues(topic)
        if ranges is None:
            ranges = _offsets.offset_ranges(namesrv, topic, group=group, start=start, end=end, admin=admin)
        known = set(queues)
        reads, planned = [], []
        for r in ranges:
            if not isinstance(r, OffsetRange):
                raise IllegalArgumentError(f"offset_ranges must hold OffsetRange values, got {r!r}")
            mq = MessageQueue(r.topic, r.broker_name, r.queue_id)
            if r.topic != topic:
                raise IllegalArgumentError(f"offset range {r} is of topic {r.topic!r}, not {topic!r}")
            if mq not in known:
                raise IllegalArgumentError(f"offset range {r}: topic {topic!r} has no queue {r.queue_id} on broker "
                                           f"{r.broker_name!r}")
            frm = r.from_offset
            if r.until_offset > r.from_offset:
                check_range(mq, r.from_offset, r.until_offset, admin.max_offset(mq))
                frm = check_data_loss(mq, r.from_offset, r.until_offset, admin.min_offset(mq), fail_on_data_loss)
            planned.append(r)
            reads.append(QueueRead(topic, r.broker_name, r.queue_id, frm, r.until_offset,
                                   tuple(sorted(addrs[r.broker_name].items())), expression or "*",
                                   (expression_type or "TAG").upper(), fail_on_data_loss, account))
        return reads, planned


def _read_partition(parts):
    for part in parts:
        yield from read_messages(part)


def create_rdd(sc, namesrv: str, topic: str, offset_ranges=None, expression: str = "*",
               expression_type: str = "TAG", fail_on_data_loss: bool = True, *, access_key: str | None = None,
               secret_key: str | None = None):
    """An RDD of MessageExt with one partition per offset range (default: every (broker, queue)
    from its min to its max offset now).  `rdd.offset_ranges` are the ranges it reads; empty
    ranges read nothing.  The expression (TAG or SQL92) is evaluated by the broker.  With
    access_key / secret_key (an ACL account), the driver's and the executors' requests are signed."""
    reads, planned = plan_reads(namesrv, topic, offset_ranges, expression=expression,
                                expression_type=expression_type, fail_on_data_loss=fail_on_data_loss,
                                account=Account.of(access_key, secret_key))
    if reads:
        # one element per slice: partition i reads range i
        rdd = sc.parallelize(reads, len(reads)).mapPartitions(_read_partition, preservesPartitioning=True)
    else:
        rdd = sc.emptyRDD()
    rdd.offset_ranges = tuple(planned)
    if (expression or "*").strip() == "*" and (expression_type or "TAG").upper() == "TAG":
        # KafkaRDD's count: consume-queue offsets are dense, so an unfiltered range holds exactly
        # until - from messages (from already moved past what retention deleted) - no data is read
        total = sum(r.until_offset - r.from_offset for r in reads)
        rdd.count = lambda: total
    return rdd


def _send_partition(namesrv: str, topic: str, account, items) -> None:
    from spark_plugin.write import send_all, to_message
    send_all(namesrv, topic, (to_message(topic, item) for item in items), account)


def save_to_topic(rdd, namesrv: str, topic: str, *, access_key: str | None = None,
                  secret_key: str | None = None) -> None:
    """Send every element (Message, MessageExt, bytes or str) of `rdd` to `topic`, in batches from
    one producer per executor process (signed with the ACL account access_key / secret_key)."""
    from rmq_core.message import TopicValidator
    check_namesrv(namesrv)
    account = Account.of(access_key, secret_key)
    try:
        TopicValidator.check_topic(topic)
    except Exception as e:
        raise IllegalArgumentError(f"bad topic {topic!r}: {e}") from None
    rdd.foreachPartition(functools.partial(_send_partition, namesrv, topic, account))


__all__ = ["create_rdd", "save_to_topic", "plan_reads", "check_namesrv"]
