"""Request and response codes of the RocketMQ 4.x remoting protocol (values exactly as 4.9.7)."""
from __future__ import annotations

import enum

from rmq_core.message import PullStatus


class RequestCode(enum.IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    TRIGGER_DELETE_FILES = 27
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    GET_CLIENT_CONFIG = 47
    UPDATE_AND_CREATE_ACL_CONFIG = 50
    DELETE_ACL_CONFIG = 51
    GET_BROKER_CLUSTER_ACL_INFO = 52
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = 53
    GET_BROKER_CLUSTER_ACL_CONFIG = 54
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    SUSPEND_CONSUMER = 209
    RESUME_CONSUMER = 210
    RESET_CONSUMER_OFFSET_IN_CONSUMER = 211
    RESET_CONSUMER_OFFSET_IN_BROKER = 212
    ADJUST_CONSUMER_THREAD_POOL = 213
    WHO_CONSUME_THE_MESSAGE = 214
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    REGISTER_TOPIC_IN_NAMESRV = 217
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    RESET_CONSUMER_OFFSET = 222  # alias: the name the broker's admin processor uses
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    REGISTER_FILTER_SERVER = 301
    REGISTER_MESSAGE_FILTER_CLASS = 302
    QUERY_CONSUME_TIME_SPAN = 303
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    CLEAN_EXPIRED_CONSUMEQUEUE = 306
    GET_CONSUMER_RUNNING_INFO = 307
    QUERY_CORRECTION_OFFSET = 308
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    GET_UNIT_TOPIC_LIST = 311
    GET_HAS_UNIT_SUB_TOPIC_LIST = 312
    GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST = 313
    CLONE_GROUP_OFFSET = 314
    VIEW_BROKER_STATS_DATA = 315
    CLEAN_UNUSED_TOPIC = 316
    GET_BROKER_CONSUME_STATS = 317
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    SEND_BATCH_MESSAGE = 320
    QUERY_CONSUME_QUEUE = 321
    QUERY_DATA_VERSION = 322
    RESUME_CHECK_HALF_MESSAGE = 323
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327
    QUERY_TOPICS_BY_CONSUMER = 343
    QUERY_SUBSCRIPTION_BY_CONSUMER = 345
    GET_TOPIC_CONFIG = 351
    LITE_PULL_MESSAGE = 361
    # RocketMQ 5's pop consumption (rmq_core/broker/pop, docs/pop.md)
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151
    # RocketMQ 5's controller mode (rmq_core/controller, docs/failover.md)
    BROKER_HEARTBEAT = 904
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    CONTROLLER_GET_METADATA_INFO = 1005
    CONTROLLER_GET_SYNC_STATE_DATA = 1006
    GET_BROKER_EPOCH_CACHE = 1007
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    CLEAN_BROKER_DATA = 1011
    CONTROLLER_GET_NEXT_BROKER_ID = 1012
    CONTROLLER_APPLY_BROKER_ID = 1013
    # rmq's own: a controller asks a master to stop taking writes until the replica it is about to
    # elect holds everything (electMaster's planned switch-over)
    PREPARE_MASTER_SWITCH = 1090


class ResponseCode(enum.IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    FLUSH_DISK_FAILED = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
    DELETE_ACL_CONFIG_FAILED = 210
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211
    FLOW_CONTROL = 215
    # RocketMQ 5 gave 209 / 210 to long polling (an empty pop answers POLLING_TIMEOUT); aliases here
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210


# what a PULL_MESSAGE answer's code means to a client (the consumers' and the admin tool's pulls)
PULL_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


# what only a name server answers: a broker asked one of these was given as a name server's address
NAMESRV_REQUEST_CODES = frozenset({
    RequestCode.PUT_KV_CONFIG, RequestCode.GET_KV_CONFIG, RequestCode.DELETE_KV_CONFIG,
    RequestCode.GET_KVLIST_BY_NAMESPACE, RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER,
    RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_BROKER_CLUSTER_INFO,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER, RequestCode.ADD_WRITE_PERM_OF_BROKER,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.REGISTER_TOPIC_IN_NAMESRV, RequestCode.GET_TOPICS_BY_CLUSTER,
    RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS, RequestCode.GET_NAMESRV_CONFIG, RequestCode.UPDATE_NAMESRV_CONFIG,
})


def not_supported_remark(code: int, broker: bool) -> str:
    """REQUEST_CODE_NOT_SUPPORTED's remark; a broker asked a name server's question says what it is
    (a client given a broker's port as its name server)."""
    if broker and code in NAMESRV_REQUEST_CODES:
        return (f"request code {code_name(code)} is a name server's: this address is a broker, "
                "not a name server (a name server listens on port 9876 by default)")
    return f"request code {code} not supported"


class MQVersion:
    """Header `version` values that change behaviour (MQVersion.Version ordinals)."""
    V3_1_8 = 63  # what the C++ 1.2.x client sends
    V4_9_4 = 401  # from here a name server writes standard JSON (quoted brokerAddrs keys)
    CURRENT = 407  # V4_9_7, what we send

    # The enum's layout from V4_0_0_SNAPSHOT (212) on: per minor version twenty entries, a
    # SNAPSHOT and a release for each patch 0-9 (so V4_9_7 is 407, V5_1_2 437).
    _V4_BASE = 212

    @classmethod
    def ordinal(cls, version: str | None) -> int:
        """The ordinal of a release like '5.1.2' (a 5.x client's x-mq-client-version); 0 if unreadable."""
        try:
            major, minor, patch = (int(p) for p in (version or "").split("-")[0].split(".")[:3])
        except ValueError:
            return 0
        if major < 4 or not (0 <= minor <= 9 and 0 <= patch <= 9):
            return 0
        return cls._V4_BASE + (major - 4) * 200 + minor * 20 + patch * 2 + 1

    @classmethod
    def desc(cls, ordinal: int) -> str:
        """MQVersion.getVersionDesc: 'V5_1_2' for 437 (a number as it is outside the known layout)."""
        if ordinal == cls.V3_1_8:
            return "V3_1_8"
        n = ordinal - cls._V4_BASE
        if n < 0:
            return str(ordinal)
        major, rest = divmod(n, 200)
        minor, rest = divmod(rest, 20)
        patch, release = divmod(rest, 2)
        return f"V{major + 4}_{minor}_{patch}" + ("" if release else "_SNAPSHOT")


def code_name(code: int, *, response: bool = False) -> str:
    """'GET_ROUTEINFO_BY_TOPIC(105)' for logs; unknown codes print as numbers."""
    enum_cls = ResponseCode if response else RequestCode
    try:
        return f"{enum_cls(code).name}({code})"
    except ValueError:
        return str(code)
