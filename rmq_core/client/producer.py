"""Producer (RocketMQ's DefaultMQProducer): sync, async, oneway, ordered (selector) and batch sends.

`send` waits, `send_async` returns a concurrent Future (and calls an optional callback); for
asyncio see rmq_core.aio.  Every send's attempts, retry rule and fault-item update come from one
SendPolicy (rmq_core.client.fault).  A plain send (no queue, no selector, no send hooks) whose
topic route is cached makes its first attempt without the client's event loop:

* to a tcp broker, the caller's thread validates the message and builds the whole SEND_MESSAGE_V2
  frame natively from its fields (client_native.SendHeader, header constants cached per queue);
  `send` exchanges it on a pooled blocking connection (rmq_core.remoting.blocking) and reads the
  answer natively, `send_async` writes it on the broker's pipelined connection
  (rmq_core.remoting.pipelined), whose reader thread completes the Future (PipelinedCompletion);
  RPC hooks are a step of both connections (RpcHookStep);
* to an in-proc broker, `send` goes the same blocking way.

Everything else - the first route look-up, retries after a failed first attempt, ordered sends,
send hooks, async sends to an in-proc broker, auto_batch's loop side - is Producer._send, a
coroutine on the loop, whose retry loop (_send_default) batches share.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import time
from typing import Any, Callable, Iterable

import attrs

from rmq_core import plugins
from rmq_core.client.accumulator import BATCH_ITEM_OVERHEAD, PipelinedAccumulator, ProduceAccumulator
from rmq_core.client.config import make_client_config
from rmq_core.client.fault import RETRY_RESPONSE_CODES, MQFaultStrategy, SendPolicy
from rmq_core.client.instance import CancellableFuture, LeanFuture, MQClientInstance, MQClientManager
from rmq_core.client.route import TopicPublishInfo, TopicRouteData
from rmq_core.client.selector import _SENDABLE_TOPICS, MAX_MESSAGE_SIZE, check_group, check_message, resolve_selector
from rmq_core.errors import ConfigError, IllegalArgumentError, MQBrokerError, MQClientError, RemotingError
from rmq_core.message import (
    Message, MessageClientIDSetter, MessageConst, MessageQueue, MixAll, SendResult, SendStatus, SysFlag,
    TopicValidator, encode_properties_checked, properties_to_string,
)
from rmq_core._native.client_native import (
    PipelinedCompletion, PipelinedSender, encode_batch, encode_batch_item, SendHeader, SendResponse, SendResultMaker, UniqIds, read_send_response, read_send_responses,
)
from rmq_core.remoting.codes import MQVersion, RequestCode, ResponseCode
from rmq_core.remoting import command as _command
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand, next_opaque

log = logging.getLogger("rmq.client.producer")

_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
COMPRESS_TYPES = ("lz4", "zlib")


class CommunicationMode(enum.Enum):
    SYNC = "SYNC"
    ASYNC = "ASYNC"
    ONEWAY = "ONEWAY"


def build_send_header(*, group: str, topic: str, queue_id: int, sys_flag: int, born_timestamp: int,
                      flag: int, properties: str, reconsume_times: int = 0, max_reconsume_times: int | None = None,
                      batch: bool = False, broker_name: str | None = None, default_topic: str = "TBW102",
                      default_topic_queue_nums: int = 4, v2: bool = True) -> dict[str, Any]:
    """SendMessageRequestHeader as a dict; V2 uses the one-letter names (a..n) Java sends."""
    h: dict[str, Any] = {
        "producerGroup": group, "topic": topic, "defaultTopic": default_topic,
        "defaultTopicQueueNums": default_topic_queue_nums, "queueId": queue_id, "sysFlag": sys_flag,
        "bornTimestamp": born_timestamp, "flag": flag, "properties": properties,
        "reconsumeTimes": reconsume_times, "unitMode": False, "batch": batch,
    }
    if max_reconsume_times is not None:
        h["maxReconsumeTimes"] = max_reconsume_times
    if broker_name is not None:
        h["brokerName"] = broker_name
    if not v2:
        return h
    short = {
        "producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d", "queueId": "e",
        "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i", "reconsumeTimes": "j",
        "unitMode": "k", "maxReconsumeTimes": "l", "batch": "m", "brokerName": "n",
    }
    return {short[k]: v for k, v in h.items()}


def parse_send_response(resp: RemotingCommand, mq: MessageQueue, msg_id: str, addr: str) -> SendResult:
    status = _STATUS_BY_CODE.get(resp.code)
    if status is None:
        raise MQBrokerError(resp.code, resp.remark, addr)
    queue_id = resp.get_int("queueId", mq.queue_id)
    return SendResult(
        status=status,
        msg_id=msg_id,
        offset_msg_id=resp.get_str("msgId") or "",
        queue=mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id),
        queue_offset=resp.get_int("queueOffset", -1),
        transaction_id=resp.get_str("transactionId"),
        region_id=resp.get_str(MessageConst.MSG_REGION) or "DefaultRegion",
    )


def read_send_response_frame(frame) -> SendResponse | RemotingCommand:
    """A send response frame (without its length prefix) read natively; what the native reader
    declines is decoded as a RemotingCommand (whose errors name a malformed frame) and read the
    same way.  A request from the peer comes back as its RemotingCommand (the channel refuses it)."""
    response = read_send_response(frame)
    if response is not None:
        return response
    command = RemotingCommand.decode(frame)
    if not command.flag & RESPONSE_FLAG:
        return command
    return SendResponse.from_command(command)


# PipelinedChannel's reader of send responses: SendResponse items (bytes where declined)
read_send_response_frames = read_send_responses


create_uniq_id = UniqIds(MessageClientIDSetter)  # MessageClientIDSetter.create_uniq_id, natively
_RESULTS = SendResultMaker(SendResult, tuple(f.name for f in attrs.fields(SendResult)), MessageQueue, _STATUS_BY_CODE)


def send_result_of(response: SendResponse, mq: MessageQueue, msg_id: str, addr: str) -> SendResult:
    """parse_send_response for a SendResponse: the SendResult, or MQBrokerError for a refusal."""
    result = _RESULTS.make(response, mq, msg_id)
    if result is None:
        raise MQBrokerError(response.code, response.remark, addr)
    return result


_RESERVED_PROPERTIES = MessageConst.SYSTEM_KEYS
_OUTER_PROPS = {wait: {MessageConst.WAIT_STORE_MSG_OK: "true" if wait else "false"} for wait in (True, False)}


_CHECKED_TOPICS: set[str] = set()  # names check_send_topic passed (a producer sends to few topics)


def check_send_topic(topic: str) -> None:
    """check_message's topic rule: a valid name, not a system topic."""
    if topic in _CHECKED_TOPICS:
        return
    TopicValidator.check_topic(topic)
    TopicValidator.check_not_system_topic_for_send(topic)
    if len(_CHECKED_TOPICS) >= 10_000:
        _CHECKED_TOPICS.clear()
    _CHECKED_TOPICS.add(topic)


_NOT_DIRECT = object()  # Producer._send_direct's "take the loop's path" answer
_NO_HEADER = object()  # not in Producer._send_headers yet


class _SendContext:
    __slots__ = ("producer_group", "message", "queue", "broker_addr", "send_result", "exception", "mode")

    def __init__(self, producer_group, message, queue, broker_addr, mode):
        self.producer_group, self.message, self.queue, self.broker_addr = producer_group, message, queue, broker_addr
        self.mode = mode
        self.send_result = None
        self.exception = None


class Producer:
    """Send messages to a topic.

    >>> with Producer("PG", namesrv="127.0.0.1:9876") as p:
    ...     r = p.send(Message("TopicA", b"body", tags="TagA"))
    """

    def __init__(self, group: str = MixAll.DEFAULT_PRODUCER_GROUP, namesrv=None, *,
                 instance_name: str | None = None,
                 send_msg_timeout: float = 3.0,
                 retry_times_when_send_failed: int = 2,
                 retry_times_when_send_async_failed: int = 2,
                 retry_another_broker_when_not_store_ok: bool = False,
                 compress_msg_body_over_howmuch: int = 4096,
                 compress_type: str = "lz4",
                 compress_level: int = 5,
                 max_message_size: int = MAX_MESSAGE_SIZE,
                 send_latency_fault_enable: bool = True,
                 use_send_message_v2: bool = True,
                 create_topic_key: str = TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC,
                 default_topic_queue_nums: int = 4,
                 auto_batch: bool = False,
                 batch_max_bytes: int = 32 * 1024,
                 **client_options):
        self.group = check_group(group)
        opts = dict(client_options)
        if instance_name is not None:
            opts["instance_name"] = instance_name
        self.client_config = make_client_config(type(self).__name__, namesrv, opts)
        if compress_type not in COMPRESS_TYPES:
            raise ConfigError(f"bad compress_type {compress_type!r}; available: {', '.join(COMPRESS_TYPES)}")
        if retry_times_when_send_failed < 0 or retry_times_when_send_async_failed < 0:
            raise ConfigError("retry_times_when_send_failed / retry_times_when_send_async_failed must be >= 0")
        if send_msg_timeout <= 0:
            raise ConfigError(f"bad send_msg_timeout {send_msg_timeout!r}: must be > 0")
        if max_message_size <= 0:
            raise ConfigError(f"bad max_message_size {max_message_size!r}: must be > 0")
        if batch_max_bytes <= 0:
            raise ConfigError(f"bad batch_max_bytes {batch_max_bytes!r}: must be > 0")
        self.send_msg_timeout = send_msg_timeout
        self.compress_msg_body_over_howmuch = compress_msg_body_over_howmuch
        self.compress_type = compress_type
        self.compress_level = compress_level
        self.max_message_size = max_message_size
        self.use_send_message_v2 = use_send_message_v2
        self.create_topic_key = create_topic_key
        self.default_topic_queue_nums = default_topic_queue_nums
        self._default_queue_nums_str = str(default_topic_queue_nums)
        self.fault_strategy = MQFaultStrategy(enabled=send_latency_fault_enable)
        # every send's attempts, retry rule and fault item update (see SendPolicy)
        self.send_policy = SendPolicy(self.fault_strategy, retry_times_when_send_failed,
                                      retry_times_when_send_async_failed, retry_another_broker_when_not_store_ok)
        self.topic_publish_info: dict[str, TopicPublishInfo] = {}
        self.instance: MQClientInstance | None = None
        self._started = False
        self._lock = threading.Lock()
        self._hooks = False
        # auto_batch (RocketMQ 5's autoBatch): async sends of a topic gathered into batch requests
        self.auto_batch = auto_batch
        self.batch_max_bytes = min(batch_max_bytes, max_message_size)
        self._accumulator = ProduceAccumulator(self, batch_max_bytes=self.batch_max_bytes,
                                               async_mode=CommunicationMode.ASYNC) if auto_batch else None
        # auto_batch's usual way (to tcp brokers, no hooks): gathered in the senders' threads and
        # written on the pipelined connection; set at start
        self._batch_accumulator: PipelinedAccumulator | None = None
        self._batch_routes: dict[str, TopicPublishInfo] = {}  # topic -> its route found fit for that way
        # (topic, broker, queue id, batch) -> SendHeader, see _encode_frame (keyed by the fields: a
        # MessageQueue's attrs-made __hash__ and __eq__ are Python calls)
        self._send_headers: dict[tuple[str, str, int, bool], SendHeader | None] = {}
        # a pipelined send's usual completion, natively (its other cases: _pipelined_done); it notes
        # fast answers in the policy's table, as SendPolicy.note does
        self._pipelined_completion = PipelinedCompletion(_RESULTS, self.fault_strategy, self.send_policy.noted,
                                                         self._pipelined_done)
        # which plain sends take the lean paths (decided at start, with the hooks)
        self._plain_direct = False
        self._plain_pipelined = False
        self._pipelined_sender: PipelinedSender | None = None  # _send_pipelined's usual case, natively

    # the retry settings live in the policy every send asks
    retry_times_when_send_failed = property(
        lambda self: self.send_policy.retry_times_when_send_failed,
        lambda self, n: setattr(self.send_policy, "retry_times_when_send_failed", n))
    retry_times_when_send_async_failed = property(
        lambda self: self.send_policy.retry_times_when_send_async_failed,
        lambda self, n: setattr(self.send_policy, "retry_times_when_send_async_failed", n))
    retry_another_broker_when_not_store_ok = property(
        lambda self: self.send_policy.retry_another_broker_when_not_store_ok,
        lambda self, v: setattr(self.send_policy, "retry_another_broker_when_not_store_ok", v))

    # --- life cycle ------------------------------------------------------------------------------
    def start(self) -> "Producer":
        with self._lock:
            if self._started:
                return self
            self.instance = MQClientManager.get_instance(self.client_config)
            self.instance.register_producer(self.group, self)
            try:
                self.instance.start()
                self._hooks = plugins.has_impls("rmq_before_send") or plugins.has_impls("rmq_after_send")
                self._plain_direct = not self._hooks and not self.retry_another_broker_when_not_store_ok
                self._pipelined_sender = PipelinedSender(
                    self, self.instance, LeanFuture, Message, check_message, create_uniq_id, self._pipelined_completion,
                    read_send_response_frames, SendResponse.from_command, _command._opaque_counter, RemotingError,
                    MixAll.MASTER_ID,  # (next_opaque's process-wide counter: opaques never repeat)
                    _SENDABLE_TOPICS)  # (the topic names check_message passed)
                # (send hooks run on the same connections: _invoke_direct, _send_pipelined_to)
                self._plain_pipelined = self._accumulator is None
                if self._accumulator is not None and not self._hooks:
                    self._batch_accumulator = PipelinedAccumulator(self, batch_max_bytes=self.batch_max_bytes)
                self._started = True
            except BaseException:
                self.instance.unregister_producer(self.group)
                raise
        log.info("the producer [%s] start OK, client id %s", self.group, self.instance.client_id)
        return self

    def shutdown(self) -> None:
        with self._lock:
            if not self._started:
                return
            self._started = False
        if self._batch_accumulator is not None and not self._batch_accumulator.drain(self.send_msg_timeout * 2 + 1):
            log.warning("producer %s: gathered messages still unanswered at shutdown", self.group)
            self._batch_accumulator.fail_pending(
                MQClientError(f"producer {self.group} shut down before the message was sent"))
        if self._accumulator is not None:
            try:  # what was accepted leaves before the client goes
                self.instance.run(self._accumulator.drain(), timeout=self.send_msg_timeout * 2 + 1)
            except Exception as e:  # noqa: BLE001 - the shutdown goes on; unsent ones fail below
                log.warning("producer %s: sending the gathered messages at shutdown failed: %s", self.group, e)
                self.instance.post(lambda: self._accumulator.fail_pending(
                    MQClientError(f"producer {self.group} shut down before the message was sent")))
        self.instance.unregister_producer(self.group)

    def __enter__(self) -> "Producer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def client_id(self) -> str:
        return self.client_config.client_id

    # called by the instance ----------------------------------------------------------------------
    def published_topics(self) -> set[str]:
        return set(self.topic_publish_info)

    def on_route_changed(self, topic: str, route: TopicRouteData) -> None:
        if topic in self.topic_publish_info:
            self.topic_publish_info[topic] = route.publish_info(topic)

    def _check_started(self) -> MQClientInstance:
        if not self._started:
            raise MQClientError(f"the producer {self.group!r} is not started; call start() first")
        return self.instance

    # --- public send API -------------------------------------------------------------------------
    def send(self, msg: Message, *, queue: MessageQueue | None = None, selector=None, arg: Any = None,
             timeout: float | None = None) -> SendResult:
        """Send and wait.  queue: send to that queue; selector(+arg): ordered send (no retry, like
        Java).  Raises MQClientError / MQBrokerError / IllegalArgumentError naming the problem."""
        inst = self._check_started()
        t = timeout or self.send_msg_timeout
        if queue is None and selector is None and self._plain_direct:
            result = self._send_plain_direct(msg, t)
            if result is not _NOT_DIRECT:
                return result
        # validation, properties, UNIQ_KEY and compression here in the caller's thread: the loop
        # thread is shared by every send, the caller's is not
        prepared = self._prepare(msg)
        if (queue is not None or selector is not None or self.retry_another_broker_when_not_store_ok
                or inst.in_loop_thread()):  # (run() refuses the loop thread: it would wait on itself)
            return inst.run(self._send(msg, CommunicationMode.SYNC, t, queue, selector, arg, prepared=prepared),
                            timeout=t + 5)
        result = self._send_direct(msg, t, prepared)
        if result is not _NOT_DIRECT:
            return result
        return inst.run(self._send(msg, CommunicationMode.SYNC, t, None, None, None, prepared=prepared),
                        timeout=t + 5)

    def _send_plain_direct(self, msg: Message, timeout: float):
        """The leanest sync send: a plain message (body under the compression threshold, no
        UNIQ_KEY of its own) to a broker whose route is cached, its queue picked and its request
        frame built in one native call (PipelinedSender.sync_frame) and its answer read natively,
        in this thread.  _NOT_DIRECT when it cannot go so (then send() takes the general way,
        validation included); a failure worth retrying continues on the loop, as _send_direct's does."""
        picked = self._pipelined_sender.sync_frame(msg)  # (check_message's errors raise from here)
        if picked is None:
            return _NOT_DIRECT
        inst = self.instance
        mq, addr = picked[0], picked[1]
        if addr is None:
            return self._send_direct_prepared(msg, timeout, mq)
        if len(picked) == 6:
            frame, opaque, uniq, code = picked[2], picked[3], picked[4], picked[5]
        else:  # no native header cached for the queue yet (or properties it leaves to Python)
            header = self._send_header(mq, False)
            uniq = create_uniq_id()
            opaque = next_opaque()
            frame = header.build_message_frame(msg, uniq, opaque) if header is not None else None
            if frame is None:
                return self._send_direct_prepared(msg, timeout, mq)
            code = header.code
        begin = time.monotonic()
        try:
            resp = inst.invoke_frame_direct(addr, frame, opaque, timeout, read_send_response_frame, code)
            if resp is None:  # every direct connection busy: the loop's way, same queue choice lost
                return self._send_direct_prepared(msg, timeout, None)
            # the SendResult, the fault item noted as SendPolicy.note notes it (None: a refusal)
            result = self._pipelined_completion.finish_sync(resp, mq, uniq, begin)
            if result is None:
                raise MQBrokerError(resp.code, resp.remark, addr)
        except (RemotingError, MQBrokerError) as e:
            self.send_policy.note(mq.broker_name, begin, True)
            if not self.send_policy.worth_retrying(e):
                raise
            log.warning("send to %s failed (attempt 1/%d): %s", mq, self.send_policy.attempts("SYNC"), e)
            return inst.run(self._send(msg, CommunicationMode.SYNC, timeout, None, None, None,
                                       prepared=self._prepared_with(msg, uniq), resume=(begin, mq.broker_name, e)),
                            timeout=timeout + 5)
        return result

    def _send_direct_prepared(self, msg: Message, timeout: float, mq: MessageQueue | None):
        """_send_plain_direct's way out once it picked a queue: the general direct send to `mq`
        (or through the loop), with the message prepared the Python way."""
        prepared = self._prepare(msg)
        if mq is None:
            return self.instance.run(self._send(msg, CommunicationMode.SYNC, timeout, None, None, None,
                                                prepared=prepared), timeout=timeout + 5)
        begin = time.monotonic()
        try:
            result = self._invoke_direct(msg, mq, *prepared, timeout, False)
        except (RemotingError, MQBrokerError) as e:
            if not self.send_policy.worth_retrying(e):
                raise
            result = None
            resume = (begin, mq.broker_name, e)
        else:
            if result is not _NOT_DIRECT:
                return result
            resume = None
        return self.instance.run(self._send(msg, CommunicationMode.SYNC, timeout, None, None, None,
                                            prepared=prepared, resume=resume), timeout=timeout + 5)

    def _prepared_with(self, msg: Message, uniq: str) -> tuple[str, bytes, int, dict]:
        """What _prepare makes of a plain message (see _send_plain_direct) whose UNIQ_KEY is `uniq`."""
        props = msg.wire_properties()
        props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        return uniq, msg.body, 0, props

    def _send_direct(self, msg: Message, timeout: float, prepared: tuple):
        """A plain sync send's first attempt made in the caller's thread over a pooled blocking
        connection (see rmq_core.remoting.blocking): no hand-off to the client's loop and back.
        Returns _NOT_DIRECT when it cannot be made that way (no route cached yet, an in-proc
        broker, every direct connection busy); a failure worth retrying continues on the loop."""
        info = self.topic_publish_info.get(msg.topic)
        if info is None or not info.ok or not self.instance.direct_send_possible():
            return _NOT_DIRECT  # (asked before a queue is picked: picking advances the round robin)
        mq = self.send_policy.select(info)
        uniq, body, sys_flag, props = prepared
        begin = time.monotonic()
        try:
            return self._invoke_direct(msg, mq, uniq, body, sys_flag, props, timeout, False)
        except (RemotingError, MQBrokerError) as e:
            if not self.send_policy.worth_retrying(e):
                raise
            log.warning("send to %s failed (attempt 1/%d): %s", mq, self.send_policy.attempts("SYNC"), e)
            return self.instance.run(
                self._send(msg, CommunicationMode.SYNC, timeout, None, None, None, prepared=prepared,
                           resume=(begin, mq.broker_name, e)), timeout=timeout + 5)

    def _invoke_direct(self, msg: Message, mq: MessageQueue, uniq: str, body: bytes, sys_flag: int, props: dict,
                       timeout: float, batch: bool):
        """One send request to `mq`'s broker from this thread: its SendResult, _NOT_DIRECT when
        the direct path is not open to that broker, or the failure (fault item updated).  To a tcp
        broker the request frame is built natively and the response read natively (no
        RemotingCommand either way); an in-proc broker takes RemotingCommands."""
        inst = self.instance
        addr = inst.find_broker_addr_in_publish(mq.broker_name)
        if addr is None or not inst.direct_send_possible():
            return _NOT_DIRECT
        ctx = None
        if self._hooks:  # SendMessageHook, as _send_kernel calls it
            ctx = _SendContext(self.group, msg, mq, addr, CommunicationMode.SYNC.value)
            plugins.get_plugin_manager().hook.rmq_before_send(context=ctx)
        t0 = time.monotonic()
        try:
            if inst.in_proc(addr):
                req = self._build_request(msg, mq, body, sys_flag, props, batch)
                resp = inst.invoke_direct(addr, req, timeout)
                if resp is None:
                    return _NOT_DIRECT
                result = parse_send_response(resp, mq, uniq, addr)
            else:
                frame, opaque, code = self._encode_frame(msg, mq, body, sys_flag, props, batch)
                resp = inst.invoke_frame_direct(addr, frame, opaque, timeout, read_send_response_frame, code)
                if resp is None:
                    return _NOT_DIRECT
                result = send_result_of(resp, mq, uniq, addr)
        except (RemotingError, MQBrokerError) as e:
            self.send_policy.note(mq.broker_name, t0, True)
            if ctx is not None:
                ctx.exception = e
                plugins.get_plugin_manager().hook.rmq_after_send(context=ctx)
            raise
        self.send_policy.note(mq.broker_name, t0, False)
        if ctx is not None:
            ctx.send_result = result
            plugins.get_plugin_manager().hook.rmq_after_send(context=ctx)
        return result

    def _encode_frame(self, msg: Message, mq: MessageQueue, body: bytes, sys_flag: int, props: dict,
                      batch: bool = False) -> tuple[bytes, int, int]:
        """(frame, opaque, code) of the send request _build_request makes, built natively from a
        header cached per queue; the Python encoder where the native one declines."""
        header = self._send_header(mq, batch)
        opaque = next_opaque()
        if header is not None:
            frame = header.build_frame(sys_flag, 0 if batch else msg.flag, props, opaque, body)
            if frame is not None:
                return frame, opaque, header.code
        req = self._build_request(msg, mq, body, sys_flag, props, batch)
        req.language = "PYTHON"
        return req.encode(), req.opaque, req.code

    def _send_header(self, mq: MessageQueue, batch: bool) -> SendHeader | None:
        """The native header of sends to `mq`, cached (None: the Python encoder's case - SEND_MESSAGE
        V1, or a retry topic, whose reconsume fields move from the properties into the header)."""
        key = (mq.topic, mq.broker_name, mq.queue_id, batch)
        header = self._send_headers.get(key, _NO_HEADER)
        if header is not _NO_HEADER:
            return header
        if len(self._send_headers) >= 4096:  # queues come and go with routes: keep it bounded
            self._send_headers.clear()
        if not self.use_send_message_v2 or MixAll.is_retry_topic(mq.topic):
            self._send_headers[key] = None
            return None
        header = self._send_headers[key] = SendHeader(
            self.group, mq.topic, mq.queue_id, mq.broker_name, self.create_topic_key, self.default_topic_queue_nums,
            RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2, batch, "PYTHON",
            MQVersion.CURRENT)
        return header

    def send_orderly(self, msg: Message, arg: Any = None, selector=None, timeout: float | None = None) -> SendResult:
        """Ordered send: messages with the same `arg` (default: the message keys) go to the same queue."""
        return self.send(msg, selector=resolve_selector(selector), arg=arg, timeout=timeout)

    def send_async(self, msg: Message, callback: Callable[[SendResult | None, BaseException | None], None] | None = None,
                   *, queue: MessageQueue | None = None, selector=None, arg: Any = None,
                   timeout: float | None = None) -> concurrent.futures.Future:
        """Send without waiting.  Returns a Future of SendResult; callback(result, exception) is called
        when it completes (from a client thread, so keep it short).  With auto_batch=True, plain
        messages of a topic sent while an earlier request of it is in flight leave together in one
        batch request (each still gets its own SendResult; see rmq_core.client.accumulator)."""
        inst = self._check_started()
        t = timeout or self.send_msg_timeout
        if self._plain_pipelined and queue is None and selector is None:  # (then no _batch_accumulator)
            # (None: it declined before picking a queue; with send hooks the Python side writes, for them)
            fut = self._pipelined_sender.send(msg, t) if not self._hooks else None
            if fut is None:
                fut = self._send_pipelined(msg, t)
            if fut is not None and fut is not False:  # (False: the loop's path takes it)
                if callback is not None:
                    self._call_back_when_done(fut, callback)
                return fut
        elif queue is None and selector is None and self._batch_accumulator is not None:
            fut = self._batch_accumulator.offer(msg, t)
            if fut is not None:
                if callback is not None:
                    self._call_back_when_done(fut, callback)
                return fut
        try:
            prepared = self._prepare(msg)
        except Exception:  # a bad message fails its Future (and callback), as any other send error
            prepared = None
        acc = self._accumulator
        if (prepared is None or queue is not None or selector is not None or self._hooks or acc is None
                or not acc.eligible(msg, prepared, self.batch_max_bytes)):
            fut = inst.submit(self._send(msg, CommunicationMode.ASYNC, t, queue, selector, arg, prepared=prepared))
        else:
            fut = CancellableFuture()

            def finished(result, error):  # on the loop; a Future the caller cancelled stays cancelled
                if isinstance(error, asyncio.CancelledError):
                    fut.cancel()
                if not fut.set_running_or_notify_cancel():
                    return
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(result)

            # (a gathered message cannot be taken back: cancelling only abandons its Future)
            inst.post(lambda: acc.add(msg, prepared, t, finished))
        if callback is not None:
            self._call_back_when_done(fut, callback)
        return fut

    def _call_back_when_done(self, fut: concurrent.futures.Future, callback) -> None:
        inst = self.instance

        def call(f: concurrent.futures.Future):
            try:
                exc = f.exception()
            except concurrent.futures.CancelledError as e:
                exc = e
            try:
                callback(None if exc else f.result(), exc)
            except Exception:
                log.exception("send callback raised")

        def done(f: concurrent.futures.Future):
            # never on the event loop or a connection's reader: a callback may itself send synchronously
            try:
                inst.blocking_executor.submit(call, f)
            except RuntimeError:  # the client is shutting down
                call(f)
        fut.add_done_callback(done)

    def _send_pipelined(self, msg: Message, timeout: float) -> CancellableFuture | None:
        """A plain async send's first attempt written from this thread on the broker's pipelined
        connection (see rmq_core.remoting.pipelined); its Future is completed on that connection's
        reader thread (_pipelined_done).  None when it cannot go that way (no route cached yet, an
        in-proc broker, the option off, a message that fails validation): the loop's path then
        takes it.  (A written request cannot be taken back: cancelling its Future abandons it.)"""
        inst = self.instance
        info = self.topic_publish_info.get(msg.topic)
        if info is None or not info.ok or not inst.pipelined_send_possible() or type(msg) is not Message:
            return None  # (asked before a queue is picked: picking advances the round robin)
        try:
            check_message(msg, self.max_message_size)
        except Exception:  # noqa: BLE001 - the general path fails the Future with it
            return None
        mq = self.send_policy.select(info)
        addr = inst.find_broker_addr_in_publish(mq.broker_name)
        if addr is None or inst.in_proc(addr):
            return None
        return self._send_pipelined_to(msg, timeout, mq, addr)

    def _send_pipelined_to(self, msg: Message, timeout: float, mq: MessageQueue, addr: str) -> CancellableFuture:
        """_send_pipelined once the queue is picked (PipelinedSender's way where it declines)."""
        inst = self.instance
        fut = LeanFuture()
        begin = time.monotonic()
        header = self._send_header(mq, False)
        opaque = next_opaque()
        frame = None
        prepared = None
        if header is not None and len(msg.body) < self.compress_msg_body_over_howmuch:
            uniq = create_uniq_id()
            frame = header.build_message_frame(msg, uniq, opaque)
        if frame is None:  # compression, a UNIQ_KEY of its own, a retry topic...: the Python way
            try:
                prepared = self._prepare(msg)
                uniq = prepared[0]
                frame, opaque, _ = self._encode_frame(msg, mq, prepared[1], prepared[2], prepared[3])
            except Exception as e:  # noqa: BLE001 - e.g. oversize properties: this send's error
                fut.set_exception(e)
                return fut
        context = (msg, uniq, prepared, mq, addr, timeout, begin, fut)
        on_done = self._pipelined_completion
        if self._hooks:  # SendMessageHook around this attempt, as _send_kernel calls it
            send_ctx = _SendContext(self.group, msg, mq, addr, CommunicationMode.ASYNC.value)
            try:
                plugins.get_plugin_manager().hook.rmq_before_send(context=send_ctx)
            except Exception as e:  # noqa: BLE001 - this send's error
                fut.finish(None, e)
                return fut
            context, on_done = (context, send_ctx), self._hooked_pipelined_done
        try:
            channel = inst.send_channel(addr, read_send_response_frames, SendResponse.from_command)
        except RemotingError as e:  # cannot connect: counted against the broker, retried elsewhere
            on_done(context, None, e)
            return fut
        fut.channel = channel  # result() reads the answer itself when no other thread does
        channel.send(frame, opaque, timeout, on_done, context)
        return fut

    def _hooked_pipelined_done(self, context: tuple, response: SendResponse | None,
                               error: BaseException | None) -> None:
        """_pipelined_done after rmq_after_send saw this attempt's outcome."""
        inner, send_ctx = context
        if error is None:
            result = _RESULTS.make(response, inner[3], inner[1])
            if result is None:
                send_ctx.exception = MQBrokerError(response.code, response.remark, inner[4])
            else:
                send_ctx.send_result = result
        else:
            send_ctx.exception = error
        try:
            plugins.get_plugin_manager().hook.rmq_after_send(context=send_ctx)
        except Exception:  # noqa: BLE001 - the send's outcome stands
            log.exception("rmq_after_send raised")
        self._pipelined_done(inner, response, error)

    def _pipelined_done(self, context: tuple, response: SendResponse | None, error: BaseException | None) -> None:
        """A pipelined send's answer or failure, on the connection's reader thread (or the sender's
        when the write itself failed).  A failure worth retrying continues in _send on the loop,
        from the second attempt, as _FastSend's does."""
        msg, uniq, prepared, mq, addr, timeout, begin, fut = context
        if error is None:
            result = _RESULTS.make(response, mq, uniq)
            if result is not None:
                self.send_policy.note(mq.broker_name, begin, False)
                fut.finish(result)
                return
            error = MQBrokerError(response.code, response.remark, addr)
        if not self._failure_worth_retrying(mq, begin, error):
            fut.finish(None, error)
            return
        log.warning("send to %s failed (attempt 1/%d): %s", mq, self.send_policy.attempts("ASYNC"), error)
        fut.channel = None  # the loop completes it now: a waiter stops reading the connection for it
        self._continue_on_loop(msg, prepared or self._prepared_with(msg, uniq), timeout,
                               (begin, mq.broker_name, error), fut)

    def _failure_worth_retrying(self, mq: MessageQueue, begin: float, error: BaseException) -> bool:
        """A pipelined request to `mq` failed: count it against the broker; True when another
        attempt should follow (a connection failure or a retryable broker code, not shutting down)."""
        self.send_policy.note(mq.broker_name, begin, True)
        return self.send_policy.worth_retrying(error) and not self.instance._stopping

    def _continue_on_loop(self, msg: Message, prepared: tuple, timeout: float, resume: tuple,
                          fut: CancellableFuture) -> None:
        """Go on with an async send in Producer._send on the loop (from `resume`), into `fut`."""
        inst = self.instance

        def start():  # on the loop
            if fut.cancelled():
                return
            if inst._stopping:
                try:
                    fut.set_exception(resume[2])
                except concurrent.futures.InvalidStateError:  # cancelled meanwhile
                    pass
                return
            task = asyncio.get_running_loop().create_task(self._send(
                msg, CommunicationMode.ASYNC, timeout, None, None, None, prepared=prepared, resume=resume))

            def done(t: asyncio.Task):
                if t.cancelled():
                    fut.cancel()
                if not fut.set_running_or_notify_cancel():
                    return
                error = t.exception()
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(t.result())

            task.add_done_callback(done)
            fut.on_cancel = lambda: inst.loop.call_soon_threadsafe(task.cancel)

        try:
            inst.post(start)
        except MQClientError:  # the client stopped meanwhile
            try:
                fut.set_exception(resume[2])
            except concurrent.futures.InvalidStateError:  # cancelled meanwhile
                pass

    # --- auto_batch on the pipelined connection (PipelinedAccumulator's transport) -----------------
    def _batch_item(self, msg: Message, batch_max_bytes: int):
        """An auto_batch message validated and encoded as a batch item, in the caller's thread:
        (topic, uniq, item, wait_store_msg_ok); the IllegalArgumentError naming what is wrong; or
        None when it does not go this way (Java's batch rules: no delay level, no compression, not
        to a retry topic, within batch_max_bytes; and a cached route to a tcp broker)."""
        body = msg.body if type(msg) is Message else None
        if (body is None or msg.delay_time_level != 0 or len(body) >= self.compress_msg_body_over_howmuch
                or len(body) + BATCH_ITEM_OVERHEAD >= batch_max_bytes):
            return None
        topic = msg.topic
        info = self.topic_publish_info.get(topic)
        inst = self.instance
        if info is None or not inst.pipelined_send_possible():
            return None
        if self._batch_routes.get(topic) is not info:  # a route not judged yet (each change is a new info)
            if not info.ok or MixAll.is_retry_topic(topic):
                return None
            addr = inst.find_broker_addr_in_publish(info.queues[0].broker_name)
            if addr is None or inst.in_proc(addr):
                return None
            if len(self._batch_routes) >= 4096:
                self._batch_routes.clear()
            self._batch_routes[topic] = info
        try:  # (check_message's checks included)
            return encode_batch_item(msg, self.max_message_size, Message, _RESERVED_PROPERTIES, check_send_topic,
                                     MessageClientIDSetter)
        except IllegalArgumentError as e:
            return e

    _results_maker = _RESULTS  # PipelinedAccumulator's SendResults (client_native.finish_batch)

    @staticmethod
    def _failed_future(error: BaseException) -> LeanFuture:
        fut = LeanFuture()
        fut.finish(None, error)
        return fut

    def _write_batch(self, topic: str, wait: bool, body: bytes, timeout: float, on_answer, context,
                     futures: list[LeanFuture]):
        """One SEND_BATCH_MESSAGE of gathered items written on the pipelined connection of the
        queue's broker; on_answer(context, status, queue, base offset, offset msg ids, region,
        error) once (from the reader thread, a waiting caller's, this one, or the loop after a
        retry).  The futures of its messages are marked with the connection their answer comes
        on (LeanFuture.channel: a waiting caller reads it); returns that connection, or None."""
        inst = self.instance
        info = self.topic_publish_info.get(topic)
        header = None
        if info is not None and info.ok and not inst._stopping:
            mq = self.send_policy.select(info)
            addr = inst.find_broker_addr_in_publish(mq.broker_name)
            if addr is not None and not inst.in_proc(addr):
                header = self._send_header(mq, True)
        opaque = next_opaque()
        frame = header.build_frame(0, 0, _OUTER_PROPS[wait], opaque, body) if header is not None else None
        if frame is None:  # no route or connection any more: the loop's way
            self._retry_batch(topic, wait, body, timeout, on_answer, context, None, futures)
            return None
        ctx = (mq, addr, time.monotonic(), topic, wait, body, timeout, on_answer, context, futures)
        try:
            channel = inst.send_channel(addr, read_send_response_frames, SendResponse.from_command)
        except RemotingError as e:  # cannot connect: counted against the broker, retried elsewhere
            self._batch_answered(ctx, None, e)
            return None
        for fut in futures:
            fut.channel = channel
        channel.send(frame, opaque, timeout, self._batch_answered, ctx)
        return channel

    def _batch_answered(self, ctx: tuple, response: SendResponse | None, error: BaseException | None) -> None:
        mq, addr, begin, topic, wait, body, timeout, on_answer, context, futures = ctx
        if error is None:
            status = _STATUS_BY_CODE.get(response.code)
            if status is not None:
                self.send_policy.note(mq.broker_name, begin, False)
                qid = response.queue_id
                queue = mq if qid is None or qid == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, qid)
                base = response.queue_offset
                on_answer(context, status, queue, -1 if base is None else base, response.msg_id, response.region_id,
                          None)
                return
            error = MQBrokerError(response.code, response.remark, addr)
        if not self._failure_worth_retrying(mq, begin, error):
            on_answer(context, None, None, -1, None, None, error)
            return
        log.warning("batch send to %s failed (attempt 1/%d): %s", mq, self.send_policy.attempts("ASYNC"), error)
        self._retry_batch(topic, wait, body, timeout - (time.monotonic() - begin), on_answer, context, error, futures)

    def _retry_batch(self, topic: str, wait: bool, body: bytes, timeout: float, on_answer, context,
                     error: BaseException | None, futures: list[LeanFuture]) -> None:
        """A gathered batch sent the loop's way (_send_batch: route look-up, retries on other brokers)."""
        for fut in futures:  # the loop completes them now: a waiter stops reading a connection for them
            fut.channel = None
        if timeout <= 0:
            on_answer(context, None, None, -1, None, None,
                      error or MQClientError(f"batch send to topic {topic!r} timed out"))
            return
        encoded = (topic, "", body, Message(topic, b"x", wait_store_msg_ok=wait), _OUTER_PROPS[wait])
        try:
            fut = self.instance.submit(self._send_batch(encoded, timeout, None, CommunicationMode.ASYNC))
        except MQClientError as e:  # the client stopped meanwhile
            on_answer(context, None, None, -1, None, None, error or e)
            return

        def done(f: concurrent.futures.Future) -> None:
            try:
                r = f.result()
            except BaseException as e:  # noqa: BLE001 - every message of the batch fails with it
                on_answer(context, None, None, -1, None, None, e)
                return
            on_answer(context, r.status, r.queue, r.queue_offset, r.offset_msg_id, r.region_id, None)

        fut.add_done_callback(done)

    async def send_aio(self, msg: Message, **kw) -> SendResult:
        """Await a send from your own asyncio loop."""
        return await asyncio.wrap_future(self.send_async(msg, **kw))

    def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None, selector=None, arg: Any = None) -> None:
        """Fire and forget: no response is awaited, no retry."""
        inst = self._check_started()
        inst.run(self._send(msg, CommunicationMode.ONEWAY, self.send_msg_timeout, queue, selector, arg),
                 timeout=self.send_msg_timeout + 5)

    def send_oneway_async(self, msg: Message, *, queue: MessageQueue | None = None, selector=None,
                          arg: Any = None) -> concurrent.futures.Future:
        """send_oneway without waiting: the Future is done once the request is written."""
        inst = self._check_started()
        return inst.submit(self._send(msg, CommunicationMode.ONEWAY, self.send_msg_timeout, queue, selector, arg))

    def send_batch(self, msgs: Iterable[Message], *, queue: MessageQueue | None = None,
                   timeout: float | None = None) -> SendResult:
        """One SEND_BATCH_MESSAGE request; all messages go to one queue of one topic.
        result.msg_id is the comma-joined UNIQ_KEYs (as Java)."""
        inst = self._check_started()
        t = timeout or self.send_msg_timeout
        encoded = self._encode_batch(list(msgs))
        if queue is not None and not inst.in_loop_thread():
            # a batch to a given queue is one request, no retry: made from this thread when it can be
            topic, uniq, body, outer, outer_props = encoded
            if queue.topic != topic:
                raise IllegalArgumentError(f"queue {queue} does not belong to topic {topic!r}")
            result = self._invoke_direct(outer, queue, uniq, body, 0, outer_props, t, True)
            if result is not _NOT_DIRECT:
                return result
        return inst.run(self._send_batch(encoded, t, queue), timeout=t + 5)

    def send_batch_async(self, msgs: Iterable[Message], *, queue: MessageQueue | None = None,
                         timeout: float | None = None) -> concurrent.futures.Future:
        inst = self._check_started()
        return inst.submit(self._send_batch(list(msgs), timeout or self.send_msg_timeout, queue, CommunicationMode.ASYNC))

    def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        inst = self._check_started()
        info = inst.run(self._find_publish_info(topic), timeout=self.send_msg_timeout + 5)
        return list(info.queues)

    # --- internals -------------------------------------------------------------------------------
    async def _find_publish_info(self, topic: str) -> TopicPublishInfo:
        info = self.topic_publish_info.get(topic)
        if info is None or not info.ok:
            self.topic_publish_info.setdefault(topic, TopicPublishInfo(topic, [], None))
            await self.instance.update_topic_route(topic)
            route = self.instance.topic_route_table.get(topic)
            if route is not None:
                info = self.topic_publish_info[topic] = route.publish_info(topic)
        if info is not None and info.ok:
            return info
        # the topic does not exist yet: send through the auto-create topic's brokers (TBW102)
        ok = await self.instance.update_topic_route(topic, default_topic=self.create_topic_key,
                                                    default_queue_nums=self.default_topic_queue_nums)
        route = self.instance.topic_route_table.get(topic) if ok else None
        if route is not None:
            info = self.topic_publish_info[topic] = route.publish_info(topic)
            if info.ok:
                return info
        raise MQClientError(
            f"no route info of topic {topic!r} (not on the name server {self.client_config.namesrv}, and no "
            f"auto-create route {self.create_topic_key!r}); create the topic first"
        )

    def _prepare(self, msg: Message, allow_system: bool = False) -> tuple[str, bytes, int, dict]:
        """Validate, give the message its UNIQ_KEY, compress; returns (uniq_id, body, sys_flag, props)."""
        check_message(msg, self.max_message_size, allow_system)
        props = msg.wire_properties()
        uniq = msg.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if not uniq:
            uniq = create_uniq_id()
        props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        body = msg.body
        sys_flag = 0
        if len(body) >= self.compress_msg_body_over_howmuch:
            from rmq_core import compression
            compressed, bits = compression.compress(body, self.compress_type, self.compress_level)
            if len(compressed) < len(body):
                body, sys_flag = compressed, sys_flag | bits
        if props.get(MessageConst.TRANSACTION_PREPARED) == "true":
            sys_flag |= SysFlag.TRANSACTION_PREPARED_TYPE
        return uniq, body, sys_flag, props

    async def _select_by(self, info: TopicPublishInfo, msg: Message, selector, arg) -> MessageQueue:
        fn = resolve_selector(selector)
        mq = fn(list(info.queues), msg, arg)
        if not isinstance(mq, MessageQueue):
            raise IllegalArgumentError(f"queue selector returned {mq!r}, not a MessageQueue")
        return mq

    async def _send(self, msg: Message, mode: CommunicationMode, timeout: float,
                    queue: MessageQueue | None, selector, arg, allow_system: bool = False,
                    prepared: tuple | None = None, resume: tuple | None = None) -> SendResult | None:
        """resume: (begin, failed broker name, its error) when a first attempt made off the loop
        (direct or pipelined) failed with an error worth retrying: go on from the second attempt,
        as if this loop had made the first."""
        begin = time.monotonic() if resume is None else resume[0]
        uniq, body, sys_flag, props = prepared or self._prepare(msg, allow_system)
        info = await self._find_publish_info(msg.topic)
        if queue is not None or selector is not None:
            mq = queue if queue is not None else await self._select_by(info, msg, selector, arg)
            if mq.topic != msg.topic:
                raise IllegalArgumentError(f"queue {mq} does not belong to topic {msg.topic!r}")
            return await self._send_kernel(msg, mq, uniq, body, sys_flag, props, mode, timeout)

        async def attempt(mq: MessageQueue, remaining: float) -> SendResult | None:
            return await self._send_kernel(msg, mq, uniq, body, sys_flag, props, mode, remaining)

        return await self._send_default(msg.topic, info, mode, timeout, begin, attempt, "send", resume)

    async def _send_default(self, topic: str, info: TopicPublishInfo, mode: CommunicationMode, timeout: float,
                            begin: float, attempt, what: str, resume: tuple | None = None) -> SendResult | None:
        """sendDefaultImpl's loop, for single messages and batches alike: attempt(mq, remaining
        time) on a queue SendPolicy picks (another broker after a failure), while SendPolicy says a
        failure is worth another attempt and the timeout is not spent.  resume: see _send."""
        policy = self.send_policy
        times = policy.attempts(mode)
        last_broker = None
        last_error: BaseException | None = None
        result = None
        first = 0
        if resume is not None:
            _, last_broker, last_error = resume
            first = 1
            await self.instance.update_topic_route(topic)
            info = self.topic_publish_info.get(topic) or info
        for n in range(first, times):
            remaining = timeout - (time.monotonic() - begin)
            if remaining <= 0:
                break
            mq = policy.select(info, last_broker)
            last_broker = mq.broker_name
            t0 = time.monotonic()
            try:
                result = await attempt(mq, remaining)
            except (RemotingError, MQClientError, MQBrokerError, TimeoutError) as e:
                policy.note(mq.broker_name, t0, True)
                last_error = e
                if not policy.worth_retrying(e):
                    raise
                log.warning("%s to %s failed (attempt %d/%d): %s", what, mq, n + 1, times, e)
                await self.instance.update_topic_route(topic)
                info = self.topic_publish_info.get(topic) or info
                continue
            policy.note(mq.broker_name, t0, False)
            if (mode is CommunicationMode.SYNC and result is not None and result.status is not SendStatus.SEND_OK
                    and policy.retry_another_broker_when_not_store_ok):
                continue
            return result
        if result is not None:
            return result
        elapsed = int((time.monotonic() - begin) * 1000)
        if last_error is None:
            raise MQClientError(f"{what} to topic {topic!r} timed out after {elapsed} ms")
        if isinstance(last_error, MQBrokerError):
            raise last_error
        raise MQClientError(
            f"{what} to topic {topic!r} failed after {times} attempt(s) in {elapsed} ms: {last_error}"
        ) from last_error

    async def _send_kernel(self, msg: Message, mq: MessageQueue, uniq: str, body: bytes, sys_flag: int,
                           props: dict, mode: CommunicationMode, timeout: float, batch: bool = False) -> SendResult | None:
        addr = await self.instance.find_broker_addr_in_publish_async(mq)
        req = self._build_request(msg, mq, body, sys_flag, props, batch)
        ctx = None
        if self._hooks:
            ctx = _SendContext(self.group, msg, mq, addr, mode.value)
            plugins.get_plugin_manager().hook.rmq_before_send(context=ctx)
        try:
            if mode is CommunicationMode.ONEWAY:
                req.mark_oneway()
                await self.instance.invoke_oneway(addr, req)
                return None
            resp = await self.instance.invoke(addr, req, timeout)
            result = parse_send_response(resp, mq, uniq, addr)
        except BaseException as e:
            if ctx is not None:
                ctx.exception = e
                plugins.get_plugin_manager().hook.rmq_after_send(context=ctx)
            raise
        if ctx is not None:
            ctx.send_result = result
            plugins.get_plugin_manager().hook.rmq_after_send(context=ctx)
        return result

    def _build_request(self, msg: Message, mq: MessageQueue, body: bytes, sys_flag: int, props: dict,
                       batch: bool = False) -> RemotingCommand:
        reconsume_times = 0
        max_reconsume = None
        if MixAll.is_retry_topic(mq.topic):
            # a consumer's own re-send to its retry topic carries these in the header, not properties
            props = dict(props)
            rt = props.pop(MessageConst.RECONSUME_TIME, None)
            mr = props.pop(MessageConst.MAX_RECONSUME_TIMES, None)
            reconsume_times = int(rt) if rt else 0
            max_reconsume = int(mr) if mr else None
        properties = properties_to_string(props)
        if len(properties) > 8191 and len(properties.encode("utf-8")) > 32767:  # > 8191 chars may exceed it
            encode_properties_checked(props)  # raises naming the size
        if self.use_send_message_v2:
            # the V2 header straight as the strings it travels as (what create_request would make of
            # build_send_header's values, without converting each one per send)
            header = self._v2_header(mq, sys_flag, int(time.time() * 1000), 0 if batch else msg.flag, properties,
                                     reconsume_times, max_reconsume, batch)
        else:
            header = build_send_header(
                group=self.group, topic=mq.topic, queue_id=mq.queue_id, sys_flag=sys_flag,
                born_timestamp=int(time.time() * 1000), flag=msg.flag if not batch else 0,
                properties=properties, reconsume_times=reconsume_times,
                max_reconsume_times=max_reconsume, batch=batch, broker_name=mq.broker_name,
                default_topic=self.create_topic_key, default_topic_queue_nums=self.default_topic_queue_nums,
                v2=False,
            )
        code = (RequestCode.SEND_BATCH_MESSAGE if batch else
                RequestCode.SEND_MESSAGE_V2 if self.use_send_message_v2 else RequestCode.SEND_MESSAGE)
        req = RemotingCommand.create_request(code, header, body)
        return req

    def _v2_header(self, mq: MessageQueue, sys_flag: int, born_timestamp: int, flag: int, properties: str,
                   reconsume_times: int, max_reconsume: int | None, batch: bool) -> dict[str, str]:
        """The SEND_MESSAGE_V2 header as the strings it travels as: the ext fields create_request
        makes of build_send_header(v2=True), without converting each value per send."""
        header = {
            "a": self.group, "b": mq.topic, "c": self.create_topic_key, "d": self._default_queue_nums_str,
            "e": str(mq.queue_id), "f": str(sys_flag), "g": str(born_timestamp), "h": str(flag), "i": properties,
            "j": str(reconsume_times), "k": "false", "m": "true" if batch else "false", "n": mq.broker_name,
        }
        if max_reconsume is not None:
            header["l"] = str(max_reconsume)
        return header

    def _encode_batch(self, msgs: list[Message]) -> tuple[str, str, bytes, Message, dict]:
        """Validate and encode a batch (in the caller's thread, natively: encode_batch in
        client_native); returns (topic, comma-joined UNIQ_KEYs, SEND_BATCH_MESSAGE body, the outer
        message, its properties)."""
        topic, uniqs, body, wait = encode_batch(msgs, self.max_message_size, Message, _RESERVED_PROPERTIES,
                                                check_send_topic, MessageClientIDSetter)
        return topic, uniqs, body, Message(topic, b"x", wait_store_msg_ok=wait), _OUTER_PROPS[wait]

    async def _send_batch(self, msgs: list[Message] | tuple, timeout: float, queue: MessageQueue | None,
                          mode: CommunicationMode = CommunicationMode.SYNC) -> SendResult:
        """msgs: the messages, or what _encode_batch made of them.  mode: ASYNC for send_batch_async
        and auto-batch (their retry count)."""
        topic, uniq, body, outer, outer_props = msgs if isinstance(msgs, tuple) else self._encode_batch(msgs)
        info = await self._find_publish_info(topic)
        if queue is not None:
            if queue.topic != topic:
                raise IllegalArgumentError(f"queue {queue} does not belong to topic {topic!r}")
            return await self._send_kernel(outer, queue, uniq, body, 0, outer_props, CommunicationMode.SYNC, timeout,
                                           batch=True)

        async def attempt(mq: MessageQueue, remaining: float) -> SendResult:
            return await self._send_kernel(outer, mq, uniq, body, 0, outer_props, CommunicationMode.SYNC, remaining,
                                           batch=True)

        return await self._send_default(topic, info, mode, timeout, time.monotonic(), attempt, "batch send")


__all__ = ["Producer", "CommunicationMode", "build_send_header", "parse_send_response", "RETRY_RESPONSE_CODES"]
