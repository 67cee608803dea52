"""Plain-Python references of the client's native send codec (rmq_core._native.frame: SendHeader,
read_send_response, SendResultMaker), written from the protocol for the tests that compare the
two: the producer itself only uses the native ones."""
from rmq_core._native import frame as frame_native
from rmq_core.errors import MQBrokerError
from rmq_core.message import MessageConst, MessageQueue, SendResult, SendStatus
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand

STATUS_BY_CODE = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
_SHORT = {
    "producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d", "queueId": "e",
    "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i", "reconsumeTimes": "j",
    "unitMode": "k", "maxReconsumeTimes": "l", "batch": "m", "brokerName": "n",
}


def send_header(*, group, topic, queue_id, sys_flag, born_timestamp, flag, properties, reconsume_times=0,
                max_reconsume_times=None, batch=False, broker_name="", default_topic="TBW102",
                default_topic_queue_nums=4, v2=True) -> dict[str, str]:
    """SendMessageRequestHeader's ext fields as they travel (strings), V2 with the one-letter names."""
    h = {
        "producerGroup": group, "topic": topic, "defaultTopic": default_topic,
        "defaultTopicQueueNums": str(default_topic_queue_nums), "queueId": str(queue_id), "sysFlag": str(sys_flag),
        "bornTimestamp": str(born_timestamp), "flag": str(flag), "properties": properties,
        "reconsumeTimes": str(reconsume_times), "unitMode": "false", "batch": "true" if batch else "false",
        "brokerName": broker_name,
    }
    if max_reconsume_times is not None:
        h["maxReconsumeTimes"] = str(max_reconsume_times)
    return {_SHORT[k]: v for k, v in h.items()} if v2 else h


def request_frame(header: dict, body: bytes, opaque: int, batch=False, v2=True, oneway=False) -> bytes:
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE
    req = RemotingCommand.create_request(code, header, body)
    req.language = "PYTHON"
    req.opaque = opaque
    if oneway:
        req.mark_oneway()
    return req.encode()


def read_send_response_frame(frame):
    """A response frame read natively, or decoded and read from its RemotingCommand where the
    native reader declines (a request comes back as its RemotingCommand)."""
    response = frame_native.read_send_response(frame)
    if response is not None:
        return response
    command = RemotingCommand.decode(frame)
    if not command.flag & RESPONSE_FLAG:
        return command
    return frame_native.SendResponse.from_command(command)


def parse_send_response(resp: RemotingCommand, mq: MessageQueue, msg_id: str, addr: str) -> SendResult:
    status = STATUS_BY_CODE.get(resp.code)
    if status is None:
        raise MQBrokerError(resp.code, resp.remark, addr)
    queue_id = resp.get_int("queueId", mq.queue_id)
    return SendResult(
        status=status, msg_id=msg_id, offset_msg_id=resp.get_str("msgId") or "",
        queue=mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id),
        queue_offset=resp.get_int("queueOffset", -1), transaction_id=resp.get_str("transactionId"),
        region_id=resp.get_str(MessageConst.MSG_REGION) or "DefaultRegion",
    )
