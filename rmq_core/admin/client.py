"""AdminClient: the calls of RocketMQ's MQAdminExt over the 4.x remoting protocol.

Every call is a plain blocking request/response on the caller's thread (BlockingChannelPool: one
socket per concurrent caller and address, no event loop), with the standard request codes and
body formats, so the same calls work against rmq and against an Apache RocketMQ 4.x cluster
wherever the codes match.  Failures raise AdminError with one line naming what was wrong (the
topic, group, broker or id) - never a bare response code.

    >>> with AdminClient("127.0.0.1:9876") as admin:
    ...     for row in admin.topic_stats("TopicA"):
    ...         print(row.broker_name, row.queue_id, row.min_offset, row.max_offset)

Values come back as small frozen attrs objects (QueueStats, ConsumeStats, Connection, ...) or
dicts where RocketMQ's own structure is a free-form table (runtime info, broker config).
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import attrs

from rmq_core.acl import signer_from
from rmq_core.common.sysflag import FLAG_SUBSCRIPTION
from rmq_core.errors import MQBrokerError, RemotingError, RMQError
from rmq_core.message import (
    MessageConst, MessageQueue, MixAll, PermName, PullResult, PullStatus, TopicValidator, decode_offset_msg_id,
)
from rmq_core.remoting.blocking import BlockingChannelPool
from rmq_core.remoting.body import ClusterInfo, TopicRouteData, kv_table_decode, loads_lenient, topic_list_decode
from rmq_core.remoting.codes import PULL_STATUS_BY_CODE, RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"  # the group mqadmin pulls with (MixAll.TOOLS_CONSUMER_GROUP)
ADMIN_PRODUCER_GROUP = "TOOLS_PRODUCER"
NO_NAMESRV = "no name server: pass -n HOST:PORT or set NAMESRV_ADDR"
# Pull sysFlag bits (PullSysFlag): the subscription travels in the request, no suspend, no commit.


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


def _parse_props_text(body: bytes | None) -> dict[str, str]:
    """A `key=value` per line body (GET_BROKER_CONFIG, GET_NAMESRV_CONFIG)."""
    from rmq_core.config import parse_properties
    return parse_properties((body or b"").decode("utf-8", "replace"), "config answer")


# fastjson writes Map<MessageQueue, Long> with object keys: {{"brokerName":..,"queueId":..,"topic":..}:12}
_MQ_KEY = re.compile(r'\{"brokerName":"((?:[^"\\]|\\.)*)","queueId":(\d+),"topic":"((?:[^"\\]|\\.)*)"\}:(-?\d+)')


def parse_mq_offset_table(body: bytes | None) -> list[OffsetReset]:
    """ResetOffsetBody's offsetTable in both forms: rmq's list of objects and Java's object-keyed map."""
    if not body:
        return []
    text = bytes(body).decode("utf-8", "replace")
    try:
        d = json.loads(text)
    except ValueError:
        return [OffsetReset(t, b, int(q), int(o)) for b, q, t, o in _MQ_KEY.findall(text)]
    table = d.get("offsetTable") if isinstance(d, dict) else None
    out = []
    for item in table or []:
        mq = item.get("mq", item)
        out.append(OffsetReset(mq["topic"], mq["brokerName"], int(mq["queueId"]), int(item["offset"])))
    return out


class AdminClient:
    """The admin calls against one cluster, addressed by its name server(s).

    namesrv: 'host:port' or 'host:port;host:port' (else NAMESRV_ADDR from the environment), or an
    embedded cluster's `inproc://` address.  Safe to share between threads (each call borrows its
    own connection).  Close it (or use `with`) to drop the connections.
    """

    def __init__(self, namesrv: str | None = None, *, timeout: float = 5.0, request_steps=(),
                 access_key: str | None = None, secret_key: str | None = None, require_namesrv: bool = True):
        namesrv = namesrv or os.environ.get("NAMESRV_ADDR")
        if not namesrv and require_namesrv:
            raise AdminError(NO_NAMESRV)
        # (require_namesrv=False: the controller's calls need none; a name server call then raises)
        self.namesrv_addrs = [a.strip() for a in (namesrv or "").split(";") if a.strip()]
        self.timeout = timeout
        # request_steps: its own client-side steps (rmq_core.remoting.RequestStep), on every request;
        # access_key / secret_key add an ACL signer (as mqadmin's AclClientRPCHook), last
        signer = signer_from(access_key, secret_key, owner="AdminClient")
        self._request_steps = tuple(request_steps or ()) + ((signer,) if signer is not None else ())
        self._pool = BlockingChannelPool(max_per_address=8, connect_timeout=min(timeout, 3.0),
                                         request_steps=self._request_steps)
        self._producer = None
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.shutdown()
            self._producer = None
        self._pool.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- transport ----------------------------------------------------------------------------------------
    def invoke(self, addr: str, code: int, ext: Mapping | None = None, body: bytes | None = None,
               *, timeout: float | None = None, what: str = "") -> RemotingCommand:
        """One request to `addr`; returns the response whatever its code (callers check it).
        Connection failures and timeouts raise AdminError naming the address."""
        request = RemotingCommand.create_request(code, ext, body)
        request.language = "PYTHON"  # our broker then passes LZ4 bodies through (we decompress them)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while True:
                response = self._pool.invoke(addr, request, timeout)
                if response is not None:
                    return response
                if time.monotonic() > deadline:  # every connection to addr busy all along
                    raise AdminError(f"{what or 'request'}: every connection to {addr} stayed busy for {timeout:g}s")
                time.sleep(0.005)
        except RemotingError as e:
            raise AdminError(f"{what + ': ' if what else ''}{e}") from None

    def _call(self, addr: str, code: int, ext: Mapping | None = None, body: bytes | None = None, *,
              what: str, ok: Sequence[int] = (ResponseCode.SUCCESS,), timeout: float | None = None) -> RemotingCommand:
        """invoke, and raise AdminError("<what> on <addr>: <remark>") unless the code is in `ok`."""
        response = self.invoke(addr, code, ext, body, timeout=timeout, what=what)
        if response.code not in ok:
            if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise AdminError(f"{what}: {addr} does not support request code {code} ({RequestCode(code).name})")
            raise AdminError(f"{what} on {addr} failed: {response.remark or f'response code {response.code}'}")
        return response

    def _namesrv_call(self, code: int, ext: Mapping | None = None, body: bytes | None = None, *, what: str,
                      ok: Sequence[int] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """A request to the first name server that answers."""
        if not self.namesrv_addrs:
            raise AdminError(NO_NAMESRV)
        errors = []
        for addr in self.namesrv_addrs:
            try:
                response = self.invoke(addr, code, ext, body, what=what)
            except AdminError as e:
                errors.append(str(e))
                continue
            if response.code not in ok:
                raise AdminError(f"{what}: {response.remark or f'response code {response.code}'}")
            return response
        raise AdminError(f"{what}: no name server answered ({'; '.join(errors)})")

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
        from rmq_core.codec import decode_messages
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

    # --- controller mode (RocketMQ 5's controller; docs/failover.md) ---------------------------------------
    def _controller_call(self, controllers: str, code: int, ext: Mapping | None = None, body: bytes | None = None,
                         *, what: str, timeout: float | None = None) -> tuple[str, RemotingCommand]:
        """A request to the first of `controllers` ('host:port;host:port') that answers it: every
        controller over the same etcd answers alike, and one that cannot reach etcd says so
        ([ETCD_UNAVAILABLE]), so the next is asked.  Returns (the controller's address, its answer);
        a refusal raises AdminError with the controller's reason."""
        addrs = [a.strip() for a in (controllers or "").split(";") if a.strip()]
        if not addrs:
            raise AdminError(f"{what}: no controller: pass -a HOST:PORT (the controller, or a name server "
                             f"with enableControllerInNamesrv=true)")
        errors = []
        for addr in addrs:
            try:
                response = self.invoke(addr, code, ext, body, timeout=timeout, what=what)
            except AdminError as e:
                errors.append(str(e))
                continue
            if response.code == ResponseCode.SUCCESS:
                return addr, response
            if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                errors.append(f"{addr} is not a controller (request code {code} not supported: is "
                              f"enableControllerInNamesrv=true on that name server?)")
                continue
            if (response.remark or "").startswith("[ETCD_UNAVAILABLE]"):
                errors.append(f"{addr}: {response.remark}")
                continue
            raise AdminError(f"{what} on {addr} refused: {response.remark or f'response code {response.code}'}")
        raise AdminError(f"{what}: no controller answered ({'; '.join(errors)})")

    def sync_state_data(self, controllers: str, broker_names: Sequence[str] = ()) -> dict[str, dict]:
        """CONTROLLER_GET_SYNC_STATE_DATA: per broker group its master (id, address, epoch), sync
        state set and its epoch, and replicas (id, address, alive, role, epoch, maxOffset); every
        group the controller knows when no name is given.  Groups it does not know are left out."""
        _, r = self._controller_call(controllers, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
                                     body=json.dumps(list(broker_names)).encode(), what="get sync state data")
        return json.loads(r.body) if r.body else {}

    def controller_metadata(self, controllers: str) -> tuple[str, dict, dict]:
        """CONTROLLER_GET_METADATA_INFO: (the controller asked, its answer's ext fields, its body:
        controllerAddress, etcdEndpoints, etcdHealth {endpoint: healthy}, ...)."""
        addr, r = self._controller_call(controllers, RequestCode.CONTROLLER_GET_METADATA_INFO,
                                        what="get controller metadata")
        return addr, dict(r.ext_fields or {}), json.loads(r.body) if r.body else {}

    def elect_master(self, controllers: str, cluster: str, broker_name: str, broker_id: int | None,
                     timeout: float | None = None) -> tuple[dict, list[int]]:
        """CONTROLLER_ELECT_MASTER with a designated broker id (a planned switch-over: the old
        master stops writing and the chosen replica catches up first), or any (None).  Returns the
        answer's fields (masterBrokerId, masterAddress, masterEpoch, syncStateSetEpoch) and the
        sync state set; a refusal raises AdminError with the controller's reason."""
        ext = {"clusterName": cluster, "brokerName": broker_name,
               "brokerId": "" if broker_id is None else str(broker_id),
               "designateElect": "true" if broker_id is not None else "false"}
        _, r = self._controller_call(controllers, RequestCode.CONTROLLER_ELECT_MASTER, ext, timeout=timeout,
                                     what=f"elect master of {broker_name}")
        return dict(r.ext_fields or {}), [int(b) for b in json.loads(r.body or b"{}").get("syncStateSet", [])]

    def broker_epoch_cache(self, addr: str) -> dict:
        """GET_BROKER_EPOCH_CACHE (a broker in controller mode): brokerName, brokerId, maxOffset and
        its epoch file's entries (epoch, startOffset, endOffset; the last one ends at maxOffset)."""
        r = self._call(addr, RequestCode.GET_BROKER_EPOCH_CACHE, what="get broker epoch cache")
        cache = json.loads(r.body) if r.body else {}
        entries = cache.get("epochList") or []
        if entries and cache.get("maxOffset") is not None:  # as mqadmin: the last epoch runs to maxOffset
            entries[-1]["endOffset"] = cache["maxOffset"]
        return cache

    # --- ACL (plain_acl.yml on each broker) ----------------------------------------------------------------
    def update_acl_config(self, addr: str, access_key: str, *, secret_key: str | None = None,
                          white_remote_address: str | None = None, admin: bool | None = None,
                          default_topic_perm: str | None = None, default_group_perm: str | None = None,
                          topic_perms: Sequence[str] | None = None, group_perms: Sequence[str] | None = None) -> None:
        """updateAclConfig: create or update one account in the broker's plain_acl.yml (fields left
        None are kept as the file has them)."""
        ext = {"accessKey": access_key, "secretKey": secret_key, "whiteRemoteAddress": white_remote_address,
               "defaultTopicPerm": default_topic_perm, "defaultGroupPerm": default_group_perm,
               "topicPerms": ",".join(topic_perms) if topic_perms is not None else None,
               "groupPerms": ",".join(group_perms) if group_perms is not None else None,
               "admin": None if admin is None else str(bool(admin)).lower()}
        self._call(addr, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, {k: v for k, v in ext.items() if v is not None},
                   what=f"update ACL account {access_key}")

    def delete_acl_config(self, addr: str, access_key: str) -> None:
        """deleteAclConfig: remove one account from the broker's plain_acl.yml."""
        self._call(addr, RequestCode.DELETE_ACL_CONFIG, {"accessKey": access_key},
                   what=f"delete ACL account {access_key}")

    def update_global_white_addrs(self, addr: str, addresses: Sequence[str], acl_file: str | None = None) -> None:
        """updateGlobalWhiteAddr: replace the broker's globalWhiteRemoteAddresses."""
        self._call(addr, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
                   {"globalWhiteAddrs": ",".join(addresses), "aclFileFullPath": acl_file or ""},
                   what="update globalWhiteRemoteAddresses")

    def acl_config_version(self, addr: str) -> list[AclVersion]:
        """clusterAclConfigVersion's rows of one broker: one per ACL file it reads (plainAclFile first)."""
        r = self._call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, what="get ACL config version")
        get = r.ext_fields.get
        try:
            files = json.loads(get("allAclFileVersion") or "{}")
        except ValueError as e:
            raise AdminError(f"get ACL config version on {addr}: bad allAclFileVersion: {e}") from None
        return [AclVersion(get("clusterName") or "", get("brokerName") or "", get("brokerAddr") or addr, path,
                           int(v.get("counter", 0)), int(v.get("timestamp", 0)))
                for path, v in files.items()]

    def acl_config(self, addr: str) -> dict:
        """getAclConfig: {"globalWhiteAddrs": [...], "plainAccessConfigs": [{accessKey, ...}, ...]}."""
        r = self._call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, what="get ACL config")
        try:
            d = loads_lenient(r.body or b"{}")
        except ValueError as e:
            raise AdminError(f"get ACL config on {addr}: bad answer: {e}") from None
        return {"globalWhiteAddrs": list(d.get("globalWhiteAddrs") or []),
                "plainAccessConfigs": list(d.get("plainAccessConfigs") or [])}

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

    # --- messages ------------------------------------------------------------------------------------------
    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, *, sub_expression: str = "*",
             group: str = TOOLS_CONSUMER_GROUP, addr: str | None = None) -> PullResult:
        """One PULL_MESSAGE (no suspend, no commit) from `offset` of a queue."""
        addr = addr or self.broker_addr(mq.broker_name)
        r = self._call(addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "queueOffset": offset,
            "maxMsgNums": max_nums, "sysFlag": FLAG_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": sub_expression or "*", "subVersion": 0, "expressionType": "TAG"},
            what=f"pull {mq.topic}/{mq.broker_name}/{mq.queue_id} at offset {offset}", ok=tuple(PULL_STATUS_BY_CODE))
        from rmq_core.codec import decode_messages
        msgs = decode_messages(r.body, broker_name=mq.broker_name) if r.code == ResponseCode.SUCCESS and r.body else []
        return PullResult(PULL_STATUS_BY_CODE[r.code], r.get_int("nextBeginOffset", offset), r.get_int("minOffset", 0),
                          r.get_int("maxOffset", 0), msgs)

    def iter_messages(self, mq: MessageQueue, begin: int, end: int, *, sub_expression: str = "*",
                      group: str = TOOLS_CONSUMER_GROUP, batch: int = 32,
                      on_progress: Callable[[int], None] | None = None) -> Iterator:
        """Every message of a queue in [begin, end) offsets; on_progress(next offset) after each pull."""
        addr = self.broker_addr(mq.broker_name)
        offset = begin
        while offset < end:
            res = self.pull(mq, offset, min(batch, end - offset), sub_expression=sub_expression, group=group, addr=addr)
            for m in res.messages:
                if m.queue_offset < end:
                    yield m
            if res.status is PullStatus.OFFSET_ILLEGAL and res.next_begin_offset > offset:
                offset = res.next_begin_offset
            elif res.next_begin_offset <= offset:
                break
            else:
                offset = res.next_begin_offset
            if on_progress is not None:
                on_progress(min(offset, end))

    def message_by_offset(self, topic: str, broker_name: str, queue_id: int, offset: int):
        """The message at `offset` of a queue (queryMsgByOffset); raises when there is none."""
        res = self.pull(MessageQueue(topic, broker_name, queue_id), offset, 1)
        for m in res.messages:
            if m.queue_offset == offset:
                return m
        raise AdminError(f"no message at offset {offset} of {topic}/{broker_name}/{queue_id} "
                         f"(queue offsets {res.min_offset}..{res.max_offset})")

    def view_message(self, msg_id: str, topic: str | None = None):
        """By id: an offset message id (store host + commit-log offset) is read with
        VIEW_MESSAGE_BY_ID; anything else is taken as the producer's unique id (needs `topic`)."""
        try:
            host, port, offset = decode_offset_msg_id(msg_id)
            addr = f"{host}:{port}"
        except (ValueError, RMQError):
            addr = None
        # (a unique id is 32 hex characters too: it decodes as an address no broker has)
        on_broker = addr is not None and addr in {b.addr for b in self.brokers()}
        if on_broker:
            r = self.invoke(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}, what=f"view message {msg_id}")
            if r.code == ResponseCode.SUCCESS and r.body:
                from rmq_core.codec import decode_messages
                msgs = decode_messages(r.body)
                if msgs and (topic is None or msgs[0].topic == topic):
                    return self._named(msgs[0], addr)
        if topic is None:
            if on_broker:
                raise AdminError(f"message {msg_id!r} not found: broker {addr} has no message at commit-log offset {offset}")
            raise AdminError(f"message {msg_id!r} not found: not an offset message id of a live broker; "
                             "give -t TOPIC to look it up as a unique key")
        return self.query_message_by_unique_key(topic, msg_id)

    def clean_expired_consume_queues(self, addr: str) -> list[tuple[str, int]]:
        """CLEAN_EXPIRED_CONSUMEQUEUE: the broker destroys consume queues whose messages its commit
        log no longer holds; the (topic, queue id)s it removed."""
        r = self._call(addr, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, what="clean expired consume queues",
                       timeout=max(self.timeout, 30.0))
        return [(t, int(q)) for t, q in json.loads(r.body or b"{}").get("removed") or []]

    def clean_unused_topics(self, addr: str) -> list[str]:
        """CLEAN_UNUSED_TOPIC: the broker deletes the consume queues of topics it has no config for."""
        r = self._call(addr, RequestCode.CLEAN_UNUSED_TOPIC, what="clean unused topics", timeout=max(self.timeout, 30.0))
        return list(json.loads(r.body or b"{}").get("removed") or [])

    def consumer_status(self, topic: str, group: str, client_addr: str | None = None) -> dict[str, dict[MessageQueue, int]]:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS on every broker of the topic: each online consumer's
        own offsets of the topic (what it holds in memory), {client id: {queue: offset}}."""
        out: dict[str, dict[MessageQueue, int]] = {}
        for _, addr in self.topic_master_addrs(topic):
            r = self._call(addr, RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                           {"topic": topic, "group": group, "clientAddr": client_addr or ""},
                           what=f"get consumer status of group {group} on topic {topic}")
            for client_id, rows in (json.loads(r.body or b"{}").get("consumerTable") or {}).items():
                mine = out.setdefault(client_id, {})
                for row in rows:
                    q = row["mq"]
                    mine[MessageQueue(q["topic"], q["brokerName"], int(q["queueId"]))] = int(row["offset"])
            if out:  # every broker asks the same clients: one answer is all of it
                break
        return out

    def consume_message_directly(self, group: str, client_id: str | None, msg_id: str,
                                 topic: str | None = None) -> dict:
        """CONSUME_MESSAGE_DIRECTLY: the message (found as view_message finds it) handed to one live
        consumer of `group` (client_id, or the first that consumerConnection lists) for its
        listener, through the broker that stores it; the consumer's ConsumeMessageDirectlyResult
        ({order, autoCommit, consumeResult, remark, spentTimeMills}) and "clientId"."""
        if client_id is None:
            client_id = self.consumer_connection(group).connections[0].client_id
        msg = self.view_message(msg_id, topic)
        host, port, _ = decode_offset_msg_id(msg.offset_msg_id)
        addr = f"{host}:{port}"
        r = self._call(addr, RequestCode.CONSUME_MESSAGE_DIRECTLY,
                       {"consumerGroup": group, "clientId": client_id, "msgId": msg.offset_msg_id, "topic": msg.topic},
                       what=f"consume message {msg_id} directly in {group} <{client_id}>", timeout=max(self.timeout, 15.0))
        return {**json.loads(r.body or b"{}"), "clientId": client_id}

    def _named(self, msg, addr: str):
        try:
            msg.broker_name = self.broker_name_of(addr)
        except AdminError:
            pass
        return msg

    def query_messages(self, topic: str, key: str, max_num: int = 64, begin: int = 0, end: int | None = None,
                       *, unique_key: bool = False) -> list:
        """QUERY_MESSAGE on every broker of the topic (by key, or by unique key with
        _UNIQUE_KEY_QUERY): the index's matches between begin and end (ms), deduplicated."""
        from rmq_core.codec import decode_messages
        end = int(time.time() * 1000) + 60_000 if end is None else end
        found = {}
        for name, addr in self.topic_master_addrs(topic):
            ext = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin, "endTimestamp": end}
            if unique_key:
                ext["_UNIQUE_KEY_QUERY"] = "true"
            r = self._call(addr, RequestCode.QUERY_MESSAGE, ext, what=f"query messages of {topic} by key {key}",
                           ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND), timeout=max(self.timeout, 15.0))
            if r.code != ResponseCode.SUCCESS or not r.body:
                continue
            for m in decode_messages(r.body, broker_name=name):
                if m.topic != topic:
                    continue
                if unique_key and m.msg_id != key:
                    continue
                if not unique_key and key not in (m.keys or "").split(" ") and m.msg_id != key:
                    continue
                found[(name, m.commit_log_offset)] = m
        return sorted(found.values(), key=lambda m: (m.store_timestamp, m.queue_id, m.queue_offset))

    def message_trace(self, msg_id: str, trace_topic: str | None = None) -> list:
        """The trace records of message `msg_id` (RocketMQ's queryMsgTraceById): the trace
        messages the index finds under the id in the trace topic (RMQ_SYS_TRACE_TOPIC unless
        given), decoded, as TraceViews in the order they happened."""
        from rmq_core.client.trace import TraceView, sort_views
        topic = trace_topic or TopicValidator.RMQ_SYS_TRACE_TOPIC
        views = []
        for m in self.query_messages(topic, msg_id, 64):
            views.extend(TraceView.from_trace_message(msg_id, m))
        return sort_views(views)

    def query_message_by_unique_key(self, topic: str, uniq_key: str):
        """The message whose producer-assigned unique id (UNIQ_KEY) is `uniq_key`."""
        msgs = self.query_messages(topic, uniq_key, 32, unique_key=True)
        if not msgs:
            raise AdminError(f"no message with unique key {uniq_key!r} in topic {topic!r}")
        return msgs[0]

    def message_track(self, msg) -> list[tuple[str, str]]:
        """Per consumer group of the message's topic: CONSUMED (the group's offset of the queue is
        past it), NOT_CONSUME_YET, or NOT_ONLINE when no member is connected (MessageTrack)."""
        out = []
        try:
            groups = self.topic_consumed_by(msg.topic)
        except AdminError:
            return out
        for g in groups:
            try:
                stats = self.consume_stats(g, msg.topic)
            except AdminError:
                out.append((g, "UNKNOWN"))
                continue
            q = next((q for q in stats.queues if q.broker_name == msg.broker_name and q.queue_id == msg.queue_id), None)
            if q is not None and q.consumer_offset > msg.queue_offset:
                out.append((g, "CONSUMED"))
                continue
            try:
                self.consumer_connection(g)
                out.append((g, "NOT_CONSUME_YET"))
            except AdminError:
                out.append((g, "NOT_ONLINE"))
        return out

    def send_message(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | None = None,
                     broker_name: str | None = None, queue_id: int | None = None,
                     properties: Mapping[str, str] | None = None) -> SendOutcome:
        """Send one message with an rmq Producer (group TOOLS_PRODUCER); to a given queue when
        broker_name and queue_id are given."""
        from rmq_core import Message
        self._tools_producer()
        msg = Message(topic, body, tags=tags, keys=keys, properties=dict(properties or {}))
        try:
            if broker_name is not None or queue_id is not None:
                if broker_name is None or queue_id is None:
                    raise AdminError("sending to a queue needs both the broker name (-b) and the queue id (-i)")
                self.broker_addr(broker_name)
                r = self._producer.send(msg, queue=MessageQueue(topic, broker_name, queue_id))
            else:
                r = self._producer.send(msg)
        except AdminError:
            raise
        except RMQError as e:
            raise AdminError(f"send to topic {topic!r} failed: {e}") from None
        return SendOutcome(r.queue.broker_name, r.queue.queue_id, r.queue_offset, r.msg_id, r.offset_msg_id,
                           r.status.value if hasattr(r.status, "value") else str(r.status))

    def send_rt(self, topic: str, amount: int, size: int, *, by_queue: bool = True,
                on_progress: Callable[[int], None] | None = None) -> list[tuple[str, int, bool, float, str]]:
        """`amount` messages of `size` bytes sent one at a time with the tools producer, each timed
        (checkMsgSendRT: queue i % n of the topic's writable queues; sendMsgStatus, by_queue=False:
        the producer's own pick).  [(broker, queue id, sent, rt ms, status or error)]."""
        from rmq_core import Message
        p = self._tools_producer()
        mqs = p.fetch_publish_message_queues(topic) if by_queue else []
        body = b"a" * size
        out = []
        for i in range(amount):
            mq = mqs[i % len(mqs)] if mqs else None
            begin = time.perf_counter()
            try:
                r = p.send(Message(topic, body), queue=mq)
                sent, broker, qid, status = True, r.queue.broker_name, r.queue.queue_id, r.status.value
            except RMQError as e:
                sent, status = False, str(e).splitlines()[0]
                broker, qid = (mq.broker_name, mq.queue_id) if mq is not None else ("", -1)
            out.append((broker, qid, sent, (time.perf_counter() - begin) * 1000, status))
            if on_progress is not None:
                on_progress(i + 1)
        return out

    def _tools_producer(self):
        """The admin's producer (group TOOLS_PRODUCER), started on first use."""
        from rmq_core import Producer
        with self._lock:
            if self._producer is None:
                p = Producer(ADMIN_PRODUCER_GROUP, namesrv=";".join(self.namesrv_addrs),
                             request_steps=self._request_steps)
                p.start()
                self._producer = p
            return self._producer

    def resend(self, msg, topic: str, *, reconsume_times: int = 0, extra_properties: Mapping[str, str] | None = None,
               broker_name: str | None = None, queue_id: int = 0) -> SendOutcome:
        """Write a copy of a stored message (same body, flag, properties - so the same UNIQ_KEY) to
        queue `queue_id` of `topic` on the broker that holds it (dlq resend, poison skip), with the
        admin's producer on the send pipeline (Producer.resend).  reconsume_times travels in the
        request header, which carries it for a retry topic only (as RocketMQ's producer sends)."""
        from rmq_core import Message
        name = broker_name or msg.broker_name
        self.broker_addr(name)  # (an unknown broker fails here, naming it)
        props = dict(msg.properties)
        props.update(extra_properties or {})
        props.pop(MessageConst.TRANSACTION_PREPARED, None)  # a plain message: no transaction state
        if MixAll.is_retry_topic(topic):
            props[MessageConst.RECONSUME_TIME] = str(reconsume_times)
        elif reconsume_times:
            raise AdminError(f"reconsume times {reconsume_times} travel only in a send to a retry topic, "
                             f"not to {topic!r}")
        copy = Message(topic, bytes(msg.body or b""), flag=msg.flag, properties=props,
                       wait_store_msg_ok=props.get(MessageConst.WAIT_STORE_MSG_OK) != "false")
        try:
            r = self._tools_producer().resend(copy, queue=MessageQueue(topic, name, queue_id))
        except RMQError as e:
            raise AdminError(f"send a copy of {msg.msg_id} to {topic} failed: {e}") from None
        return SendOutcome(r.queue.broker_name, r.queue.queue_id, r.queue_offset, r.msg_id, r.offset_msg_id,
                           r.status.value if hasattr(r.status, "value") else str(r.status))

    # --- dead letters --------------------------------------------------------------------------------------
    def dlq_messages(self, group: str, *, on_progress: Callable[[int, int], None] | None = None) -> list:
        """Every message in the group's dead-letter topic %DLQ%<group>, oldest first."""
        topic = MixAll.get_dlq_topic(group)
        spans = []
        # (asked of the brokers, not the route: a dead-letter topic is made on the fly and reaches
        # the name server only with the broker's next registration)
        for b in self.brokers():
            if b.broker_id != MixAll.MASTER_ID:
                continue
            tc = self.all_topic_config(b.addr).get(topic)
            for qid in range(int(tc.get("readQueueNums", 0)) if tc else 0):
                spans.append((MessageQueue(topic, b.broker_name, qid), self.min_offset(b.addr, topic, qid),
                              self.max_offset(b.addr, topic, qid)))
        if not spans:
            raise AdminError(f"consumer group {group!r} has no dead-letter queue ({topic} does not exist)")
        total = sum(hi - lo for _, lo, hi in spans)
        done, out = 0, []
        for mq, lo, hi in spans:
            for m in self.iter_messages(mq, lo, hi):
                out.append(m)
                done += 1
                if on_progress is not None:
                    on_progress(done, total)
        return out

    def dlq_resend(self, group: str, msg_ids: Iterable[str] | None = None, *,
                   on_progress: Callable[[int, int], None] | None = None) -> list[SendOutcome]:
        """Resend dead letters of a group (those whose id - unique or offset id - is in msg_ids, else
        all) to %RETRY%<group>: only that group consumes them again, with the original topic restored
        (RETRY_TOPIC) and the retry count from 0."""
        wanted = set(msg_ids or ())
        msgs = self.dlq_messages(group)
        if wanted:
            msgs = [m for m in msgs if m.msg_id in wanted or m.offset_msg_id in wanted]
            missing = wanted - {m.msg_id for m in msgs} - {m.offset_msg_id for m in msgs}
            if missing:
                raise AdminError(f"not in the dead-letter queue of group {group!r}: {', '.join(sorted(missing))}")
        retry = MixAll.get_retry_topic(group)
        out = []
        for i, m in enumerate(msgs):
            out.append(self.resend(m, retry, reconsume_times=0, extra_properties={
                "RETRY_TOPIC": m.properties.get("RETRY_TOPIC") or m.topic,
                "ORIGIN_MESSAGE_ID": m.properties.get("ORIGIN_MESSAGE_ID") or m.msg_id}))
            if on_progress is not None:
                on_progress(i + 1, len(msgs))
        return out

    def skip_message(self, group: str, topic: str, broker_name: str, queue_id: int,
                     offset: int | None = None) -> tuple[OffsetReset, SendOutcome | None]:
        """Skip a poison message that stalls an (orderly) queue: copy it to %DLQ%<group> (so it can be
        resent later) and move the group's offset of that queue past it, telling live members.
        offset defaults to the group's committed offset of the queue (the message it is stuck on)."""
        addr = self.broker_addr(broker_name)
        if offset is None:
            offset = self.query_consumer_offset(addr, group, topic, queue_id)
            if offset < 0:
                raise AdminError(f"group {group!r} has no offset on {topic}/{broker_name}/{queue_id}; give -o OFFSET")
        copied = None
        try:
            msg = self.message_by_offset(topic, broker_name, queue_id, offset)
        except AdminError:
            msg = None
        if msg is not None:
            copied = self.resend(msg, MixAll.get_dlq_topic(group), extra_properties={
                "RETRY_TOPIC": topic, "ORIGIN_MESSAGE_ID": msg.msg_id}, broker_name=broker_name)
        return self.reset_queue_offset(group, topic, broker_name, queue_id, offset + 1), copied

    # --- allocation ----------------------------------------------------------------------------------------
    def allocate(self, topic: str, client_ids: Sequence[str], strategy: str = "averagely") -> dict[str, list[MessageQueue]]:
        """allocateMQ: which queues each client id would own under an allocate strategy plugin."""
        from rmq_core.plugins import get_allocate_strategy
        mqs = self.queues(topic)
        alloc = get_allocate_strategy(strategy)
        alloc = alloc() if isinstance(alloc, type) else alloc
        cids = sorted(client_ids)
        return {cid: sorted(alloc.allocate("TOOLS", cid, mqs, cids), key=lambda m: (m.broker_name, m.queue_id))
                for cid in cids}


def _stats_body(body) -> tuple[dict, list[tuple[dict, dict]]]:
    """(the body's other fields, [(MessageQueue json, stats json)]) of a TopicStatsTable /
    ConsumeStats body: rmq writes the offset table as a list of flat rows; Java's fastjson writes a
    map keyed by MessageQueue objects (not JSON), whose entries are read with a regex."""
    if not body:
        return {}, []
    text = bytes(body).decode("utf-8", "replace")
    try:
        d = json.loads(text)
    except ValueError:
        rows = [({"brokerName": m.group(1), "queueId": int(m.group(2)), "topic": m.group(3)}, json.loads(m.group(4)))
                for m in _JAVA_ROW.finditer(text)]
        tps = re.search(r'"consumeTps":(-?[0-9.Ee+-]+)', text)
        return ({"consumeTps": float(tps.group(1))} if tps else {}), rows
    table = d.get("offsetTable") if isinstance(d, dict) else None
    rows = [({"topic": r["topic"], "brokerName": r["brokerName"], "queueId": r["queueId"]}, r)
            for r in table] if isinstance(table, list) else []
    return (d if isinstance(d, dict) else {}), rows


def _consume_stats_list(body) -> dict:
    """ConsumeStatsList with each ConsumeStats' offsetTable as a list of flat rows (rmq's form); a
    Java broker's object-keyed tables are cut per group and read row by row."""
    if not body:
        return {}
    try:
        return loads_lenient(body)
    except RMQError:
        pass
    text = bytes(body).decode("utf-8", "replace")
    starts = list(re.finditer(r'\{"((?:[^"\\]|\\.)*)":\[\{"consumeTps":(-?[0-9.Ee+-]+)', text))
    groups = []
    for i, m in enumerate(starts):
        segment = text[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        rows = [{"brokerName": r.group(1), "queueId": int(r.group(2)), "topic": r.group(3), **json.loads(r.group(4))}
                for r in _JAVA_ROW.finditer(segment)]
        groups.append({m.group(1): [{"consumeTps": float(m.group(2)), "offsetTable": rows}]})
    addr = re.search(r'"brokerAddr":"([^"]*)"', text)
    total = re.search(r'"totalDiff":(-?\d+)', text)
    return {"brokerAddr": addr.group(1) if addr else "", "totalDiff": int(total.group(1)) if total else 0,
            "consumeStatsList": groups}


def _running_info(body) -> dict:
    """ConsumerRunningInfo: rmq clients send plain JSON (mqTable a list); a Java client's fastjson
    body keys mqTable by MessageQueue objects, so its rows and properties are read with regexes."""
    try:
        return loads_lenient(body)
    except RMQError:
        pass
    text = bytes(body).decode("utf-8", "replace")
    props = re.search(r'"properties":(\{[^{}]*\})', text)
    subs = re.search(r'"subscriptionSet":(\[[^\]]*\])', text)
    out = {"properties": json.loads(props.group(1)) if props else {}, "mqTable": []}
    try:
        out["subscriptionSet"] = json.loads(subs.group(1)) if subs else []
    except ValueError:
        out["subscriptionSet"] = []
    for m in _JAVA_ROW.finditer(text):
        out["mqTable"].append({"brokerName": m.group(1), "queueId": int(m.group(2)), "topic": m.group(3),
                               **json.loads(m.group(4))})
    return out


_JAVA_ROW = re.compile(r'\{"brokerName":"((?:[^"\\]|\\.)*)","queueId":(\d+),"topic":"((?:[^"\\]|\\.)*)"\}:(\{[^{}]*\})')
