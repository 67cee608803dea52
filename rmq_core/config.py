"""Configs as attrs classes, loaded from RocketMQ's `broker.conf` property names.

Each field carries its RocketMQ property name in metadata (`key`), so `storePathRootDir=/x` in a
file lands on `MessageStoreConfig.store_path_root_dir`.  Unknown keys and bad values raise
ConfigError naming the key, the value and what was expected.
"""
from __future__ import annotations

import difflib
import enum
import logging
import os
from typing import Any, Iterable, Mapping

import attrs

from rmq_core.errors import ConfigError

_log = logging.getLogger("rmq.broker")


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


# serverSocketBacklog: the accept queue of every socket rmq listens on (remoting, console, metrics,
# HA), as RocketMQ's NettyServerConfig.  asyncio's default (100) and socketserver's (5) overflow
# when a few hundred clients reconnect at once: each dropped SYN costs its client 1 s, then 3 s.
# The kernel caps it at net.core.somaxconn.
DEFAULT_SERVER_SOCKET_BACKLOG = 1024

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_TIME_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str) -> list[int]:
    """'1s 5s 1m' -> [1000, 5000, 60000] (ms per level, level 1 first)."""
    out = []
    for item in str(spec).split():
        unit = item[-1:]
        if unit not in _TIME_UNITS_MS:
            raise ConfigError(f"messageDelayLevel: bad level {item!r} (use a number with s, m, h or d)")
        try:
            n = int(item[:-1])
        except ValueError:
            raise ConfigError(f"messageDelayLevel: bad level {item!r} (use a number with s, m, h or d)") from None
        if n <= 0:
            raise ConfigError(f"messageDelayLevel: level {item!r} must be positive")
        out.append(n * _TIME_UNITS_MS[unit])
    if not out:
        raise ConfigError("messageDelayLevel: no levels given")
    return out


# --- generic properties loading -----------------------------------------------------------------
def prop(default, key: str, **kw):
    """An attrs field bound to the RocketMQ property `key`."""
    return attrs.field(default=default, metadata={"key": key}, **kw)


def read_properties_file(path: str) -> dict[str, str]:
    """Java .properties subset: `key=value` or `key: value`, `#`/`!` comments, blank lines."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path!r}: {e.strerror}") from None
    return parse_properties(text, path)


def parse_properties(text: str, where: str = "properties") -> dict[str, str]:
    """The .properties subset of read_properties_file from text (also the body of UPDATE_BROKER_CONFIG,
    UPDATE_NAMESRV_CONFIG and their GET answers); a bad line raises ConfigError naming it."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep <= 0:
            raise ConfigError(f"{where}:{lineno}: expected key=value, got {raw!r}")
        out[line[:sep].strip()] = line[sep + 1 :].strip()
    return out


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the nearest known name, else '': the tail of an unknown-name error."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _convert(where: str, field: attrs.Attribute, value: Any, key: str | None = None) -> Any:
    """`value` as the field's type; a bad value is a ConfigError naming `where` (the file it came
    from; "" for a keyword setting), the key and the accepted values."""
    key = key or field.metadata["key"]
    typ = field.type if not isinstance(field.type, str) else _TYPE_NAMES.get(field.type, str)
    if value is None or (isinstance(value, str) and not isinstance(typ, type)):
        return value
    try:
        if isinstance(typ, type) and issubclass(typ, enum.Enum):
            return value if isinstance(value, typ) else typ(str(value).strip().upper())
        if typ is bool:
            if isinstance(value, bool):
                return value
            v = str(value).strip().lower()
            if v in ("true", "1", "yes", "on"):
                return True
            if v in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if typ is int:
            return int(str(value).strip()) if not isinstance(value, int) else value
        if typ is float:
            return float(str(value).strip()) if not isinstance(value, (int, float)) else float(value)
        return str(value)
    except ValueError:
        expected = (
            " | ".join(m.value for m in typ) if isinstance(typ, type) and issubclass(typ, enum.Enum)
            else getattr(typ, "__name__", str(typ))
        )
        msg = f"bad value {value!r} for {key} (expected {expected})"
        raise ConfigError(f"{where}: {msg}" if where else msg) from None


_TYPE_NAMES = {"int": int, "bool": bool, "float": float, "str": str, "FlushDiskType": FlushDiskType,
               "BrokerRole": BrokerRole, "str | None": str, "int | None": int}


class PropertiesConfig:
    """Mixin: `from_properties`, `keys()`, `to_properties()` for attrs configs with `prop` fields."""

    @classmethod
    def keys(cls) -> dict[str, str]:
        """RocketMQ property name -> attribute name."""
        return {f.metadata["key"]: f.name for f in attrs.fields(cls) if "key" in f.metadata}

    @classmethod
    def from_properties(cls, props: Mapping[str, Any] | str | None = None, *, strict: bool = True,
                        where: str | None = None, **overrides):
        """Build from a mapping of RocketMQ property names (or a path to a .properties file).

        strict: unknown keys raise ConfigError (a typo must not be silently ignored).
        where: what errors name as the source of the properties (default: the file, else "config").
        overrides: attribute names (snake_case) that win over the file; errors name them as settings.
        """
        if isinstance(props, (str, os.PathLike)):
            where = where or os.fspath(props)
            props = read_properties_file(os.fspath(props))
        where = where or "config"
        props = dict(props or {})
        keymap = cls.keys()
        fields = {f.name: f for f in attrs.fields(cls)}
        kwargs = {}
        for k, v in props.items():
            name = keymap.get(k)
            if name is None:
                if strict:
                    raise ConfigError(f"{where}: unknown key {k!r}{did_you_mean(k, keymap)}")
                continue
            kwargs[name] = _convert(where, fields[name], v)
        for name, v in overrides.items():
            if name not in fields:
                raise ConfigError(f"unknown setting {name!r}{did_you_mean(name, fields)}")
            if v is not None:
                kwargs[name] = (_convert("", fields[name], v, f"setting {name}")
                                if "key" in fields[name].metadata else v)
        try:
            return cls(**kwargs)
        except ConfigError as e:  # a validator's complaint ("<key> must be > 0, got 0"): say where
            raise ConfigError(f"{where}: {e}") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None

    def to_properties(self, *, hide_secrets: bool = False) -> dict[str, str]:
        """key -> value text; hide_secrets: a secret setting (secretKey) shown as *** (to show)."""
        out = {}
        for f in attrs.fields(type(self)):
            if "key" in f.metadata:
                v = getattr(self, f.name)
                if v is None:
                    continue
                if hide_secrets and f.metadata.get("secret"):
                    out[f.metadata["key"]] = "***"
                    continue
                out[f.metadata["key"]] = v.value if isinstance(v, enum.Enum) else ("true" if v is True else "false" if v is False else str(v))
        return out


def _positive(inst, attribute, value):
    if value <= 0:
        raise ConfigError(f"{attribute.metadata.get('key', attribute.name)} must be > 0, got {value!r}")


def _ext_file_size(inst, attribute, value):
    if value != attribute.default:
        raise ConfigError(f"mappedFileSizeConsumeQueueExt={value} is not supported: rmq keeps one consume-queue ext "
                          "file of filter bit maps beside each consume-queue file, sized by "
                          "mappedFileSizeConsumeQueue and bitMapLengthConsumeQueueExt; remove the setting")


def _transfer_by_heap(inst, attribute, value):
    if not value:
        raise ConfigError("transferMsgByHeap=false (RocketMQ's zero-copy transfer of a pull's messages from the "
                          "mapped commit log) is not supported: rmq copies them into the answer, as "
                          "transferMsgByHeap=true does; remove the setting")


def _optional_port(inst, attribute, value):
    if value is not None and not 0 <= value <= 65535:
        raise ConfigError(f"{type(inst).__name__}: {attribute.metadata['key']} must be a port within 0..65535, got {value!r}")


def _ratio_percent(inst, attribute, value):
    if not 1 <= value <= 99:
        raise ConfigError(f"{attribute.metadata['key']} must be within 1..99, got {value!r}")


def _hours_of_day(inst, attribute, value):
    hours = [h.strip() for h in str(value).split(";") if h.strip()]
    if not hours or not all(h.isdigit() and 0 <= int(h) <= 23 for h in hours):
        raise ConfigError(f"bad value {value!r} for {attribute.metadata['key']} (expected hours of the day "
                          f"0..23 separated by ';', e.g. 04 or 04;16)")


def _valid_delay_levels(inst, attribute, value):
    parse_delay_levels(value)


def _expand_home(path: str | None) -> str | None:
    return os.path.expanduser(path) if isinstance(path, str) else path


def _under_store_root(name: str) -> property:
    """A read-only property: `name` below the config's store_path_root_dir."""
    return property(lambda self: os.path.join(self.store_path_root_dir, name))


@attrs.define
class MessageStoreConfig(PropertiesConfig):
    # `~/rmq-store` in a broker.conf is the user's (a path a user owns, without writing out $HOME)
    store_path_root_dir: str = prop(os.path.join(os.path.expanduser("~"), "store"), "storePathRootDir",
                                    converter=_expand_home)
    store_path_commit_log: str | None = prop(None, "storePathCommitLog", converter=_expand_home)
    mapped_file_size_commit_log: int = prop(1024 * 1024 * 1024, "mappedFileSizeCommitLog", validator=_positive)
    mapped_file_size_consume_queue: int = prop(300_000 * 20, "mappedFileSizeConsumeQueue", validator=_positive)
    enable_consume_queue_ext: bool = prop(False, "enableConsumeQueueExt")
    mapped_file_size_consume_queue_ext: int = prop(48 * 1024 * 1024, "mappedFileSizeConsumeQueueExt",
                                                    validator=_ext_file_size)
    bit_map_length_consume_queue_ext: int = prop(64, "bitMapLengthConsumeQueueExt", validator=_positive)
    flush_disk_type: FlushDiskType = prop(FlushDiskType.ASYNC_FLUSH, "flushDiskType")
    flush_interval_commit_log: int = prop(500, "flushIntervalCommitLog", validator=_positive)
    flush_commit_log_least_pages: int = prop(4, "flushCommitLogLeastPages")
    flush_commit_log_thorough_interval: int = prop(10_000, "flushCommitLogThoroughInterval")
    flush_interval_consume_queue: int = prop(1000, "flushIntervalConsumeQueue", validator=_positive)
    flush_consume_queue_least_pages: int = prop(2, "flushConsumeQueueLeastPages")
    sync_flush_timeout: int = prop(5000, "syncFlushTimeout", validator=_positive)
    file_reserved_time: int = prop(72, "fileReservedTime", validator=_positive)  # hours
    delete_when: str = prop("04", "deleteWhen", validator=_hours_of_day)  # hours of day, e.g. "04" or "04;16"
    clean_resource_interval: int = prop(10_000, "cleanResourceInterval", validator=_positive)
    disk_max_used_space_ratio: int = prop(75, "diskMaxUsedSpaceRatio", validator=_ratio_percent)
    disk_space_clean_forcibly_ratio: float = prop(0.85, "diskSpaceCleanForciblyRatio")
    disk_space_warning_level_ratio: float = prop(0.90, "diskSpaceWarningLevelRatio")
    max_message_size: int = prop(4 * 1024 * 1024, "maxMessageSize", validator=_positive)
    message_delay_level: str = prop(DEFAULT_DELAY_LEVELS, "messageDelayLevel", validator=_valid_delay_levels)
    message_index_enable: bool = prop(True, "messageIndexEnable")
    max_hash_slot_num: int = prop(5_000_000, "maxHashSlotNum", validator=_positive)
    max_index_num: int = prop(5_000_000 * 4, "maxIndexNum", validator=_positive)
    check_crc_on_recover: bool = prop(True, "checkCRCOnRecover")
    max_transfer_bytes_on_message_in_memory: int = prop(256 * 1024, "maxTransferBytesOnMessageInMemory")
    max_transfer_count_on_message_in_memory: int = prop(32, "maxTransferCountOnMessageInMemory")
    max_transfer_bytes_on_message_in_disk: int = prop(64 * 1024, "maxTransferBytesOnMessageInDisk")
    max_transfer_count_on_message_in_disk: int = prop(8, "maxTransferCountOnMessageInDisk")
    access_message_in_memory_max_ratio: int = prop(40, "accessMessageInMemoryMaxRatio")
    broker_role: BrokerRole = prop(BrokerRole.ASYNC_MASTER, "brokerRole")
    # Replication (RocketMQ's store/ha).  haListenPort None: the broker's listenPort + 1 (a store
    # used on its own without one does not listen for slaves); 0: any free port (tests).
    ha_listen_port: int | None = prop(None, "haListenPort", validator=_optional_port)
    ha_master_address: str | None = prop(None, "haMasterAddress")  # a slave's master, host:port of its HA listener
    ha_send_heartbeat_interval: int = prop(5000, "haSendHeartbeatInterval", validator=_positive)
    ha_housekeeping_interval: int = prop(20_000, "haHousekeepingInterval", validator=_positive)
    ha_transfer_batch_size: int = prop(32 * 1024, "haTransferBatchSize", validator=_positive)
    ha_slave_fallbehind_max: int = prop(256 * 1024 * 1024, "haSlaveFallbehindMax", validator=_positive)
    # Controller mode (RocketMQ 5's keys; the broker's enableControllerMode turns it on).  A put is
    # acknowledged by every member of the controller-confirmed sync state set (allAckInSyncStateSet)
    # or by minInSyncReplicas - 1 of them; a confirmed set smaller than minInSyncReplicas refuses puts.
    all_ack_in_sync_state_set: bool = prop(False, "allAckInSyncStateSet")
    min_in_sync_replicas: int = prop(1, "minInSyncReplicas", validator=_positive)
    # A member not caught up with the master for this long is proposed out of the set.  RocketMQ's
    # 15 s would stall an all-ack writer that long whenever a replica dies.
    ha_max_time_slave_not_catchup: int = prop(3000, "haMaxTimeSlaveNotCatchup", validator=_positive)
    timer_wheel_enable: bool = prop(True, "timerWheelEnable")
    timer_precision_ms: int = prop(100, "timerPrecisionMs", validator=_positive)
    # RocketMQ 5 timer: the farthest delivery time a message may ask for, and how many precision
    # slots ahead the timing wheel holds in memory (later ones stay in the log until their turn).
    timer_max_delay_sec: int = prop(3 * 24 * 3600, "timerMaxDelaySec", validator=_positive)
    timer_roll_window_slot: int = prop(2 * 24 * 3600, "timerRollWindowSlot", validator=_positive)
    # Where each broker setting not at its default came from (load_broker_conf): key -> ConfigOrigin.
    # Not a setting itself; getBrokerConfig shows it, updateBrokerConfig --reset falls back on it.
    config_origins: dict = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def commit_log_dir(self) -> str:
        return self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog")

    # the store's places below storePathRootDir, named as RocketMQ's StorePathConfigHelper names them
    consume_queue_dir = _under_store_root("consumequeue")
    consume_queue_ext_dir = _under_store_root("consumequeue_ext")
    index_dir = _under_store_root("index")
    config_dir = _under_store_root("config")
    abort_file = _under_store_root("abort")
    checkpoint_file = _under_store_root("checkpoint")

    @property
    def delay_levels_ms(self) -> list[int]:
        return parse_delay_levels(self.message_delay_level)

    @property
    def updated_config_file(self) -> str:
        """Where updateBrokerConfig writes what it changed (RocketMQ's brokerConfigPath when no -c
        file is given): read over broker.conf at the next start, until `--reset` drops a key."""
        return os.path.join(self.config_dir, "broker.properties")


@attrs.frozen
class ConfigOrigin:
    """Where a broker setting's value came from.  `kind`: "file" (the -c broker.conf), "updated"
    (persisted by updateBrokerConfig, in force), "pending" (persisted by updateBrokerConfig, in
    force from the next start: `pending` is that value), "argument" (a command-line flag or keyword
    argument), "standalone" (the embedded mode's laptop sizes); `source`: the file, if any; `under`:
    where the value an "updated" or "pending" one overrides came from (None: the default),
    `under_value` that value."""
    kind: str
    source: str = ""
    under: "ConfigOrigin | None" = None
    under_value: str | None = None
    pending: str | None = None

    def describe(self) -> str:
        under = self.under.describe() if self.under else "the default"
        if self.kind == "updated":
            return f"updateBrokerConfig ({self.source}), over {under}'s {self.under_value}"
        if self.kind == "pending":
            return f"{under}; updateBrokerConfig ({self.source}) makes it {self.pending} at the next start"
        return {"file": f"file {self.source}", "argument": "command line / argument",
                "standalone": "rmq standalone's default"}[self.kind]


def _default_plain_acl_file() -> str | None:
    home = os.environ.get("ROCKETMQ_HOME")
    return os.path.join(home, "conf", "plain_acl.yml") if home else None


@attrs.define
class BrokerConfig(PropertiesConfig):
    broker_cluster_name: str = prop("DefaultCluster", "brokerClusterName")
    broker_name: str = prop("broker-a", "brokerName")
    broker_id: int = prop(0, "brokerId")
    # Controller mode (RocketMQ 5): the controllers assign this broker's id and role; brokerId and
    # brokerRole of the file are not used (docs/failover.md)
    enable_controller_mode: bool = prop(False, "enableControllerMode")
    controller_addr: str | None = prop(None, "controllerAddr")  # 'host:port;host:port'
    broker_election_priority: int = prop(2**31 - 1, "brokerElectionPriority")  # lower is preferred
    # How long this broker's controller lease lasts without a heartbeat: the time from a master's
    # death to the election of the next.  RocketMQ's 10 s; ours 3 s, the shortest etcd serves
    # reliably (leases count whole seconds, with a floor of about 1.5 etcd election timeouts), and
    # several heartbeats long so that one slow heartbeat does not cost the group its master.
    controller_heart_beat_timeout_mills: int = prop(3000, "controllerHeartBeatTimeoutMills", validator=_positive)
    broker_heartbeat_interval: int = prop(500, "brokerHeartbeatInterval", validator=_positive)
    namesrv_addr: str | None = prop(None, "namesrvAddr")  # 'host:port;host:port'
    listen_port: int = prop(10911, "listenPort")
    # more addresses the broker serves on besides listenPort, of any transport scheme
    # ('unix:///run/rmq/broker-a.sock;...'): the same processors, steps and send lane
    listen_addresses: str | None = prop(None, "listenAddresses")
    # RocketMQ 5's gRPC protocol (apache.rocketmq.v2, for the 5.x clients) on this port of the
    # listen host: the proxy's key (rmq_core/proxy serves it in the broker, the proxy's "local"
    # mode); 0: off (`rmq standalone` turns it on at 8081)
    grpc_server_port: int = prop(0, "grpcServerPort", validator=_optional_port)
    # the shortest invisible duration a gRPC ReceiveMessage may ask for (the proxy's key and default)
    min_invisible_time_mills_for_recv: int = prop(10_000, "minInvisibleTimeMillsForRecv", validator=_positive)
    broker_ip1: str = prop("127.0.0.1", "brokerIP1")
    broker_ip2: str | None = prop(None, "brokerIP2")
    broker_permission: int = prop(6, "brokerPermission")
    # a slave serves pulls (a master then sends a consumer that lags by more than
    # accessMessageInMemoryMaxRatio of memory to its slave, suggestWhichBrokerId)
    slave_read_enable: bool = prop(False, "slaveReadEnable")
    auto_create_topic_enable: bool = prop(True, "autoCreateTopicEnable")
    auto_create_subscription_group: bool = prop(True, "autoCreateSubscriptionGroup")
    default_topic_queue_nums: int = prop(8, "defaultTopicQueueNums", validator=_positive)
    cluster_topic_enable: bool = prop(True, "clusterTopicEnable")
    broker_topic_enable: bool = prop(True, "brokerTopicEnable")
    enable_property_filter: bool = prop(False, "enablePropertyFilter")
    enable_calc_filter_bit_map: bool = prop(False, "enableCalcFilterBitMap")
    filter_support_retry: bool = prop(False, "filterSupportRetry")
    expect_consumer_num_use_filter: int = prop(32, "expectConsumerNumUseFilter")
    max_error_rate_of_bloom_filter: int = prop(20, "maxErrorRateOfBloomFilter")
    long_polling_enable: bool = prop(True, "longPollingEnable")
    short_polling_time_mills: int = prop(1000, "shortPollingTimeMills")
    notify_consumer_ids_changed_enable: bool = prop(True, "notifyConsumerIdsChangedEnable")
    transfer_msg_by_heap: bool = prop(True, "transferMsgByHeap", validator=_transfer_by_heap)
    # A reader on this host (a loopback peer: rmq's Spark reader) that asks for it is answered a
    # pull's records as where they lie in the commit-log files, and reads them there itself:
    # the bytes cross no socket (HDFS's short-circuit local reads).  Off: always over the connection.
    pull_local_read_enable: bool = prop(True, "pullLocalReadEnable")
    register_name_server_period: int = prop(30_000, "registerNameServerPeriod")
    # The full registration in RocketMQ's deflate layout (off, as in RocketMQ: that layout drops
    # each topic's topicSysFlag and order, and level-9 zlib costs CPU the plain body does not; it
    # pays off only when the name servers are far away and the table large).
    compressed_register: bool = prop(False, "compressedRegister")
    server_socket_backlog: int = prop(DEFAULT_SERVER_SOCKET_BACKLOG, "serverSocketBacklog", validator=_positive)
    flush_consumer_offset_interval: int = prop(5000, "flushConsumerOffsetInterval")
    client_channel_max_idle_time_seconds: int = prop(120, "clientChannelMaxIdleTimeSeconds")
    reject_transaction_message: bool = prop(False, "rejectTransactionMessage")
    transaction_time_out: int = prop(6000, "transactionTimeOut")
    transaction_check_max: int = prop(15, "transactionCheckMax")
    transaction_check_interval: int = prop(60_000, "transactionCheckInterval")
    # creates msgTraceTopicName at start (so, as in RocketMQ, updateBrokerConfig's change takes effect
    # after a restart)
    trace_topic_enable: bool = prop(False, "traceTopicEnable")
    msg_trace_topic_name: str = prop("RMQ_SYS_TRACE_TOPIC", "msgTraceTopicName")
    rebalance_lock_max_live_time: int = prop(60_000, "rebalanceLockMaxLiveTime")  # orderly queue lock lease
    error_reply_delay_ms: int = prop(1000, "errorReplyDelayMs")  # C++ client retries at once: slow it down
    # A refused queue lock is answered after this long: the C++ client retries at once, while a
    # Java client gives up on a lock call after 1 s, so the delay stays under that.
    lock_refuse_reply_delay_ms: int = prop(500, "lockRefuseReplyDelayMs")
    server_max_frame_length: int = prop(16 * 1024 * 1024, "serverMaxFrameLength")
    # RocketMQ 5's metrics keys: DISABLE | PROM | LOG (or an exporter a plugin adds)
    metrics_exporter_type: str = prop("DISABLE", "metricsExporterType")
    metrics_prom_exporter_host: str | None = prop(None, "metricsPromExporterHost")  # default: brokerIP1
    metrics_prom_exporter_port: int = prop(5557, "metricsPromExporterPort")
    metrics_logging_exporter_interval_in_mills: int = prop(10_000, "metricsLoggingExporterIntervalInMills",
                                                           validator=_positive)
    # ACL (RocketMQ 4.x): every request checked by the access validator named by accessValidator
    # (rmq's key; a plugin may add validators) against plainAclFile (rmq's key; RocketMQ's
    # $ROCKETMQ_HOME/conf/plain_acl.yml when ROCKETMQ_HOME is set), and as RocketMQ 4.9 every .yml /
    # .yaml under {rocketmqHome}/conf/acl
    acl_enable: bool = prop(False, "aclEnable")
    access_validator: str = prop("plain", "accessValidator")
    plain_acl_file: str | None = attrs.field(factory=lambda: _default_plain_acl_file(), metadata={"key": "plainAclFile"})
    rocketmq_home: str = attrs.field(factory=lambda: os.environ.get("ROCKETMQ_HOME", ""), metadata={"key": "rocketmqHome"})
    # the broker's own account, signing its requests to other brokers (a slave's sync of topics,
    # offsets and groups from a master with aclEnable=true): rmq's keys, RocketMQ 4.9 has none
    access_key: str | None = prop(None, "accessKey")
    secret_key: str | None = attrs.field(default=None, metadata={"key": "secretKey", "secret": True})

    @property
    def broker_addr(self) -> str:
        return f"{self.broker_ip1}:{self.listen_port}"

    @property
    def namesrv_addr_list(self) -> list[str]:
        return _address_list(self.namesrv_addr)

    @property
    def controller_addr_list(self) -> list[str]:
        return _address_list(self.controller_addr)


def _address_list(value: str | None) -> list[str]:
    """'host:port;host:port' as a list."""
    return [a.strip() for a in (value or "").split(";") if a.strip()]


@attrs.define
class ControllerConfig(PropertiesConfig):
    """A controller's settings (RocketMQ 5's ControllerConfig, with etcd as its consensus engine):
    from controller.conf (`rmq controller -c`), or from the name server's config when it embeds
    one (enableControllerInNamesrv=true)."""
    listen_port: int = prop(9878, "listenPort")
    controller_etcd_endpoints: str = prop("", "controllerEtcdEndpoints")  # 'host:port,host:port'
    controller_etcd_root: str = prop("/rmq/controller", "controllerEtcdRoot")
    controller_etcd_timeout_mills: int = prop(1000, "controllerEtcdTimeoutMills", validator=_positive)
    enable_elect_unclean_master: bool = prop(False, "enableElectUncleanMaster")
    # how often a controller looks for groups whose master's lease ran out (RocketMQ: 5 s; the
    # look is one etcd range read, and failover waits for it)
    scan_inactive_master_interval: int = prop(200, "scanInactiveMasterInterval", validator=_positive)

    def check(self, where: str = "controller config") -> "ControllerConfig":
        if not self.controller_etcd_endpoints.strip():
            raise ConfigError(f"{where}: controllerEtcdEndpoints is not set: the controller keeps its state in "
                              f"etcd (e.g. controllerEtcdEndpoints=127.0.0.1:2379)")
        return self


@attrs.define
class NamesrvConfig(PropertiesConfig):
    listen_port: int = prop(9876, "listenPort")
    listen_host: str = prop("0.0.0.0", "listenHost")
    rocketmq_home: str = prop(os.environ.get("ROCKETMQ_HOME", ""), "rocketmqHome")
    kv_config_path: str = prop(os.path.join(os.path.expanduser("~"), "namesrv", "kvConfig.json"), "kvConfigPath")
    order_message_enable: bool = prop(False, "orderMessageEnable")
    scan_not_active_broker_interval: int = prop(5000, "scanNotActiveBrokerInterval")
    broker_channel_expired_time: int = prop(120_000, "brokerChannelExpiredTime")
    server_max_frame_length: int = prop(16 * 1024 * 1024, "serverMaxFrameLength")
    server_socket_backlog: int = prop(DEFAULT_SERVER_SOCKET_BACKLOG, "serverSocketBacklog", validator=_positive)
    metrics_exporter_type: str = prop("DISABLE", "metricsExporterType")
    metrics_prom_exporter_host: str | None = prop(None, "metricsPromExporterHost")  # default: the listen host
    metrics_prom_exporter_port: int = prop(5557, "metricsPromExporterPort")
    metrics_logging_exporter_interval_in_mills: int = prop(10_000, "metricsLoggingExporterIntervalInMills",
                                                           validator=_positive)
    enable_controller_in_namesrv: bool = prop(False, "enableControllerInNamesrv")


def load_namesrv_conf(props: Mapping[str, Any] | str | None = None, *, where: str | None = None,
                      **overrides) -> tuple[NamesrvConfig, ControllerConfig]:
    """A name server's config file, which also carries its embedded controller's keys (as
    RocketMQ 5's namesrv.conf does): keys of either are accepted, any other is an error."""
    if isinstance(props, (str, os.PathLike)):
        where = where or os.fspath(props)
        props = read_properties_file(os.fspath(props))
    where = where or "namesrv config"
    props = dict(props or {})
    nkeys, ckeys = NamesrvConfig.keys(), ControllerConfig.keys()
    unknown = [k for k in props if k not in nkeys and k not in ckeys]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], {**nkeys, **ckeys})}")
    namesrv = NamesrvConfig.from_properties({k: v for k, v in props.items() if k in nkeys}, where=where, **overrides)
    controller = ControllerConfig.from_properties({k: v for k, v in props.items() if k in ckeys}, where=where)
    if namesrv.enable_controller_in_namesrv:
        controller.check(where)
    return namesrv, controller


def load_broker_conf(props: Mapping[str, Any] | str | None = None, *, defaults: Mapping[str, Any] | None = None,
                     where: str | None = None, updated: bool = True,
                     **overrides) -> tuple[BrokerConfig, MessageStoreConfig]:
    """Split one broker.conf into the broker's and the store's settings (as RocketMQ does); any key
    that neither knows is an error naming the file (`where`) and the key.  `defaults`: property
    values the file may override (the embedded mode's small segments); `overrides`: attribute
    names that win over the file.  `updated`: what updateBrokerConfig wrote into the store
    (`updated_config_file`) wins over the file (RocketMQ rewrites its -c file instead); each such
    value is logged at start, naming what it overrides and how to drop it.  Where every value
    came from is kept in the store config's `config_origins`."""
    if isinstance(props, (str, os.PathLike)):
        where = where or os.fspath(props)
        props = read_properties_file(os.fspath(props))
    where = where or "broker config"
    given = dict(props or {})
    props = {**(defaults or {}), **given}
    bkeys, skeys = BrokerConfig.keys(), MessageStoreConfig.keys()
    unknown = [k for k in props if k not in bkeys and k not in skeys]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], {**bkeys, **skeys})}")
    b_over = {k: v for k, v in overrides.items() if k in attrs.fields_dict(BrokerConfig)}
    s_over = {k: v for k, v in overrides.items() if k in attrs.fields_dict(MessageStoreConfig)}
    bad = sorted(set(overrides) - set(b_over) - set(s_over))
    if bad:
        known = {**attrs.fields_dict(BrokerConfig), **attrs.fields_dict(MessageStoreConfig)}
        raise ConfigError(f"unknown setting {bad[0]!r}{did_you_mean(bad[0], known)}")
    broker = BrokerConfig.from_properties({k: v for k, v in props.items() if k in bkeys}, where=where, **b_over)
    store = MessageStoreConfig.from_properties({k: v for k, v in props.items() if k in skeys}, where=where, **s_over)
    origins = {k: ConfigOrigin("file", where) if k in given else ConfigOrigin("standalone") for k in props}
    key_of = {name: key for keys in (bkeys, skeys) for key, name in keys.items()}
    origins.update({key_of[n]: ConfigOrigin("argument") for n, v in overrides.items() if v is not None and n in key_of})
    store.config_origins = origins
    if updated and os.path.exists(store.updated_config_file):
        path = store.updated_config_file
        changed = read_properties_file(path)
        broker_u, store_u = load_broker_conf({**props, **changed}, where=f"{where} + {path}", updated=False, **overrides)
        before = {**broker.to_properties(), **store.to_properties()}
        addr = f"{broker_u.broker_ip1}:{broker_u.listen_port}"
        for key, value in changed.items():
            under = origins.get(key)
            if under is not None and under.kind == "argument":
                continue  # a flag or keyword argument wins over both
            origins[key] = ConfigOrigin("updated", path, under, before.get(key))
            # one line per persisted value: what it overrides, and the way back to that
            _log.warning("%s=%s (persisted by updateBrokerConfig in %s) overrides %s: %s; to go back to it: "
                         "rmq admin updateBrokerConfig -b %s -k %s --reset", key, value, path,
                         under.describe() if under else "the default", before.get(key), addr, key)
        store_u.config_origins = origins
        return broker_u, store_u
    return broker, store


# Keys a running broker applies at once through updateBrokerConfig: the services read them where
# they act (the store refreshes what it keeps, MessageStore.apply_config).  Any other key is written
# to the store's updated_config_file and takes effect after a restart (they name or place the
# broker, size its files, or are read once by a service as it starts - in RocketMQ too).
RUNTIME_BROKER_KEYS = frozenset({
    # store
    "maxMessageSize", "flushIntervalCommitLog", "flushCommitLogLeastPages", "flushCommitLogThoroughInterval",
    "flushIntervalConsumeQueue", "flushConsumeQueueLeastPages", "syncFlushTimeout", "fileReservedTime",
    "deleteWhen", "cleanResourceInterval", "diskMaxUsedSpaceRatio", "diskSpaceCleanForciblyRatio",
    "diskSpaceWarningLevelRatio", "maxTransferBytesOnMessageInMemory", "maxTransferCountOnMessageInMemory",
    "maxTransferBytesOnMessageInDisk", "maxTransferCountOnMessageInDisk", "accessMessageInMemoryMaxRatio",
    "timerWheelEnable", "timerMaxDelaySec",
    # broker
    "namesrvAddr", "brokerPermission", "autoCreateTopicEnable", "autoCreateSubscriptionGroup",
    "defaultTopicQueueNums", "enablePropertyFilter", "filterSupportRetry", "longPollingEnable",
    "shortPollingTimeMills", "notifyConsumerIdsChangedEnable", "rejectTransactionMessage",
    "transactionTimeOut", "transactionCheckMax", "errorReplyDelayMs",
    "lockRefuseReplyDelayMs", "pullLocalReadEnable",
})


def names(values: Iterable[str]) -> str:
    return ", ".join(sorted(values))
