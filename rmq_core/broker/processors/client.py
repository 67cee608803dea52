"""HEART_BEAT, UNREGISTER_CLIENT, CHECK_CLIENT_CONFIG, GET_CONSUMER_LIST_BY_GROUP,
QUERY/UPDATE_CONSUMER_OFFSET, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ."""
from __future__ import annotations

import asyncio
import json
import logging

from rmq_core.broker.client_manager import ClientChannelInfo, DuplicateClientIdError, parse_heartbeat
from rmq_core.common.subscription import SubscriptionData
from rmq_core.broker.processors import Processor
from rmq_core.broker.consumer_filter_manager import PropertyFilterDisabledError
from rmq_core.errors import FilterExpressionError, PluginNotFoundError
from rmq_core.message import ExpressionType, MessageQueue, MixAll
from rmq_core.remoting.codes import RequestCode, ResponseCode

log = logging.getLogger("rmq.broker")


def register_consumer(ctrl, group: str, info: ClientChannelInfo, consume_type: str, message_model: str,
                      consume_from_where: str, subscriptions) -> tuple[int, str] | None:
    """A consumer's registration in its group, one decision for a 4.x heartbeat and a RocketMQ 5
    client's settings alike: the group found (or made, autoCreateSubscriptionGroup), its %RETRY% topic
    in clustering mode, its SQL92 expressions checked and registered for the bit maps, then the
    consumer table.  None, or the refusal as (response code, remark)."""
    sg = ctrl.subscription_manager.find_or_create(group)
    if sg is None:
        return ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist"
    if message_model == "CLUSTERING":
        ctrl.topic_manager.retry_topic(group, max(1, sg.retry_queue_nums))
    # An unparsable SQL92 expression is refused here, naming its position.  A well-formed one on a
    # broker with enablePropertyFilter=false is registered, as RocketMQ's broker does: CHECK_CLIENT_CONFIG
    # and the pull refuse it, naming the setting.
    for sub in subscriptions:
        if not ExpressionType.is_tag_type(sub.expression_type):
            try:
                ctrl.check_filter(group, sub)
            except (FilterExpressionError, PluginNotFoundError) as e:
                return ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e)
            except PropertyFilterDisabledError:
                pass
    ctrl.register_group_filters(group, subscriptions)
    try:
        changed = ctrl.consumer_manager.register_consumer(group, info, consume_type, message_model,
                                                         consume_from_where, subscriptions)
    except DuplicateClientIdError as e:
        log.warning("%s", e)
        return ResponseCode.SYSTEM_ERROR, str(e)
    if changed:
        log.info("new consumer connected, group: %s %s %s channel: %s", group, consume_type, message_model,
                 info.addr)
    return None


def json_body(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _lock_batch_body(request) -> tuple[str, str, list]:
    """(consumer group, client id, queues) of a LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body."""
    body = json.loads(bytes(request.body or b"{}"))
    return body["consumerGroup"], body["clientId"], [_mq_from_json(d) for d in body.get("mqSet") or []]


def _mq_from_json(d: dict) -> MessageQueue:
    return MessageQueue(str(d["topic"]), str(d["brokerName"]), int(d["queueId"]))


def _mq_to_json(mq: MessageQueue) -> dict:
    return {"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic}


class ClientManageProcessor(Processor):
    CODES = {
        RequestCode.HEART_BEAT: "heartbeat",
        RequestCode.UNREGISTER_CLIENT: "unregister_client",
        RequestCode.CHECK_CLIENT_CONFIG: "check_client_config",
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: "get_consumer_list_by_group",
        RequestCode.QUERY_CONSUMER_OFFSET: "query_consumer_offset",
        RequestCode.UPDATE_CONSUMER_OFFSET: "update_consumer_offset",
        RequestCode.LOCK_BATCH_MQ: "lock_batch_mq",
        RequestCode.UNLOCK_BATCH_MQ: "unlock_batch_mq",
    }

    async def heartbeat(self, ctx, request):
        ctrl = self.ctrl
        try:
            hb = parse_heartbeat(request.body)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat body: {e}")
        client_id = hb["client_id"]
        info_args = dict(channel=ctx, client_id=client_id, language=request.language, version=request.version)
        refused = None  # a group's refusal is answered after every other group and producer is registered
        for c in hb["consumers"]:
            if not c["group"]:
                continue
            bad = register_consumer(ctrl, c["group"], ClientChannelInfo(**info_args), c["consume_type"],
                                    c["message_model"], c["consume_from_where"], c["subscriptions"])
            if bad is not None:
                refused = refused or request.make_response(*bad)
        for group in hb["producers"]:
            ctrl.producer_manager.register_producer(group, ClientChannelInfo(**info_args))
        return refused or request.make_response(ResponseCode.SUCCESS, None)

    async def unregister_client(self, ctx, request):
        ctrl = self.ctrl
        producer_group = request.get_str("producerGroup")
        consumer_group = request.get_str("consumerGroup")
        if producer_group:
            ctrl.producer_manager.unregister_producer(producer_group, ctx)
        if consumer_group:
            ctrl.consumer_manager.unregister_consumer(consumer_group, ctx)
        if not producer_group and not consumer_group:
            ctrl.producer_manager.do_channel_close(ctx)
            ctrl.consumer_manager.do_channel_close(ctx)
        return request.make_response(ResponseCode.SUCCESS, None)

    async def check_client_config(self, ctx, request):
        try:
            data = json.loads(bytes(request.body or b"{}"))
            sub = data.get("subscriptionData") or {}
            group = data.get("group") or ""
            etype = sub.get("expressionType") or ExpressionType.TAG
            if not ExpressionType.is_tag_type(etype):
                self.ctrl.check_filter(group, SubscriptionData.build(sub.get("topic", ""), sub.get("subString"), etype))
        except (FilterExpressionError, PluginNotFoundError) as e:
            return request.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e))
        except PropertyFilterDisabledError as e:
            return request.make_response(ResponseCode.NO_PERMISSION, str(e))
        except ValueError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad client config: {e}")
        return request.make_response(ResponseCode.SUCCESS, None)

    async def get_consumer_list_by_group(self, ctx, request):
        group = request.get_str("consumerGroup")
        info = self.ctrl.consumer_manager.get(group or "")
        if info is None or not info.channels:
            log.warning("getConsumerListByGroup: consumer group %s not exist or has no member (from %s)",
                        group, ctx.remote_address)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body({"consumerIdList": info.all_client_ids()}))

    async def query_consumer_offset(self, ctx, request):
        ctrl = self.ctrl
        group, topic, queue_id = request.get_str("consumerGroup"), request.get_str("topic"), request.get_int("queueId")
        offset = ctrl.offset_manager.query_offset(group, topic, queue_id)
        if offset >= 0:
            return request.make_response(ResponseCode.SUCCESS, None, {"offset": str(offset)})
        # Java's rule for a group without an offset: 0 while the queue still starts at 0 and its head
        # is in memory (the C++ client's Python API cannot choose where a new group starts).
        min_offset = ctrl.store.get_min_offset_in_queue(topic, queue_id)
        if min_offset <= 0 and not ctrl.check_in_disk_by_consume_offset(topic, queue_id, 0):
            return request.make_response(ResponseCode.SUCCESS, None, {"offset": "0"})
        return request.make_response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    async def update_consumer_offset(self, ctx, request):
        try:
            group, topic = request.get_str("consumerGroup"), request.get_str("topic")
            queue_id, offset = request.get_int("queueId"), request.get_int("commitOffset")
        except Exception as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad offset update: {e}")
        if not group or not topic or queue_id is None or offset is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "offset update needs consumerGroup, topic, queueId, commitOffset")
        # a slave keeps what it receives (its master is away, or the client chose it) for its
        # master to take back (rmq_core.broker.slave_sync)
        self.ctrl.offset_manager.commit_offset(ctx.remote_address, group, topic, queue_id, offset,
                                               self.ctrl.consumer_manager.client_id_of(group, ctx),
                                               received_by_slave=self.ctrl.is_slave)
        return request.make_response(ResponseCode.SUCCESS, None)

    async def lock_batch_mq(self, ctx, request):
        try:
            group, client_id, mqs = _lock_batch_body(request)
        except (ValueError, KeyError, TypeError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad lock request body: {e}")
        # Queue locks live on the master: a slave grants none, so an orderly consumer pauses while
        # its master is away instead of consuming in an order no lock guards.
        locked = set() if self.ctrl.is_slave else self.ctrl.lock_manager.try_lock_batch(group, mqs, client_id)
        if len(locked) < len(mqs):
            # The C++ client retries a refused lock immediately: answer a refusal slowly.
            await asyncio.sleep(self.ctrl.broker_config.lock_refuse_reply_delay_ms / 1000)
        return request.make_response(ResponseCode.SUCCESS, None, None,
                                     json_body({"lockOKMQSet": [_mq_to_json(m) for m in sorted(locked)]}))

    async def unlock_batch_mq(self, ctx, request):
        try:
            group, client_id, mqs = _lock_batch_body(request)
        except (ValueError, KeyError, TypeError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad unlock request body: {e}")
        self.ctrl.lock_manager.unlock_batch(group, mqs, client_id)
        return request.make_response(ResponseCode.SUCCESS, None)


def retry_topic_of(group: str) -> str:
    return MixAll.get_retry_topic(group)
