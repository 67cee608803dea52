"""The admin calls of the name server (cluster, routes, KV config, write permission) and of a
broker's runtime (runtime info, config, stats)."""
from __future__ import annotations

import json
from typing import Mapping

from rmq_core.admin.bodies import _parse_props_text
from rmq_core.admin.calls.transport import AdminTransport
from rmq_core.admin.values import AdminError, BrokerInfo
from rmq_core.codec import decode_messages
from rmq_core.message import MixAll
from rmq_core.remoting.body import (
    ClusterInfo, TopicRouteData, kv_table_decode, loads_lenient, topic_list_decode,
)
from rmq_core.remoting.codes import RequestCode, ResponseCode


class ClusterCalls(AdminTransport):
    """The name server's and brokers' calls."""

    # --- name server ---------------------------------------------------------------------------------------
    def cluster_info(self) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO: brokers by name (BrokerData with id -> address) and clusters."""
        r = self._namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO, what="get cluster info")
        return ClusterInfo.decode(r.body) if r.body else ClusterInfo()

    def brokers(self, cluster: str | None = None) -> list[BrokerInfo]:
        """Every broker (masters and slaves) sorted by cluster, name, id; an unknown cluster raises."""
        info = self.cluster_info()
        if cluster is not None and cluster not in info.cluster_addr_table:
            raise AdminError(f"cluster {cluster!r} does not exist (known: {', '.join(sorted(info.cluster_addr_table)) or 'none'})")
        out = []
        for cname, names in sorted(info.cluster_addr_table.items()):
            if cluster is not None and cname != cluster:
                continue
            for name in sorted(names):
                bd = info.broker_addr_table.get(name)
                if bd is None:
                    continue
                for bid, addr in sorted(bd.broker_addrs.items()):
                    out.append(BrokerInfo(cname, name, bid, addr))
        return out

    def master_addrs(self, cluster: str | None = None) -> list[str]:
        """The master addresses of a cluster (all clusters when None)."""
        return [b.addr for b in self.brokers(cluster) if b.broker_id == MixAll.MASTER_ID]

    def broker_addr(self, broker_name: str) -> str:
        """The master address of a broker by name (an unknown name raises naming it)."""
        bd = self.cluster_info().broker_addr_table.get(broker_name)
        addr = bd.select_broker_addr() if bd is not None else None
        if addr is None:
            raise AdminError(f"broker {broker_name!r} does not exist in the name server")
        return addr

    def broker_name_of(self, addr: str) -> str:
        for b in self.brokers():
            if b.addr == addr:
                return b.broker_name
        raise AdminError(f"broker address {addr} is not registered in the name server")

    def topic_list(self) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER."""
        r = self._namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, what="get topic list")
        return sorted(topic_list_decode(r.body)) if r.body else []

    def topics_by_cluster(self, cluster: str) -> list[str]:
        """GET_TOPICS_BY_CLUSTER."""
        self.brokers(cluster)  # an unknown cluster is an error, not an empty list
        r = self._namesrv_call(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": cluster}, what=f"get topics of cluster {cluster}")
        return sorted(topic_list_decode(r.body)) if r.body else []

    def topic_route(self, topic: str) -> TopicRouteData:
        """GET_ROUTEINFO_BY_TOPIC; an unknown topic raises "topic X does not exist"."""
        r = self._namesrv_call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, what=f"get route of topic {topic}",
                               ok=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST))
        if r.code == ResponseCode.TOPIC_NOT_EXIST or not r.body:
            raise AdminError(f"topic {topic!r} does not exist (no route in the name server)")
        return TopicRouteData.decode(r.body)

    def topic_clusters(self, topic: str) -> list[str]:
        """The clusters a topic's brokers belong to (topicClusterList)."""
        route = self.topic_route(topic)
        return sorted({b.cluster for b in route.broker_datas})

    def topic_master_addrs(self, topic: str) -> list[tuple[str, str]]:
        """(broker name, master address) of every broker holding the topic."""
        route = self.topic_route(topic)
        out = []
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = bd.broker_addrs.get(MixAll.MASTER_ID)
            if addr:
                out.append((bd.broker_name, addr))
        return out

    def namesrv_config(self) -> dict[str, dict[str, str]]:
        """GET_NAMESRV_CONFIG of each name server: {namesrv addr: {key: value}}."""
        out = {}
        for addr in self.namesrv_addrs:
            r = self._call(addr, RequestCode.GET_NAMESRV_CONFIG, what="get name server config")
            out[addr] = _parse_props_text(r.body)
        return out

    def update_namesrv_config(self, props: Mapping[str, str]) -> None:
        """UPDATE_NAMESRV_CONFIG on every name server."""
        body = "".join(f"{k}={v}\n" for k, v in props.items()).encode("utf-8")
        for addr in self.namesrv_addrs:
            self._call(addr, RequestCode.UPDATE_NAMESRV_CONFIG, body=body, what="update name server config")

    def change_write_perm(self, broker_name: str, wipe: bool) -> list[tuple[str, int]]:
        """WIPE_WRITE_PERM_OF_BROKER (wipe) or ADD_WRITE_PERM_OF_BROKER on every name server: the
        broker's queues of every topic become read-only in the routes (producers move to other
        brokers, consumers drain it), or writable again.  [(name server, topics changed)]."""
        code, key = ((RequestCode.WIPE_WRITE_PERM_OF_BROKER, "wipeTopicCount") if wipe
                     else (RequestCode.ADD_WRITE_PERM_OF_BROKER, "addTopicCount"))
        what = f"{'wipe' if wipe else 'add'} write perm of broker {broker_name}"
        out = []
        for addr in self.namesrv_addrs:
            r = self._call(addr, code, {"brokerName": broker_name}, what=what)
            out.append((addr, int((r.ext_fields or {}).get(key) or 0)))
        return out

    def put_kv_config(self, namespace: str, key: str, value: str) -> None:
        """PUT_KV_CONFIG on every name server (updateKvConfig)."""
        for addr in self.namesrv_addrs:
            self._call(addr, RequestCode.PUT_KV_CONFIG, {"namespace": namespace, "key": key, "value": value},
                       what=f"put kv config {namespace}/{key}")

    def get_kv_config(self, namespace: str, key: str) -> str | None:
        r = self._namesrv_call(RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key},
                               what=f"get kv config {namespace}/{key}", ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        return r.get_str("value") if r.code == ResponseCode.SUCCESS else None

    def kv_list(self, namespace: str) -> dict[str, str]:
        r = self._namesrv_call(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": namespace},
                               what=f"get kv list of {namespace}", ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        return kv_table_decode(r.body) if r.code == ResponseCode.SUCCESS and r.body else {}

    def delete_kv_config(self, namespace: str, key: str) -> None:
        """DELETE_KV_CONFIG on every name server (deleteKvConfig)."""
        for addr in self.namesrv_addrs:
            self._call(addr, RequestCode.DELETE_KV_CONFIG, {"namespace": namespace, "key": key},
                       what=f"delete kv config {namespace}/{key}")

    # --- brokers -------------------------------------------------------------------------------------------
    def broker_runtime_info(self, addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO: the broker's KVTable (putTps, getTransferedTps, brokerVersionDesc, ...)."""
        r = self._call(addr, RequestCode.GET_BROKER_RUNTIME_INFO, what="get broker runtime info")
        return kv_table_decode(r.body) if r.body else {}

    def earliest_message_time(self, addr: str, runtime_info: Mapping[str, str] | None = None) -> int:
        """Store time (ms) of the oldest message the broker keeps: the runtime info's
        earliestMessageTimeStamp (Java), else the first record at commitLogMinOffset; 0 if none."""
        info = runtime_info if runtime_info is not None else self.broker_runtime_info(addr)
        if int(info.get("earliestMessageTimeStamp") or 0) > 0:
            return int(info["earliestMessageTimeStamp"])
        lo, hi = int(info.get("commitLogMinOffset") or 0), int(info.get("commitLogMaxOffset") or 0)
        if hi <= lo:
            return 0
        r = self.invoke(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": lo}, what="view the oldest message")
        if r.code != ResponseCode.SUCCESS or not r.body:
            return 0
        msgs = decode_messages(r.body, read_body=False)
        return msgs[0].store_timestamp if msgs else 0

    def broker_config(self, addr: str) -> dict[str, str]:
        """GET_BROKER_CONFIG: the broker's settings as key -> value strings."""
        return self.broker_config_origins(addr)[0]

    def broker_config_origins(self, addr: str) -> tuple[dict[str, str], dict[str, str] | None]:
        """GET_BROKER_CONFIG's settings, and where each one not at its default came from (the -c
        file, updateBrokerConfig's file, a flag); None from a broker that does not say (Java's)."""
        r = self._call(addr, RequestCode.GET_BROKER_CONFIG, what="get broker config")
        origins = r.ext_fields.get("configOrigins")
        return _parse_props_text(r.body), (json.loads(origins) if origins else None)

    def reset_broker_config(self, addr: str, keys: list[str]) -> str:
        """updateBrokerConfig --reset: the broker drops the keys that updateBrokerConfig persisted,
        and the -c file's values (or the defaults) hold again; returns its account of each."""
        r = self._call(addr, RequestCode.UPDATE_BROKER_CONFIG, {"resetKeys": ",".join(keys)},
                       what=f"reset broker config {', '.join(keys)}")
        if r.ext_fields.get("resetKeys") is None:  # RocketMQ's broker has no such request: it ignored it
            raise AdminError(f"the broker at {addr} cannot drop a persisted setting (not an rmq broker: "
                             "RocketMQ rewrites the broker's -c file instead; edit that file)")
        return r.remark or ""

    def update_broker_config(self, addr: str, props: Mapping[str, str]) -> str | None:
        """UPDATE_BROKER_CONFIG: body is `key=value` lines (Java's properties form).  Returns the
        broker's remark: which keys take effect only after a restart (None: all at once)."""
        body = "".join(f"{k}={v}\n" for k, v in props.items()).encode("utf-8")
        r = self._call(addr, RequestCode.UPDATE_BROKER_CONFIG, body=body, what=f"update broker config {', '.join(props)}")
        return r.remark or None

    def stats_data(self, addr: str, stats_name: str, stats_key: str) -> dict | None:
        """VIEW_BROKER_STATS_DATA (BrokerStatsData: statsMinute / statsHour / statsDay with sum, tps,
        avgpt), or None when the broker has no such item."""
        r = self._call(addr, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": stats_name, "statsKey": stats_key},
                       what=f"view stats {stats_name} {stats_key}", ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
        if r.code != ResponseCode.SUCCESS or not r.body:
            return None
        return loads_lenient(r.body)
