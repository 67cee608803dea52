# The send decision's types (send_route.pyx): the route's queue choice, the fault table and the
# completion a sync send waits on - one owner each, used by the Python attempts
# (rmq_core.client.producer.SendAttempts, through rmq_core.client.fault / route) and by the native
# first attempt (send_pipeline.PipelinedSender) alike, as typed objects.
from cpython.pythread cimport PyThread_type_lock
from libc.stdint cimport int64_t


cdef class FaultItem:
    cdef readonly str name
    cdef public int64_t current_latency
    cdef public double start_timestamp  # ms (the tolerance's clock): available again from here on

    cpdef bint is_available(self, double now_ms)


cdef class LatencyFaultTolerance:
    cdef readonly dict items  # broker name -> its FaultItem
    cdef public object clock  # ms now; None: the monotonic clock
    cdef Py_ssize_t _which_worst

    cdef double now(self) except? -1
    cpdef update_fault_item(self, str name, int64_t current_latency, double not_available_ms)
    cpdef bint is_available(self, str name) except -1
    cpdef remove(self, str name)
    cpdef object pick_one_at_least(self)


cdef class TopicPublishInfo:
    cdef readonly str topic
    cdef readonly list queues  # the writable queues, in the route's order
    cdef list _brokers  # the broker name of each queue (the same order)
    cdef dict _write_queue_nums  # broker name -> its write queue count (the route's)
    cdef public object route
    cdef public bint order_topic
    cdef public bint have_route
    cdef public int64_t index  # the round robin's cursor (sendWhichQueue)

    cpdef int64_t next_index(self)
    cpdef object select_one(self, str last_broker_name=*)
    cpdef Py_ssize_t write_queue_nums_of(self, str broker_name)


cdef class MQFaultStrategy:
    cdef public bint enabled
    cdef readonly tuple latency_max
    cdef readonly tuple not_available_duration
    cdef readonly LatencyFaultTolerance tolerance

    cpdef object select_one_message_queue(self, TopicPublishInfo info, str last_broker_name)
    cpdef int64_t compute_not_available_duration(self, int64_t latency_ms) except? -1
    cpdef update_fault_item(self, str broker_name, int64_t latency_ms, bint isolation)


cdef class SendWait:
    cdef bint _done
    cdef object _result
    cdef object _error
    cdef public object channel  # the connection whose answer finishes it (a waiter reads it; None: none)
    cdef PyThread_type_lock _lock  # made when a thread sleeps on it; held until the wait is finished
    cdef int _sleepers
    cdef bint _woken  # a wake() that found nobody asleep: the next sleep() returns at once

    cpdef bint done(self)
    cpdef finish(self, result, error=*)
    cdef void _wake(self)
    cdef double _wait(self, timeout) except? -2
