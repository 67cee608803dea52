"""JSON bodies shared by the name server, the broker and the clients (RocketMQ's field names).

Java writes bodies with fastjson: keys sorted, nulls omitted, and `Map<Long, String>` keys
UNQUOTED (`{0:"127.0.0.1:10911"}`), which Python's json rejects; `loads_lenient` accepts that
form.  We always write standard JSON with quoted keys (docs/protocol.md §4.1).
"""
from __future__ import annotations

import json
import random
import re
import struct
import time
import zlib
from typing import Any, Iterable, Mapping

import attrs

from rmq_core.common.fastjson import dumps, loads_lenient  # noqa: F401 - also this module's names
from rmq_core.errors import RemotingCommandError
from rmq_core.remoting.command import json_int
from rmq_core.message import MessageQueue, MixAll, PermName


def _int(obj: Mapping, key: str, default: int | None = None, where: str = "") -> int:
    value = obj.get(key, default)
    number = json_int(value)
    if number is None:
        raise RemotingCommandError(f"bad {where}{key!r}: {value!r} is not an integer")
    return number


def _mapping(value, bad: str) -> Mapping:
    """`value` if it is a JSON object, else a RemotingCommandError: `bad` and the value."""
    if not isinstance(value, Mapping):
        raise RemotingCommandError(f"{bad}{value!r:.80}")
    return value


def _str(obj: Mapping, key: str, default: str | None = None, where: str = "") -> str:
    value = obj.get(key, default)
    if isinstance(value, str):
        return value
    if value is None:
        raise RemotingCommandError(f"bad {where}: {key!r} is missing")
    if type(value) is int:
        return str(value)
    raise RemotingCommandError(f"bad {where}{key!r}: {value!r} is not a string")


# --- route data ------------------------------------------------------------------------------------
@attrs.define
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PermName.PERM_READ | PermName.PERM_WRITE
    topic_sys_flag: int = 0

    def to_json(self) -> dict:
        return {"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, d: Mapping) -> "QueueData":
        w = "queueData "
        _mapping(d, "bad queueData: ")
        return cls(_str(d, "brokerName", where=w), _int(d, "readQueueNums", 0, w), _int(d, "writeQueueNums", 0, w),
                   _int(d, "perm", 6, w), _int(d, "topicSysFlag", 0, w))


@attrs.define
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = attrs.field(factory=dict)  # brokerId -> "ip:port"; 0 is the master
    # rmq's: the group runs in controller mode (its master registered with a master epoch), so a
    # group without a master is having one elected.  In the JSON only when true (RocketMQ 4's otherwise).
    enable_controller_mode: bool = False

    def to_json(self) -> dict:
        out = {"brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
               "brokerName": self.broker_name, "cluster": self.cluster}
        if self.enable_controller_mode:
            out["enableControllerMode"] = True
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "BrokerData":
        w = "brokerData "
        _mapping(d, "bad brokerData: ")
        addrs = d.get("brokerAddrs") or {}
        _mapping(addrs, "bad brokerData 'brokerAddrs': ")
        try:
            parsed = {int(k): str(v) for k, v in addrs.items()}
        except ValueError:
            raise RemotingCommandError(f"bad brokerData 'brokerAddrs' keys: {list(addrs)!r:.80}") from None
        return cls(_str(d, "cluster", "", w), _str(d, "brokerName", where=w), parsed,
                   d.get("enableControllerMode") is True)

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MixAll.MASTER_ID)

    def select_broker_addr(self) -> str | None:
        """The master's address, else a random slave's (what a consumer may read from; Java's
        selectBrokerAddr)."""
        if MixAll.MASTER_ID in self.broker_addrs:
            return self.broker_addrs[MixAll.MASTER_ID]
        return random.choice(list(self.broker_addrs.values())) if self.broker_addrs else None

    def clone(self) -> "BrokerData":
        return BrokerData(self.cluster, self.broker_name, dict(self.broker_addrs), self.enable_controller_mode)


@attrs.define
class TopicRouteData:
    """The name server's route of a topic (one type for every side), with what a producer and a
    consumer derive from it."""

    queue_datas: list[QueueData] = attrs.field(factory=list)
    broker_datas: list[BrokerData] = attrs.field(factory=list)
    order_topic_conf: str | None = None
    filter_server_table: dict[str, list[str]] = attrs.field(factory=dict)

    def to_json(self) -> dict:
        out = {"brokerDatas": [b.to_json() for b in self.broker_datas],
               "filterServerTable": dict(self.filter_server_table),
               "queueDatas": [q.to_json() for q in self.queue_datas]}
        if self.order_topic_conf is not None:
            out["orderTopicConf"] = self.order_topic_conf
        return out

    def encode(self) -> bytes:
        return dumps(self.to_json())

    @classmethod
    def decode(cls, body) -> "TopicRouteData":
        d = loads_lenient(body)
        _mapping(d, "bad TopicRouteData: expected an object, got ")
        order = d.get("orderTopicConf")
        return cls([QueueData.from_json(q) for q in d.get("queueDatas") or []],
                   [BrokerData.from_json(b) for b in d.get("brokerDatas") or []],
                   order if isinstance(order, str) else None,
                   dict(d.get("filterServerTable") or {}))

    def broker_data(self, broker_name: str) -> BrokerData | None:
        for bd in self.broker_datas:
            if bd.broker_name == broker_name:
                return bd
        return None

    def with_default_topic_queue_nums(self, queue_nums: int) -> "TopicRouteData":
        """TBW102 fallback: use the default topic's brokers, capping queue counts (Java does the same
        before a broker has auto-created the new topic)."""
        qds = [
            attrs.evolve(q, read_queue_nums=min(queue_nums, q.read_queue_nums),
                         write_queue_nums=min(queue_nums, q.read_queue_nums))
            for q in self.queue_datas
        ]
        return attrs.evolve(self, queue_datas=qds)

    def no_master(self) -> str | None:
        """Why a producer finds no queue to write to when the topic has writable queues whose broker
        groups have no master right now (only slaves registered), else None."""
        names = sorted({q.broker_name for q in self.queue_datas if PermName.is_writeable(q.perm)})
        groups = [self.broker_data(n) for n in names]
        if not groups or any(bd is not None and bd.master_addr is not None for bd in groups):
            return None
        slaves = sorted(a for bd in groups if bd is not None for a in bd.broker_addrs.values())
        which = ", ".join(names)
        text = (f"broker group {which} has no master" if len(names) == 1 else
                f"none of the broker groups {which} has a master")
        text += f" (only slaves registered: {', '.join(slaves)})" if slaves else ""
        if all(bd is not None and bd.enable_controller_mode for bd in groups):
            return text + "; a new master is being elected (controller mode): retry in a few seconds"
        return text + "; start the master again (a slave is read-only)"

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues (topicRouteData2TopicSubscribeInfo)."""
        out = []
        for qd in self.queue_datas:
            if PermName.is_readable(qd.perm):
                out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        return sorted(out)

    def publish_queues(self, topic: str) -> tuple[list[MessageQueue], bool]:
        """The writable queues on brokers with a master, and whether the topic is ordered (its
        orderTopicConf lists the queues): topicRouteData2TopicPublishInfo's part."""
        queues: list[MessageQueue] = []
        order = False
        if self.order_topic_conf:
            # "brokerA:8;brokerB:8": ordered topics list their queues explicitly
            for item in self.order_topic_conf.split(";"):
                name, _, n = item.partition(":")
                if name and n.strip().isdigit():
                    queues.extend(MessageQueue(topic, name, i) for i in range(int(n)))
            order = True
        else:
            for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
                if not PermName.is_writeable(qd.perm):
                    continue
                bd = self.broker_data(qd.broker_name)
                if bd is None or bd.master_addr is None:
                    continue
                queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
        return queues, order


@attrs.define
class ClusterInfo:
    broker_addr_table: dict[str, BrokerData] = attrs.field(factory=dict)
    cluster_addr_table: dict[str, set[str]] = attrs.field(factory=dict)

    def encode(self) -> bytes:
        return dumps({"brokerAddrTable": {k: v.to_json() for k, v in self.broker_addr_table.items()},
                      "clusterAddrTable": {k: sorted(v) for k, v in self.cluster_addr_table.items()}})

    @classmethod
    def decode(cls, body) -> "ClusterInfo":
        d = loads_lenient(body)
        _mapping(d, "bad ClusterInfo: expected an object, got ")
        return cls({k: BrokerData.from_json(v) for k, v in (d.get("brokerAddrTable") or {}).items()},
                   {k: set(v) for k, v in (d.get("clusterAddrTable") or {}).items()})


# --- broker registration -----------------------------------------------------------------------------
@attrs.define
class DataVersion:
    """Version of a broker's topic config table; a change makes the name server re-read it.
    `state_version` (RocketMQ 5's stateVersion): in a registration, the master epoch the broker
    holds in controller mode - the name server ignores a master registering with a lower one than
    it saw; 0 in manual mode, where it is not written (the JSON stays RocketMQ 4's)."""
    timestamp: int = attrs.field(factory=lambda: int(time.time() * 1000))
    counter: int = 0
    state_version: int = 0

    def next_version(self) -> None:
        self.timestamp = int(time.time() * 1000)
        self.counter += 1

    def to_json(self) -> dict:
        if self.state_version:
            return {"counter": self.counter, "stateVersion": self.state_version, "timestamp": self.timestamp}
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, d: Any) -> "DataVersion":
        if not isinstance(d, Mapping):
            return cls(0, 0)
        return cls(_int(d, "timestamp", 0, "dataVersion "), _int(d, "counter", 0, "dataVersion "),
                   _int(d, "stateVersion", 0, "dataVersion "))


_TOPIC_CONFIG_FIELDS = (  # attribute name, JSON name, default
    ("topic_name", "topicName", None), ("read_queue_nums", "readQueueNums", 16),
    ("write_queue_nums", "writeQueueNums", 16), ("perm", "perm", 6),
    ("topic_filter_type", "topicFilterType", "SINGLE_TAG"), ("topic_sys_flag", "topicSysFlag", 0),
    ("order", "order", False),
)


_PLAIN = (int, str, bool, type(None))


def topic_config_to_json(topic: str, config: Any) -> dict:
    """A TopicConfig as Java writes it, from a dict (Java names) or an object (snake_case attributes)."""
    # (a name server decodes every topic of every full registration: one type test per config,
    # not an isinstance(Mapping) per field)
    if type(config) is dict or isinstance(config, Mapping):
        get = config.get
        out = {key: get(key, get(attr, default)) for attr, key, default in _TOPIC_CONFIG_FIELDS}
    else:
        out = {key: getattr(config, attr, default) for attr, key, default in _TOPIC_CONFIG_FIELDS}
    for key, value in out.items():
        if type(value) not in _PLAIN and hasattr(value, "value") and not isinstance(value, (int, str)):
            out[key] = value.value  # an enum (topic filter type)
    if out["topicName"] is None:
        out["topicName"] = topic
    return out


# REGISTER_BROKER ext field rmq's brokers add to their full (periodic) registration: the body carries
# the broker's whole topic table, so the name server may drop the topics it lacks.  RocketMQ 4.9's
# brokers never send it (their name server only adds and updates); Java's name server ignores it.
REGISTER_ALL = "registerAll"


def register_body_json(data_version: "DataVersion", table_members: str, filter_server_list: Iterable[str] = ()) -> bytes:
    """RegisterBrokerBody's JSON, with the topic table given as encoded object members
    (`"T":{...},"U":{...}`): a broker holding its entries encoded registers by joining strings."""
    return (f'{{"filterServerList":{json.dumps(list(filter_server_list))},"topicConfigSerializeWrapper":'
            f'{{"dataVersion":{dumps(data_version.to_json()).decode()},"topicConfigTable":{{{table_members}}}}}}}'
            ).encode("utf-8")


@attrs.define
class RegisterBrokerBody:
    topic_config_table: dict[str, dict] = attrs.field(factory=dict)  # topic -> TopicConfig JSON dict
    data_version: DataVersion = attrs.field(factory=DataVersion)
    filter_server_list: list[str] = attrs.field(factory=list)

    @classmethod
    def build(cls, topic_configs: Mapping[str, Any], data_version: DataVersion,
              filter_server_list: Iterable[str] = ()) -> "RegisterBrokerBody":
        return cls({t: topic_config_to_json(t, c) for t, c in topic_configs.items()}, data_version,
                   list(filter_server_list))

    def encode(self, compress: bool = False) -> bytes:
        if compress:
            return self.encode_compressed(
                self.data_version, ((c["topicName"], c["readQueueNums"], c["writeQueueNums"], c["perm"],
                                     c["topicFilterType"]) for c in self.topic_config_table.values()),
                self.filter_server_list)
        table = dumps(self.topic_config_table).decode("utf-8")
        return register_body_json(self.data_version, table[1:-1], self.filter_server_list)

    @classmethod
    def decode(cls, body, compressed: bool = False) -> "RegisterBrokerBody":
        if compressed:
            return cls._decode_compressed(body)
        d = loads_lenient(body)
        _mapping(d, "bad RegisterBrokerBody: expected an object, got ")
        # Brokers before V3_0_11 sent the bare TopicConfigSerializeWrapper.
        wrapper = d.get("topicConfigSerializeWrapper", d if "topicConfigTable" in d else {})
        _mapping(wrapper, "bad topicConfigSerializeWrapper: ")
        table = wrapper.get("topicConfigTable") or {}
        _mapping(table, "bad topicConfigTable: ")
        configs = {}
        for topic, config in table.items():
            if type(config) is not dict and not isinstance(config, Mapping):
                raise RemotingCommandError(f"bad topic config for {topic!r}: {config!r:.80}")
            c = configs[str(topic)] = topic_config_to_json(str(topic), config)
            for key in ("readQueueNums", "writeQueueNums", "perm", "topicSysFlag"):
                if type(c[key]) is not int:  # (a string number is accepted; anything else is named)
                    c[key] = _int(c, key, where=f"topic config {topic!r} ")
        servers = d.get("filterServerList") or []
        return cls(configs, DataVersion.from_json(wrapper.get("dataVersion")),
                   [str(s) for s in servers] if isinstance(servers, list) else [])

    # Java's compressedRegister form (RegisterBrokerBody.encode(true)): one zlib stream (Deflater
    # BEST_COMPRESSION) of big-endian int32-length-prefixed parts: the DataVersion JSON, the topic
    # count, one `name read write perm filterType` line per topic (TopicConfig.encode: no sys flag,
    # no order), then the filter server list JSON.
    @staticmethod
    def encode_compressed(data_version: "DataVersion", entries: Iterable[tuple], filter_server_list: Iterable[str] = ()) -> bytes:
        """`entries`: (topicName, readQueueNums, writeQueueNums, perm, topicFilterType) tuples."""
        pack = struct.Struct(">i").pack
        parts = []

        def put(b: bytes) -> None:
            parts.append(pack(len(b)))
            parts.append(b)

        put(dumps(data_version.to_json()))
        count = len(parts)
        parts.append(b"")  # the count, once known
        n = 0
        for name, r, w, perm, filter_type in entries:
            put(f"{name} {r} {w} {perm} {filter_type}".encode("utf-8"))
            n += 1
        parts[count] = pack(n)
        put(dumps(list(filter_server_list)))
        return zlib.compress(b"".join(parts), 9)

    @classmethod
    def _decode_compressed(cls, body) -> "RegisterBrokerBody":
        try:
            raw = zlib.decompressobj().decompress(bytes(body or b""), 64 * 1024 * 1024)
        except zlib.error as e:
            raise RemotingCommandError(f"bad compressed RegisterBrokerBody: {e}") from None
        pos = 0

        def take() -> bytes:
            nonlocal pos
            if pos + 4 > len(raw):
                raise RemotingCommandError("bad compressed RegisterBrokerBody: truncated")
            (n,) = struct.unpack_from(">i", raw, pos)
            if n < 0 or pos + 4 + n > len(raw):
                raise RemotingCommandError(f"bad compressed RegisterBrokerBody: part length {n}")
            pos += 4 + n
            return raw[pos - n:pos]

        version = DataVersion.from_json(loads_lenient(take()))
        if pos + 4 > len(raw):
            raise RemotingCommandError("bad compressed RegisterBrokerBody: truncated")
        (count,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        configs = {}
        for _ in range(max(count, 0)):
            fields = take().decode("utf-8", "replace").split(" ")
            if len(fields) < 5:
                raise RemotingCommandError(f"bad compressed topic config {' '.join(fields)!r}")
            try:
                configs[fields[0]] = {"topicName": fields[0], "readQueueNums": int(fields[1]),
                                      "writeQueueNums": int(fields[2]), "perm": int(fields[3]),
                                      "topicFilterType": fields[4], "topicSysFlag": 0, "order": False}
            except ValueError:
                raise RemotingCommandError(f"bad compressed topic config {' '.join(fields)!r}") from None
        servers = loads_lenient(take()) if pos < len(raw) else []
        return cls(configs, version, [str(s) for s in servers] if isinstance(servers, list) else [])


def kv_table_encode(table: Mapping[str, str]) -> bytes:
    """KVTable body: {"table": {key: value}}."""
    return dumps({"table": dict(table)})


def kv_table_decode(body) -> dict[str, str]:
    d = loads_lenient(body)
    table = d.get("table") if isinstance(d, Mapping) else None
    if not isinstance(table, Mapping):
        raise RemotingCommandError(f"bad KVTable body: {d!r:.80}")
    return {str(k): str(v) for k, v in table.items()}


def topic_list_encode(topics: Iterable[str], broker_addr: str | None = None) -> bytes:
    """TopicList body: {"topicList": [...]} (plus brokerAddr when known)."""
    out: dict[str, Any] = {"topicList": sorted(topics)}
    if broker_addr is not None:
        out["brokerAddr"] = broker_addr
    return dumps(out)


def topic_list_decode(body) -> list[str]:
    d = loads_lenient(body)
    topics = d.get("topicList") if isinstance(d, Mapping) else None
    if not isinstance(topics, list):
        raise RemotingCommandError(f"bad TopicList body: {d!r:.80}")
    return [str(t) for t in topics]


# fastjson writes Map<MessageQueue, Long> with object keys ({{"brokerName":..,"queueId":..,"topic":..}:12}),
# which is not JSON: each key object and its offset, then the key's fields in any order
_MQ_KEYED_ENTRY = re.compile(r'\{([^{}]*)\}\s*:\s*(-?\d+)')
_MQ_KEY_FIELD = re.compile(r'"(\w+)"\s*:\s*(?:"((?:[^"\\]|\\.)*)"|(-?\d+))')


def decode_reset_offset_body(body, topic: str | None = None) -> dict[MessageQueue, int]:
    """ResetOffsetBody's offsetTable (the RESET_CONSUMER_CLIENT_OFFSET request to a client, the
    INVOKE_BROKER_TO_RESET_OFFSET answer to mqadmin), in every form a broker writes: rmq's list of
    rows (`{"brokerName","queueId","topic","offset"}`, or the queue under `"mq"`), string keys
    `"topic@broker@queueId"`, and Java's object-keyed map.  `topic`: the topic of a row naming none."""
    if not body:
        return {}
    text = bytes(body).decode("utf-8", "replace")
    out: dict[MessageQueue, int] = {}
    try:
        raw = json.loads(text)
        table = raw.get("offsetTable", raw) if isinstance(raw, dict) else raw
        if isinstance(table, list):
            for row in table:
                q = row.get("mq", row)
                out[MessageQueue(q.get("topic", topic), q["brokerName"], int(q["queueId"]))] = int(row["offset"])
            return out
        for key, offset in (table or {}).items():
            t, b, q = key.split("@")
            out[MessageQueue(t, b, int(q))] = int(offset)
        return out
    except (ValueError, KeyError, AttributeError, TypeError):
        out.clear()
    for entry in _MQ_KEYED_ENTRY.finditer(text):
        fields = {name: json.loads(f'"{s}"') if num == "" else num
                  for name, s, num in _MQ_KEY_FIELD.findall(entry.group(1))}
        try:
            out[MessageQueue(fields.get("topic", topic), fields["brokerName"], int(fields["queueId"]))] = int(entry.group(2))
        except (KeyError, ValueError):
            continue
    return out
