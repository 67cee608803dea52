"""RebalanceImpl: which queues this consumer owns, and the ProcessQueue of each.

Called on the instance's rebalance thread (every `rebalance_interval`, and at once on
NOTIFY_CONSUMER_IDS_CHANGED).  Clustering: ask a broker for the group's consumer ids, sort ids and
queues, let the allocation strategy pick this client's share.  Broadcasting: every queue.
Queues no longer owned are dropped (their offset persisted first, their orderly lock released);
new ones get a ProcessQueue, a start offset and a pull task.
"""
from __future__ import annotations

import collections
import json
import logging
import threading
import time
from typing import Protocol

from rmq_core.client.process_queue import ProcessQueue
from rmq_core.errors import MQBrokerError, MQClientError, RemotingError
from rmq_core.message import MessageModel, MessageQueue, MixAll
from rmq_core.remoting.codes import RequestCode
from rmq_core.remoting.command import RemotingCommand

log = logging.getLogger("rmq.client.rebalance")


class RebalanceOwner(Protocol):
    """What a consumer provides to its RebalanceImpl."""

    def remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool: ...
    def remove_dirty_offset(self, mq: MessageQueue) -> None: ...
    def compute_pull_from_where(self, mq: MessageQueue) -> int: ...
    def dispatch_pull(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None: ...
    def message_queue_changed(self, topic: str, mq_all: list, mq_divided: set) -> None: ...


def mq_to_json(mq: MessageQueue) -> dict:
    return {"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic}


class RebalanceImpl:
    def __init__(self, owner: RebalanceOwner, instance, group: str, message_model: MessageModel,
                 strategy, *, orderly: bool = False, pull_max_idle_time: float = 120.0,
                 lock_max_live_time: float = 30.0, check_pull_expired: bool = True):
        self.owner = owner
        self.instance = instance
        self.group = group
        self.message_model = message_model
        self.strategy = strategy
        self.orderly = orderly
        self.pull_max_idle_time = pull_max_idle_time
        self.lock_max_live_time = lock_max_live_time
        self.check_pull_expired = check_pull_expired
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        self.topic_subscribe_info: dict[str, list[MessageQueue]] = {}
        self.subscriptions: dict = {}  # topic -> SubscriptionData
        self._lock = threading.RLock()
        # the last allocations (time, topic, queues): for running info and debugging, bounded
        self.allocation_history: collections.deque = collections.deque(maxlen=64)
        self._missing_topics: set[str] = set()  # subscribed topics without a route, already reported

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    # --- rebalance -------------------------------------------------------------------------------
    def do_rebalance(self) -> None:
        with self._lock:
            for topic in list(self.subscriptions):
                try:
                    self._rebalance_by_topic(topic)
                except (MQClientError, MQBrokerError, RemotingError) as e:
                    log.warning("rebalance of group %s topic %s failed: %s", self.group, topic, e)
            self._truncate_not_subscribed()

    def _rebalance_by_topic(self, topic: str) -> None:
        mq_set = self.topic_subscribe_info.get(topic)
        if mq_set is None:
            # said once while it lasts (a rebalance runs every 20 s), again after the topic came and went
            if not MixAll.is_retry_topic(topic) and topic not in self._missing_topics:
                self._missing_topics.add(topic)
                log.warning("doRebalance, %s, but the topic[%s] does not exist", self.group, topic)
            return
        if topic in self._missing_topics:
            self._missing_topics.discard(topic)
            log.info("doRebalance, %s, the topic[%s] exists now", self.group, topic)
        if not self.clustering:
            allocated = set(mq_set)
        else:
            cids = self.instance.run(self.instance.find_consumer_id_list(topic, self.group),
                                     timeout=self.instance.config.mq_client_api_timeout * 2 + 1)
            if not cids:
                log.warning("doRebalance, %s %s, get consumer id list failed", self.group, topic)
                return
            mq_all = sorted(mq_set)
            cid_all = sorted(cids)
            try:
                allocated = set(self.strategy.allocate(self.group, self.instance.client_id, mq_all, cid_all))
            except Exception as e:
                log.error("allocate message queue strategy %s failed: %s", getattr(self.strategy, "name", self.strategy), e)
                return
        changed = self._update_process_queue_table(topic, allocated)
        if changed:
            self.allocation_history.append((time.time(), topic, tuple(sorted(allocated))))
            log.info("rebalanced group=%s topic=%s client=%s: %d queue(s)", self.group, topic,
                     self.instance.client_id, len(allocated))
            self.owner.message_queue_changed(topic, list(mq_set), allocated)

    def _update_process_queue_table(self, topic: str, allocated: set) -> bool:
        changed = False
        for mq, pq in list(self.process_queue_table.items()):
            if mq.topic != topic:
                continue
            if mq not in allocated:
                pq.dropped = True
                if self.owner.remove_unnecessary_message_queue(mq, pq):
                    self.process_queue_table.pop(mq, None)
                    changed = True
                    log.info("doRebalance, %s, remove unnecessary mq, %s", self.group, mq)
            elif self.check_pull_expired and pq.is_pull_expired(self.pull_max_idle_time):
                pq.dropped = True
                if self.owner.remove_unnecessary_message_queue(mq, pq):
                    self.process_queue_table.pop(mq, None)
                    changed = True
                    log.warning("doRebalance, %s, remove expired mq %s (not pulled for %.0f s)",
                                self.group, mq, self.pull_max_idle_time)
        new = []
        for mq in sorted(allocated):
            if mq in self.process_queue_table:
                continue
            if self.orderly and self.clustering and not self.lock(mq):
                log.warning("doRebalance, %s, add a new mq failed, %s, because lock failed", self.group, mq)
                continue
            self.owner.remove_dirty_offset(mq)
            pq = ProcessQueue()
            if self.orderly:
                pq.locked = self.clustering
                pq.last_lock_timestamp = time.monotonic()
            try:
                offset = self.owner.compute_pull_from_where(mq)
            except (MQClientError, MQBrokerError, RemotingError) as e:
                log.warning("doRebalance, %s, compute offset of %s failed: %s", self.group, mq, e)
                offset = -1
            if offset < 0:
                log.warning("doRebalance, %s, add new mq failed, %s (no start offset)", self.group, mq)
                if self.orderly and self.clustering:
                    self.unlock(mq, oneway=True)
                continue
            self.process_queue_table[mq] = pq
            new.append((mq, pq, offset))
            changed = True
            log.info("doRebalance, %s, add a new mq %s from offset %d", self.group, mq, offset)
        for mq, pq, offset in new:
            self.owner.dispatch_pull(mq, pq, offset)
        return changed

    def _truncate_not_subscribed(self) -> None:
        for mq, pq in list(self.process_queue_table.items()):
            if mq.topic not in self.subscriptions:
                pq.dropped = True
                if self.owner.remove_unnecessary_message_queue(mq, pq):
                    self.process_queue_table.pop(mq, None)

    def drop_all(self) -> None:
        """At shutdown: drop every queue (offsets are persisted by the caller)."""
        with self._lock:
            for pq in self.process_queue_table.values():
                pq.dropped = True

    # --- orderly locks ---------------------------------------------------------------------------
    async def _lock_batch(self, broker_name: str, mqs: list[MessageQueue], timeout: float) -> set[MessageQueue]:
        # queue locks live on the master: with it away an orderly consumer pauses (its locks
        # expire) and resumes once the master is back in the route
        addr = self.instance.find_broker_addr_in_subscribe(broker_name, MixAll.MASTER_ID, only_this_broker=True)
        if addr is None:
            await self.instance.update_topic_route(mqs[0].topic)
            addr = self.instance.find_broker_addr_in_subscribe(broker_name, MixAll.MASTER_ID, only_this_broker=True)
        if addr is None:
            raise MQClientError(f"the master of broker {broker_name!r} is not in any route")
        body = json.dumps({"consumerGroup": self.group, "clientId": self.instance.client_id,
                           "mqSet": [mq_to_json(m) for m in mqs]}).encode("utf-8")
        req = RemotingCommand.create_request(RequestCode.LOCK_BATCH_MQ, {}, body)
        resp = await self.instance.invoke_broker(addr, req, timeout)
        out = set()
        if resp.body:
            for e in json.loads(resp.body).get("lockOKMQSet") or []:
                out.add(MessageQueue(e["topic"], e["brokerName"], int(e["queueId"])))
        return out

    def lock(self, mq: MessageQueue) -> bool:
        try:
            locked = self.instance.run(self._lock_batch(mq.broker_name, [mq], 3.0), timeout=10)
        except (MQClientError, MQBrokerError, RemotingError) as e:
            log.warning("lock %s failed: %s", mq, e)
            return False
        ok = mq in locked
        pq = self.process_queue_table.get(mq)
        if pq is not None and ok:
            pq.locked = True
            pq.last_lock_timestamp = time.monotonic()
        return ok

    def lock_all(self) -> None:
        """Renew (or take) the broker lock of every owned queue (every lock_interval)."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in list(self.process_queue_table):
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, mqs in by_broker.items():
            try:
                locked = self.instance.run(self._lock_batch(broker, mqs, 3.0), timeout=10)
            except (MQClientError, MQBrokerError, RemotingError) as e:
                log.warning("lockAll on broker %s failed: %s", broker, e)
                continue
            now = time.monotonic()
            for mq in mqs:
                pq = self.process_queue_table.get(mq)
                if pq is None:
                    continue
                if mq in locked:
                    if not pq.locked:
                        log.info("the message queue locked OK, group=%s %s", self.group, mq)
                    pq.locked = True
                    pq.last_lock_timestamp = now
                else:
                    if pq.locked:
                        log.warning("the message queue lock lost, group=%s %s", self.group, mq)
                    pq.locked = False

    async def _unlock_batch(self, broker_name: str, mqs: list[MessageQueue], oneway: bool) -> None:
        addr = self.instance.find_broker_addr_in_subscribe(broker_name, MixAll.MASTER_ID, only_this_broker=True)
        if addr is None:
            return
        body = json.dumps({"consumerGroup": self.group, "clientId": self.instance.client_id,
                           "mqSet": [mq_to_json(m) for m in mqs]}).encode("utf-8")
        req = RemotingCommand.create_request(RequestCode.UNLOCK_BATCH_MQ, {}, body)
        if oneway:
            req.mark_oneway()
            await self.instance.invoke_oneway(addr, req)
        else:
            await self.instance.invoke_broker(addr, req, 1.0)

    def unlock(self, mq: MessageQueue, oneway: bool = False) -> None:
        try:
            self.instance.run(self._unlock_batch(mq.broker_name, [mq], oneway), timeout=5)
            log.info("unlock %s group=%s", mq, self.group)
        except (MQClientError, MQBrokerError, RemotingError) as e:
            log.warning("unlock %s failed: %s", mq, e)

    def unlock_all(self, oneway: bool = False) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in list(self.process_queue_table):
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, mqs in by_broker.items():
            try:
                self.instance.run(self._unlock_batch(broker, mqs, oneway), timeout=5)
            except (MQClientError, MQBrokerError, RemotingError) as e:
                log.warning("unlockAll on broker %s failed: %s", broker, e)
            for mq in mqs:
                pq = self.process_queue_table.get(mq)
                if pq is not None:
                    pq.locked = False


__all__ = ["RebalanceImpl", "RebalanceOwner", "mq_to_json"]
