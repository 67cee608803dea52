"""Delay levels (RocketMQ's ScheduleMessageService) — also what consumer retries ride on.

A message with DELAY=L is stored in SCHEDULE_TOPIC_XXXX queue L-1 with its real topic/queue in
REAL_TOPIC/REAL_QID and its delivery time as the consume-queue tag code.  One asyncio task per
level reads its queue in order (delivery times within a level are non-decreasing), re-puts due
messages to the real topic, and sleeps until the next due time or until a new message arrives on
its queue — never a busy poll.  Progress is `<store>/config/delayOffset.json`, written after each
delivered batch, so a restart re-delivers at most the batch in flight (at-least-once).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading

from rmq_core.common.clock import now_ms
from rmq_core.loops import cancel_and_wait
from rmq_core.codec import decode_messages
from rmq_core.message import MessageConst, SysFlag, TopicValidator, host_port
from rmq_core.store import MessageExtBrokerInner, PutMessageStatus
from rmq_core.common.files import atomic_write

log = logging.getLogger("rmq.broker")
SCHEDULE_TOPIC = TopicValidator.RMQ_SYS_SCHEDULE_TOPIC
_BATCH = 32



class ScheduleMessageService:
    def __init__(self, controller):
        self.ctrl = controller
        self.delay_levels_ms: list[int] = controller.store_config.delay_levels_ms
        self.max_level = len(self.delay_levels_ms)
        self.path = os.path.join(controller.store_config.config_dir, "delayOffset.json")
        self._offsets: dict[int, int] = {}
        self._persist_lock = threading.Lock()
        self._events: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task] = []
        self.delivered = 0

    # --- send path ----------------------------------------------------------------------------------
    def redirect_if_delayed(self, inner: MessageExtBrokerInner) -> MessageExtBrokerInner:
        """Rewrite a message with DELAY>0 (and not a prepared transaction) to the schedule topic."""
        props = inner.properties
        level_s = props.get(MessageConst.DELAY_TIME_LEVEL) if props else None
        if not level_s:
            return inner
        tx = SysFlag.transaction_value(inner.sys_flag)
        if tx not in (SysFlag.TRANSACTION_NOT_TYPE, SysFlag.TRANSACTION_COMMIT_TYPE):
            return inner
        try:
            level = int(level_s)
        except ValueError:
            return inner
        if level <= 0:
            return inner
        level = min(level, self.max_level)
        props[MessageConst.DELAY_TIME_LEVEL] = str(level)
        props[MessageConst.REAL_TOPIC] = inner.topic
        props[MessageConst.REAL_QUEUE_ID] = str(inner.queue_id)
        inner.properties_bytes = None
        inner.topic = SCHEDULE_TOPIC
        inner.queue_id = level - 1
        inner.tags_code = now_ms() + self.delay_levels_ms[level - 1]
        return inner

    # --- lifecycle ------------------------------------------------------------------------------------
    def load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                table = json.load(f).get("offsetTable", {})
            self._offsets = {int(k): int(v) for k, v in table.items()}
        except FileNotFoundError:
            self._offsets = {}
        except (ValueError, OSError) as e:
            log.error("cannot read %s (%s); delay offsets start from the queue minimum", self.path, e)
            self._offsets = {}

    def persist(self) -> None:
        # Called from the loop (after deliveries, at stop) and from the periodic persist thread:
        # one writer at a time, or two would race on the same temp file.
        with self._persist_lock:
            body = {"offsetTable": {str(k): v for k, v in sorted(self._offsets.items())}}
            atomic_write(self.path, json.dumps(body, indent=2).encode("utf-8"))

    def replace_offset_table(self, offsets: dict[int, int]) -> None:
        """A slave takes its master's delay offsets (slave_sync); it delivers nothing itself."""
        self._offsets = dict(offsets)

    def offset_table(self) -> dict[str, int]:
        return {str(k): v for k, v in self._offsets.items()}

    async def start(self) -> None:
        for level in range(1, self.max_level + 1):
            self._events[level] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._deliver_loop(level), name=f"schedule-level-{level}"))

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        self.persist()

    def on_arrival(self, queue_id: int) -> None:
        """A message arrived on SCHEDULE_TOPIC_XXXX queue `queue_id` (called in the loop thread)."""
        ev = self._events.get(queue_id + 1)
        if ev is not None:
            ev.set()

    # --- delivery -----------------------------------------------------------------------------------------
    async def _deliver_loop(self, level: int) -> None:
        store = self.ctrl.store
        qid = level - 1
        event = self._events[level]
        while True:
            try:
                offset = max(self._offsets.get(level, 0), store.get_min_offset_in_queue(SCHEDULE_TOPIC, qid))
                result = store.get_message("SCHEDULE_SERVICE", SCHEDULE_TOPIC, qid, offset, _BATCH)
                if result.message_count == 0:
                    event.clear()
                    if store.get_max_offset_in_queue(SCHEDULE_TOPIC, qid) > offset:
                        continue  # raced with a put: read again
                    await event.wait()
                    continue
                wait_ms, delivered_to = await self._deliver_due(level, result)
                if delivered_to is not None:
                    self._offsets[level] = delivered_to
                    self.persist()
                if wait_ms > 0:
                    event.clear()
                    try:
                        await asyncio.wait_for(event.wait(), wait_ms / 1000)
                    except asyncio.TimeoutError:
                        pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("schedule service level %d failed; retrying in 1s", level)
                await asyncio.sleep(1)

    async def _deliver_due(self, level: int, result):
        """Deliver the due prefix of a batch; returns (ms until the next is due, new offset|None)."""
        delay = self.delay_levels_ms[level - 1]
        new_offset = None
        for msg in decode_messages(result.buffer, decompress=False):
            due = msg.store_timestamp + delay
            now = now_ms()
            if due > now:
                return due - now, new_offset
            inner = self._to_real(msg)
            if inner is not None:
                res = await self.ctrl.put_message(inner)
                if res.status != PutMessageStatus.PUT_OK:
                    log.warning("schedule: re-put of %s failed (%s); retrying", msg.msg_id, res.status)
                    return 1000, new_offset
                self.delivered += 1
            new_offset = msg.queue_offset + 1
        return 0, new_offset

    @staticmethod
    def _to_real(msg) -> MessageExtBrokerInner | None:
        props = dict(msg.properties)
        real_topic = props.pop(MessageConst.REAL_TOPIC, None)
        real_qid = props.pop(MessageConst.REAL_QUEUE_ID, None)
        props.pop(MessageConst.DELAY_TIME_LEVEL, None)
        if not real_topic:
            log.error("schedule: message %s has no REAL_TOPIC; dropped", msg.msg_id)
            return None
        try:
            qid = int(real_qid or 0)
        except ValueError:
            qid = 0
        return MessageExtBrokerInner(
            topic=real_topic, queue_id=qid, body=msg.body, flag=msg.flag, properties=props,
            sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=host_port(msg.born_host),
            reconsume_times=msg.reconsume_times)
