# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The send decision (RocketMQ's TopicPublishInfo, MQFaultStrategy and LatencyFaultToleranceImpl),
and the completion a sync send waits on: typed classes (send_route.pxd) that the Python attempts
(rmq_core.client.producer.SendAttempts, through rmq_core.client.fault and route, which re-export
them) and the native first attempt (send_pipeline.PipelinedSender) both call - one owner of each.

After each send the producer records how long the broker took.  A slow answer (or a failure,
counted as 30 s) puts the broker on the bench for a while, read from two ladders:

    latency  >= 50 ms 100 ms 550 ms 1 s  2 s   3 s   15 s
    benched     0      0     30 s   60 s 120 s 180 s 600 s

Queue selection skips benched brokers; when every broker is benched it picks among the better half
of them rather than failing.

Each step below that changes a table (the round robin's cursor, a fault item) runs without
calling Python code between its read and its write, so under the GIL it is one step: no lock.
"""
from cpython.pythread cimport (
    NOWAIT_LOCK, PY_LOCK_ACQUIRED, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
    PyThread_release_lock, PyThread_type_lock,
)
from libc.stdint cimport int64_t

cimport cython

from clock cimport monotonic as _monotonic

import random

cdef extern from "pythread.h":
    int PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds, int intr_flag) nogil

LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
ISOLATION_LATENCY_MS = 30000

# The Python layer's types (this module imports nothing of rmq): rmq_core.client.route hands them
# in when it loads (use_python_layer).  Until then a plain ValueError stands in for the client
# error, and the fault strategy makes no queue of its own (it picks among the route's).
cdef object _QUEUE_CLS = None
cdef object _CLIENT_ERROR = ValueError


def use_python_layer(*, message_queue, client_error):
    """message_queue: the MessageQueue class (a queue the fault strategy makes on a benched
    broker's side is one); client_error: what a topic without writable queues raises."""
    global _QUEUE_CLS, _CLIENT_ERROR
    _QUEUE_CLS, _CLIENT_ERROR = message_queue, client_error


@cython.final
cdef class FaultItem:

    def __init__(self, str name, int64_t current_latency, double start_timestamp):
        self.name = name
        self.current_latency = current_latency
        self.start_timestamp = start_timestamp

    cpdef bint is_available(self, double now_ms):
        return now_ms >= self.start_timestamp

    def sort_key(self, double now_ms):
        # available first, then lower latency, then sooner available (FaultItem.compareTo)
        return (not self.is_available(now_ms), self.current_latency, self.start_timestamp)

    def __repr__(self):
        return f"FaultItem({self.name!r}, {self.current_latency}, {self.start_timestamp})"


@cython.final
cdef class LatencyFaultTolerance:
    """broker name -> FaultItem.  clock: ms now (None: the monotonic clock's)."""

    def __init__(self, clock=None):
        self.items = {}
        self.clock = clock
        self._which_worst = random.randrange(1 << 16)

    cdef double now(self) except? -1:
        return _monotonic() * 1000.0 if self.clock is None else self.clock()

    cpdef update_fault_item(self, str name, int64_t current_latency, double not_available_ms):
        cdef double now = self.now()
        cdef FaultItem item = self.items.get(name)
        if item is None:
            self.items[name] = FaultItem(name, current_latency, now + not_available_ms)
        else:
            item.current_latency = current_latency
            item.start_timestamp = now + not_available_ms

    cpdef bint is_available(self, str name) except -1:
        cdef FaultItem item = self.items.get(name)
        return item is None or item.is_available(self.now())

    cpdef remove(self, str name):
        self.items.pop(name, None)

    cpdef object pick_one_at_least(self):
        """A broker from the better half of the benched ones (round robin among them)."""
        cdef double now = self.now()
        cdef list items = list(self.items.values())
        cdef Py_ssize_t half
        if not items:
            return None
        random.shuffle(items)
        items.sort(key=_SortKey(now))
        half = len(items) // 2
        if half <= 0:
            return (<FaultItem>items[0]).name
        self._which_worst = (self._which_worst + 1) & 0x7FFFFFFF
        return (<FaultItem>items[self._which_worst % half]).name

    def snapshot(self):
        cdef double now = self.now()
        return {k: ((<FaultItem>v).current_latency, (<FaultItem>v).is_available(now)) for k, v in self.items.items()}


@cython.final
cdef class _SortKey:
    """FaultItem.sort_key at one moment (a cpdef method may not hold a closure)."""
    cdef double now

    def __init__(self, double now):
        self.now = now

    def __call__(self, FaultItem item):
        return item.sort_key(self.now)


@cython.final
cdef class TopicPublishInfo:
    """The queues a producer may write to, with the round-robin cursor (sendWhichQueue).
    write_queue_nums: broker name -> its write queue count in the route (what
    TopicRouteData.publish_info hands over; a broker not in it has -1)."""

    def __init__(self, str topic, queues, route, bint order_topic=False, dict write_queue_nums=None):
        self.topic = topic
        self.queues = list(queues)
        self._brokers = [mq.broker_name for mq in self.queues]  # (MessageQueue: a frozen value)
        self._write_queue_nums = write_queue_nums or {}
        self.route = route
        self.order_topic = order_topic
        self.have_route = route is not None
        # Java's ThreadLocalIndex starts at a random value so producers do not all hit queue 0
        self.index = random.randrange(1 << 16)

    @property
    def ok(self):
        return len(self.queues) > 0

    cpdef int64_t next_index(self):
        self.index = (self.index + 1) & 0x7FFFFFFF
        return self.index

    cpdef object select_one(self, str last_broker_name=None):
        """Round robin; when retrying, prefer a queue on another broker than the one that failed."""
        cdef Py_ssize_t n = len(self.queues), i, k
        if n == 0:
            raise _CLIENT_ERROR(f"no writable queue for topic {self.topic!r}")
        if last_broker_name is not None:
            for i in range(n):
                k = self.next_index() % n
                if self._brokers[k] != last_broker_name:
                    return self.queues[k]
        return self.queues[self.next_index() % n]

    cpdef Py_ssize_t write_queue_nums_of(self, str broker_name):
        return self._write_queue_nums.get(broker_name, -1)

    def __repr__(self):
        return f"TopicPublishInfo({self.topic!r}, {len(self.queues)} queues, order_topic={self.order_topic})"


@cython.final
cdef class MQFaultStrategy:

    def __init__(self, bint enabled=True, clock=None, latency_max=LATENCY_MAX_MS,
                 not_available_duration=NOT_AVAILABLE_DURATION_MS):
        if len(latency_max) != len(not_available_duration):
            raise ValueError("latency_max and not_available_duration must have the same length")
        self.enabled = enabled
        self.latency_max = tuple(latency_max)
        self.not_available_duration = tuple(not_available_duration)
        self.tolerance = LatencyFaultTolerance(clock)

    cpdef object select_one_message_queue(self, TopicPublishInfo info, str last_broker_name):
        cdef Py_ssize_t n, i, k, write_nums
        cdef int64_t index
        cdef double now = -1.0
        cdef FaultItem item
        if not self.enabled:
            return info.select_one(last_broker_name)
        n = len(info.queues)
        if n:
            index = info.next_index()
            items = self.tolerance.items
            for i in range(n):
                k = (index + i) % n
                item = items.get(info._brokers[k])
                if item is not None:
                    if now < 0:
                        now = self.tolerance.now()
                    if not item.is_available(now):
                        continue
                return info.queues[k]
        not_best = self.tolerance.pick_one_at_least()
        if not_best is not None:
            write_nums = info.write_queue_nums_of(not_best)
            if write_nums > 0 and _QUEUE_CLS is not None:
                return _QUEUE_CLS(info.topic, not_best, info.next_index() % write_nums)
            self.tolerance.remove(not_best)
        return info.select_one()

    cpdef int64_t compute_not_available_duration(self, int64_t latency_ms) except? -1:
        cdef Py_ssize_t i
        for i in range(len(self.latency_max) - 1, -1, -1):
            if latency_ms >= self.latency_max[i]:
                return self.not_available_duration[i]
        return 0

    cpdef update_fault_item(self, str broker_name, int64_t latency_ms, bint isolation):
        if self.enabled:
            duration = self.compute_not_available_duration(ISOLATION_LATENCY_MS if isolation else latency_ms)
            self.tolerance.update_fault_item(broker_name, latency_ms, duration)


# --- the completion a sync send waits on ------------------------------------------------------------
@cython.final
cdef class SendWait:
    """What a sync send on the native path waits on (Producer.send): finished once by finish()
    - usually on the waiting thread itself, which read its own answer (PipelinedChannel.exchange) -
    and read by result().  A thread that must wait sleeps on a lock made then (none per send
    otherwise): finish() and the sleeper's check run without Python code between read and write,
    so no wake-up is lost.  `channel`: the connection its answer comes on; result() reads answers
    there itself while no other thread does (PipelinedChannel.wait)."""

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    cpdef bint done(self):
        return self._done

    cpdef finish(self, result, error=None):
        """The outcome (error: the send's failure); a second one is ignored."""
        if self._done:
            return
        self._result, self._error, self._done = result, error, True
        self._wake()

    cdef void _wake(self):
        if self._lock != NULL and self._sleepers:
            PyThread_release_lock(self._lock)
        else:
            self._woken = True

    def wake(self):
        """Wake the threads sleeping in sleep() (a connection's read token came free)."""
        self._wake()

    def sleep(self, timeout=None):
        """Block until finished or woken (or `timeout` seconds pass); True when finished."""
        cdef int64_t us = -1 if timeout is None else <int64_t>(max(0.0, timeout) * 1e6)
        cdef int got
        if self._done:
            return True
        if self._woken:
            self._woken = False
            return False
        if self._lock == NULL:
            self._lock = PyThread_allocate_lock()
            if self._lock == NULL:
                raise MemoryError("SendWait: no lock")
            PyThread_acquire_lock(self._lock, NOWAIT_LOCK)  # held: a sleeper blocks until released
        self._sleepers += 1
        with nogil:
            got = PyThread_acquire_lock_timed(self._lock, us, 0)
        self._sleepers -= 1
        if got == PY_LOCK_ACQUIRED:
            if self._sleepers:  # pass the wake-up on to the next sleeper
                PyThread_release_lock(self._lock)
            else:
                self._woken = False
        return self._done

    cdef double _wait(self, timeout) except? -2:
        """Wait until finished (reading the channel's answers meanwhile); the time left, -1 for none."""
        cdef double deadline = 0.0, left = -1.0
        if timeout is not None:
            deadline = _monotonic() + timeout
        channel = self.channel
        if channel is not None and not self._done:
            channel.wait(self, timeout)
        while not self._done:
            if timeout is not None:
                left = deadline - _monotonic()
                if left <= 0:
                    break
            self.sleep(None if timeout is None else left)
        return left

    def result(self, timeout=None):
        self._wait(timeout)
        if not self._done:
            raise TimeoutError(f"no answer within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self, timeout=None):
        self._wait(timeout)
        if not self._done:
            raise TimeoutError(f"no answer within {timeout} s")
        return self._error

    def cancelled(self):
        return False
