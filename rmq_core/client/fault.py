"""Latency fault tolerance (RocketMQ's MQFaultStrategy + LatencyFaultToleranceImpl).

After each send the producer records how long the broker took.  A slow answer (or a failure,
counted as 30 s) puts the broker on the bench for a while, read from two ladders:

    latency  >= 50 ms 100 ms 550 ms 1 s  2 s   3 s   15 s
    benched     0      0     30 s   60 s 120 s 180 s 600 s

Queue selection skips benched brokers; when every broker is benched it picks among the better half
of them rather than failing.

SendPolicy is the one place a producer's sends (sync, async, oneway, batch, auto-batch; whichever
connection carries them) ask how many attempts they get, whether a failure is worth another
attempt, and where the outcome is noted: MQFaultStrategy plus the retry rules of Java's
DefaultMQProducerImpl.sendDefaultImpl.
"""
from __future__ import annotations

import random
import threading
import time
from typing import Callable

from rmq_core.errors import MQBrokerError, MQClientError, RemotingError
from rmq_core.message import MessageQueue
from rmq_core.remoting.codes import ResponseCode

LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
ISOLATION_LATENCY_MS = 30000


class FaultItem:
    __slots__ = ("name", "current_latency", "start_timestamp")

    def __init__(self, name: str, current_latency: int, start_timestamp: float):
        self.name = name
        self.current_latency = current_latency
        self.start_timestamp = start_timestamp  # ms: available again from here on

    def is_available(self, now_ms: float) -> bool:
        return now_ms >= self.start_timestamp

    def sort_key(self, now_ms: float):
        # available first, then lower latency, then sooner available (FaultItem.compareTo)
        return (not self.is_available(now_ms), self.current_latency, self.start_timestamp)


class LatencyFaultTolerance:
    def __init__(self, clock: Callable[[], float] | None = None):
        self.items: dict[str, FaultItem] = {}  # broker name -> its fault item (the native sender reads it)
        self._lock = threading.Lock()
        self._which_worst = random.randrange(1 << 16)
        self.clock = clock or (lambda: time.monotonic() * 1000.0)

    def update_fault_item(self, name: str, current_latency: int, not_available_ms: int) -> None:
        now = self.clock()
        with self._lock:
            item = self.items.get(name)
            if item is None:
                self.items[name] = FaultItem(name, current_latency, now + not_available_ms)
            else:
                item.current_latency = current_latency
                item.start_timestamp = now + not_available_ms

    def is_available(self, name: str) -> bool:
        item = self.items.get(name)
        return item is None or item.is_available(self.clock())

    def remove(self, name: str) -> None:
        with self._lock:
            self.items.pop(name, None)

    def pick_one_at_least(self) -> str | None:
        """A broker from the better half of the benched ones (round robin among them)."""
        now = self.clock()
        with self._lock:
            items = list(self.items.values())
        if not items:
            return None
        random.shuffle(items)
        items.sort(key=lambda it: it.sort_key(now))
        half = len(items) // 2
        if half <= 0:
            return items[0].name
        self._which_worst = (self._which_worst + 1) & 0x7FFFFFFF
        return items[self._which_worst % half].name

    def snapshot(self) -> dict[str, tuple[int, bool]]:
        now = self.clock()
        return {k: (v.current_latency, v.is_available(now)) for k, v in self.items.items()}


class MQFaultStrategy:
    def __init__(self, enabled: bool = True, clock: Callable[[], float] | None = None,
                 latency_max: tuple = LATENCY_MAX_MS, not_available_duration: tuple = NOT_AVAILABLE_DURATION_MS):
        if len(latency_max) != len(not_available_duration):
            raise ValueError("latency_max and not_available_duration must have the same length")
        self.enabled = enabled
        self.latency_max = tuple(latency_max)
        self.not_available_duration = tuple(not_available_duration)
        self.tolerance = LatencyFaultTolerance(clock)

    def select_one_message_queue(self, info, last_broker_name: str | None) -> MessageQueue:
        if not self.enabled:
            return info.select_one(last_broker_name)
        queues = info.queues
        n = len(queues)
        if n:
            index = info.next_index()
            for i in range(n):
                mq = queues[(index + i) % n]
                if self.tolerance.is_available(mq.broker_name):
                    return mq
        not_best = self.tolerance.pick_one_at_least()
        if not_best is not None:
            write_nums = info.write_queue_nums_of(not_best)
            if write_nums > 0:
                return MessageQueue(info.topic, not_best, info.next_index() % write_nums)
            self.tolerance.remove(not_best)
        return info.select_one()

    def compute_not_available_duration(self, latency_ms: int) -> int:
        for i in range(len(self.latency_max) - 1, -1, -1):
            if latency_ms >= self.latency_max[i]:
                return self.not_available_duration[i]
        return 0

    def update_fault_item(self, broker_name: str, latency_ms: int, isolation: bool) -> None:
        if self.enabled:
            duration = self.compute_not_available_duration(ISOLATION_LATENCY_MS if isolation else latency_ms)
            self.tolerance.update_fault_item(broker_name, latency_ms, duration)


# response codes after which a send tries again (DefaultMQProducer.retryResponseCodes)
RETRY_RESPONSE_CODES = frozenset({
    ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
    ResponseCode.NO_PERMISSION, ResponseCode.NO_BUYER_ID, ResponseCode.NOT_IN_CURRENT_UNIT,
    ResponseCode.SYSTEM_BUSY,
})


class SendPolicy:
    """sendDefaultImpl's retry rules over an MQFaultStrategy, shared by every send of a producer.

    * attempts: 1 + retry_times_when_send_failed for a sync send (and a sync batch),
      1 + retry_times_when_send_async_failed for an async one (async batches and auto-batch
      included), 1 for oneway; a send to a given queue or by a selector gets one attempt (Java).
    * worth_retrying: a connection failure or a timeout (RemotingError, TimeoutError), a client-side
      failure (MQClientError: e.g. no address for the picked broker), or a broker answer whose code
      is in RETRY_RESPONSE_CODES; any other broker refusal is the send's answer.
    * note: the fault item update after every attempt.  A fast answer (< 50 ms, which benches
      nobody) is recorded at most once per millisecond per broker - the ones in between would store
      the same moment to the millisecond; a slow or failed one always is.  (The native completion,
      send_pipeline.PipelinedCompletion, notes through the same `noted` table.)
    """

    __slots__ = ("fault", "retry_times_when_send_failed", "retry_times_when_send_async_failed",
                 "retry_another_broker_when_not_store_ok", "noted")

    def __init__(self, fault: MQFaultStrategy, retry_times_when_send_failed: int = 2,
                 retry_times_when_send_async_failed: int = 2, retry_another_broker_when_not_store_ok: bool = False):
        self.fault = fault
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.retry_times_when_send_async_failed = retry_times_when_send_async_failed
        self.retry_another_broker_when_not_store_ok = retry_another_broker_when_not_store_ok
        self.noted: dict[str, int] = {}  # broker -> ms of its last fast answer noted

    def attempts(self, mode) -> int:
        """mode: a CommunicationMode (or its value)."""
        mode = getattr(mode, "value", mode)
        if mode == "SYNC":
            return 1 + self.retry_times_when_send_failed
        if mode == "ASYNC":
            return 1 + self.retry_times_when_send_async_failed
        return 1

    @staticmethod
    def worth_retrying(error: BaseException) -> bool:
        if isinstance(error, MQBrokerError):
            return error.code in RETRY_RESPONSE_CODES
        return isinstance(error, (RemotingError, MQClientError, TimeoutError))

    def select(self, info, last_broker_name: str | None = None) -> MessageQueue:
        return self.fault.select_one_message_queue(info, last_broker_name)

    def note(self, broker_name: str, begin: float, failed: bool) -> None:
        """The attempt to `broker_name` that began at `begin` (time.monotonic()) ended."""
        now = time.monotonic()
        latency = int((now - begin) * 1000)
        now_ms = int(now * 1000)
        if failed or latency >= 50:
            self.noted.pop(broker_name, None)
        elif self.noted.get(broker_name) == now_ms:
            return
        else:
            self.noted[broker_name] = now_ms
        self.fault.update_fault_item(broker_name, latency, failed)


__all__ = ["FaultItem", "LatencyFaultTolerance", "MQFaultStrategy", "SendPolicy", "RETRY_RESPONSE_CODES",
           "LATENCY_MAX_MS", "NOT_AVAILABLE_DURATION_MS"]
