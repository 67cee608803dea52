"""The admin calls of subscription groups and consumers: stats, connections, running info, offset
resets and clones."""
from __future__ import annotations

import json
from typing import Callable, Mapping

from rmq_core.admin.bodies import _consume_stats_list, _running_info, _stats_body, parse_mq_offset_table
from rmq_core.admin.calls.topic import TopicCalls
from rmq_core.admin.values import (
    AdminError, ConsumeStats, Connection, ConsumerConnection, OffsetReset, QueueProgress,
)
from rmq_core.message import MixAll
from rmq_core.remoting.body import loads_lenient
from rmq_core.remoting.codes import RequestCode, ResponseCode


class ConsumerCalls(TopicCalls):
    """Subscription groups' and consumers' calls."""

    # --- subscription groups -------------------------------------------------------------------------------
    def subscription_groups(self, addr: str) -> dict[str, dict]:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: group -> SubscriptionGroupConfig (Java field names)."""
        r = self._call(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, what="get subscription groups")
        return (loads_lenient(r.body) or {}).get("subscriptionGroupTable") or {}

    def create_or_update_subscription_group(self, addr: str, config: Mapping) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP with a SubscriptionGroupConfig body (groupName, ...)."""
        body = json.dumps(dict(config), separators=(",", ":")).encode("utf-8")
        self._call(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body,
                   what=f"update subscription group {config.get('groupName')}")

    def delete_subscription_group(self, addr: str, group: str, remove_offset: bool = False) -> None:
        """DELETE_SUBSCRIPTIONGROUP (with removeOffset: its committed offsets go too)."""
        self._call(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": group, "removeOffset": remove_offset},
                   what=f"delete subscription group {group}")

    # --- consumers -----------------------------------------------------------------------------------------
    def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """GET_CONSUME_STATS on every master: each queue's broker and consumer offsets (consumerProgress -g).
        A group with no offsets and no subscription config anywhere raises naming it."""
        queues, tps, known = [], 0.0, False
        for addr in self.master_addrs():
            r = self._call(addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, **({"topic": topic} if topic else {})},
                           what=f"get consume stats of group {group}",
                           ok=(ResponseCode.SUCCESS, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, ResponseCode.TOPIC_NOT_EXIST))
            if r.code != ResponseCode.SUCCESS or not r.body:
                continue
            d, rows = _stats_body(r.body)
            tps += float(d.get("consumeTps") or 0)
            for mq, st in rows:
                queues.append(QueueProgress(mq["topic"], mq["brokerName"], int(mq["queueId"]), int(st["brokerOffset"]),
                                            int(st["consumerOffset"]), int(st.get("lastTimestamp") or 0),
                                            int(st.get("inflight") or 0)))
            known = known or bool(rows)
        if not known and not self._group_exists(group):
            raise AdminError(f"consumer group {group!r} does not exist (no offsets or subscription config on any broker)")
        queues.sort(key=lambda q: (q.topic, q.broker_name, q.queue_id))
        return ConsumeStats(group, tuple(queues), tps)

    def _group_exists(self, group: str) -> bool:
        for addr in self.master_addrs():
            if group in self.subscription_groups(addr):
                return True
        return False

    def consumer_groups(self) -> list[str]:
        """The consumer groups of the cluster as mqadmin finds them: the owners of %RETRY% topics
        (every group that has consumed in clustering mode)."""
        return sorted(t[len(MixAll.RETRY_GROUP_TOPIC_PREFIX):] for t in self.topic_list() if MixAll.is_retry_topic(t))

    def consumer_connection(self, group: str) -> ConsumerConnection:
        """GET_CONSUMER_CONNECTION_LIST from the masters, merged; a group with no live member raises."""
        conns, subs, first = {}, {}, None
        for addr in self.master_addrs():
            r = self._call(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group},
                           what=f"get connections of group {group}", ok=(ResponseCode.SUCCESS, ResponseCode.CONSUMER_NOT_ONLINE))
            if r.code != ResponseCode.SUCCESS or not r.body:
                continue
            d = loads_lenient(r.body)
            first = first or d
            for c in d.get("connectionSet") or []:
                conns[c["clientId"]] = Connection(c["clientId"], c.get("clientAddr", ""), str(c.get("language", "")),
                                                  int(c.get("version") or 0))
            for t, s in (d.get("subscriptionTable") or {}).items():
                subs[t] = s.get("subString", "*") if isinstance(s, dict) else str(s)
        if first is None or not conns:
            raise AdminError(f"consumer group {group!r} is not online (no connected consumer)")
        return ConsumerConnection(group, tuple(sorted(conns.values(), key=lambda c: c.client_id)), subs,
                                  str(first.get("consumeType", "")), str(first.get("messageModel", "")),
                                  str(first.get("consumeFromWhere", "")))

    def producer_connection(self, group: str, topic: str) -> list[Connection]:
        """GET_PRODUCER_CONNECTION_LIST on the topic's brokers; none connected raises."""
        conns = {}
        for _, addr in self.topic_master_addrs(topic):
            r = self._call(addr, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group},
                           what=f"get connections of producer group {group}")
            for c in (loads_lenient(r.body) or {}).get("connectionSet") or [] if r.body else []:
                conns[c["clientId"]] = Connection(c["clientId"], c.get("clientAddr", ""), str(c.get("language", "")),
                                                  int(c.get("version") or 0))
        if not conns:
            raise AdminError(f"producer group {group!r} is not online on the brokers of topic {topic!r}")
        return sorted(conns.values(), key=lambda c: c.client_id)

    def consumer_running_info(self, group: str, client_id: str) -> dict:
        """GET_CONSUMER_RUNNING_INFO: the broker asks the client for its running info (properties,
        subscriptions, queue table with cached counts and commit offsets)."""
        errors = []
        for addr in self.master_addrs():
            r = self.invoke(addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
                            {"consumerGroup": group, "clientId": client_id, "jstackEnable": False},
                            what=f"get running info of {client_id}")
            if r.code == ResponseCode.SUCCESS and r.body:
                return _running_info(r.body)
            errors.append(r.remark or f"code {r.code}")
        raise AdminError(f"running info of consumer {client_id!r} in group {group!r}: {'; '.join(errors) or 'no broker'}")

    def broker_consume_stats(self, addr: str, diff_level: int = 0, is_order: bool = False,
                             timeout_ms: int = 50000) -> dict:
        """GET_BROKER_CONSUME_STATS: ConsumeStatsList {brokerAddr, totalDiff, consumeStatsList:
        [{group: [ConsumeStats...]}]} for every group on the broker whose diff >= diff_level."""
        r = self._call(addr, RequestCode.GET_BROKER_CONSUME_STATS,
                       {"isOrder": is_order, "timeoutMillis": timeout_ms}, what="get broker consume stats",
                       timeout=max(self.timeout, timeout_ms / 1000))
        d = _consume_stats_list(r.body)
        d["consumeStatsList"] = [
            {g: [s for s in stats if sum(max(0, st["brokerOffset"] - st["consumerOffset"])
                                         for st in s.get("offsetTable") or []) >= diff_level]
             for g, stats in item.items()} for item in d.get("consumeStatsList") or []]
        return d

    def reset_offset_by_time(self, topic: str, group: str, timestamp: int, force: bool = True, *,
                             on_broker: Callable[[str], None] | None = None) -> list[OffsetReset]:
        """INVOKE_BROKER_TO_RESET_OFFSET on every broker of the topic: the group's offsets move to the
        first message stored at/after `timestamp` (ms; -1 = the queue ends), live members are told.
        Without force a queue only moves back.  on_broker(broker name) after each broker is done."""
        self.topic_route(topic)
        out = []
        for name, addr in self.topic_master_addrs(topic):
            r = self._call(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                           {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force},
                           what=f"reset offsets of group {group} on topic {topic}",
                           ok=(ResponseCode.SUCCESS, ResponseCode.CONSUMER_NOT_ONLINE))
            if r.code == ResponseCode.CONSUMER_NOT_ONLINE:
                # An Apache broker resets only through live members; move the broker's offsets directly.
                out.extend(self._reset_offsets_in_broker(addr, name, topic, group, timestamp))
            else:
                out.extend(parse_mq_offset_table(r.body))
            if on_broker is not None:
                on_broker(name)
        return sorted(out, key=lambda o: (o.broker_name, o.queue_id))

    def _reset_offsets_in_broker(self, addr, broker_name, topic, group, timestamp) -> list[OffsetReset]:
        out = []
        tc = self.topic_config(addr, topic)
        for qid in range(int(tc.get("readQueueNums", 0))):
            offset = self.max_offset(addr, topic, qid) if timestamp < 0 else self.search_offset(addr, topic, qid, timestamp)
            self.update_consumer_offset(addr, group, topic, qid, offset)
            out.append(OffsetReset(topic, broker_name, qid, offset))
        return out

    def reset_queue_offset(self, group: str, topic: str, broker_name: str, queue_id: int, offset: int) -> OffsetReset:
        """Move one queue of a group to `offset` (the broker's offset, and live members are told):
        INVOKE_BROKER_TO_RESET_OFFSET with queueId and offset (RocketMQ 5's per-queue form)."""
        addr = self.broker_addr(broker_name)
        self._call(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                   {"topic": topic, "group": group, "timestamp": -1, "isForce": True, "queueId": queue_id, "offset": offset},
                   what=f"reset offset of group {group} on {topic}/{broker_name}/{queue_id}")
        return OffsetReset(topic, broker_name, queue_id, offset)

    def update_consumer_offset(self, addr: str, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._call(addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                   {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset},
                   what=f"update offset of group {group} on {topic}/{queue_id}")

    def query_consumer_offset(self, addr: str, group: str, topic: str, queue_id: int) -> int:
        """QUERY_CONSUMER_OFFSET; -1 when the group has none for that queue."""
        r = self._call(addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": queue_id},
                       what=f"query offset of group {group}", ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        return r.get_int("offset", -1) if r.code == ResponseCode.SUCCESS else -1

    def clone_group_offset(self, src_group: str, dest_group: str, topic: str, offline: bool = False) -> list[str]:
        """CLONE_GROUP_OFFSET on every broker of the topic: dest group's offsets become src's.
        Unless `offline`, a source group online without a subscription to the topic is refused (the
        broker skips it, as RocketMQ's does).  Returns the brokers' addresses."""
        addrs = []
        what = f"clone offsets of group {src_group} to {dest_group} on topic {topic}"
        for _, addr in self.topic_master_addrs(topic):
            r = self._call(addr, RequestCode.CLONE_GROUP_OFFSET,
                           {"srcGroup": src_group, "destGroup": dest_group, "topic": topic, "offline": offline},
                           what=what)
            if r.remark and r.remark.startswith("skipped: "):
                raise AdminError(f"{what} on {addr}: {r.remark}")
            addrs.append(addr)
        return addrs
