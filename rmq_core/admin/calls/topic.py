"""The admin calls of topics: create, update, delete, stats and permissions, the queues' offsets and
the allocation of a topic's queues to client ids."""
from __future__ import annotations

from typing import Sequence

from rmq_core.admin.bodies import _stats_body
from rmq_core.admin.calls.cluster import ClusterCalls
from rmq_core.admin.values import AdminError, QueueStats
from rmq_core.message import MessageQueue, PermName
from rmq_core.plugins import get_allocate_strategy
from rmq_core.remoting.body import loads_lenient
from rmq_core.remoting.codes import RequestCode, ResponseCode


class TopicCalls(ClusterCalls):
    """Topics, queue offsets, allocation."""

    # --- topics --------------------------------------------------------------------------------------------
    def create_or_update_topic(self, addr: str, topic: str, *, read_queue_nums: int = 8, write_queue_nums: int = 8,
                               perm: int = 6, order: bool = False, topic_filter_type: str = "SINGLE_TAG",
                               topic_sys_flag: int = 0, attributes: str | None = None) -> None:
        """UPDATE_AND_CREATE_TOPIC on one broker (updateTopic -b); `attributes`: RocketMQ 5's
        '+message.type=FIFO' string, applied to the topic's current attributes."""
        fields = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": read_queue_nums,
                  "writeQueueNums": write_queue_nums, "perm": perm, "topicFilterType": topic_filter_type,
                  "topicSysFlag": topic_sys_flag, "order": order}
        if attributes:
            fields["attributes"] = attributes
        self._call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields, what=f"create topic {topic}")

    def topic_config(self, addr: str, topic: str) -> dict:
        """One topic's config on a broker (from GET_ALL_TOPIC_CONFIG), Java's field names."""
        r = self._call(addr, RequestCode.GET_ALL_TOPIC_CONFIG, what="get topic configs")
        table = (loads_lenient(r.body) or {}).get("topicConfigTable") or {}
        if topic not in table:
            raise AdminError(f"topic {topic!r} does not exist on broker {addr}")
        return table[topic]

    def all_topic_config(self, addr: str) -> dict[str, dict]:
        r = self._call(addr, RequestCode.GET_ALL_TOPIC_CONFIG, what="get topic configs")
        return (loads_lenient(r.body) or {}).get("topicConfigTable") or {}

    def delete_topic(self, topic: str, cluster: str) -> list[str]:
        """deleteTopic: DELETE_TOPIC_IN_BROKER on the cluster's masters, then DELETE_TOPIC_IN_NAMESRV
        on every name server.  Returns the broker addresses it was deleted from."""
        addrs = self.master_addrs(cluster)
        for addr in addrs:
            self._call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}, what=f"delete topic {topic}")
        for ns in self.namesrv_addrs:
            self._call(ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic, "clusterName": cluster},
                       what=f"delete topic {topic} in name server")
        return addrs

    def topic_stats(self, topic: str) -> list[QueueStats]:
        """GET_TOPIC_STATS_INFO on every broker of the topic's route (topicStatus)."""
        rows = []
        for name, addr in self.topic_master_addrs(topic):
            r = self._call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}, what=f"get stats of topic {topic}",
                           ok=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST))
            if r.code != ResponseCode.SUCCESS:
                continue
            for mq, st in _stats_body(r.body)[1]:
                rows.append(QueueStats(mq["topic"], mq["brokerName"], int(mq["queueId"]), max(0, int(st["minOffset"])),
                                       int(st["maxOffset"]), int(st.get("lastUpdateTimestamp") or 0)))
        if not rows:
            raise AdminError(f"topic {topic!r} has no queues on any broker")
        return sorted(rows, key=lambda q: (q.broker_name, q.queue_id))

    def topic_consumed_by(self, topic: str) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO over the topic's brokers: the groups that consume it."""
        groups = set()
        for _, addr in self.topic_master_addrs(topic):
            r = self._call(addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic}, what=f"who consumes {topic}")
            if r.body:
                groups.update((loads_lenient(r.body) or {}).get("groupList") or [])
        return sorted(groups)

    def update_topic_perm(self, topic: str, perm: int, *, addr: str | None = None, cluster: str | None = None) -> list[tuple[str, int]]:
        """updateTopicPerm: rewrite the topic's perm on one broker or a cluster's masters holding it.
        Returns (broker address, old perm)."""
        if perm not in (2, 4, 6):
            raise AdminError(f"bad perm {perm}: 2 (write only), 4 (read only) or 6 (read and write)")
        if addr:
            addrs = [addr]
        else:
            route_addrs = dict(self.topic_master_addrs(topic))
            addrs = [a for a in self.master_addrs(cluster) if a in route_addrs.values()] if cluster else list(route_addrs.values())
            if not addrs:
                raise AdminError(f"topic {topic!r} is on no broker of cluster {cluster!r}")
        out = []
        for a in addrs:
            tc = self.topic_config(a, topic)
            self.create_or_update_topic(a, topic, read_queue_nums=int(tc.get("readQueueNums", 8)),
                                        write_queue_nums=int(tc.get("writeQueueNums", 8)), perm=perm,
                                        order=bool(tc.get("order", False)),
                                        topic_filter_type=tc.get("topicFilterType", "SINGLE_TAG"),
                                        topic_sys_flag=int(tc.get("topicSysFlag", 0)))
            out.append((a, int(tc.get("perm", 6))))
        return out

    # --- offsets -------------------------------------------------------------------------------------------
    def max_offset(self, addr: str, topic: str, queue_id: int) -> int:
        r = self._call(addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id}, what=f"max offset of {topic}/{queue_id}")
        return r.get_int("offset", 0)

    def min_offset(self, addr: str, topic: str, queue_id: int) -> int:
        r = self._call(addr, RequestCode.GET_MIN_OFFSET, {"topic": topic, "queueId": queue_id}, what=f"min offset of {topic}/{queue_id}")
        return r.get_int("offset", 0)

    def search_offset(self, addr: str, topic: str, queue_id: int, timestamp: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at/after `timestamp` (ms)."""
        r = self._call(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": topic, "queueId": queue_id, "timestamp": timestamp},
                       what=f"search offset of {topic}/{queue_id} by time")
        return r.get_int("offset", 0)

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues from its route (as a consumer sees them)."""
        route = self.topic_route(topic)
        out = []
        for qd in route.queue_datas:
            if PermName.is_readable(qd.perm):
                out.extend(MessageQueue(topic, qd.broker_name, q) for q in range(qd.read_queue_nums))
        return sorted(out, key=lambda m: (m.broker_name, m.queue_id))

    # --- allocation ----------------------------------------------------------------------------------------
    def allocate(self, topic: str, client_ids: Sequence[str], strategy: str = "averagely") -> dict[str, list[MessageQueue]]:
        """allocateMQ: which queues each client id would own under an allocate strategy plugin."""
        mqs = self.queues(topic)
        alloc = get_allocate_strategy(strategy)
        alloc = alloc() if isinstance(alloc, type) else alloc
        cids = sorted(client_ids)
        return {cid: sorted(alloc.allocate("TOOLS", cid, mqs, cids), key=lambda m: (m.broker_name, m.queue_id))
                for cid in cids}
