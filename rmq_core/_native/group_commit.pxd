# The group commit's C state (store_group_commit.h) and its two classes, declared here so the
# store's single put (commit_log.pyx) can wait on a gate without the GIL and ask the Futures.
cimport cython
from libc.stdint cimport int64_t

cdef extern from "store_group_commit.h" nogil:
    ctypedef struct rmq_gc:
        int64_t requested
        int64_t flushed
        int64_t flushed_ts
        int64_t rounds
        int64_t sync_ns
        int64_t idle_ns
        int64_t awaits
        int stopped
        int last_errno
    int RMQ_GC_OK, RMQ_GC_TIMEOUT, RMQ_GC_STOPPED, RMQ_GC_NEED_FLUSH, RMQ_GC_RETURN, RMQ_GC_IO_ERROR
    int rmq_gc_init(rmq_gc *g)
    void rmq_gc_destroy(rmq_gc *g)
    void rmq_gc_request(rmq_gc *g, int64_t end, int64_t store_ts, int return_each_round, int notify)
    void rmq_gc_set_notify_fd(rmq_gc *g, int fd)
    int64_t rmq_gc_epoch(rmq_gc *g)
    int rmq_gc_await(rmq_gc *g, int64_t end, int64_t store_ts, int64_t timeout_ns)
    void rmq_gc_complete(rmq_gc *g, int64_t flushed, int64_t store_ts)
    void rmq_gc_reset(rmq_gc *g, int64_t flushed)
    void rmq_gc_kick(rmq_gc *g)
    void rmq_gc_halt(rmq_gc *g)
    void rmq_gc_stop(rmq_gc *g)
    int rmq_gc_serve(rmq_gc *g, int fd, int64_t seg_from, int64_t seg_end, int64_t budget_ns,
                     int return_each_round, int64_t *upto)


@cython.final
cdef class GroupCommitGate:
    cdef rmq_gc g
    cdef bint ready


cdef class GroupCommitFutures:
    cdef GroupCommitGate gate
    cdef object future_cls
    cdef object open_future
    cdef int64_t open_end
    cdef int64_t open_epoch
    cdef list sealed
    cdef object refused
    cdef public bint notify

    cdef object request_c(self, int64_t end, int64_t store_ts)
