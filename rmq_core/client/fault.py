"""Latency fault tolerance (RocketMQ's MQFaultStrategy + LatencyFaultToleranceImpl) and the
send policy over it.

FaultItem, LatencyFaultTolerance and MQFaultStrategy are rmq_core._native.send_route's typed
classes (see its doc for the latency ladders), re-exported here: the Python attempts and the
native first attempt (send_pipeline.PipelinedSender) pick queues and note latencies through the
same objects.

SendPolicy is the one place a producer's sends (sync, async, oneway, batch, auto-batch; whichever
connection carries them) ask how many attempts they get, whether a failure is worth another
attempt, and where the outcome is noted: MQFaultStrategy plus the retry rules of Java's
DefaultMQProducerImpl.sendDefaultImpl.
"""
from __future__ import annotations

import time

from rmq_core._native.send_route import (
    ISOLATION_LATENCY_MS, LATENCY_MAX_MS, NOT_AVAILABLE_DURATION_MS, FaultItem, LatencyFaultTolerance, MQFaultStrategy,
)
from rmq_core.errors import MQBrokerError, MQClientError, RemotingError
from rmq_core.message import MessageQueue
from rmq_core.remoting.codes import ResponseCode

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
           "LATENCY_MAX_MS", "NOT_AVAILABLE_DURATION_MS", "ISOLATION_LATENCY_MS"]
