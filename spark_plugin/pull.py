"""What an executor does: pull its own partition (one queue's offset range) from the broker.

A partition is a picklable QueueRead: the queue, [from, until), the broker's addresses (broker id
-> host:port, so a pull follows the broker's suggestWhichBrokerId to a slave) and the filter
expression.  The pull is rmq_core's PULL_MESSAGE (pull_api.build_pull_request /
process_pull_response) over a blocking TCP connection from the executor's own thread, in pulls of
up to 1024 messages; one connection per broker per executor process is kept across partitions
(`channel_pool()`), never one per partition.

Two shapes come out of one pull loop: MessageExt objects (the RDD) or the raw body of each pull,
which arrow.py decodes into Arrow columns (the data source).  Nothing here imports pyspark.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Iterator

import attrs

from rmq_core.errors import IllegalArgumentError, MQBrokerError, MQClientError, RemotingConnectError, RemotingError
from rmq_core.message import MessageQueue, MessageSelector, PullStatus

from spark_plugin.offsets import Account, DataLossError, check_data_loss

log = logging.getLogger("rmq.spark")

PULL_BATCH = 1024  # messages per pull: what the broker lets an rmq client take at once
PULL_TIMEOUT = 30.0
# the group named in pull requests: pulls neither commit nor suspend, so it owns no offsets
READER_GROUP = "SPARK_RMQ_READER"


@attrs.frozen
class QueueRead:
    """One partition: messages [from_offset, until_offset) of a queue, with what it takes to pull them."""

    topic: str
    broker_name: str
    queue_id: int
    from_offset: int
    until_offset: int
    broker_addrs: tuple  # ((broker id, "host:port"), ...)
    expression: str = "*"
    expression_type: str = "TAG"
    fail_on_data_loss: bool = True
    account: Account | None = None  # the ACL account the pulls are signed with

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


def selector_of(expression: str | None, expression_type: str | None) -> MessageSelector:
    etype = (expression_type or "TAG").upper()
    return MessageSelector(etype, expression or "*") if etype != "TAG" else MessageSelector.by_tag(expression or "*")


def subscription_of(topic: str, expression: str | None, expression_type: str | None):
    """The SubscriptionData of an expression; a malformed one raises naming the expression (so
    planning fails, not an executor)."""
    from rmq_core.client.subscription import build_subscription
    try:
        return build_subscription(topic, selector_of(expression, expression_type))
    except IllegalArgumentError:
        raise
    except Exception as e:
        raise IllegalArgumentError(f"bad {expression_type or 'TAG'} expression {expression!r}: {e}") from None


# --- one connection per broker per process (and per ACL account) --------------------------------------
_pools: dict = {}  # account (None: unsigned) -> its pool
_pool_pid = -1
_pool_lock = threading.Lock()


def channel_pool(account: Account | None = None):
    """This process's blocking connections to brokers (at most one per broker), signing with
    `account`'s ACL signer when given."""
    global _pool_pid
    with _pool_lock:
        if _pool_pid != os.getpid():  # (a forked worker opens its own)
            _pools.clear()
            _pool_pid = os.getpid()
        pool = _pools.get(account)
        if pool is None or pool.closed:
            from rmq_core.acl import signer_from
            from rmq_core.remoting.blocking import BlockingChannelPool
            steps = () if account is None else (signer_from(account.access_key, account.secret_key),)
            pool = _pools[account] = BlockingChannelPool(max_per_address=1, connect_timeout=5.0, request_steps=steps)
        return pool


def _invoke(addr: str, request, account: Account | None = None):
    pool = channel_pool(account)
    request.language = "PYTHON"  # an rmq client: large pulls, LZ4 bodies kept as stored
    while True:
        response = pool.invoke(addr, request, PULL_TIMEOUT)
        if response is not None:
            return response
        time.sleep(0.001)  # another thread of this process holds the connection: wait for it


# --- the pull loop -------------------------------------------------------------------------------------
def pull_range(part: QueueRead, decode: bool) -> Iterator:
    """Pull [from, until) of the partition's queue.  Yields, per pull, (PullResultExt, body):
    with decode, result.messages are MessageExt (past-`until` ones dropped); else body is the
    raw records (the caller trims at until_offset)."""
    from rmq_core.client.pull_api import build_pull_request, process_pull_response
    from rmq_core.common.sysflag import build_pull_sys_flag

    mq = part.queue
    sub = subscription_of(part.topic, part.expression, part.expression_type)
    addrs = dict(part.broker_addrs)
    if not addrs:
        raise MQClientError(f"no address of broker {part.broker_name!r} for {mq}")
    master = addrs.get(0) or next(iter(addrs.values()))
    broker_id = 0
    unreachable: set[str] = set()  # a master (or slave) gone while the job runs: read from the other
    offset = part.from_offset
    sys_flag = build_pull_sys_flag(False, False, True, lite_pull=True)
    while offset < part.until_offset:
        addr = addrs.get(broker_id, master)
        if addr in unreachable:
            addr = next((a for _, a in sorted(addrs.items()) if a not in unreachable), addr)
        req = build_pull_request(group=READER_GROUP, mq=mq, sub=sub, offset=offset,
                                 max_nums=min(PULL_BATCH, part.until_offset - offset), sys_flag=sys_flag,
                                 commit_offset=0, suspend_timeout_ms=0)
        try:
            resp = _invoke(addr, req, part.account)
            result = process_pull_response(resp, mq, sub, addr, decode=decode)
        except RemotingConnectError as e:
            unreachable.add(addr)
            if any(a not in unreachable for a in addrs.values()):
                log.warning("pulling %s from %s failed (%s); reading from another broker of its group", mq, addr, e)
                continue
            raise MQClientError(f"pulling {mq} at offset {offset} from {addr} failed: {e}") from None
        except (RemotingError, MQBrokerError) as e:
            raise MQClientError(f"pulling {mq} at offset {offset} from {addr} failed: {e}") from None
        # the broker says which of its replicas to pull from next (a slave when we lag far behind)
        broker_id = result.suggest_which_broker_id if result.suggest_which_broker_id in addrs else 0
        status = result.status
        if status is PullStatus.FOUND:
            if decode:
                if result.messages and result.messages[-1].queue_offset >= part.until_offset:
                    result.messages = [m for m in result.messages if m.queue_offset < part.until_offset]
                for m in result.messages:
                    m.broker_name = part.broker_name
            yield result, resp.body
            offset = result.next_begin_offset
        elif status is PullStatus.NO_MATCHED_MSG:
            offset = result.next_begin_offset  # the filter matched nothing in what was scanned
        elif status is PullStatus.OFFSET_ILLEGAL and offset < result.min_offset:
            offset = check_data_loss(mq, offset, part.until_offset, result.min_offset, part.fail_on_data_loss)
        elif result.next_begin_offset > offset and status is PullStatus.NO_NEW_MSG:
            offset = result.next_begin_offset  # a consume-queue file gone missing: skip past it
        elif (broker_id != 0 or addr != master) and master not in unreachable:
            broker_id = 0  # a slave behind its master: ask the master
            continue
        else:
            raise MQClientError(
                f"{mq} ends at offset {result.max_offset}, before the partition's until offset "
                f"{part.until_offset} (pull at {offset}: {status.name})")


def read_messages(part: QueueRead) -> Iterator:
    """The partition's messages as MessageExt (the RDD's elements)."""
    for result, _ in pull_range(part, decode=True):
        yield from result.messages


__all__ = ["QueueRead", "PULL_BATCH", "READER_GROUP", "channel_pool", "pull_range", "read_messages",
           "subscription_of", "selector_of", "DataLossError"]
