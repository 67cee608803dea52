"""The admin calls of messages: pull, query, view, trace and track, send, resend."""
from __future__ import annotations

import json
import time
from typing import Callable, Iterator, Mapping

from rmq_core.admin.calls.consumer import ConsumerCalls
from rmq_core.admin.values import ADMIN_PRODUCER_GROUP, TOOLS_CONSUMER_GROUP, AdminError, SendOutcome
from rmq_core.client.producer import Producer
from rmq_core.client.trace import TraceView, sort_views
from rmq_core.codec import decode_messages
from rmq_core.common.sysflag import FLAG_SUBSCRIPTION
from rmq_core.errors import RMQError
from rmq_core.message import (
    Message, MessageConst, MessageQueue, MixAll, PullResult, PullStatus, TopicValidator, decode_offset_msg_id,
)
from rmq_core.remoting.codes import PULL_STATUS_BY_CODE, RequestCode, ResponseCode


class MessageCalls(ConsumerCalls):
    """Messages' calls."""

    # --- messages ------------------------------------------------------------------------------------------
    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, *, sub_expression: str = "*",
             group: str = TOOLS_CONSUMER_GROUP, addr: str | None = None) -> PullResult:
        """One PULL_MESSAGE (no suspend, no commit) from `offset` of a queue."""
        addr = addr or self.broker_addr(mq.broker_name)
        r = self._call(addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "queueOffset": offset,
            "maxMsgNums": max_nums, "sysFlag": FLAG_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": sub_expression or "*", "subVersion": 0, "expressionType": "TAG"},
            what=f"pull {mq.topic}/{mq.broker_name}/{mq.queue_id} at offset {offset}", ok=tuple(PULL_STATUS_BY_CODE))
        msgs = decode_messages(r.body, broker_name=mq.broker_name) if r.code == ResponseCode.SUCCESS and r.body else []
        return PullResult(PULL_STATUS_BY_CODE[r.code], r.get_int("nextBeginOffset", offset), r.get_int("minOffset", 0),
                          r.get_int("maxOffset", 0), msgs)

    def iter_messages(self, mq: MessageQueue, begin: int, end: int, *, sub_expression: str = "*",
                      group: str = TOOLS_CONSUMER_GROUP, batch: int = 32,
                      on_progress: Callable[[int], None] | None = None) -> Iterator:
        """Every message of a queue in [begin, end) offsets; on_progress(next offset) after each pull."""
        addr = self.broker_addr(mq.broker_name)
        offset = begin
        while offset < end:
            res = self.pull(mq, offset, min(batch, end - offset), sub_expression=sub_expression, group=group, addr=addr)
            for m in res.messages:
                if m.queue_offset < end:
                    yield m
            if res.status is PullStatus.OFFSET_ILLEGAL and res.next_begin_offset > offset:
                offset = res.next_begin_offset
            elif res.next_begin_offset <= offset:
                break
            else:
                offset = res.next_begin_offset
            if on_progress is not None:
                on_progress(min(offset, end))

    def message_by_offset(self, topic: str, broker_name: str, queue_id: int, offset: int):
        """The message at `offset` of a queue (queryMsgByOffset); raises when there is none."""
        res = self.pull(MessageQueue(topic, broker_name, queue_id), offset, 1)
        for m in res.messages:
            if m.queue_offset == offset:
                return m
        raise AdminError(f"no message at offset {offset} of {topic}/{broker_name}/{queue_id} "
                         f"(queue offsets {res.min_offset}..{res.max_offset})")

    def view_message(self, msg_id: str, topic: str | None = None):
        """By id: an offset message id (store host + commit-log offset) is read with
        VIEW_MESSAGE_BY_ID; anything else is taken as the producer's unique id (needs `topic`)."""
        try:
            host, port, offset = decode_offset_msg_id(msg_id)
            addr = f"{host}:{port}"
        except (ValueError, RMQError):
            addr = None
        # (a unique id is 32 hex characters too: it decodes as an address no broker has)
        on_broker = addr is not None and addr in {b.addr for b in self.brokers()}
        if on_broker:
            r = self.invoke(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}, what=f"view message {msg_id}")
            if r.code == ResponseCode.SUCCESS and r.body:
                msgs = decode_messages(r.body)
                if msgs and (topic is None or msgs[0].topic == topic):
                    return self._named(msgs[0], addr)
        if topic is None:
            if on_broker:
                raise AdminError(f"message {msg_id!r} not found: broker {addr} has no message at commit-log offset {offset}")
            raise AdminError(f"message {msg_id!r} not found: not an offset message id of a live broker; "
                             "give -t TOPIC to look it up as a unique key")
        return self.query_message_by_unique_key(topic, msg_id)

    def clean_expired_consume_queues(self, addr: str) -> list[tuple[str, int]]:
        """CLEAN_EXPIRED_CONSUMEQUEUE: the broker destroys consume queues whose messages its commit
        log no longer holds; the (topic, queue id)s it removed."""
        r = self._call(addr, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, what="clean expired consume queues",
                       timeout=max(self.timeout, 30.0))
        return [(t, int(q)) for t, q in json.loads(r.body or b"{}").get("removed") or []]

    def clean_unused_topics(self, addr: str) -> list[str]:
        """CLEAN_UNUSED_TOPIC: the broker deletes the consume queues of topics it has no config for."""
        r = self._call(addr, RequestCode.CLEAN_UNUSED_TOPIC, what="clean unused topics", timeout=max(self.timeout, 30.0))
        return list(json.loads(r.body or b"{}").get("removed") or [])

    def consumer_status(self, topic: str, group: str, client_addr: str | None = None) -> dict[str, dict[MessageQueue, int]]:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS on every broker of the topic: each online consumer's
        own offsets of the topic (what it holds in memory), {client id: {queue: offset}}."""
        out: dict[str, dict[MessageQueue, int]] = {}
        for _, addr in self.topic_master_addrs(topic):
            r = self._call(addr, RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                           {"topic": topic, "group": group, "clientAddr": client_addr or ""},
                           what=f"get consumer status of group {group} on topic {topic}")
            for client_id, rows in (json.loads(r.body or b"{}").get("consumerTable") or {}).items():
                mine = out.setdefault(client_id, {})
                for row in rows:
                    q = row["mq"]
                    mine[MessageQueue(q["topic"], q["brokerName"], int(q["queueId"]))] = int(row["offset"])
            if out:  # every broker asks the same clients: one answer is all of it
                break
        return out

    def consume_message_directly(self, group: str, client_id: str | None, msg_id: str,
                                 topic: str | None = None) -> dict:
        """CONSUME_MESSAGE_DIRECTLY: the message (found as view_message finds it) handed to one live
        consumer of `group` (client_id, or the first that consumerConnection lists) for its
        listener, through the broker that stores it; the consumer's ConsumeMessageDirectlyResult
        ({order, autoCommit, consumeResult, remark, spentTimeMills}) and "clientId"."""
        if client_id is None:
            client_id = self.consumer_connection(group).connections[0].client_id
        msg = self.view_message(msg_id, topic)
        host, port, _ = decode_offset_msg_id(msg.offset_msg_id)
        addr = f"{host}:{port}"
        r = self._call(addr, RequestCode.CONSUME_MESSAGE_DIRECTLY,
                       {"consumerGroup": group, "clientId": client_id, "msgId": msg.offset_msg_id, "topic": msg.topic},
                       what=f"consume message {msg_id} directly in {group} <{client_id}>", timeout=max(self.timeout, 15.0))
        return {**json.loads(r.body or b"{}"), "clientId": client_id}

    def _named(self, msg, addr: str):
        try:
            msg.broker_name = self.broker_name_of(addr)
        except AdminError:
            pass
        return msg

    def query_messages(self, topic: str, key: str, max_num: int = 64, begin: int = 0, end: int | None = None,
                       *, unique_key: bool = False) -> list:
        """QUERY_MESSAGE on every broker of the topic (by key, or by unique key with
        _UNIQUE_KEY_QUERY): the index's matches between begin and end (ms), deduplicated."""
        end = int(time.time() * 1000) + 60_000 if end is None else end
        found = {}
        for name, addr in self.topic_master_addrs(topic):
            ext = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin, "endTimestamp": end}
            if unique_key:
                ext["_UNIQUE_KEY_QUERY"] = "true"
            r = self._call(addr, RequestCode.QUERY_MESSAGE, ext, what=f"query messages of {topic} by key {key}",
                           ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND), timeout=max(self.timeout, 15.0))
            if r.code != ResponseCode.SUCCESS or not r.body:
                continue
            for m in decode_messages(r.body, broker_name=name):
                if m.topic != topic:
                    continue
                if unique_key and m.msg_id != key:
                    continue
                if not unique_key and key not in (m.keys or "").split(" ") and m.msg_id != key:
                    continue
                found[(name, m.commit_log_offset)] = m
        return sorted(found.values(), key=lambda m: (m.store_timestamp, m.queue_id, m.queue_offset))

    def message_trace(self, msg_id: str, trace_topic: str | None = None) -> list:
        """The trace records of message `msg_id` (RocketMQ's queryMsgTraceById): the trace
        messages the index finds under the id in the trace topic (RMQ_SYS_TRACE_TOPIC unless
        given), decoded, as TraceViews in the order they happened."""
        topic = trace_topic or TopicValidator.RMQ_SYS_TRACE_TOPIC
        views = []
        for m in self.query_messages(topic, msg_id, 64):
            views.extend(TraceView.from_trace_message(msg_id, m))
        return sort_views(views)

    def query_message_by_unique_key(self, topic: str, uniq_key: str):
        """The message whose producer-assigned unique id (UNIQ_KEY) is `uniq_key`."""
        msgs = self.query_messages(topic, uniq_key, 32, unique_key=True)
        if not msgs:
            raise AdminError(f"no message with unique key {uniq_key!r} in topic {topic!r}")
        return msgs[0]

    def message_track(self, msg) -> list[tuple[str, str]]:
        """Per consumer group of the message's topic: CONSUMED (the group's offset of the queue is
        past it), NOT_CONSUME_YET, or NOT_ONLINE when no member is connected (MessageTrack)."""
        out = []
        try:
            groups = self.topic_consumed_by(msg.topic)
        except AdminError:
            return out
        for g in groups:
            try:
                stats = self.consume_stats(g, msg.topic)
            except AdminError:
                out.append((g, "UNKNOWN"))
                continue
            q = next((q for q in stats.queues if q.broker_name == msg.broker_name and q.queue_id == msg.queue_id), None)
            if q is not None and q.consumer_offset > msg.queue_offset:
                out.append((g, "CONSUMED"))
                continue
            try:
                self.consumer_connection(g)
                out.append((g, "NOT_CONSUME_YET"))
            except AdminError:
                out.append((g, "NOT_ONLINE"))
        return out

    def send_message(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | None = None,
                     broker_name: str | None = None, queue_id: int | None = None,
                     properties: Mapping[str, str] | None = None) -> SendOutcome:
        """Send one message with an rmq Producer (group TOOLS_PRODUCER); to a given queue when
        broker_name and queue_id are given."""
        self._tools_producer()
        msg = Message(topic, body, tags=tags, keys=keys, properties=dict(properties or {}))
        try:
            if broker_name is not None or queue_id is not None:
                if broker_name is None or queue_id is None:
                    raise AdminError("sending to a queue needs both the broker name (-b) and the queue id (-i)")
                self.broker_addr(broker_name)
                r = self._producer.send(msg, queue=MessageQueue(topic, broker_name, queue_id))
            else:
                r = self._producer.send(msg)
        except AdminError:
            raise
        except RMQError as e:
            raise AdminError(f"send to topic {topic!r} failed: {e}") from None
        return SendOutcome(r.queue.broker_name, r.queue.queue_id, r.queue_offset, r.msg_id, r.offset_msg_id,
                           r.status.value if hasattr(r.status, "value") else str(r.status))

    def send_rt(self, topic: str, amount: int, size: int, *, by_queue: bool = True,
                on_progress: Callable[[int], None] | None = None) -> list[tuple[str, int, bool, float, str]]:
        """`amount` messages of `size` bytes sent one at a time with the tools producer, each timed
        (checkMsgSendRT: queue i % n of the topic's writable queues; sendMsgStatus, by_queue=False:
        the producer's own pick).  [(broker, queue id, sent, rt ms, status or error)]."""
        p = self._tools_producer()
        mqs = p.fetch_publish_message_queues(topic) if by_queue else []
        body = b"a" * size
        out = []
        for i in range(amount):
            mq = mqs[i % len(mqs)] if mqs else None
            begin = time.perf_counter()
            try:
                r = p.send(Message(topic, body), queue=mq)
                sent, broker, qid, status = True, r.queue.broker_name, r.queue.queue_id, r.status.value
            except RMQError as e:
                sent, status = False, str(e).splitlines()[0]
                broker, qid = (mq.broker_name, mq.queue_id) if mq is not None else ("", -1)
            out.append((broker, qid, sent, (time.perf_counter() - begin) * 1000, status))
            if on_progress is not None:
                on_progress(i + 1)
        return out

    def _tools_producer(self):
        """The admin's producer (group TOOLS_PRODUCER), started on first use."""
        with self._lock:
            if self._producer is None:
                p = Producer(ADMIN_PRODUCER_GROUP, namesrv=";".join(self.namesrv_addrs),
                             request_steps=self._request_steps)
                p.start()
                self._producer = p
            return self._producer

    def resend(self, msg, topic: str, *, reconsume_times: int = 0, extra_properties: Mapping[str, str] | None = None,
               broker_name: str | None = None, queue_id: int = 0) -> SendOutcome:
        """Write a copy of a stored message (same body, flag, properties - so the same UNIQ_KEY) to
        queue `queue_id` of `topic` on the broker that holds it (dlq resend, poison skip), with the
        admin's producer on the send pipeline (Producer.resend).  reconsume_times travels in the
        request header, which carries it for a retry topic only (as RocketMQ's producer sends)."""
        name = broker_name or msg.broker_name
        self.broker_addr(name)  # (an unknown broker fails here, naming it)
        props = dict(msg.properties)
        props.update(extra_properties or {})
        props.pop(MessageConst.TRANSACTION_PREPARED, None)  # a plain message: no transaction state
        if MixAll.is_retry_topic(topic):
            props[MessageConst.RECONSUME_TIME] = str(reconsume_times)
        elif reconsume_times:
            raise AdminError(f"reconsume times {reconsume_times} travel only in a send to a retry topic, "
                             f"not to {topic!r}")
        copy = Message(topic, bytes(msg.body or b""), flag=msg.flag, properties=props,
                       wait_store_msg_ok=props.get(MessageConst.WAIT_STORE_MSG_OK) != "false")
        try:
            r = self._tools_producer().resend(copy, queue=MessageQueue(topic, name, queue_id))
        except RMQError as e:
            raise AdminError(f"send a copy of {msg.msg_id} to {topic} failed: {e}") from None
        return SendOutcome(r.queue.broker_name, r.queue.queue_id, r.queue_offset, r.msg_id, r.offset_msg_id,
                           r.status.value if hasattr(r.status, "value") else str(r.status))
