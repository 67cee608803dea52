"""The admin client's errors, constants and the values its calls return (small frozen attrs
objects, RocketMQ's field names in snake case)."""
from __future__ import annotations

import json
from typing import Mapping

import attrs

from rmq_core.errors import RMQError

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"  # the group mqadmin pulls with (MixAll.TOOLS_CONSUMER_GROUP)
ADMIN_PRODUCER_GROUP = "TOOLS_PRODUCER"
NO_NAMESRV = "no name server: pass -n HOST:PORT or set NAMESRV_ADDR"


class AdminError(RMQError):
    """An admin call failed; the message names the topic / group / broker / id concerned."""


# --- values ----------------------------------------------------------------------------------------------
@attrs.frozen
class BrokerInfo:
    """One broker of the cluster as the name server knows it (clusterList's rows)."""
    cluster: str
    broker_name: str
    broker_id: int
    addr: str


@attrs.frozen
class QueueStats:
    """One queue's offsets (topicStatus): lastUpdateTimestamp is the newest message's store time (ms)."""
    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp: int


@attrs.frozen
class QueueProgress:
    """One queue of a group's consume stats (consumerProgress -g): diff = broker - consumer offset."""
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp: int
    inflight: int = 0  # pop consumption: handed out, not yet acked (the consumer offset is past them)

    @property
    def diff(self) -> int:
        return max(0, self.broker_offset - self.consumer_offset)


@attrs.frozen
class ConsumeStats:
    """A group's progress over every broker: the queues and the summed consume TPS."""
    group: str
    queues: tuple[QueueProgress, ...]
    consume_tps: float

    @property
    def diff_total(self) -> int:
        return sum(q.diff for q in self.queues)

    @property
    def inflight_total(self) -> int:
        return sum(q.inflight for q in self.queues)


@attrs.frozen
class Connection:
    """A client connection of a producer or consumer group."""
    client_id: str
    client_addr: str
    language: str
    version: int


@attrs.frozen
class ConsumerConnection:
    """consumerConnection: the members, their subscriptions and how the group consumes."""
    group: str
    connections: tuple[Connection, ...]
    subscriptions: dict  # topic -> sub expression
    consume_type: str
    message_model: str
    consume_from_where: str


@attrs.frozen
class OffsetReset:
    """A queue's new offset after resetOffsetByTime / skipAccumulatedMessage."""
    topic: str
    broker_name: str
    queue_id: int
    offset: int


@attrs.frozen
class SendOutcome:
    """A message written by the admin tool (sendMessage, dlq resend)."""
    broker_name: str
    queue_id: int
    queue_offset: int
    msg_id: str
    offset_msg_id: str
    status: str


@attrs.frozen
class AclVersion:
    """clusterAclConfigVersion: one ACL file of one broker and its data version."""
    cluster: str
    broker_name: str
    broker_addr: str
    acl_file: str
    counter: int
    timestamp: int



def replica_state(runtime_info: Mapping[str, str]) -> tuple[str, int | None, list[int] | None]:
    """A broker's role (SYNC_MASTER, ASYNC_MASTER, SLAVE) from its runtime info and, in controller
    mode (its runtime info has brokerControllerId), the master epoch it follows and the sync state
    set it last heard of; (role, None, None) otherwise."""
    role = runtime_info.get("brokerRole", "")
    if "brokerControllerId" not in runtime_info:
        return role, None, None
    epoch = runtime_info.get("masterEpoch")
    try:
        sss = [int(b) for b in json.loads(runtime_info.get("syncStateSet") or "[]")]
    except (ValueError, TypeError):
        sss = None
    return role, int(epoch) if epoch not in (None, "") else None, sss
