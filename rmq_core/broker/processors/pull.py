"""PULL_MESSAGE (11) with long polling (RocketMQ's PullMessageProcessor)."""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os

from rmq_core.broker.processors import Processor
from rmq_core.broker.consumer_filter_manager import PropertyFilterDisabledError
from rmq_core.common.subscription import SubscriptionData
from rmq_core.common.sysflag import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND
from rmq_core.errors import FilterExpressionError, PluginNotFoundError
from rmq_core.filtering import RetryMessageFilter
from rmq_core.message import ExpressionType, MixAll, PermName
from rmq_core.remoting.codes import PULL_STATUS_BY_CODE, RequestCode, ResponseCode
from rmq_core.remoting.command import ManyMessageTransfer
from rmq_core.store import GetMessageStatus

log = logging.getLogger("rmq.broker")

_STATUS_TO_CODE = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}
# The codes a 4.x client treats as a normal pull result; anything else it re-pulls at once.
# rmq's own clients (language PYTHON: the lite pull consumer, Spark's executors) may take up to
# 1024 messages / 4 MiB in one pull; the 4.x caps (maxTransferCountOnMessageInMemory 32,
# maxTransferBytesOnMessageInMemory 256 KiB) stay for every other client, sized as Java's are.
RMQ_CLIENT_MAX_TRANSFER_COUNT = 1024
RMQ_CLIENT_MAX_TRANSFER_BYTES = 4 * 1024 * 1024
PULL_RESULT_CODES = frozenset(PULL_STATUS_BY_CODE)
# A local read (rmq's Spark reader on the broker's host asks with extFields localRead=true): the
# answer's extField localRecordRuns says where the records lie instead of carrying them, one line
# per commit-log segment, "<its first commit-log offset>,<start>,<end>[,<start>,<end>...]\t<absolute
# path>", positions in the file; the reader checks each record's physical offset against them.
LOCAL_READ = "localRead"
LOCAL_RECORD_RUNS = "localRecordRuns"
LOCAL_READ_MAX_TRANSFER_COUNT = 8192
LOCAL_READ_MAX_TRANSFER_BYTES = 8 * 1024 * 1024  # (the reader holds one such answer per task)


def encode_local_record_runs(file_runs) -> str | None:
    """GetMessageResult.file_runs as localRecordRuns; None when a path cannot be written in it."""
    lines = []
    for path, file_from, runs in file_runs:
        path = _absolute(path)
        if "\n" in path:
            return None
        lines.append(f"{file_from},{','.join(map(str, runs))}\t{path}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=4096)
def is_loopback_peer(addr: str) -> bool:
    """Whether a connection's remote address ('host:port', '[v6]:port') is on this host."""
    host = addr.rpartition(":")[0].strip("[]") if addr else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # (in-proc and unix-socket peers: no host)
        return False


_absolute = functools.lru_cache(maxsize=4096)(os.path.abspath)


# Subscriptions parsed from pull requests, by (topic, expression, type, version): a consumer sends
# the same one with every pull, and parsing it (tags split and hashed) was per-pull work.
_SUBSCRIPTION_CACHE_MAX = 10_000


class PullMessageProcessor(Processor):
    CODES = {RequestCode.PULL_MESSAGE: "pull_message"}

    def __init__(self, controller):
        super().__init__(controller)
        self._subscriptions: dict = {}

    def _subscription(self, topic: str, sub_string, expression_type: str, sub_version: int):
        cache = self._subscriptions
        key = (topic, sub_string, expression_type, sub_version)
        sub = cache.get(key)
        if sub is None:
            sub = SubscriptionData.build(topic, sub_string, expression_type, sub_version)
            if len(cache) >= _SUBSCRIPTION_CACHE_MAX:
                cache.clear()
            cache[key] = sub
        return sub

    async def pull_message(self, ctx, request):
        response = await self._process(ctx, request, broker_allow_suspend=True)
        if response is not None and response.code not in PULL_RESULT_CODES:
            # The C++ client re-pulls at once with no back-off: slow an error down (docs/protocol.md §9).
            await asyncio.sleep(self.ctrl.broker_config.error_reply_delay_ms / 1000)
        return response

    async def _process(self, ctx, request, broker_allow_suspend: bool):
        ctrl = self.ctrl
        bc = ctrl.broker_config
        try:
            group = request.get_str("consumerGroup")
            topic = request.get_str("topic")
            queue_id = request.get_int("queueId")
            queue_offset = request.get_int("queueOffset")
            max_msg_nums = request.get_int("maxMsgNums", 32)
            sys_flag = request.get_int("sysFlag", 0)
            commit_offset = request.get_int("commitOffset", -1)
            suspend_ms = request.get_int("suspendTimeoutMillis", 15000)
            sub_string = request.get_str("subscription")
            sub_version = request.get_int("subVersion", 0)
            expression_type = request.get_str("expressionType") or ExpressionType.TAG
        except Exception as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad pull request: {e}")
        if not group or not topic or queue_id is None or queue_offset is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         "pull request needs consumerGroup, topic, queueId and queueOffset")
        if not PermName.is_readable(bc.broker_permission):
            return request.make_response(ResponseCode.NO_PERMISSION,
                                         f"the broker[{bc.broker_ip1}] pulling message is forbidden")
        sg = ctrl.subscription_manager.find_or_create(group)
        if sg is None:
            return request.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                         f"subscription group [{group}] does not exist")
        if not sg.consume_enable:
            return request.make_response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        tc = ctrl.topic_manager.select(topic)
        if tc is None and ctrl.is_slave:
            tc = await ctrl.slave_synchronize.find_topic(topic)
        if tc is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                         f"topic[{topic}] not exist, apply first please!")
        if not PermName.is_readable(tc.perm):
            return request.make_response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if queue_id < 0 or queue_id >= tc.read_queue_nums:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{tc.read_queue_nums}] consumer:[{ctx.remote_address}]")

        has_subscription = bool(sys_flag & FLAG_SUBSCRIPTION)
        if has_subscription:
            sub = self._subscription(topic, sub_string, expression_type, sub_version)
        else:
            sub = ctrl.consumer_manager.find_subscription(group, topic)
            if sub is None:
                return request.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                             f"the consumer's subscription not exist, group: {group} topic: {topic}")
        try:
            message_filter = ctrl.build_message_filter(group, sub)
        except (FilterExpressionError, PluginNotFoundError) as e:
            return request.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e))
        except PropertyFilterDisabledError as e:
            return request.make_response(ResponseCode.NO_PERMISSION, str(e))
        if bc.filter_support_retry and topic.startswith(MixAll.RETRY_GROUP_TOPIC_PREFIX):
            message_filter = RetryMessageFilter(lambda real: ctrl.expression_filter_of(group, real))

        sc = ctrl.store_config
        ours = ctrl.client_understands_lz4(request)
        local = ours and bc.pull_local_read_enable and request.get_str(LOCAL_READ) == "true" and \
            is_loopback_peer(ctx.remote_address)
        if local:  # (nothing crosses the socket: a pull as large as a reader's batch)
            result = ctrl.store.get_message(
                group, topic, queue_id, queue_offset, max_msg_nums, message_filter,
                max_total_bytes=max(LOCAL_READ_MAX_TRANSFER_BYTES, sc.max_transfer_bytes_on_message_in_memory),
                max_transfer_count=min(max_msg_nums, LOCAL_READ_MAX_TRANSFER_COUNT))
        elif ours and max_msg_nums > sc.max_transfer_count_on_message_in_memory:
            # one of ours asking for a large pull (see RMQ_CLIENT_MAX_TRANSFER_COUNT)
            result = ctrl.store.get_message(
                group, topic, queue_id, queue_offset, max_msg_nums, message_filter,
                max_total_bytes=max(RMQ_CLIENT_MAX_TRANSFER_BYTES, sc.max_transfer_bytes_on_message_in_memory),
                max_transfer_count=min(max_msg_nums, RMQ_CLIENT_MAX_TRANSFER_COUNT))
        else:
            result = ctrl.store.get_message(group, topic, queue_id, queue_offset, max_msg_nums, message_filter)
        code = _STATUS_TO_CODE.get(result.status)
        if code is None:  # NO_MESSAGE_IN_QUEUE / NO_MATCHED_LOGIC_QUEUE
            code = ResponseCode.PULL_OFFSET_MOVED if queue_offset != 0 else ResponseCode.PULL_NOT_FOUND
        suggest = suggest_which_broker_id(bc, sg, result.suggest_pulling_from_slave)
        slave = ctrl.is_slave
        if code == ResponseCode.PULL_OFFSET_MOVED and slave:
            # A slave may be behind its master: it never corrects a consumer's offset (RocketMQ's
            # offsetCheckInSlave=false), the consumer asks again.
            code, suggest = ResponseCode.PULL_RETRY_IMMEDIATELY, sg.broker_id
        ext = {"nextBeginOffset": str(result.next_begin_offset), "minOffset": str(result.min_offset),
               "maxOffset": str(result.max_offset), "suggestWhichBrokerId": str(suggest)}

        # offsets committed with a pull are kept by a master only (a slave's come by
        # UPDATE_CONSUMER_OFFSET, see rmq_core.broker.slave_sync)
        store_offset_enable = broker_allow_suspend and bool(sys_flag & FLAG_COMMIT_OFFSET) and not slave
        if store_offset_enable and commit_offset is not None and commit_offset >= 0:
            ctrl.offset_manager.commit_offset(ctx.remote_address, group, topic, queue_id, commit_offset,
                                              ctrl.consumer_manager.client_id_of(group, ctx))

        if code == ResponseCode.SUCCESS:
            if ours:
                if local and result.file_runs is not None:
                    runs = encode_local_record_runs(result.file_runs)
                    if runs is not None:
                        ext[LOCAL_RECORD_RUNS] = runs
                        ctrl.stats.inc_get(group, topic, result.message_count, result.buffer_total_size)
                        return request.make_response(code, None, ext)
                # the records as the store has them: views of the mapped log, sent uncopied
                body = ManyMessageTransfer(result.message_buffer_list, result.buffer_total_size)
            else:
                body = ctrl.recompress_for_4x(result.buffer)
            ctrl.stats.inc_get(group, topic, result.message_count, len(body))
            return request.make_response(code, None, ext, body)
        if code == ResponseCode.PULL_NOT_FOUND and broker_allow_suspend and sys_flag & FLAG_SUSPEND:
            timeout_ms = suspend_ms if bc.long_polling_enable else bc.short_polling_time_mills
            fut = ctrl.pull_hold_service.hold(topic, queue_id, queue_offset, message_filter)
            try:
                await asyncio.wait_for(asyncio.shield(fut), max(0.0, timeout_ms / 1000))
            except asyncio.TimeoutError:
                pass
            finally:
                ctrl.pull_hold_service.release(topic, queue_id, fut)
            if ctx.closed:
                return None
            return await self._process(ctx, request, broker_allow_suspend=False)
        if code == ResponseCode.PULL_OFFSET_MOVED:
            log.info("PULL_OFFSET_MOVED: group=%s topic=%s queue=%d requested=%d next=%d min=%d max=%d",
                     group, topic, queue_id, queue_offset, result.next_begin_offset, result.min_offset,
                     result.max_offset)
        return request.make_response(code, None, ext)


def suggest_which_broker_id(bc, sg, pulling_from_slave: bool) -> int:
    """Which broker of the group the consumer should pull from next (RocketMQ 4.9's
    PullMessageProcessor): with slaveReadEnable, a consumer that lags by more than
    accessMessageInMemoryMaxRatio of memory goes to the group's whichBrokerWhenConsumeSlowly (1,
    the slave), any other to the group's brokerId (0); without it, always the master - a slave
    without slaveReadEnable serves the pull but sends the consumer back to its master."""
    if not bc.slave_read_enable:
        return MixAll.MASTER_ID
    return sg.which_broker_when_consume_slowly if pulling_from_slave else sg.broker_id
