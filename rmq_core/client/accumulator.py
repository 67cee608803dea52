"""ProduceAccumulator: a producer's `auto_batch` (RocketMQ 5's autoBatch, opt-in).

Async sends of one topic are gathered into SEND_BATCH_MESSAGE requests, and each message still
gets its own SendResult (its UNIQ_KEY as msg_id, its own offsetMsgId and queue offset, split from
the batch's answer).  Java's accumulator holds messages for batchMaxDelayMs; this one adds no
delay of its own: a message goes out at the end of the loop iteration it arrived in, together
with whatever arrived in the same iteration, unless a request of that topic is already in
flight — then it waits for that answer and leaves with everything gathered meanwhile (the way
a group commit gathers writers).  A quiet producer sends at once; a busy one sends big batches.

Only plain messages qualify (Java's batch rules): no delay level, no transaction, not to a retry
topic, no explicit queue or selector, not compressed (batches carry no per-message sys flag).
Runs entirely on the client's event loop.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from rmq_core.codec import encode_batch_body
from rmq_core.errors import MQClientError
from rmq_core.message import Message, MessageConst, MixAll, SendResult, properties_to_string

log = logging.getLogger("rmq.client.producer")

BATCH_ITEM_OVERHEAD = 20  # totalSize, magic, bodyCRC, flag, bodyLength (+ propertiesLength 2) per message


class _Pile:
    """The messages of one (topic, waitStoreMsgOK) waiting for a request."""

    __slots__ = ("items", "size", "inflight", "flush_scheduled")

    def __init__(self):
        self.items: list[tuple] = []  # (msg, prepared, raw properties, on_done)
        self.size = 0
        self.inflight = 0
        self.flush_scheduled = False


class ProduceAccumulator:
    def __init__(self, producer, *, batch_max_bytes: int, async_mode, max_inflight: int = 1):
        self.producer = producer
        self.async_mode = async_mode  # CommunicationMode.ASYNC: a lone message's ordinary send
        self.batch_max_bytes = batch_max_bytes
        self.max_inflight = max_inflight
        self._piles: dict[tuple[str, bool], _Pile] = {}
        self._tasks: set[asyncio.Task] = set()

    @staticmethod
    def eligible(msg: Message, prepared: tuple, batch_max_bytes: int) -> bool:
        _, body, sys_flag, props = prepared
        return (sys_flag == 0 and msg.delay_time_level <= 0 and not MixAll.is_retry_topic(msg.topic)
                and MessageConst.TRANSACTION_PREPARED not in props
                and len(body) + BATCH_ITEM_OVERHEAD < batch_max_bytes)

    def add(self, msg: Message, prepared: tuple, timeout: float,
            on_done: Callable[[SendResult | None, BaseException | None], None]) -> None:
        """On the loop: queue one message; on_done(result, error) is called on the loop."""
        key = (msg.topic, msg.wait_store_msg_ok)
        pile = self._piles.get(key)
        if pile is None:
            pile = self._piles[key] = _Pile()
        raw = properties_to_string(prepared[3]).encode("utf-8")
        pile.items.append((msg, prepared, raw, timeout, on_done))
        pile.size += BATCH_ITEM_OVERHEAD + 2 + len(prepared[1]) + len(raw)
        if pile.size >= self.batch_max_bytes:
            self._flush(key, pile)
        elif pile.inflight < self.max_inflight and not pile.flush_scheduled:
            # the end of this iteration: messages posted together leave together
            pile.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_scheduled, key)

    def _flush_scheduled(self, key) -> None:
        pile = self._piles.get(key)
        if pile is not None:
            pile.flush_scheduled = False
            if pile.inflight < self.max_inflight:
                self._flush(key, pile)

    def _flush(self, key, pile: _Pile) -> None:
        """Send the pile's messages (up to batch_max_bytes of them) as one request."""
        if not pile.items:
            return
        items, size = [], 0
        for item in pile.items:
            item_size = BATCH_ITEM_OVERHEAD + 2 + len(item[1][1]) + len(item[2])
            if items and size + item_size > self.batch_max_bytes:
                break
            items.append(item)
            size += item_size
        del pile.items[:len(items)]
        pile.size -= size
        pile.inflight += 1
        task = asyncio.get_running_loop().create_task(self._send(items))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._sent(key, items, t))

    async def _send(self, items: list[tuple]) -> None:
        p = self.producer
        if len(items) == 1:  # alone: an ordinary send, as if never accumulated
            msg, prepared, _, timeout, on_done = items[0]
            try:
                result = await p._send(msg, self.async_mode, timeout, None, None, None, prepared=prepared)
            except Exception as e:  # noqa: BLE001 - handed to the caller's Future
                on_done(None, e)
            else:
                on_done(result, None)
            return
        first = items[0][0]
        uniqs = [prepared[0] for _, prepared, _, _, _ in items]
        body = encode_batch_body([(msg.flag, prepared[1], raw) for msg, prepared, raw, _, _ in items])
        outer = Message(first.topic, b"x", wait_store_msg_ok=first.wait_store_msg_ok)
        outer_props = {MessageConst.WAIT_STORE_MSG_OK: "true" if first.wait_store_msg_ok else "false"}
        timeout = min(item[3] for item in items)
        try:
            batch = await p._send_batch((first.topic, ",".join(uniqs), body, outer, outer_props), timeout, None)
        except Exception as e:  # noqa: BLE001 - every message of the batch fails with it
            for *_, on_done in items:
                on_done(None, e)
            return
        offset_ids = batch.offset_msg_id.split(",") if batch.offset_msg_id else []
        for i, (_, prepared, _, _, on_done) in enumerate(items):
            on_done(SendResult(
                status=batch.status, msg_id=prepared[0],
                offset_msg_id=offset_ids[i] if i < len(offset_ids) else "",
                queue=batch.queue,
                queue_offset=batch.queue_offset + i if batch.queue_offset >= 0 else -1,
                transaction_id=None, region_id=batch.region_id), None)

    def _sent(self, key, items: list[tuple], task: asyncio.Task) -> None:
        self._tasks.discard(task)
        pile = self._piles.get(key)
        if task.cancelled():  # the client is shutting down: nothing more leaves
            error = MQClientError("send cancelled: the producer is shutting down")
            waiting = list(items) + (pile.items if pile is not None else [])
            if pile is not None:
                pile.items, pile.size = [], 0
                pile.inflight -= 1
            for *_, on_done in waiting:
                try:
                    on_done(None, error)
                except Exception:  # noqa: BLE001 - a finished future
                    log.debug("on_done after cancel failed", exc_info=True)
            return
        if pile is None:
            return
        pile.inflight -= 1
        if pile.items:
            self._flush(key, pile)
        elif not pile.inflight:
            del self._piles[key]  # nothing left for this topic: forget it

    def pending(self) -> int:
        """Messages accepted and not yet handed to a request (for tests and shutdown)."""
        return sum(len(p.items) for p in self._piles.values())

    async def drain(self) -> None:
        """Send everything gathered and wait for every request in flight (a clean shutdown)."""
        for key, pile in list(self._piles.items()):
            while pile.items:
                self._flush(key, pile)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def fail_pending(self, error: BaseException) -> None:
        """Fail every message still waiting (the producer is shutting down)."""
        for pile in self._piles.values():
            items, pile.items, pile.size = pile.items, [], 0
            for *_, on_done in items:
                on_done(None, error)
