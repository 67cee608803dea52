"""Producer (RocketMQ's DefaultMQProducer): sync, async, oneway, ordered (selector) and batch sends.

Every send travels one pipeline: the caller's thread validates the message and builds the whole
request frame natively (rmq_core._native.frame.SendHeader, the one header writer), and writes it on its
broker's one pipelined connection (rmq_core.remoting.pipelined; an in-proc broker's the same
way, plugins/transport/inproc.py).  `send_async` returns the LeanFuture the answer finishes;
`send` is that plus a wait, in which the waiting thread reads its own answer off the connection.
A send's attempts, retry rule and fault-item notes are SendAttempts over the producer's one
SendPolicy (rmq_core.client.fault): the next attempt is written from the completion of the last.
The client's event loop only fetches a topic's route the first time.  A plain message's first
attempt is made natively (rmq_core._native.send_pipeline.PipelinedSender, answered by
PipelinedCompletion), from the tables and settings this module owns and hands over.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import functools
import logging
import threading
import time
from threading import get_ident
from typing import Any, Callable, Iterable

import attrs

from rmq_core import plugins
from rmq_core.client.accumulator import BATCH_ITEM_OVERHEAD, PipelinedAccumulator
from rmq_core.client.config import make_client_config
from rmq_core.client.fault import RETRY_RESPONSE_CODES, MQFaultStrategy, SendPolicy
from rmq_core.client.futures import LeanFuture
from rmq_core.client.instance import MQClientInstance, MQClientManager
from rmq_core.client.route import TopicPublishInfo, publish_info
from rmq_core.remoting.body import TopicRouteData
from rmq_core.client.trace import TraceDispatcher
from rmq_core.common.delegate import delegate
from rmq_core.client.selector import _SENDABLE_TOPICS, MAX_MESSAGE_SIZE, check_message, resolve_selector
from rmq_core.errors import ConfigError, IllegalArgumentError, MQBrokerError, MQClientError, RemotingError
from rmq_core.message import (
    Message, MessageClientIDSetter, MessageConst, MessageQueue, MixAll, SendResult, SendStatus, SysFlag,
    TopicValidator, check_group, encode_properties_checked,
)
from rmq_core._native.frame import SendHeader, SendResponse
from rmq_core.remoting.frames import read_send_responses
from rmq_core._native.record_batch import encode_batch_item, encode_send_batch
from rmq_core._native.send_pipeline import PipelinedCompletion, PipelinedSender, SendResultMaker
from rmq_core.remoting.codes import MQVersion, RequestCode, ResponseCode
from rmq_core.remoting.command import next_opaque, opaque_counter
from rmq_core.remoting.pipelined import PipelinedChannel

log = logging.getLogger("rmq.client.producer")

# a send answer's code -> SendStatus: SUCCESS is SEND_OK, the other statuses are the codes' names
_STATUS_BY_CODE = {ResponseCode.SUCCESS: SendStatus.SEND_OK} | {
    ResponseCode[s.name]: s for s in SendStatus if s is not SendStatus.SEND_OK}
COMPRESS_TYPES = ("lz4", "zlib")


class CommunicationMode(enum.Enum):
    SYNC = "SYNC"
    ASYNC = "ASYNC"
    ONEWAY = "ONEWAY"


# PipelinedChannel's reader of send responses: SendResponse items (bytes where declined)
read_send_response_frames = read_send_responses


create_uniq_id = MessageClientIDSetter.create_uniq_id  # (the native UNIQ_KEY maker, record_batch.pyx: UniqIds)
_RESULTS = SendResultMaker(SendResult, tuple(f.name for f in attrs.fields(SendResult)), MessageQueue, _STATUS_BY_CODE)


_RESERVED_PROPERTIES = MessageConst.SYSTEM_KEYS
_OUTER_PROPS = {wait: {MessageConst.WAIT_STORE_MSG_OK: "true" if wait else "false"} for wait in (True, False)}


_CHECKED_TOPICS: set[str] = set()  # names check_send_topic passed (a producer sends to few topics)


def _sender_setting(path: str, key: str) -> property:
    """A producer setting at `path` (an attribute, or one of an attribute) that the native sender
    keeps a copy of: a write is pushed to it as configure(key=value) once it exists."""
    setting = delegate(path, writable=True)

    def set_value(producer, value) -> None:
        setting.fset(producer, value)
        if producer._pipelined_sender is not None:
            producer._pipelined_sender.configure(**{key: value})
    return setting.setter(set_value)


def check_send_topic(topic: str) -> None:
    """check_message's topic rule: a valid name, not a system topic."""
    if topic in _CHECKED_TOPICS:
        return
    TopicValidator.check_topic(topic)
    TopicValidator.check_not_system_topic_for_send(topic)
    if len(_CHECKED_TOPICS) >= 10_000:
        _CHECKED_TOPICS.clear()
    _CHECKED_TOPICS.add(topic)


class _SendContext:
    __slots__ = ("producer_group", "message", "queue", "broker_addr", "send_result", "exception", "mode")

    def __init__(self, producer_group, message, queue, broker_addr, mode):
        self.producer_group, self.message, self.queue, self.broker_addr = producer_group, message, queue, broker_addr
        self.mode = mode
        self.send_result = None
        self.exception = None


_PLAIN = {}  # (a send channel's `request` is given only to a connection with request steps)


class SendAttempts:
    """One send (a message or a batch) on the send pipeline: RocketMQ's sendDefaultImpl.  Each
    attempt picks a queue (SendPolicy: another broker after a failure; a given or selected queue
    never changes), builds the request with the queue's SendHeader and writes it on the broker's
    pipelined connection (Producer.instance.send_channel: tcp or in-proc); its completion
    (`answered`, on whichever thread read the answer) notes the broker's latency in the policy
    and either finishes the send or starts the next attempt - while the policy grants attempts
    (sync: 1 + retry_times_when_send_failed, async: 1 + retry_times_when_send_async_failed, oneway
    and fixed queues: 1) and the send's timeout, counted across attempts, is not spent."""

    __slots__ = ("producer", "msg", "mode", "timeout", "begin", "batch", "on_result", "futures", "fut", "topic",
                 "uniq", "body", "sys_flag", "props", "reconsume", "max_reconsume", "info", "fixed", "times", "n",
                 "last_broker", "last_error", "result", "mq", "addr", "t0", "hook_ctx")

    def __init__(self, producer: "Producer", msg: Message, mode: CommunicationMode, timeout: float,
                 batch: tuple | None, on_result, futures: list | None, fut: LeanFuture | None = None,
                 begin: float | None = None):
        self.producer, self.msg, self.mode, self.timeout = producer, msg, mode, timeout
        self.begin = time.monotonic() if begin is None else begin
        self.batch, self.on_result, self.futures = batch is not None, on_result, futures
        self.fut = fut if fut is not None or on_result is not None else LeanFuture()
        self.topic = msg.topic
        self.info = self.fixed = self.last_broker = self.last_error = self.result = None
        self.mq = self.addr = self.hook_ctx = None
        self.times, self.n, self.t0 = 1, 0, 0.0
        self.reconsume, self.max_reconsume = 0, None
        if batch is not None:
            self.topic, self.uniq, self.body, _, self.props = batch
            self.sys_flag = 0

    def set_prepared(self, prepared: tuple) -> None:
        self.uniq, self.body, self.sys_flag, props = prepared
        if MixAll.is_retry_topic(self.topic):
            # a consumer's own re-send to its retry topic carries these in the header, not properties
            props = dict(props)
            rt = props.pop(MessageConst.RECONSUME_TIME, None)
            mr = props.pop(MessageConst.MAX_RECONSUME_TIMES, None)
            self.reconsume = int(rt) if rt else 0
            self.max_reconsume = int(mr) if mr else None
        self.props = props

    def first(self, info: TopicPublishInfo, queue: MessageQueue | None, selector, arg,
              picked: MessageQueue | None = None) -> None:
        """The first attempt, the topic's route known.  picked: the queue already chosen for it."""
        self.info = info
        if queue is not None or selector is not None:
            mq = queue
            if mq is None:
                mq = resolve_selector(selector)(list(info.queues), self.msg, arg)
                if not isinstance(mq, MessageQueue):
                    raise IllegalArgumentError(f"queue selector returned {mq!r}, not a MessageQueue")
            if mq.topic != self.topic:
                raise IllegalArgumentError(f"queue {mq} does not belong to topic {self.topic!r}")
            self.fixed = mq
        else:
            self.times = self.producer.send_policy.attempts(self.mode)
        self.attempt(picked)

    def attempt(self, picked: MessageQueue | None = None) -> None:
        """Pick the queue and write the next attempt (or give up: no time left)."""
        if self.timeout - (time.monotonic() - self.begin) <= 0:
            self.give_up()
            return
        mq = self.fixed or picked or self.producer.send_policy.select(self.info, self.last_broker)
        self.write(mq, self.producer.instance.find_broker_addr_in_publish(mq.broker_name))

    def write(self, mq: MessageQueue, addr: str | None) -> None:
        p = self.producer
        inst = p.instance
        self.n += 1
        self.mq, self.addr, self.last_broker = mq, addr, mq.broker_name
        self.t0 = time.monotonic()
        remaining = self.timeout - (self.t0 - self.begin)
        if addr is None:
            self.answered(None, MQClientError(f"the broker {mq.broker_name!r} of topic {self.topic!r} has no "
                                              "master address in the route"))
            return
        oneway = self.mode is CommunicationMode.ONEWAY
        opaque = next_opaque()
        header = p._send_header(mq, self.batch)
        flag = 0 if self.batch else self.msg.flag
        if p._client_steps:  # the request steps get it before it is written (steps.FrameStep.before_request)
            request = header.request(self.sys_flag, flag, self.props, opaque, self.body, self.reconsume,
                                     self.max_reconsume, oneway)
            frame = None if request is None else False
        else:
            request, frame = None, header.build_frame(self.sys_flag, flag, self.props, opaque, self.body, None,
                                                      self.reconsume, self.max_reconsume, oneway)
        if frame is None:  # (a property the format cannot hold raised naming it)
            encode_properties_checked(self.props)  # raises naming the size
            raise IllegalArgumentError(f"message flag {flag!r} cannot be encoded (a 64-bit int at most)")
        if p._hooks:  # SendMessageHook around this attempt
            self.hook_ctx = _SendContext(p.group, self.msg, mq, addr, self.mode.value)
            plugins.get_plugin_manager().hook.rmq_before_send(context=self.hook_ctx)
        try:
            channel = inst.send_channel(addr, read_send_response_frames, SendResponse.from_command)
        except RemotingError as e:  # cannot connect: counted against the broker, retried elsewhere
            self.answered(None, e)
            return
        if request is not None:
            frame = None
            built = {"request": request}
        else:
            built = _PLAIN
        if oneway:
            channel.send_oneway(frame, **built)
            self.finish(None, None)
            return
        if self.fut is not None:
            self.fut.channel = channel  # result() reads the answer itself when no other thread does
        if self.futures:
            for fut in self.futures:
                fut.channel = channel
        if self.mode is CommunicationMode.SYNC:  # the caller waits at once: it writes and reads itself
            channel.exchange(frame, opaque, remaining, SendAttempts.answered, self, **built)
        else:
            channel.send(frame, opaque, remaining, SendAttempts.answered, self, **built)

    def answered(self, response: SendResponse | None, error: BaseException | None) -> None:
        """An attempt's outcome (PipelinedChannel's completion): noted, then the send finished or
        the next attempt started."""
        p = self.producer
        policy = p.send_policy
        mq = self.mq
        result = None
        if error is None:
            result = _RESULTS.make(response, mq, self.uniq)
            if result is None:
                error = MQBrokerError(response.code, response.remark, self.addr)
        if self.fixed is None:  # (Java notes latency in sendDefaultImpl only, not for a chosen queue)
            policy.note(mq.broker_name, self.t0, error is not None)
        ctx, self.hook_ctx = self.hook_ctx, None
        if result is not None and p.trace is not None and not self.batch:  # SendMessageTraceHookImpl
            p.trace.on_send((self.msg, self.uniq, None, mq, self.addr, None, self.t0), result)
        if ctx is not None:
            ctx.send_result, ctx.exception = result, error
            try:
                plugins.get_plugin_manager().hook.rmq_after_send(context=ctx)
            except Exception:  # noqa: BLE001 - the send's outcome stands
                log.exception("rmq_after_send raised")
        if error is None:
            if (self.mode is CommunicationMode.SYNC and result.status is not SendStatus.SEND_OK
                    and policy.retry_another_broker_when_not_store_ok and self.n < self.times):
                self.result = result
                self.next()
                return
            self.finish(result, None)
            return
        self.last_error = error
        if self.addr is not None:  # a master gone or no longer master: its group's route asked for at once
            p.instance.note_request_failed(self.addr, error)
        if not policy.worth_retrying(error) or self.fixed is not None:
            self.finish(None, error)
            return
        if self.n < self.times and p.instance.pipelined_send_possible():
            log.warning("%s to %s failed (attempt %d/%d): %s", "batch send" if self.batch else "send", mq, self.n,
                        self.times, error)
            self.next()
            return
        self.give_up()

    def next(self) -> None:
        """The next attempt, from the completion of the last one.  A connect to the next broker
        must not hold up the thread that read the last answer: that one goes to a client thread."""
        try:
            if self.fut is not None and self.fut.done():  # cancelled meanwhile: no more attempts
                return
            if self.timeout - (time.monotonic() - self.begin) <= 0:
                self.give_up()
                return
            for fut in self.futures or ():
                fut.channel = None
            if self.fut is not None:
                self.fut.channel = None  # a waiter stops reading the last connection for it
            mq = self.producer.send_policy.select(self.info, self.last_broker)
            inst = self.producer.instance
            addr = inst.find_broker_addr_in_publish(mq.broker_name)
            if addr is not None and not inst.has_send_channel(addr):
                inst.blocking_executor.submit(self._write_guarded, mq, addr)
                return
            self.write(mq, addr)
        except Exception as e:  # noqa: BLE001 - e.g. the client shut down meanwhile
            self.finish(None, self.last_error or e)

    def _write_guarded(self, mq: MessageQueue, addr: str) -> None:
        try:
            self.write(mq, addr)
        except Exception as e:  # noqa: BLE001
            self.finish(None, e)

    def give_up(self) -> None:
        """No attempt or time left: the last result (a store not OK), or the failure."""
        if self.result is not None:
            self.finish(self.result, None)
            return
        what = "batch send" if self.batch else "send"
        elapsed = int((time.monotonic() - self.begin) * 1000)
        error = self.last_error
        if error is None:
            error = MQClientError(f"{what} to topic {self.topic!r} timed out after {elapsed} ms")
        elif not isinstance(error, MQBrokerError):
            wrapped = MQClientError(f"{what} to topic {self.topic!r} failed after {self.n} attempt(s) in {elapsed} "
                                    f"ms: {error}")
            wrapped.__cause__ = error
            error = wrapped
        self.finish(None, error)

    def finish(self, result, error: BaseException | None) -> None:
        if self.on_result is not None:
            self.on_result(result, error)
        else:
            self.fut.finish(result, error)


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
                 enable_msg_trace: bool = False,
                 customized_trace_topic: str | None = None,
                 **client_options):
        self.group = check_group(group)
        # message trace (RocketMQ's enableMsgTrace): each answered send noted, sent in the background
        self.trace = TraceDispatcher.create(self.group, "PRODUCE", enable_msg_trace, customized_trace_topic)
        opts = dict(client_options)
        if instance_name is not None:
            opts["instance_name"] = instance_name
        self.client_config = make_client_config(type(self).__name__, namesrv, opts, own=type(self).__init__)
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
        self._pipelined_sender: PipelinedSender | None = None  # a plain send's first attempt, natively (at start)
        self.send_msg_timeout = send_msg_timeout
        self.compress_msg_body_over_howmuch = compress_msg_body_over_howmuch
        self.compress_type = compress_type
        self.compress_level = compress_level
        self.max_message_size = max_message_size
        self.use_send_message_v2 = use_send_message_v2
        self.create_topic_key = create_topic_key
        self.default_topic_queue_nums = default_topic_queue_nums
        self.fault_strategy = MQFaultStrategy(enabled=send_latency_fault_enable)
        # every send's attempts, retry rule and fault item update (see SendPolicy)
        self.send_policy = SendPolicy(self.fault_strategy, retry_times_when_send_failed,
                                      retry_times_when_send_async_failed, retry_another_broker_when_not_store_ok)
        self.topic_publish_info: dict[str, TopicPublishInfo] = {}
        self.instance: MQClientInstance | None = None
        self._started = False
        self._lock = threading.Lock()
        self._hooks = False
        self._client_steps = False
        # auto_batch (RocketMQ 5's autoBatch): async sends of a topic gathered into batch requests
        self.auto_batch = auto_batch
        self.batch_max_bytes = min(batch_max_bytes, max_message_size)
        # gathered in the senders' threads, sent as batches on the pipeline; made at start
        self._batch_accumulator: PipelinedAccumulator | None = None
        # (topic, broker, queue id, batch) -> SendHeader, see _send_header (keyed by the fields: a
        # MessageQueue's attrs-made __hash__ and __eq__ are Python calls)
        self._send_headers: dict[tuple, SendHeader] = {}
        # a native first attempt's usual completion (its other cases: _native_failed); it notes
        # fast answers in the policy's table, as SendPolicy.note does
        self._pipelined_completion = PipelinedCompletion(
            maker=_RESULTS, fault=self.fault_strategy, noted=self.send_policy.noted, fallback=self._native_failed,
            traced=self.trace.buffer if self.trace is not None else None)
        self._loop_ident: int | None = None  # the client loop's thread, where no send may wait
        self._native_first = False  # plain sends make their first attempt natively (no send hooks; at start)

    # the settings the native sender keeps a copy of: pushed to it when they change
    max_message_size = _sender_setting("_max_message_size", "max_message_size")
    compress_msg_body_over_howmuch = _sender_setting("_compress_over", "compress_over")
    send_latency_fault_enable = delegate("fault_strategy.enabled", writable=True)  # (the sender reads the strategy)

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
        return self._start_on(None)

    def _start_on(self, instance: MQClientInstance | None) -> "Producer":
        """start() on `instance` (the client instance's own inner producer), else on the instance
        of this producer's client id."""
        with self._lock:
            if self._started:
                return self
            self.instance = instance or MQClientManager.get_instance(self.client_config, Producer)
            self.instance.register_producer(self.group, self)
            try:
                self.instance.start()
                self._loop_ident = self.instance.loop_thread_ident  # (send()'s check, see _check_may_wait)
                self._hooks = plugins.has_impls("rmq_before_send") or plugins.has_impls("rmq_after_send")
                # request steps: its send connections take each send before it is written
                self._client_steps = getattr(getattr(self.instance, "remoting", None), "steps", None) is not None
                # (send hooks run around each attempt of a SendAttempts, on the same connection)
                self._native_first = not self._hooks
                self._pipelined_sender = self._make_pipelined_sender()
                # (with send hooks each message goes alone: each gets its own hook calls)
                if self.auto_batch and not self._hooks:
                    self._batch_accumulator = PipelinedAccumulator(self, batch_max_bytes=self.batch_max_bytes)
                if self.trace is not None:
                    self.trace.start(self.instance)
                self._started = True
            except BaseException:
                self.instance.unregister_producer(self.group)
                raise
        log.info("the producer [%s] start OK, client id %s", self.group, self.instance.client_id)
        return self

    def _make_pipelined_sender(self) -> PipelinedSender:
        """The native first attempt, working from this producer's tables and settings and those of
        its (started) client instance; the client's shutdown closes it (on_client_stopping)."""
        inst = self.instance
        steps = getattr(getattr(inst, "remoting", None), "steps", None)
        send_channel = functools.partial(inst.send_channel, read_frames=read_send_response_frames,
                                         from_command=SendResponse.from_command)

        def channel_for(addr: str) -> tuple:
            """(the connection, its PipelinedWrites when it is a tcp one - the native sender writes
            there itself, and knows it open while they are - and whether it closed, for another kind)"""
            channel = send_channel(addr)
            if type(channel) is PipelinedChannel:
                return channel, channel.writes, None
            return channel, None, lambda: channel.closed

        return PipelinedSender(
            routes=self.topic_publish_info, fault=self.fault_strategy, headers=self._send_headers,
            broker_addrs=inst.broker_addr_table, master_id=MixAll.MASTER_ID,
            checked_topics=_SENDABLE_TOPICS, check_message=check_message,  # (the topic names check_message passed)
            new_uniq=create_uniq_id,
            opaques=opaque_counter,  # (next_opaque's process-wide counter: opaques never repeat)
            future_cls=LeanFuture, message_cls=Message, channel_for=channel_for,
            remoting_error=RemotingError, completion=self._pipelined_completion, send_general=self._send_general,
            failed=self._native_failed, steps_on=steps is not None,
            header_signer=None if steps is None else steps.header_signer,
            before_steps=None if steps is None or steps.after else steps.before,
            encode_send=None if steps is None else steps.encode_send,
            one_channel_per_broker=getattr(getattr(inst, "config", None), "pipelined_send_connections", 0) == 1,
            max_message_size=self._max_message_size, compress_over=self._compress_over)

    def on_client_stopping(self) -> None:
        """The client instance is shutting down: no more native first attempts (the general path
        refuses them, naming why)."""
        sender = self._pipelined_sender
        if sender is not None:
            sender.configure(open=False)

    def shutdown(self) -> None:
        with self._lock:
            if not self._started:
                return
            self._started = False
        if self._batch_accumulator is not None and not self._batch_accumulator.drain(self.send_msg_timeout * 2 + 1):
            log.warning("producer %s: gathered messages still unanswered at shutdown", self.group)
            self._batch_accumulator.fail_pending(
                MQClientError(f"producer {self.group} shut down before the message was sent"))
        if self.trace is not None:  # (its last records leave through the client's inner producer)
            self.trace.shutdown()
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
            self.topic_publish_info[topic] = publish_info(route, topic)

    def on_master_changed(self, broker_name: str) -> None:
        """The route shows a new master of `broker_name`: what the fault strategy noted was of the
        old one (benched for minutes after it failed), so sends go to the new one at once."""
        self.fault_strategy.tolerance.remove(broker_name)
        self.send_policy.noted.pop(broker_name, None)

    def _check_started(self) -> MQClientInstance:
        if not self._started:
            raise MQClientError(f"the producer {self.group!r} is not started; call start() first")
        return self.instance

    def _check_may_wait(self) -> None:
        """A blocking send is refused on the client's loop: it may be the one to finish it."""
        if not self._started:
            self._check_started()
        if self.instance.loop_thread_ident == get_ident():
            raise RuntimeError("a blocking send called on the client event loop (would deadlock)")

    # --- public send API -------------------------------------------------------------------------
    def send(self, msg: Message, *, queue: MessageQueue | None = None, selector=None, arg: Any = None,
             timeout: float | None = None) -> SendResult:
        """Send and wait: send_async's send, whose answer this thread reads itself off the
        broker's connection.  queue: send to that queue; selector(+arg): ordered send (neither
        switches queue on a failure, like Java).  Raises MQClientError / MQBrokerError /
        IllegalArgumentError naming the problem."""
        if not self._started or self._loop_ident == get_ident():
            self._check_may_wait()  # (raises naming why)
        t = timeout or self.send_msg_timeout
        if self._goes_native(True, queue, selector):
            fut = self._pipelined_sender.send(msg, t, "SYNC")  # (_submit's first case, without its checks)
            if fut is not None:
                return self._wait(fut, t)
        return self._wait(self._submit(msg, CommunicationMode.SYNC, t, queue, selector, arg), t)

    def resend(self, msg: Message, *, queue: MessageQueue | None = None, timeout: float | None = None) -> SendResult:
        """Send a copy of a stored message with its system properties (RETRY_TOPIC,
        ORIGIN_MESSAGE_ID, UNIQ_KEY, TAGS, RECONSUME_TIME, MAX_RECONSUME_TIMES...), as RocketMQ's own
        re-sends set them (MessageAccessor): a consumer's fallback to its retry topic (the client
        instance's inner producer) and the admin tools' resends.  To a retry topic, RECONSUME_TIME and
        MAX_RECONSUME_TIMES travel in the request header (SendAttempts.set_prepared)."""
        self._check_may_wait()
        t = timeout or self.send_msg_timeout
        return self._wait(self._submit(msg, CommunicationMode.SYNC, t, queue, prepared=self._prepare(msg, True)), t)

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
        self._check_started()
        t = timeout or self.send_msg_timeout
        fut = None
        if self._batch_accumulator is not None and queue is None and selector is None:
            fut = self._batch_accumulator.offer(msg, t)
        if fut is None:
            fut = self._submit(msg, CommunicationMode.ASYNC, t, queue, selector, arg)
        if callback is not None:
            self._call_back_when_done(fut, callback)
        return fut

    def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None, selector=None, arg: Any = None) -> None:
        """Fire and forget: no response is awaited, no retry."""
        self._check_may_wait()
        t = self.send_msg_timeout
        self._wait(self._submit(msg, CommunicationMode.ONEWAY, t, queue, selector, arg), t)

    def send_oneway_async(self, msg: Message, *, queue: MessageQueue | None = None, selector=None,
                          arg: Any = None) -> concurrent.futures.Future:
        """send_oneway without waiting: the Future is done once the request is written."""
        self._check_started()
        return self._submit(msg, CommunicationMode.ONEWAY, self.send_msg_timeout, queue, selector, arg)

    def send_batch(self, msgs: Iterable[Message], *, queue: MessageQueue | None = None,
                   timeout: float | None = None) -> SendResult:
        """One SEND_BATCH_MESSAGE request; all messages go to one queue of one topic.
        result.msg_id is the comma-joined UNIQ_KEYs (as Java)."""
        self._check_may_wait()
        t = timeout or self.send_msg_timeout
        msgs = list(msgs)
        encoded = self._encode_batch(msgs)
        begin = time.monotonic()
        result = self._wait(self._submit(encoded[3], CommunicationMode.SYNC, t, queue, batch=encoded), t)
        if self.trace is not None:  # a Pub record per message
            self.trace.on_send_batch(msgs, encoded[1].split(","), result.offset_msg_id, result.region_id,
                                     result.status, begin)
        return result

    def send_batch_async(self, msgs: Iterable[Message], *, queue: MessageQueue | None = None,
                         timeout: float | None = None) -> concurrent.futures.Future:
        self._check_started()
        msgs = list(msgs)
        try:
            encoded = self._encode_batch(msgs)
        except Exception as e:  # noqa: BLE001 - a bad batch fails its Future, as any other send error
            return self._failed_future(e)
        begin = time.monotonic()
        fut = self._submit(encoded[3], CommunicationMode.ASYNC, timeout or self.send_msg_timeout, queue,
                           batch=encoded)
        if self.trace is not None:  # a Pub record per message, once answered
            trace, ids = self.trace, encoded[1].split(",")

            def traced(f) -> None:
                if not f.cancelled() and f.exception() is None:
                    r = f.result()
                    trace.on_send_batch(msgs, ids, r.offset_msg_id, r.region_id, r.status, begin)
            fut.add_done_callback(traced)
        return fut

    async def send_aio(self, msg: Message, **kw) -> SendResult:
        """Await a send from your own asyncio loop."""
        return await asyncio.wrap_future(self.send_async(msg, **kw))

    def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        inst = self._check_started()
        info = inst.run(self._find_publish_info(topic), timeout=self.send_msg_timeout + 5)
        return list(info.queues)

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

    # --- the send pipeline -----------------------------------------------------------------------
    def _submit(self, msg: Message, mode: CommunicationMode, timeout: float, queue: MessageQueue | None = None,
                selector=None, arg: Any = None, *, batch: tuple | None = None, prepared: tuple | None = None,
                on_result=None, futures: list | None = None) -> LeanFuture | None:
        """Start a send on the pipeline: its LeanFuture (None with on_result: on_result(result,
        error) is called instead).  A plain message without send hooks makes its first attempt
        natively (PipelinedSender.send, the kernel of SendAttempts' first write); everything else
        is a SendAttempts from the start.  batch: what _encode_batch made (msg is its outer message)."""
        if (batch is None and prepared is None and mode is not CommunicationMode.ONEWAY
                and self._goes_native(mode is CommunicationMode.SYNC, queue, selector)):
            fut = self._pipelined_sender.send(msg, timeout, mode.value)
            if fut is not None:
                return fut
        s = SendAttempts(self, msg, mode, timeout, batch, on_result, futures)
        try:
            if batch is None:
                s.set_prepared(prepared or self._prepare(msg))
            info = self.topic_publish_info.get(msg.topic)
            if info is not None and info.ok:
                s.first(info, queue, selector, arg)
            elif queue is not None and self.instance.find_broker_addr_in_publish(queue.broker_name) is not None:
                # (as Java's send to a given queue: the broker's address is all it needs, not the topic's route)
                s.first(info or TopicPublishInfo(msg.topic, [], None), queue, None, None)
            elif mode is CommunicationMode.SYNC and not self.instance.in_loop_thread():
                s.first(self.instance.run(self._find_publish_info(msg.topic), timeout=timeout + 5), queue, selector,
                        arg)
            else:  # the topic's route is not known yet: fetched on the loop, then on the pipeline
                self._route_then(s, queue, selector, arg)
        except Exception as e:  # noqa: BLE001 - a bad message, no route...: this send's error
            s.finish(None, e)
        return s.fut

    def _goes_native(self, sync: bool, queue: MessageQueue | None, selector) -> bool:
        """Whether a plain message's send (sync or async, not oneway) makes its first attempt
        natively (PipelinedSender.send): no given queue or selector, no send hooks, and for a sync
        send no retry of a store-not-OK answer (SendAttempts judges that one).  The one predicate
        of the fast path: send(), _submit() and rmq_core.aio ask it."""
        return (queue is None and selector is None and self._native_first
                and not (sync and self.send_policy.retry_another_broker_when_not_store_ok))

    def _route_then(self, s: "SendAttempts", queue, selector, arg) -> None:
        inst = self.instance
        routed = inst.submit(self._find_publish_info(s.topic))

        def go(info) -> None:
            try:
                s.first(info, queue, selector, arg)
            except Exception as e:  # noqa: BLE001
                s.finish(None, e)

        def done(f: concurrent.futures.Future) -> None:  # on the loop: the first attempt may connect
            error = f.exception()
            if error is not None:
                s.finish(None, error)
                return
            try:
                inst.blocking_executor.submit(go, f.result())
            except RuntimeError:  # the client is shutting down
                s.finish(None, MQClientError(f"producer {self.group} shut down before the message was sent"))

        routed.add_done_callback(done)

    def _send_general(self, msg: Message, timeout: float, mq: MessageQueue, addr: str | None, mode: str):
        """PipelinedSender's way out once it picked `mq` (no address, a body to compress...): the
        same first attempt made by a SendAttempts."""
        s = SendAttempts(self, msg, CommunicationMode(mode), timeout, None, None, None)
        try:
            s.set_prepared(self._prepare(msg))
            s.first(self.topic_publish_info.get(msg.topic), None, None, None, mq)
        except Exception as e:  # noqa: BLE001
            s.finish(None, e)
        return s.fut

    def _native_failed(self, context: tuple, response: SendResponse | None, error: BaseException | None) -> None:
        """PipelinedCompletion's other cases (a failure, a refusal): the attempt's outcome judged
        by its SendAttempts, which retries as the policy says."""
        msg, uniq, mode, mq, addr, timeout, begin, fut = context
        s = SendAttempts(self, msg, CommunicationMode(mode), timeout, None, None, None, fut, begin)
        s.set_prepared(self._prepared_with(msg, uniq))
        s.info = self.topic_publish_info.get(msg.topic)
        s.times = self.send_policy.attempts(s.mode)
        s.n, s.mq, s.addr, s.t0, s.last_broker = 1, mq, addr, begin, mq.broker_name
        s.answered(response, error)

    def _prepared_with(self, msg: Message, uniq: str) -> tuple[str, bytes, int, dict]:
        """What _prepare makes of a plain message (PipelinedSender's kind) whose UNIQ_KEY is `uniq`."""
        props = msg.wire_properties()
        props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        return uniq, msg.body, 0, props

    @staticmethod
    def _wait(fut: concurrent.futures.Future, timeout: float):
        """A send's outcome; the pipeline finishes every send within its timeout (the slack covers
        a route look-up made first)."""
        try:
            return fut.result(timeout + 5)
        except concurrent.futures.TimeoutError:
            raise MQClientError(f"send timed out after {timeout} s") from None

    def _send_header(self, mq: MessageQueue, batch: bool) -> SendHeader:
        """The header writer of sends to `mq` (V2, or V1 with use_send_message_v2=False), cached."""
        # (a retry topic's header is keyed apart: the native first attempt, which looks up the plain
        # key, leaves such sends to SendAttempts, which moves their reconsume fields into the header)
        key = (mq.topic, mq.broker_name, mq.queue_id, ("retry", batch) if MixAll.is_retry_topic(mq.topic) else batch)
        header = self._send_headers.get(key)
        if header is not None:
            return header
        if len(self._send_headers) >= 4096:  # queues come and go with routes: keep it bounded
            self._send_headers.clear()
        code = (RequestCode.SEND_BATCH_MESSAGE if batch else
                RequestCode.SEND_MESSAGE_V2 if self.use_send_message_v2 else RequestCode.SEND_MESSAGE)
        header = SendHeader(
            self.group, mq.topic, mq.queue_id, mq.broker_name, self.create_topic_key, self.default_topic_queue_nums,
            code, batch, "PYTHON", MQVersion.CURRENT, self.use_send_message_v2 or batch)
        self._send_headers[key] = header
        return header

    # --- auto_batch (PipelinedAccumulator's transport) ---------------------------------------------
    def _batch_item(self, msg: Message, batch_max_bytes: int):
        """An auto_batch message validated and encoded as a batch item, in the caller's thread:
        (topic, uniq, item, wait_store_msg_ok); the IllegalArgumentError naming what is wrong; or
        None when it does not go this way (Java's batch rules: no delay level, no compression, not
        to a retry topic, within batch_max_bytes)."""
        body = msg.body if type(msg) is Message else None
        if (body is None or msg.delay_time_level != 0 or len(body) >= self.compress_msg_body_over_howmuch
                or len(body) + BATCH_ITEM_OVERHEAD >= batch_max_bytes):
            return None
        if MixAll.is_retry_topic(msg.topic):
            return None
        try:  # (check_message's checks included)
            return encode_batch_item(msg, self.max_message_size, Message, _RESERVED_PROPERTIES, check_send_topic,
                                     create_uniq_id)
        except IllegalArgumentError as e:
            return e

    _results_maker = _RESULTS  # PipelinedAccumulator's SendResults (send_pipeline.finish_batch)

    @staticmethod
    def _failed_future(error: BaseException) -> LeanFuture:
        fut = LeanFuture()
        fut.finish(None, error)
        return fut

    def _write_batch(self, topic: str, wait: bool, body: bytes, timeout: float, on_answer, context,
                     futures: list[LeanFuture]):
        """One SEND_BATCH_MESSAGE of gathered items, an async batch send on the pipeline;
        on_answer(context, status, queue, base offset, offset msg ids, region, error) once.  The
        futures of its messages are marked with the connection their answer comes on
        (LeanFuture.channel: a waiting caller reads it); returns that connection, or None."""
        outer = Message(topic, b"x", wait_store_msg_ok=wait)

        def on_result(result: SendResult | None, error: BaseException | None) -> None:
            if error is not None:
                on_answer(context, None, None, -1, None, None, error)
            else:
                on_answer(context, result.status, result.queue, result.queue_offset, result.offset_msg_id,
                          result.region_id, None)

        s = self._submit(outer, CommunicationMode.ASYNC, timeout, batch=(topic, "", body, outer, _OUTER_PROPS[wait]),
                         on_result=on_result, futures=futures)
        return futures[0].channel if futures else None

    # --- internals -------------------------------------------------------------------------------
    async def _find_publish_info(self, topic: str) -> TopicPublishInfo:
        info = self.topic_publish_info.get(topic)
        if info is None or not info.ok:
            self.topic_publish_info.setdefault(topic, TopicPublishInfo(topic, [], None))
            await self.instance.update_topic_route(topic, report=False)  # (a failure is raised below)
            route = self.instance.topic_route_table.get(topic)
            if route is not None:
                info = self.topic_publish_info[topic] = publish_info(route, topic)
        if info is not None and info.ok:
            return info
        # the topic does not exist yet: send through the auto-create topic's brokers (TBW102)
        ok = await self.instance.update_topic_route(topic, default_topic=self.create_topic_key,
                                                    default_queue_nums=self.default_topic_queue_nums, report=False)
        route = self.instance.topic_route_table.get(topic) if ok else None
        if route is not None:
            info = self.topic_publish_info[topic] = publish_info(route, topic)
            if info.ok:
                return info
        cause = self.instance.route_error(topic)
        if cause is not None:
            raise cause
        route = self.instance.topic_route_table.get(topic)
        no_master = route.no_master() if route is not None else None
        if no_master is not None:
            raise MQClientError(f"cannot send to topic {topic!r}: {no_master}")
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

    def _encode_batch(self, msgs: list[Message]) -> tuple[str, str, bytes, Message, dict]:
        """Validate and encode a batch (in the caller's thread, natively: record_batch.pyx's
        encode_send_batch); returns (topic, comma-joined UNIQ_KEYs, SEND_BATCH_MESSAGE body, the outer
        message, its properties)."""
        topic, uniqs, body, wait = encode_send_batch(msgs, self.max_message_size, Message, _RESERVED_PROPERTIES,
                                                     check_send_topic, create_uniq_id)
        return topic, uniqs, body, Message(topic, b"x", wait_store_msg_ok=wait), _OUTER_PROPS[wait]


__all__ = ["Producer", "CommunicationMode", "SendAttempts", "RETRY_RESPONSE_CODES"]
