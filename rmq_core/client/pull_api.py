"""PULL_MESSAGE and the offset look-ups shared by the push and the lite pull consumer
(RocketMQ's PullAPIWrapper + the MQAdmin offset calls)."""
from __future__ import annotations

import asyncio
import collections
import logging

import attrs

from rmq_core.errors import MQBrokerError, MQClientError, RemotingError
from rmq_core.message import MessageQueue, MixAll, PullStatus
from rmq_core.remoting.codes import PULL_STATUS_BY_CODE, RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand, next_opaque

log = logging.getLogger("rmq.client.pull")

# A queue's pulls on the wire at once (PullChain): the one at the next offset, and up to three
# guessed after it while the broker reports a backlog (more in flight hide the round trip to the
# broker; beyond four the 128 B benchmark gained nothing).
PULLS_IN_FLIGHT = 4



@attrs.define
class PullResultExt:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int
    messages: list = attrs.field(factory=list)
    scanned: int = 0  # messages decoded before the client-side tag check


class PullRequests:
    """The PULL_MESSAGE requests of one queue and subscription: the header fields that stay the
    same from pull to pull are made into strings once, a pull copies them and sets its offsets."""

    __slots__ = ("sub", "max_nums", "_fields")

    def __init__(self, *, group: str, mq: MessageQueue, sub, max_nums: int, suspend_timeout_ms: int):
        self.sub = sub
        self.max_nums = max_nums
        self._fields = {
            "consumerGroup": group, "topic": mq.topic, "queueId": str(mq.queue_id), "queueOffset": "",
            "maxMsgNums": str(max_nums), "sysFlag": "", "commitOffset": "",
            "suspendTimeoutMillis": str(suspend_timeout_ms), "subscription": sub.sub_string,
            "subVersion": str(sub.sub_version), "expressionType": str(sub.expression_type),
        }

    def request(self, offset: int, sys_flag: int, commit_offset: int) -> RemotingCommand:
        fields = self._fields.copy()
        fields["queueOffset"] = str(offset)
        fields["sysFlag"] = str(sys_flag)
        fields["commitOffset"] = str(commit_offset)
        # every value already a string: the header goes out as is, not converted field by field
        return RemotingCommand(RequestCode.PULL_MESSAGE, opaque=next_opaque(), ext_fields=fields)


def build_pull_request(*, group: str, mq: MessageQueue, sub, offset: int, max_nums: int, sys_flag: int,
                       commit_offset: int, suspend_timeout_ms: int) -> RemotingCommand:
    return PullRequests(group=group, mq=mq, sub=sub, max_nums=max_nums,
                        suspend_timeout_ms=suspend_timeout_ms).request(offset, sys_flag, commit_offset)


def process_pull_response(resp: RemotingCommand, mq: MessageQueue, sub, addr: str, decode: bool = True) -> PullResultExt:
    """The pull's status and offsets; with `decode`, its messages as MessageExt (a caller that
    decodes the body its own way, e.g. into columns, passes decode=False and reads resp.body)."""
    status = PULL_STATUS_BY_CODE.get(resp.code)
    if status is None:
        raise MQBrokerError(resp.code, resp.remark, addr)
    result = PullResultExt(
        status=status,
        next_begin_offset=resp.get_int("nextBeginOffset", 0),
        min_offset=resp.get_int("minOffset", 0),
        max_offset=resp.get_int("maxOffset", 0),
        suggest_which_broker_id=resp.get_int("suggestWhichBrokerId", 0) or 0,
    )
    if decode and status is PullStatus.FOUND and resp.body:
        from rmq_core.codec import decode_messages
        msgs = decode_messages(resp.body, broker_name=mq.broker_name)
        result.scanned = len(msgs)
        if sub.is_tag and sub.tags_set:
            # the broker filtered by tag hash code, which can collide: re-check the exact string
            tags = frozenset(sub.tags_set)
            msgs = [m for m in msgs if m.tags in tags]
        result.messages = msgs
    return result


class _Pull:
    """A pull of a PullChain on the wire or answered, not yet taken by the loop."""

    __slots__ = ("offset", "addr", "future", "next_offset")

    def __init__(self, offset: int, addr: str):
        self.offset = offset
        self.addr = addr
        self.future = None
        self.next_offset = None  # the answer's nextBeginOffset once answered (-1: not a FOUND answer)


class PullChain:
    """One queue's pulls, each sent from inside the read that brought the answer before it.

    RocketMQ's consumer sends a queue's next pull once the previous batch is in the process queue;
    here the next pull leaves in the same read as that answer (its offset is the answer's
    nextBeginOffset), before the client decodes and dispatches the batch, so the broker reads it
    while the client works and the answers of several queues share one write each way.  While the
    broker's answers show a backlog (maxOffset at least a whole stride past the pull on the wire)
    and every pull moved the offset by the same stride, a second pull follows at the offset the
    first will answer with: up to PULLS_IN_FLIGHT of a queue's pulls are on the wire at once, so a
    queue's rate is not one pull per round trip.  The loop takes the answers in offset order; a
    pull it does not want (a wrong guess, a seek, a dropped queue) is cancelled and its answer
    dropped, so nothing is consumed out of place.  `make_request(offset)` builds a pull,
    `may_pull_ahead(answer, batches)` says whether the loop would send a pull now with `batches`
    pulled batches not yet in its process queue (flow control counting each as pull_batch_size
    messages of the answer's body size, not paused, ...)."""

    __slots__ = ("instance", "group", "mq", "timeout", "make_request", "may_pull_ahead", "filter_hooks", "ahead",
                 "stride")

    def __init__(self, instance, group: str, mq: MessageQueue, timeout: float, make_request, may_pull_ahead):
        from rmq_core import plugins

        self.instance = instance
        self.group = group
        self.mq = mq
        self.timeout = timeout
        self.make_request = make_request
        self.may_pull_ahead = may_pull_ahead
        self.filter_hooks = plugins.has_impls("rmq_filter_message")  # resolved once per queue, not per pull
        self.ahead: collections.deque = collections.deque()  # _Pull in offset order, the loop's next first
        self.stride = 0  # how far the last answered pull moved the offset

    async def pull(self, addr: str, offset: int, sub) -> PullResultExt:
        """The result of the pull at `offset` (one sent ahead, or a new one), decoded and through
        the FilterMessageHook plugins."""
        ahead = self.ahead
        if ahead and ahead[0].offset != offset:
            self.cancel()
        if not ahead:
            self._send(addr, offset)
        if ahead:
            p = ahead[0]
            try:
                resp = await p.future
            finally:
                if ahead and ahead[0] is p:
                    ahead.popleft()
            addr = p.addr
        else:  # not connected yet (or an RPC hook runs): the usual invoke, unchained
            resp = await self.instance.invoke(addr, self.make_request(offset), self.timeout)
        result = process_pull_response(resp, self.mq, sub, addr)
        if self.filter_hooks and result.messages:
            run_filter_hooks(self.group, self.mq, result)
        return result

    async def pull_or_back_off(self, broker_id: int, offset: int, sub, delay: float, stopped) -> PullResultExt | None:
        """The pull at `offset` from the queue's broker (`broker_id` as the last answer suggested;
        the master when that one is not in the route), or None when it failed: logged, then
        `delay` seconds waited, as both consumers' pull loops back off - at once when `stopped()`
        says the loop is over."""
        addr = None
        try:
            addr = self.instance.find_broker_addr_in_subscribe(self.mq.broker_name, broker_id)
            if addr is None:
                addr = await self.instance.find_broker_addr_in_subscribe_async(self.mq, broker_id)
            return await self.pull(addr, offset, sub)
        except (RemotingError, MQClientError, MQBrokerError, ValueError) as e:
            if stopped():
                return None
            if addr is not None:  # a master gone: its group's route asked for at once (the new master's pulls)
                self.instance.note_request_failed(addr, e)
            log.warning("pull %s from offset %d failed: %s", self.mq, offset, e)
            await asyncio.sleep(delay)
            return None

    def _send(self, addr: str, offset: int) -> bool:
        p = _Pull(offset, addr)
        p.future = self.instance.invoke_nowait(addr, self.make_request(offset), self.timeout,
                                               lambda resp: self._on_answer(p, resp))
        if p.future is None:
            return False
        self.ahead.append(p)
        return True

    def _on_answer(self, p: _Pull, resp: RemotingCommand) -> None:
        ahead = self.ahead
        nb = resp.get_int("nextBeginOffset") if resp.code == ResponseCode.SUCCESS else None
        p.next_offset = -1 if nb is None else nb
        try:
            i = ahead.index(p)
        except ValueError:
            return  # taken or cancelled meanwhile
        if i + 1 < len(ahead) and ahead[i + 1].offset != nb:  # the guess after it was wrong
            while len(ahead) > i + 1:
                ahead.pop().future.cancel()
        if nb is None:
            return
        stride = nb - p.offset
        guess = stride > 0 and stride == self.stride  # (a filtered queue's strides vary: no guesses)
        self.stride = stride
        max_offset = resp.get_int("maxOffset", 0)
        while True:
            tail = ahead[-1]
            if tail is p:
                offset = nb
            elif guess and tail.next_offset is None and tail.offset + stride <= max_offset:
                offset = tail.offset + stride  # the tail's answer will end there (backlog, same stride)
            else:
                return
            if sum(1 for q in ahead if q.next_offset is None) >= PULLS_IN_FLIGHT:
                return
            if not self.may_pull_ahead(resp, len(ahead)) or not self._send(tail.addr, offset):
                return

    def cancel(self) -> None:
        ahead = self.ahead
        while ahead:
            ahead.pop().future.cancel()  # its answer, if any, is dropped as unmatched


class FilterMessageContext:
    """What a FilterMessageHook plugin sees after a pull; it may drop messages from `messages`."""

    __slots__ = ("consumer_group", "queue", "messages", "unit_mode")

    def __init__(self, group: str, mq: MessageQueue, msgs: list):
        self.consumer_group, self.queue, self.messages, self.unit_mode = group, mq, msgs, False


def run_filter_hooks(group: str, mq: MessageQueue, result: PullResultExt) -> None:
    """Call rmq_filter_message plugins (only when some plugin implements it: callers check once)."""
    from rmq_core import plugins

    ctx = FilterMessageContext(group, mq, result.messages)
    plugins.get_plugin_manager().hook.rmq_filter_message(context=ctx)
    result.messages = list(ctx.messages)


def reset_retry_topic(msgs, group: str) -> None:
    """A message pulled from %RETRY%<group> shows its original topic (Java resetRetryAndNamespace)."""
    retry = MixAll.get_retry_topic(group)
    for m in msgs:
        if m.topic == retry:
            origin = m.get_property("RETRY_TOPIC")
            if origin:
                m.topic = origin


async def query_offset(instance, code: int, mq: MessageQueue, addr: str, timestamp: int | None = None) -> int:
    ext = {"topic": mq.topic, "queueId": mq.queue_id}
    if timestamp is not None:
        ext["timestamp"] = timestamp
    resp = await instance.invoke_broker(addr, RemotingCommand.create_request(code, ext))
    return resp.get_int("offset", -1)


# A queue's offsets are asked where it is read (the master, else a slave: a consumer starting
# while its master is away still learns where to begin).
async def max_offset(instance, mq: MessageQueue) -> int:
    addr = await instance.find_broker_addr_in_subscribe_async(mq)
    return await query_offset(instance, RequestCode.GET_MAX_OFFSET, mq, addr)


async def min_offset(instance, mq: MessageQueue) -> int:
    addr = await instance.find_broker_addr_in_subscribe_async(mq)
    return await query_offset(instance, RequestCode.GET_MIN_OFFSET, mq, addr)


async def search_offset(instance, mq: MessageQueue, timestamp_ms: int) -> int:
    addr = await instance.find_broker_addr_in_subscribe_async(mq)
    return await query_offset(instance, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, addr, int(timestamp_ms))


async def query_consumer_offset(instance, group: str, mq: MessageQueue) -> int:
    """The broker's stored offset; MQBrokerError(22 QUERY_NOT_FOUND) when there is none."""
    addr = await instance.find_broker_addr_in_subscribe_async(mq)
    req = RemotingCommand.create_request(RequestCode.QUERY_CONSUMER_OFFSET,
                                         {"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id})
    resp = await instance.invoke_broker(addr, req)
    return resp.get_int("offset", -1)


async def update_consumer_offset(instance, group: str, mq: MessageQueue, offset: int, oneway: bool,
                                 commit_guard=None) -> None:
    addr = await instance.find_broker_addr_in_subscribe_async(mq)
    # Checked again here, in the loop, with nothing between it and the write: a pull that
    # committed a newer offset since the caller's check wins (the loop orders both sends).
    if commit_guard is not None and not commit_guard.admit(mq, offset):
        return
    req = RemotingCommand.create_request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "commitOffset": offset,
    })
    if oneway:
        req.mark_oneway()
        await instance.invoke_oneway(addr, req)
    else:
        await instance.invoke_broker(addr, req)


class BrokerOffsetApi:
    """The `broker_api` a remote offset store calls (synchronously, never from the event loop)."""

    def __init__(self, instance, group: str):
        self.instance = instance
        self.group = group
        self.commit_guard = None  # the offset store's CommitGuard (set by the store)

    def query_consumer_offset(self, mq: MessageQueue) -> int:
        return self.instance.run(query_consumer_offset(self.instance, self.group, mq),
                                 timeout=self.instance.config.mq_client_api_timeout + 5)

    def update_consumer_offset(self, mq: MessageQueue, offset: int, oneway: bool = False) -> None:
        self.instance.run(update_consumer_offset(self.instance, self.group, mq, offset, oneway, self.commit_guard),
                          timeout=self.instance.config.mq_client_api_timeout + 5)


__all__ = [
    "PullResultExt", "PullChain",
    "build_pull_request", "PullRequests", "process_pull_response", "reset_retry_topic",
    "FilterMessageContext", "run_filter_hooks",
    "max_offset", "min_offset", "search_offset", "query_consumer_offset", "update_consumer_offset",
    "BrokerOffsetApi",
]
