"""RouteInfoManager: the name server's view of clusters, brokers, topics and broker liveness.

Everything runs on the name server's event loop, so the tables need no locks.  A master's
registration carries topic configs, applied as RocketMQ 4.9's name server does: when it is the
broker's first registration or its data version changed, every carried topic is added or updated;
otherwise it is a heartbeat (only topics new to that broker are added), and a
WIPE_WRITE_PERM_OF_BROKER stays in force, as in Java.  A registration only adds and updates, so a
broker's incremental registration (RocketMQ's registerIncrementBrokerData: the changed topics
alone) costs what it carries.  A registration marked `registerAll` (rmq's brokers mark their full,
periodic one) carries the broker's whole table, and the topics it no longer has are dropped.

In controller mode a master registers with its master epoch as the data version's stateVersion
(RocketMQ 5's): the name server keeps the highest one per broker name and ignores a master
registration with a lower one (an old master that has not yet learned it was replaced); a higher
one from another address takes brokerId 0 over, and the old master's entry goes.  Manual mode
registers stateVersion 0 throughout: nothing changes.

`broker_topics` indexes the topics of each broker name, so applying, dropping and wiping cost the
size of one broker's table, never a scan of every topic; a route lookup is two dict lookups.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import attrs

from rmq_core.message import MixAll, PermName
from rmq_core.remoting.body import BrokerData, ClusterInfo, DataVersion, QueueData, RegisterBrokerBody, TopicRouteData

log = logging.getLogger("rmq.namesrv")


def _now_ms() -> float:
    return time.monotonic() * 1000.0  # liveness must not jump with the wall clock


@attrs.define
class BrokerLiveInfo:
    last_update_ms: float
    data_version: DataVersion
    channel: Any  # the ChannelContext the broker registered over (None when unknown)
    ha_server_addr: str | None


@attrs.frozen
class RegisterBrokerResult:
    ha_server_addr: str | None = None
    master_addr: str | None = None


class RouteInfoManager:
    def __init__(self) -> None:
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}  # topic -> brokerName -> QueueData
        self.broker_addr_table: dict[str, BrokerData] = {}  # brokerName -> BrokerData
        self.cluster_addr_table: dict[str, set[str]] = {}  # cluster -> brokerNames
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}  # brokerAddr -> liveness
        self.filter_server_table: dict[str, list[str]] = {}  # brokerAddr -> filter servers
        self.broker_topics: dict[str, set[str]] = {}  # brokerName -> its topics (topic_queue_table's index)
        # brokerName -> the highest stateVersion its masters registered with (kept when the name goes:
        # an old master re-registering while the new one is briefly gone must still be ignored)
        self.master_state_versions: dict[str, int] = {}

    # --- registration ------------------------------------------------------------------------------
    def register_broker(self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int,
                        ha_server_addr: str | None, body: RegisterBrokerBody | None,
                        channel: Any = None, register_all: bool = False) -> RegisterBrokerResult:
        data_version = body.data_version if body is not None else DataVersion(0, 0)
        if broker_id == MixAll.MASTER_ID and not self._master_epoch_current(
                cluster_name, broker_name, broker_addr, data_version.state_version):
            return RegisterBrokerResult()  # ignored (answered as a success, as RocketMQ 5 does)
        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is None:
            broker_data = self.broker_addr_table[broker_name] = BrokerData(cluster_name, broker_name, {})
        broker_data.cluster = cluster_name
        if data_version.state_version:  # (only a broker in controller mode registers a master epoch)
            broker_data.enable_controller_mode = True
        # The same address under another id means a slave became master (or back): keep one entry.
        for other_id, addr in list(broker_data.broker_addrs.items()):
            if addr == broker_addr and other_id != broker_id:
                del broker_data.broker_addrs[other_id]
        old_addr = broker_data.broker_addrs.get(broker_id)
        first = old_addr != broker_addr
        broker_data.broker_addrs[broker_id] = broker_addr
        if broker_id == MixAll.MASTER_ID and old_addr is not None and first and data_version.state_version:
            # a newer master epoch from another address: the old master's entry goes (it registers
            # again as a slave, under its own id, once it learns the new master)
            self.broker_live_table.pop(old_addr, None)
            self.filter_server_table.pop(old_addr, None)
            log.info("broker %s %s: master %s (stateVersion %d) replaces %s", cluster_name, broker_name,
                     broker_addr, data_version.state_version, old_addr)

        if body is not None and broker_id == MixAll.MASTER_ID:
            carried = body.topic_config_table
            held = self.broker_topics.get(broker_name, ())
            if first or self.is_broker_topic_config_changed(broker_addr, data_version):
                self._apply_topic_configs(broker_name, carried)
            else:  # a heartbeat: only what the name server does not hold yet (a broker that forgot to bump its version)
                new = {t: c for t, c in carried.items() if t not in held}
                if new:
                    self._apply_topic_configs(broker_name, new)
            held = self.broker_topics.get(broker_name, ())
            if register_all and len(held) > len(carried):  # held covers carried now: the rest is gone
                for topic in [t for t in held if t not in carried]:
                    self._remove_topic_of_broker(topic, broker_name)
        self.broker_live_table[broker_addr] = BrokerLiveInfo(_now_ms(), data_version, channel, ha_server_addr)
        if body is not None:
            if body.filter_server_list:
                self.filter_server_table[broker_addr] = list(body.filter_server_list)
            else:
                self.filter_server_table.pop(broker_addr, None)
        if first:
            log.info("new broker registered, %s %s[%s] HAServer: %s", cluster_name, broker_name,
                     broker_id, ha_server_addr)
        result = RegisterBrokerResult()
        if broker_id != MixAll.MASTER_ID:
            master_addr = broker_data.broker_addrs.get(MixAll.MASTER_ID)
            if master_addr is not None:
                master_live = self.broker_live_table.get(master_addr)
                result = RegisterBrokerResult(master_live.ha_server_addr if master_live else None, master_addr)
        return result

    def _master_epoch_current(self, cluster_name: str, broker_name: str, broker_addr: str, state_version: int) -> bool:
        """Whether a master registration of `broker_name` with `state_version` counts: False (and a
        warning naming both) when a master of it registered with a higher one; else it is held."""
        held = self.master_state_versions.get(broker_name, 0)
        if state_version < held:
            master = self.broker_addr_table.get(broker_name)
            log.warning("registered broker conflicts with the existing one, ignored: %s %s[0] %s stateVersion %d "
                        "< %d held (master %s)", cluster_name, broker_name, broker_addr, state_version, held,
                        master.broker_addrs.get(MixAll.MASTER_ID) if master is not None else None)
            return False
        if state_version > held:
            self.master_state_versions[broker_name] = state_version
        return True

    def _apply_topic_configs(self, broker_name: str, table: dict[str, dict]) -> None:
        """Add or update the carried topics of `broker_name` (nothing else is touched)."""
        held = self.broker_topics.setdefault(broker_name, set())
        for topic, config in table.items():
            queue_data = QueueData(broker_name, int(config["readQueueNums"]), int(config["writeQueueNums"]),
                                   int(config["perm"]), int(config.get("topicSysFlag", 0)))
            per_broker = self.topic_queue_table.setdefault(topic, {})
            old = per_broker.get(broker_name)
            if old != queue_data:
                if old is None:
                    log.info("new topic registered, %s %s", topic, queue_data)
                else:
                    log.info("topic changed, %s OLD: %s NEW: %s", topic, old, queue_data)
                per_broker[broker_name] = queue_data
                held.add(topic)

    def _remove_topic_of_broker(self, topic: str, broker_name: str) -> None:
        held = self.broker_topics.get(broker_name)
        if held is not None:
            held.discard(topic)
            if not held:
                del self.broker_topics[broker_name]
        per_broker = self.topic_queue_table.get(topic)
        if per_broker is None:
            return
        if per_broker.pop(broker_name, None) is not None:
            log.info("removed topic %s from broker %s", topic, broker_name)
        if not per_broker:
            del self.topic_queue_table[topic]

    def register_topic(self, topic: str, queue_datas: list[QueueData]) -> None:
        """REGISTER_TOPIC_IN_NAMESRV: add queue data for brokers this name server knows."""
        for queue_data in queue_datas:
            if queue_data.broker_name in self.broker_addr_table:
                self.topic_queue_table.setdefault(topic, {})[queue_data.broker_name] = queue_data
                self.broker_topics.setdefault(queue_data.broker_name, set()).add(topic)

    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != data_version

    def query_broker_data_version(self, broker_addr: str) -> DataVersion | None:
        live = self.broker_live_table.get(broker_addr)
        return live.data_version if live else None

    def update_broker_info_update_timestamp(self, broker_addr: str) -> None:
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update_ms = _now_ms()

    # --- removal -----------------------------------------------------------------------------------
    def unregister_broker(self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        broker_data = self.broker_addr_table.get(broker_name)
        remove_name = False
        if broker_data is not None:
            if broker_data.broker_addrs.get(broker_id) == broker_addr:
                del broker_data.broker_addrs[broker_id]
            if not broker_data.broker_addrs:
                del self.broker_addr_table[broker_name]
                remove_name = True
        log.info("unregister broker %s %s[%s], removed name: %s", cluster_name, broker_name, broker_id, remove_name)
        if remove_name:
            names = self.cluster_addr_table.get(cluster_name)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster_name]
            self._remove_topics_of_broker_name(broker_name)

    def _remove_topics_of_broker_name(self, broker_name: str) -> None:
        for topic in list(self.broker_topics.get(broker_name, ())):
            self._remove_topic_of_broker(topic, broker_name)

    def on_channel_destroy(self, channel: Any) -> str | None:
        """A connection closed: forget the broker that registered over it; returns its address."""
        for addr, live in self.broker_live_table.items():
            if live.channel is channel:
                self.remove_broker_addr(addr, "connection closed")
                return addr
        return None

    def remove_broker_addr(self, broker_addr: str, why: str) -> None:
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        for broker_name, broker_data in list(self.broker_addr_table.items()):
            for broker_id, addr in list(broker_data.broker_addrs.items()):
                if addr == broker_addr:
                    del broker_data.broker_addrs[broker_id]
                    log.info("remove broker %s[%s] %s: %s", broker_name, broker_id, broker_addr, why)
            if not broker_data.broker_addrs:
                del self.broker_addr_table[broker_name]
                for cluster, names in list(self.cluster_addr_table.items()):
                    names.discard(broker_name)
                    if not names:
                        del self.cluster_addr_table[cluster]
                self._remove_topics_of_broker_name(broker_name)

    def scan_not_active_broker(self, expired_ms: float) -> list[str]:
        """Drop brokers silent for longer than `expired_ms` (closing their connection too)."""
        now = _now_ms()
        expired = [addr for addr, live in self.broker_live_table.items() if live.last_update_ms + expired_ms < now]
        for addr in expired:
            channel = self.broker_live_table[addr].channel
            log.warning("the broker channel expired, %s %.0fms", addr, expired_ms)
            self.remove_broker_addr(addr, "not active")
            if channel is not None:
                channel.close()
        return expired

    # --- queries -----------------------------------------------------------------------------------
    def pickup_topic_route_data(self, topic: str) -> TopicRouteData | None:
        per_broker = self.topic_queue_table.get(topic)
        if not per_broker:
            return None
        route = TopicRouteData()
        route.queue_datas = sorted(per_broker.values(), key=lambda q: q.broker_name)
        for broker_name in sorted(per_broker):
            broker_data = self.broker_addr_table.get(broker_name)
            if broker_data is None:
                continue
            route.broker_datas.append(broker_data.clone())
            for addr in broker_data.broker_addrs.values():
                servers = self.filter_server_table.get(addr)
                if servers:
                    route.filter_server_table[addr] = list(servers)
        return route if route.broker_datas else None

    def get_all_cluster_info(self) -> ClusterInfo:
        return ClusterInfo({k: v.clone() for k, v in self.broker_addr_table.items()},
                           {k: set(v) for k, v in self.cluster_addr_table.items()})

    def get_all_topic_list(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def get_topics_by_cluster(self, cluster: str) -> list[str]:
        topics: set[str] = set()
        for name in self.cluster_addr_table.get(cluster, ()):
            topics |= self.broker_topics.get(name, set())
        return sorted(topics)

    def get_system_topic_list(self) -> tuple[list[str], str | None]:
        """Cluster and broker names (the topics a broker creates for itself), and a master address."""
        topics = set(self.cluster_addr_table)
        for names in self.cluster_addr_table.values():
            topics |= names
        broker_addr = None
        for broker_data in self.broker_addr_table.values():
            broker_addr = broker_data.broker_addrs.get(MixAll.MASTER_ID) or broker_addr
        return sorted(topics), broker_addr

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> None:
        if not cluster_name:
            for broker_name in list(self.topic_queue_table.get(topic, ())):
                self._remove_topic_of_broker(topic, broker_name)
            return
        for broker_name in self.cluster_addr_table.get(cluster_name, set()):
            self._remove_topic_of_broker(topic, broker_name)

    def _change_write_perm(self, broker_name: str, wipe: bool) -> int:
        count = 0
        for topic in self.broker_topics.get(broker_name, ()):
            queue_data = self.topic_queue_table[topic].get(broker_name)
            if queue_data is not None:
                if wipe:
                    queue_data.perm &= ~PermName.PERM_WRITE
                else:
                    queue_data.perm = PermName.PERM_READ | PermName.PERM_WRITE
                count += 1
        return count

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        return self._change_write_perm(broker_name, True)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        return self._change_write_perm(broker_name, False)
