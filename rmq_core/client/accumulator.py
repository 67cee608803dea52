"""A producer's `auto_batch` (RocketMQ 5's autoBatch, opt-in): async sends of one topic gathered
into SEND_BATCH_MESSAGE requests, each message still with its own SendResult (its UNIQ_KEY as
msg_id, its own offsetMsgId and queue offset, split from the batch's answer).

Only plain messages qualify (Java's batch rules): no delay level, no transaction, not to a retry
topic, no explicit queue or selector, not compressed (batches carry no per-message sys flag).

PipelinedAccumulator: the caller's thread validates and encodes the message natively and gathers
it; a batch is an async batch send on the send pipeline (Producer._write_batch: a SendAttempts,
written on its broker's pipelined connection, tcp or in-proc, answered on whichever thread reads
that connection, retried on another broker from there as the policy says).
"""
from __future__ import annotations

import logging
import threading
import time

from rmq_core._native.send_pipeline import finish_batch
from rmq_core.client.futures import LeanFuture
from rmq_core.message import Message

log = logging.getLogger("rmq.client.producer")

BATCH_ITEM_OVERHEAD = 20  # totalSize, magic, bodyCRC, flag, bodyLength (+ propertiesLength 2) per message


class _Gathering:
    """The encoded messages of one (topic, waitStoreMsgOK) waiting for a request, and how many of
    its requests are in flight."""

    __slots__ = ("key", "items", "size", "inflight", "channel", "deadline")

    def __init__(self, key):
        self.key = key
        self.items: list[tuple] = []  # (encoded batch item, uniq, future, timeout, message)
        self.size = 0
        self.inflight = 0
        self.channel = None  # the connection of the latest request (None: not written yet)
        self.deadline = 0.0  # when the gathered items leave at the latest (0: no linger running)


class GatheredFuture(LeanFuture):
    """The Future of a gathered message: waiting on it (result / exception) sends what its topic
    gathered at once, instead of after the linger or the answer in flight."""

    def result(self, timeout: float | None = None):
        if not self.done():
            self.gathering_flush()
        return super().result(timeout)

    def exception(self, timeout: float | None = None):
        if not self.done():
            self.gathering_flush()
        return super().exception(timeout)

    def gathering_flush(self) -> None:
        acc = self.__dict__.pop("accumulator", None)  # (asked once: later waits find it sent)
        if acc is not None:
            acc.flush_for(self.__dict__.pop("gathering"))


class PipelinedAccumulator:
    """auto_batch without the event loop (RocketMQ 5's autoBatch): a plain async send is validated
    and encoded as a batch item in the caller's thread (Producer._batch_item, natively) and
    gathered there, per (topic, waitStoreMsgOK).  Gathered items leave as one SEND_BATCH_MESSAGE
    frame on the broker's pipelined connection (Producer._write_batch) when

    * they fill batch_max_bytes or max_batch_count (at once, even beside a request in flight);
    * the request of the topic in flight is answered (sent from the thread that read the answer);
    * a thread waits for one of them (GatheredFuture.result: it would send no more meanwhile);
    * with nothing in flight, `linger` seconds passed since the first of them (a flusher thread,
      for producers that only take callbacks).

    So a burst leaves in one request and a send that is waited for at once is not delayed.  Each
    message gets its own SendResult (msg_id its UNIQ_KEY, queue offset the batch's base + its
    index); a refused batch fails every message of it, one that failed in a way worth retrying is
    retried as a whole (SendAttempts: another broker); an ineligible message is sent on its own
    (offer: None)."""

    def __init__(self, producer, *, batch_max_bytes: int, max_batch_count: int = 1024, max_inflight: int = 1,
                 linger: float = 0.002):
        self.producer = producer
        self.batch_max_bytes = batch_max_bytes
        self.max_batch_count = max_batch_count
        self.max_inflight = max_inflight
        self.linger = linger
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a linger started, a topic emptied, closing
        self._gatherings: dict[tuple[str, bool], _Gathering] = {}
        self._lingering = 0  # gatherings with a linger running
        self._flusher: threading.Thread | None = None
        self._draining = False  # drain() waits for the topics to empty
        self._closed = False

    def offer(self, msg: Message, timeout: float):
        """Take an eligible message (a GatheredFuture of its SendResult), or None: the caller sends
        it another way.  A message that fails validation gets a failed Future."""
        p = self.producer
        encoded = p._batch_item(msg, self.batch_max_bytes)
        if encoded is None or isinstance(encoded, BaseException):
            return encoded if encoded is None else p._failed_future(encoded)
        topic, uniq, item, wait = encoded
        fut = GatheredFuture()
        key = (topic, wait)
        with self._lock:
            g = self._gatherings.get(key)
            if g is None:
                g = self._gatherings[key] = _Gathering(key)
            g.items.append((item, uniq, fut, timeout, msg))
            g.size += len(item)
            if g.size < self.batch_max_bytes and len(g.items) < self.max_batch_count:
                fut.accumulator, fut.gathering = self, g
                if g.inflight:  # leaves when the request in flight is answered: a thread waiting
                    fut.channel = g.channel  # for it reads that connection (LeanFuture.channel)
                elif not g.deadline:
                    g.deadline = time.monotonic() + self.linger
                    self._lingering += 1
                    if self._flusher is None:
                        self._start_flusher()
                    elif self._lingering == 1:
                        self._changed.notify_all()
                return fut
            batch = self._take(g)
        self._write(g, batch)
        return fut

    def flush_for(self, g: _Gathering) -> None:
        """A thread waits for a message gathered in `g`: send what gathered now, beside any request
        in flight (a caller that waits sends no more meanwhile: gathering longer gains nothing)."""
        with self._lock:
            if not g.items:
                return
            batch = self._take(g)
        self._write(g, batch)

    def _take(self, g: _Gathering) -> list[tuple]:
        """Up to batch_max_bytes / max_batch_count of the gathered items (at least one), counted in
        flight; under the lock."""
        items = g.items
        size = len(items[0][0])
        n = 1
        limit = min(len(items), self.max_batch_count)
        while n < limit:
            s = len(items[n][0])
            if size + s > self.batch_max_bytes:
                break
            size += s
            n += 1
        batch = items[:n]
        del items[:n]
        g.size -= size
        g.inflight += 1
        if g.deadline and not items:
            g.deadline = 0.0
            self._lingering -= 1
        return batch

    def _write(self, g: _Gathering, batch: list[tuple]) -> None:
        """One request of `batch` (outside the lock; the answer comes to _answered)."""
        body = batch[0][0] if len(batch) == 1 else b"".join([it[0] for it in batch])
        timeout = min(it[3] for it in batch)
        g.channel = self.producer._write_batch(g.key[0], g.key[1], body, timeout, self._answered,
                                               (g, batch, time.monotonic()), [it[2] for it in batch])

    def _answered(self, context: tuple, status, queue, base: int, offset_ids: str | None, region: str | None,
                  error: BaseException | None) -> None:
        """A request's outcome (from the reader thread, a waiting caller's or the sender's): every message of it finished, then the next gathered request of the
        topic sent."""
        g, batch, begin = context
        if error is not None:
            for it in batch:
                it[2].finish(None, error)
        else:  # natively: a SendResult per message (msg_id its UNIQ_KEY, offset base + index)
            finish_batch(self.producer._results_maker, batch, status, queue, base, offset_ids, region)
            trace = self.producer.trace
            if trace is not None:  # a Pub record per message
                trace.on_send_batch([it[4] for it in batch], [it[1] for it in batch], offset_ids, region, status,
                                    begin)
        with self._lock:
            g.inflight -= 1
            nxt = self._take(g) if g.items else None
            if nxt is None and not g.inflight:
                if self._gatherings.get(g.key) is g:
                    del self._gatherings[g.key]
                if self._draining:
                    self._changed.notify_all()
        if nxt is not None:
            self._write(g, nxt)

    def _start_flusher(self) -> None:  # under the lock
        self._flusher = threading.Thread(target=self._flush_lingering, name="rmq-auto-batch", daemon=True)
        self._flusher.start()

    def _flush_lingering(self) -> None:
        """The flusher thread: sends the gatherings whose linger passed with nothing in flight."""
        while True:
            out = []
            with self._lock:
                while not self._closed and not self._lingering:
                    self._changed.wait()
                if self._closed:
                    return
                now = time.monotonic()
                first = None
                for g in self._gatherings.values():
                    if not g.deadline:
                        continue
                    if g.deadline <= now and not g.inflight and g.items:
                        out.append((g, self._take(g)))
                    elif first is None or g.deadline < first:
                        first = g.deadline
                if not out and first is not None:
                    self._changed.wait(max(0.0, first - now))
            for g, batch in out:
                self._write(g, batch)

    def pending(self) -> int:
        """Messages gathered and not yet in a request."""
        with self._lock:
            return sum(len(g.items) for g in self._gatherings.values())

    def drain(self, timeout: float) -> bool:
        """Send everything gathered and wait (up to `timeout` s) until every request is answered;
        False when some are still out.  Stops the flusher thread."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                with self._lock:
                    self._draining = True
                    out = [(g, self._take(g)) for g in self._gatherings.values() if g.items]
                    if not out:
                        while self._gatherings:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                return False
                            self._changed.wait(left)
                        return True
                for g, batch in out:
                    self._write(g, batch)
        finally:
            with self._lock:
                self._closed = True
                self._changed.notify_all()
                flusher = self._flusher
            if flusher is not None and flusher is not threading.current_thread():
                flusher.join(1.0)

    def fail_pending(self, error: BaseException) -> None:
        """Fail every message gathered and not sent (the producer is shutting down)."""
        with self._lock:
            waiting = [it for g in self._gatherings.values() for it in g.items]
            for g in self._gatherings.values():
                g.items, g.size = [], 0
                if g.deadline:
                    g.deadline = 0.0
                    self._lingering -= 1
        for _, _, fut, *_ in waiting:
            fut.finish(None, error)
