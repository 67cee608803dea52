"""Admin and query requests (RocketMQ's AdminBrokerProcessor / QueryMessageProcessor): topics,
subscription groups, offsets, message lookup by id / key / time, stats, broker config."""
from __future__ import annotations

import json
import logging

from rmq_core.broker import message_type
from rmq_core.broker.processors import Processor
from rmq_core.broker.processors.client import json_body
from rmq_core.errors import IllegalArgumentError, StoreError
from rmq_core.message import MixAll, TopicValidator
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.broker.config_file import SubscriptionGroupConfig
from rmq_core.broker.topic_config_manager import TopicConfig

log = logging.getLogger("rmq.broker")


class AdminBrokerProcessor(Processor):
    CODES = {
        RequestCode.UPDATE_AND_CREATE_TOPIC: "update_and_create_topic",
        RequestCode.DELETE_TOPIC_IN_BROKER: "delete_topic",
        RequestCode.GET_ALL_TOPIC_CONFIG: "get_all_topic_config",
        RequestCode.GET_MAX_OFFSET: "get_max_offset",
        RequestCode.GET_MIN_OFFSET: "get_min_offset",
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: "search_offset_by_timestamp",
        RequestCode.GET_EARLIEST_MSG_STORETIME: "get_earliest_msg_storetime",
        RequestCode.VIEW_MESSAGE_BY_ID: "view_message_by_id",
        RequestCode.QUERY_MESSAGE: "query_message",
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: "update_and_create_subscription_group",
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: "get_all_subscription_group",
        RequestCode.DELETE_SUBSCRIPTIONGROUP: "delete_subscription_group",
        RequestCode.GET_BROKER_RUNTIME_INFO: "get_broker_runtime_info",
        RequestCode.GET_TOPIC_STATS_INFO: "get_topic_stats_info",
        RequestCode.GET_CONSUMER_CONNECTION_LIST: "get_consumer_connection_list",
        RequestCode.GET_PRODUCER_CONNECTION_LIST: "get_producer_connection_list",
        RequestCode.GET_CONSUME_STATS: "get_consume_stats",
        RequestCode.GET_ALL_CONSUMER_OFFSET: "get_all_consumer_offset",
        RequestCode.GET_ALL_DELAY_OFFSET: "get_all_delay_offset",
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: "reset_offset",
        RequestCode.GET_BROKER_CONFIG: "get_broker_config",
        RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: "query_topic_consume_by_who",
        RequestCode.GET_TOPIC_NAME_LIST: "get_topic_name_list",
    }

    def _slave_refuses(self, request):
        """Topics and subscription groups are the master's; its slave copies them (slave_sync)."""
        return request.make_response(
            ResponseCode.SYSTEM_ERROR,
            f"Can't modify topic or subscription group from slave broker {self.ctrl.broker_addr} "
            f"(brokerRole=SLAVE), please execute it from master broker.")

    # --- topics -----------------------------------------------------------------------------------
    async def update_and_create_topic(self, ctx, request):
        if self.ctrl.is_slave:
            return self._slave_refuses(request)
        topic = request.get_str("topic")
        try:
            TopicValidator.check_topic(topic)
            if topic == self.ctrl.broker_config.broker_cluster_name:
                raise IllegalArgumentError(f"bad topic name {topic!r}: it is the cluster name")
            tc = TopicConfig(
                topic_name=topic,
                read_queue_nums=request.get_int("readQueueNums", 8),
                write_queue_nums=request.get_int("writeQueueNums", 8),
                perm=request.get_int("perm", 6),
                topic_filter_type=request.get_str("topicFilterType", "SINGLE_TAG"),
                topic_sys_flag=request.get_int("topicSysFlag", 0),
                order=request.get_bool("order", False),
                # RocketMQ 5's '+message.type=FIFO': applied to the topic's current attributes
                attributes=message_type.parse_attributes(
                    request.get_str("attributes"), getattr(self.ctrl.topic_manager.select(topic), "attributes", None)),
            )
            await self.ctrl.topic_manager.update_topic_config(tc)  # answered once written and registered
        except (IllegalArgumentError, ValueError, StoreError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        return request.make_response(ResponseCode.SUCCESS, None)

    async def delete_topic(self, ctx, request):
        if self.ctrl.is_slave:
            return self._slave_refuses(request)
        topic = request.get_str("topic")
        if not topic:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "delete topic needs a topic")
        self.ctrl.topic_manager.delete(topic)
        self.ctrl.offset_manager.clean_offset_by_topic(topic)
        self.ctrl.store.delete_topics({topic})
        return request.make_response(ResponseCode.SUCCESS, None)

    async def get_all_topic_config(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, None, None,
                                     json_body(self.ctrl.topic_manager.serialize_wrapper()))

    async def get_topic_name_list(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, None, None,
                                     json_body({"topicList": sorted(self.ctrl.topic_manager.all())}))

    # --- offsets ------------------------------------------------------------------------------------
    def _topic_queue(self, request):
        topic, queue_id = request.get_str("topic"), request.get_int("queueId")
        if not topic or queue_id is None:
            raise IllegalArgumentError("request needs topic and queueId")
        return topic, queue_id

    def _queue_offset(self, request, offset_in_queue):
        """GET_MAX_OFFSET / GET_MIN_OFFSET: the answer of `offset_in_queue(topic, queueId)`."""
        try:
            topic, qid = self._topic_queue(request)
        except IllegalArgumentError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": str(offset_in_queue(topic, qid))})

    async def get_max_offset(self, ctx, request):
        return self._queue_offset(request, self.ctrl.store.get_max_offset_in_queue)

    async def get_min_offset(self, ctx, request):
        return self._queue_offset(request, self.ctrl.store.get_min_offset_in_queue)

    async def search_offset_by_timestamp(self, ctx, request):
        try:
            topic, qid = self._topic_queue(request)
            ts = request.get_int("timestamp")
        except (IllegalArgumentError, Exception) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        return request.make_response(ResponseCode.SUCCESS, None,
                                     {"offset": str(self.ctrl.store.get_offset_in_queue_by_time(topic, qid, ts or 0))})

    async def get_earliest_msg_storetime(self, ctx, request):
        try:
            topic, qid = self._topic_queue(request)
        except IllegalArgumentError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        return request.make_response(ResponseCode.SUCCESS, None,
                                     {"timestamp": str(self.ctrl.store.get_earliest_message_time(topic, qid))})

    async def get_all_consumer_offset(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, None, None,
                                     self.ctrl.offset_manager.encode().encode("utf-8"))

    async def get_all_delay_offset(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, None, None,
                                     json_body({"offsetTable": self.ctrl.schedule_service.offset_table()}))

    async def reset_offset(self, ctx, request):
        """INVOKE_BROKER_TO_RESET_OFFSET: set a group's offsets on a topic to the first message stored
        at or after `timestamp` (-1 = latest), and tell the group's online clients."""
        ctrl = self.ctrl
        topic, group = request.get_str("topic"), request.get_str("group")
        ts = request.get_int("timestamp", -1)
        tc = ctrl.topic_manager.select(topic or "")
        if tc is None or not group:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"[reset-offset] topic {topic!r} does not exist or no group")
        table = {}
        queue_id, offset = request.get_int("queueId", -1), request.get_int("offset", -1)
        if queue_id is not None and queue_id >= 0:
            # RocketMQ 5's per-queue form: one queue to an explicit offset (skipping a poison message)
            if queue_id >= tc.read_queue_nums or offset is None or offset < 0:
                return request.make_response(ResponseCode.SYSTEM_ERROR,
                                             f"[reset-offset] bad queueId {queue_id} / offset {offset} for topic {topic}")
            table[queue_id] = offset
        for qid in range(tc.read_queue_nums) if not table else ():
            if ts is None or ts < 0:
                off = ctrl.store.get_max_offset_in_queue(topic, qid)
            else:
                off = ctrl.store.get_offset_in_queue_by_time(topic, qid, ts)
            current = ctrl.offset_manager.query_offset(group, topic, qid)
            if not request.get_bool("isForce", True) and 0 <= current < off:
                off = current  # without force a reset only moves a group back (Broker2Client.resetOffset)
            table[qid] = off
        ctrl.offset_manager.reset_offsets(group, topic, table)
        await ctrl.notify_reset_offset(group, topic, ts, table)
        body = {"offsetTable": [{"brokerName": ctrl.broker_config.broker_name, "queueId": q, "topic": topic,
                                 "offset": o} for q, o in table.items()]}
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body(body))

    # --- messages -----------------------------------------------------------------------------------
    async def view_message_by_id(self, ctx, request):
        offset = request.get_int("offset")
        raw = self.ctrl.store.select_one_message_by_offset(offset) if offset is not None else None
        if raw is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return request.make_response(ResponseCode.SUCCESS, None, None, self.ctrl.recompress_for_request(request, raw))

    async def query_message(self, ctx, request):
        topic, key = request.get_str("topic"), request.get_str("key")
        max_num = request.get_int("maxNum", 32)
        begin, end = request.get_int("beginTimestamp", 0), request.get_int("endTimestamp", 2**62)
        if not topic or not key:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "query message needs topic and key")
        res = self.ctrl.store.query_message(topic, key, max_num, begin, end)
        ext = {"indexLastUpdateTimestamp": str(res.index_last_update_timestamp),
               "indexLastUpdatePhyoffset": str(res.index_last_update_phyoffset)}
        if not res.message_count:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND,
                                         "can not find message, maybe time range not correct", ext)
        body = self.ctrl.recompress_for_request(request, res.buffer)
        return request.make_response(ResponseCode.SUCCESS, None, ext, body)

    # --- subscription groups --------------------------------------------------------------------------
    async def update_and_create_subscription_group(self, ctx, request):
        if self.ctrl.is_slave:
            return self._slave_refuses(request)
        try:
            d = json.loads(bytes(request.body or b"{}"))
            cfg = SubscriptionGroupConfig.from_json(d)
            await self.ctrl.subscription_manager.update(cfg)
        except (ValueError, KeyError, TypeError, StoreError) as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad subscription group config: {e}")
        return request.make_response(ResponseCode.SUCCESS, None)

    async def get_all_subscription_group(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, None, None,
                                     json_body(self.ctrl.subscription_manager.serialize()))

    async def delete_subscription_group(self, ctx, request):
        if self.ctrl.is_slave:
            return self._slave_refuses(request)
        group = request.get_str("groupName")
        await self.ctrl.subscription_manager.delete(group or "")
        if request.get_bool("removeOffset", False):
            self.ctrl.offset_manager.remove_offset(group)
        return request.make_response(ResponseCode.SUCCESS, None)

    # --- stats / connections ----------------------------------------------------------------------------
    async def get_broker_runtime_info(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body({"table": self.ctrl.runtime_info()}))

    async def get_broker_config(self, ctx, request):
        props = {**self.ctrl.store_config.to_properties(), **self.ctrl.broker_config.to_properties(hide_secrets=True)}
        text = "\n".join(f"{k}={v}" for k, v in sorted(props.items()))
        # where each value not at its default came from, beside the body RocketMQ's tools read
        # (an ext field they ignore): the -c file, updateBrokerConfig's file, a flag
        origins = {k: o.describe() for k, o in self.ctrl.store_config.config_origins.items()}
        return request.make_response(ResponseCode.SUCCESS, None, {"configOrigins": json.dumps(origins)},
                                     text.encode("utf-8"))

    async def get_topic_stats_info(self, ctx, request):
        ctrl = self.ctrl
        topic = request.get_str("topic")
        tc = ctrl.topic_manager.select(topic or "")
        if tc is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = []
        for qid in range(tc.write_queue_nums):
            mx = ctrl.store.get_max_offset_in_queue(topic, qid)
            last = ctrl.store.get_message_store_timestamp(topic, qid, mx - 1) if mx > 0 else 0
            table.append({"brokerName": ctrl.broker_config.broker_name, "queueId": qid, "topic": topic,
                          "minOffset": ctrl.store.get_min_offset_in_queue(topic, qid), "maxOffset": mx,
                          "lastUpdateTimestamp": last})
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body({"offsetTable": table}))

    async def get_consume_stats(self, ctx, request):
        ctrl = self.ctrl
        group = request.get_str("consumerGroup") or ""
        only_topic = request.get_str("topic")
        topics = [only_topic] if only_topic else sorted(ctrl.offset_manager.which_topic_by_consumer(group))
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body(consume_stats_body(ctrl, group, topics)))

    async def get_consumer_connection_list(self, ctx, request):
        group = request.get_str("consumerGroup")
        info = self.ctrl.consumer_manager.get(group or "")
        if info is None:
            return request.make_response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {
            "connectionSet": [{"clientId": c.client_id, "clientAddr": c.addr, "language": c.language, "version": c.version}
                              for c in info.channels.values()],
            "subscriptionTable": {t: s.to_json() for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type, "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body(body))

    async def get_producer_connection_list(self, ctx, request):
        group = request.get_str("producerGroup")
        chans = self.ctrl.producer_manager.groups().get(group or "", [])
        body = {"connectionSet": [{"clientId": c.client_id, "clientAddr": c.addr, "language": c.language,
                                   "version": c.version} for c in chans]}
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body(body))

    async def query_topic_consume_by_who(self, ctx, request):
        topic = request.get_str("topic") or ""
        groups = self.ctrl.consumer_manager.query_topic_consume_by_who(topic)
        groups |= set(self.ctrl.offset_manager.which_group_by_topic(topic))
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body({"groupList": sorted(groups)}))


def consume_stats_body(ctrl, group: str, topics) -> dict:
    """ConsumeStats of a group over some topics: per queue the broker and consumer offsets, the
    store time of the last consumed message, and for pop consumption the messages handed out and
    not yet acked (`inflight`; a pop group's consumer offset is where its next pop starts, so its
    diff is what was never handed out) (GET_CONSUME_STATS, GET_BROKER_CONSUME_STATS)."""
    table = []
    pop = ctrl.pop_service
    for topic in topics:
        tc = ctrl.topic_manager.select(topic)
        if tc is None:
            continue
        for qid in range(tc.read_queue_nums):
            broker_off = ctrl.store.get_max_offset_in_queue(topic, qid)
            consumer_off = max(0, ctrl.offset_manager.query_offset(group, topic, qid))
            last = ctrl.store.get_message_store_timestamp(topic, qid, consumer_off - 1) if consumer_off > 0 else 0
            table.append({"brokerName": ctrl.broker_config.broker_name, "queueId": qid, "topic": topic,
                          "brokerOffset": broker_off, "consumerOffset": consumer_off, "lastTimestamp": last,
                          "inflight": pop.inflight_in_queue(group, topic, qid)})
    return {"consumeTps": ctrl.stats.group_get_tps(group), "offsetTable": table}



def is_sys_group(group: str) -> bool:
    return group.startswith(MixAll.CLIENT_INNER_PRODUCER_GROUP)
