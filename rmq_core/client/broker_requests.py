"""The client's answers to broker->client requests (RocketMQ's ClientRemotingProcessor):
NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY,
GET_CONSUMER_STATUS_FROM_CLIENT, RESET_CONSUMER_CLIENT_OFFSET and CHECK_TRANSACTION_STATE, registered
on the client instance's remoting client.  Blocking work (offset resets, listener calls) runs off
the event loop, on the instance's blocking executor."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING

from rmq_core.codec import decode_messages
from rmq_core.message import MessageConst
from rmq_core.remoting.body import decode_reset_offset_body
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from rmq_core.client.instance import MQClientInstance

log = logging.getLogger("rmq.client")

# the request codes BrokerRequestProcessor answers
BROKER_REQUEST_CODES = (
    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, RequestCode.GET_CONSUMER_RUNNING_INFO,
    RequestCode.CONSUME_MESSAGE_DIRECTLY, RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
    RequestCode.RESET_CONSUMER_CLIENT_OFFSET, RequestCode.CHECK_TRANSACTION_STATE,
)


class BrokerRequestProcessor:
    """Answers broker->client requests (ClientRemotingProcessor)."""

    def __init__(self, instance: "MQClientInstance"):
        self.instance = instance

    async def process_request(self, ctx, request: RemotingCommand):
        code = request.code
        inst = self.instance
        if code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            log.info("consumer ids of group %s changed: rebalancing now", request.get_str("consumerGroup"))
            inst.rebalance_immediately()
            return None
        if code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            group = request.get_str("consumerGroup")
            consumer = inst.consumers.get(group)
            if consumer is None:
                return request.make_response(ResponseCode.SYSTEM_ERROR,
                                             f"The Consumer Group <{group}> not exist in this consumer")
            body = json.dumps(consumer.running_info(), default=str).encode("utf-8")
            return request.make_response(ResponseCode.SUCCESS, body=body)
        if code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            return await self._consume_message_directly(request)
        if code == RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT:  # (mqadmin getConsumerStatus, via the broker)
            group, topic = request.get_str("group"), request.get_str("topic")
            consumer = inst.consumers.get(group)
            store = getattr(consumer, "offset_store", None)
            if store is None:
                return request.make_response(ResponseCode.SYSTEM_ERROR,
                                             f"The Consumer Group <{group}> not exist in this consumer")
            table = [{"mq": {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id}, "offset": off}
                     for mq, off in sorted(store.clone_offset_table(topic).items())]
            return request.make_response(ResponseCode.SUCCESS,
                                         body=json.dumps({"messageQueueTable": table}).encode("utf-8"))
        if code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            group = request.get_str("group")
            topic = request.get_str("topic")
            consumer = inst.consumers.get(group)
            if consumer is not None and request.body:
                table = decode_reset_offset_body(request.body, topic)
                loop = asyncio.get_running_loop()
                # the reset blocks (offset store, waits for consume threads): off the event loop
                loop.run_in_executor(inst.blocking_executor, consumer.reset_offset, topic, table)
            return request.make_response(ResponseCode.SUCCESS)
        if code == RequestCode.CHECK_TRANSACTION_STATE:
            self._check_transaction_state(ctx, request)
            return None  # oneway: the answer is an END_TRANSACTION request
        return request.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                     f"request code {code} not supported by this client")

    async def _consume_message_directly(self, request: RemotingCommand) -> RemotingCommand:
        """ClientRemotingProcessor.consumeMessageDirectly: the message in the body to the group's
        push consumer's listener (off the event loop), its ConsumeMessageDirectlyResult back."""
        group = request.get_str("consumerGroup")
        consumer = self.instance.consumers.get(group)
        service = getattr(consumer, "consume_service", None)
        if service is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The Consumer Group <{group}> not exist in this consumer")
        try:
            msgs = decode_messages(request.body or b"")
        except ValueError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"cannot decode the message: {e}")
        if not msgs:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "no message in the request")
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self.instance.blocking_executor, service.consume_message_directly,
                                            msgs[0], request.get_str("brokerName"))
        return request.make_response(ResponseCode.SUCCESS, body=json.dumps(result).encode("utf-8"))

    def _check_transaction_state(self, ctx, request: RemotingCommand) -> None:
        try:
            msgs = decode_messages(request.body or b"")
        except ValueError as e:
            log.warning("CHECK_TRANSACTION_STATE with an undecodable message: %s", e)
            return
        if not msgs:
            return
        msg = msgs[0]
        group = msg.get_property(MessageConst.PRODUCER_GROUP)
        producer = self.instance.producers.get(group)
        if producer is None or not hasattr(producer, "check_transaction_state"):
            log.warning("CHECK_TRANSACTION_STATE for group %s: no transaction producer here", group)
            return
        addr = ctx.attributes.get("addr") or ctx.remote_address
        producer.check_transaction_state(addr, msg, dict(request.ext_fields))


__all__ = ["BROKER_REQUEST_CODES", "BrokerRequestProcessor"]
