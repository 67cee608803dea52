"""The broker's metrics snapshot (RocketMQ 5's BrokerMetricsManager names and labels), read when
an exporter is scraped: counters from BrokerStats, lag from the offset table and the consume
queues, connections from the client managers, storage from the commit log."""
from __future__ import annotations

import os
import time
from collections import Counter

from rmq_core.metrics import (
    COUNTER, GAUGE, HISTOGRAM, ExporterSettings, MetricFamily, RpcLatency, check_exporter_type, start_exporter,
)
from rmq_core.broker.offset_manager import TOPIC_GROUP_SEPARATOR


class BrokerMetrics:
    """Owns the broker's exporter (started by BrokerController when `metricsExporterType` is set)."""

    def __init__(self, ctrl):
        self.ctrl = ctrl
        self.rpc_latency = RpcLatency()
        self.exporter = None
        self.role_changes: Counter = Counter()  # controller mode: role -> times this broker took it
        # an unknown metricsExporterType fails when the broker is built, naming the known ones
        check_exporter_type(ctrl.broker_config.metrics_exporter_type)

    def start(self) -> None:
        ctrl = self.ctrl
        bc = ctrl.broker_config
        if check_exporter_type(bc.metrics_exporter_type) is None:
            return  # DISABLE: no request timing, no size histogram - a broker without metrics pays nothing
        ctrl.stats.enable_message_size()
        for server in ctrl.servers:
            server.set_rpc_latency(self.rpc_latency)
        settings = ExporterSettings(self.collect, host=bc.metrics_prom_exporter_host or bc.broker_ip1,
                                    port=bc.metrics_prom_exporter_port,
                                    interval_ms=bc.metrics_logging_exporter_interval_in_mills,
                                    node=f"broker[{bc.broker_name}]", backlog=bc.server_socket_backlog)
        self.exporter = start_exporter(bc.metrics_exporter_type, settings)

    def stop(self) -> None:
        exporter, self.exporter = self.exporter, None
        if exporter is not None:
            exporter.stop()
        for server in self.ctrl.servers:
            server.set_rpc_latency(None)

    def const_labels(self) -> dict[str, str]:
        bc = self.ctrl.broker_config
        return {"cluster": bc.broker_cluster_name, "node_type": "broker", "node_id": bc.broker_name}

    def collect(self) -> list[MetricFamily]:
        ctrl = self.ctrl
        const = self.const_labels()
        if ctrl.store is None:  # scraped while the broker boots: only what the servers timed
            return [self.rpc_latency.family(const)]
        cv = tuple(const.values())
        cl = tuple(const)
        c = ctrl.stats.counters()

        def by_topic(name, doc, table, unit=""):
            return MetricFamily(name, COUNTER, doc, cl + ("topic",),
                                [(cv + (t,), v) for t, v in sorted(table.items())], unit)

        def by_topic_group(name, doc, table, kind=COUNTER, unit=""):
            samples = []
            for key, v in sorted(table.items()):
                topic, group = key if isinstance(key, tuple) else key.split(TOPIC_GROUP_SEPARATOR, 1)
                samples.append((cv + (topic, group), v))
            return MetricFamily(name, kind, doc, cl + ("topic", "consumer_group"), samples, unit)

        def by_topic_type(name, doc, totals, by_type, unit=""):
            # (a topic's puts not counted under another type are normal)
            samples = []
            for t, total in sorted(totals.items()):
                others = {mt: v for (tt, mt), v in by_type.items() if tt == t}
                for mt, v in sorted({"normal": total - sum(others.values()), **others}.items()):
                    if v or not others:
                        samples.append((cv + (t, mt), v))
            return MetricFamily(name, COUNTER, doc, cl + ("topic", "message_type"), samples, unit)

        families = [
            by_topic_type("rocketmq_messages_in", "Messages put into the broker", c["put_nums"], c["put_nums_by_type"]),
            by_topic_type("rocketmq_throughput_in", "Bytes put into the broker", c["put_size"], c["put_size_by_type"],
                          "bytes"),
            by_topic_group("rocketmq_messages_out", "Messages pulled by consumer groups", c["get_nums"]),
            by_topic_group("rocketmq_throughput_out", "Bytes pulled by consumer groups", c["get_size"], unit="bytes"),
            by_topic_group("rocketmq_send_to_dlq_messages", "Messages sent to a group's dead-letter queue",
                           c["dlq_nums"]),
            by_topic("rocketmq_commit_messages", "Transactional messages committed", c["commit_nums"]),
            by_topic("rocketmq_rollback_messages", "Transactional messages rolled back", c["rollback_nums"]),
        ]
        pop = ctrl.pop_service  # pop consumption (RocketMQ 5's SimpleConsumer / gRPC clients, POP_MESSAGE)
        families += [
            by_topic_group("rocketmq_pop_receive_messages", "Messages handed out by pop consumption", pop.received),
            by_topic_group("rocketmq_pop_ack_messages", "Pop-consumed messages acked", pop.acked),
            by_topic_group("rocketmq_pop_revive_messages",
                           "Pop-consumed messages whose invisible time ran out unacked (delivered again or "
                           "dead-lettered)", pop.revived),
            by_topic_group("rocketmq_pop_inflight_messages", "Pop-consumed messages handed out and not yet acked",
                           {(t, g): n for (g, t), n in pop.inflight_table().items()}, GAUGE),
        ]
        sizes = ctrl.stats.message_size
        families.append(MetricFamily(
            "rocketmq_message_size", HISTOGRAM, "Size of the messages put", cl + ("topic",),
            [(cv + (t,), h) for t, h in sorted(sizes.values())] if sizes is not None else [], "bytes"))
        lag, latency = self._lag()
        families.append(by_topic_group("rocketmq_consumer_lag_messages",
                                       "Messages not yet consumed (committed) by a group", lag, GAUGE))
        families.append(by_topic_group("rocketmq_consumer_lag_latency",
                                       "Age of the oldest message a group has not consumed", latency, GAUGE, "ms"))
        families += self._connections(cl, cv)
        families += self._storage(cl, cv)
        families.append(self._replication(cl, cv))
        families += self._roles(cl, cv)
        families.append(self.rpc_latency.family(const))
        return families

    def on_role_change(self, role: str) -> None:
        self.role_changes[role] += 1

    def _roles(self, cl, cv) -> list[MetricFamily]:
        """Controller mode: how often this broker became master / slave, and the epoch it follows."""
        rm = self.ctrl.replicas_manager
        if rm is None:
            return []
        return [
            MetricFamily("rocketmq_broker_role_changes", COUNTER, "Times this broker changed role (controller mode)",
                         cl + ("broker_role",), [(cv + (r,), n) for r, n in sorted(self.role_changes.items())]),
            MetricFamily("rocketmq_broker_master_epoch", GAUGE, "The master epoch this broker follows or leads",
                         cl, [(cv, rm.master_epoch)]),
        ]

    def _lag(self) -> tuple[dict, dict]:
        """Per (topic, group) with committed offsets: messages behind the consume queues' ends,
        and now minus the store time of the first of them (0 when caught up)."""
        ctrl = self.ctrl
        store = ctrl.store
        now = int(time.time() * 1000)
        lag, latency = {}, {}
        for (topic, group), queues in ctrl.offset_manager.snapshot().items():
            tc = ctrl.topic_manager.select(topic)
            if tc is None:
                continue
            behind, oldest = 0, 0
            for qid in range(tc.read_queue_nums):
                mx = store.get_max_offset_in_queue(topic, qid)
                off = max(queues.get(qid, 0), store.get_min_offset_in_queue(topic, qid))
                if mx > off:
                    behind += mx - off
                    ts = store.get_message_store_timestamp(topic, qid, off)
                    if ts > 0 and (oldest == 0 or ts < oldest):
                        oldest = ts
            lag[(topic, group)] = behind
            latency[(topic, group)] = max(0, now - oldest) if oldest else 0
        return lag, latency

    def _connections(self, cl, cv) -> list[MetricFamily]:
        ctrl = self.ctrl
        producers = Counter()
        for chans in ctrl.producer_manager.groups().values():
            for ch in chans:
                producers[(ch.language, str(ch.version))] += 1
        consumers = Counter()
        for group, info in ctrl.consumer_manager.groups().items():
            mode = "push" if info.consume_type == "CONSUME_PASSIVELY" else "pull"
            for ch in list(info.channels.values()):
                consumers[(group, ch.language, str(ch.version), mode)] += 1
        return [
            MetricFamily("rocketmq_producer_connections", GAUGE, "Producer connections", cl + ("language", "version"),
                         [(cv + k, n) for k, n in sorted(producers.items())]),
            MetricFamily("rocketmq_consumer_connections", GAUGE, "Consumer connections",
                         cl + ("consumer_group", "language", "version", "consume_mode"),
                         [(cv + k, n) for k, n in sorted(consumers.items())]),
        ]

    def _storage(self, cl, cv) -> list[MetricFamily]:
        store = self.ctrl.store
        root = self.ctrl.store_config.store_path_root_dir
        size = 0
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                try:
                    size += os.stat(os.path.join(dirpath, f)).st_blocks * 512  # on disk, not the mapped size
                except OSError:
                    pass  # removed meanwhile (retention)
        max_phy = store.get_max_phy_offset()
        flush_behind = max(0, max_phy - store.commit_log.mapped_file_queue.flushed_where)
        # (the consume queues are written by the put itself; the index is built behind it)
        dispatch_behind = store.dispatch_behind_bytes()
        first_ts = _first_store_timestamp(store)
        reserve = max(0, int(time.time() * 1000) - first_ts) if first_ts > 0 else 0
        return [
            MetricFamily("rocketmq_storage_size", GAUGE, "Bytes the store takes on disk", cl, [(cv, size)], "bytes"),
            MetricFamily("rocketmq_storage_flush_behind_bytes", GAUGE, "Commit log bytes not yet flushed",
                         cl, [(cv, flush_behind)], "bytes"),
            MetricFamily("rocketmq_storage_dispatch_behind_bytes", GAUGE,
                         "Commit log bytes not yet dispatched to the consume queues", cl, [(cv, dispatch_behind)], "bytes"),
            MetricFamily("rocketmq_storage_message_reserve_time", GAUGE, "Age of the oldest message in the store",
                         cl, [(cv, reserve)], "ms"),
        ]

    def _replication(self, cl, cv) -> MetricFamily:
        """Replication lag in bytes: on a master one sample per connected slave (its HA address),
        how far its acknowledged offset is behind the master's log end; on a slave one sample,
        how far it is behind what its master's frames showed."""
        info = self.ctrl.store.ha_runtime_info()
        if self.ctrl.is_slave:
            samples = [(cv + ("slave", info.get("masterAddr") or ""), self.ctrl.store.slave_fall_behind_bytes())]
        else:
            # (diff -1: the slave has acknowledged nothing yet, so the whole log is behind)
            samples = [(cv + ("master", c["addr"]), c["diff"] if c["diff"] >= 0 else info.get("masterPutWhere", 0))
                       for c in info.get("haConnectionInfo") or []]
        return MetricFamily("rocketmq_replication_lag_bytes", GAUGE, "Commit log bytes a slave is behind its master",
                            cl + ("broker_role", "ha_peer"), samples, "bytes")


def _first_store_timestamp(store) -> int:
    """Store time of the first record in the commit log (0 when it is empty)."""
    phy = store.get_min_phy_offset()
    if phy >= store.get_max_phy_offset():
        return 0
    msg = store.look_message_by_offset(phy)
    return msg.store_timestamp if msg is not None else 0
