# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""SYNC_FLUSH group commit: GroupCommitGate, where writers wait for durability and the
group-commit thread serves rounds, both without the GIL (store_group_commit.h), and
GroupCommitFutures, the Futures of puts that do not wait themselves."""
cimport cython
from libc.stdint cimport int64_t

GC_OK = RMQ_GC_OK
GC_TIMEOUT = RMQ_GC_TIMEOUT
GC_STOPPED = RMQ_GC_STOPPED
GC_NEED_FLUSH = RMQ_GC_NEED_FLUSH
GC_RETURN = RMQ_GC_RETURN
GC_IO_ERROR = RMQ_GC_IO_ERROR


cdef class GroupCommitGate:
    """Where SYNC_FLUSH writers wait for durability and the group-commit thread serves rounds, both
    without the GIL (store_group_commit.h).  `flushed`: every commit-log byte below it is durable."""


    def __cinit__(self):
        if rmq_gc_init(&self.g) != 0:
            raise OSError("cannot initialise the group-commit mutex / conditions")
        self.ready = True

    def __dealloc__(self):
        if self.ready:
            rmq_gc_destroy(&self.g)

    @property
    def flushed(self):
        return self.g.flushed

    @property
    def flushed_timestamp(self):
        return self.g.flushed_ts

    @property
    def requested(self):
        return self.g.requested

    @property
    def rounds(self):
        """fdatasync rounds served natively (rounds flushed through Python are not counted)."""
        return self.g.rounds

    @property
    def stats(self):
        """Instrumentation of the native rounds: {"rounds", "awaits" (writers that waited for a
        round), "sync_s" (time in fdatasync), "idle_s" (time the serving thread waited for
        requests)}.  awaits / rounds is how many writers a round carries."""
        return {"rounds": self.g.rounds, "awaits": self.g.awaits, "sync_s": self.g.sync_ns / 1e9,
                "idle_s": self.g.idle_ns / 1e9}

    @property
    def stopped(self):
        return bool(self.g.stopped)

    @property
    def last_errno(self):
        return self.g.last_errno

    def await_flushed(self, int64_t end_offset, int64_t store_timestamp, int64_t timeout_ms):
        """Block (GIL released) until bytes below end_offset are durable: GC_OK, GC_TIMEOUT after
        timeout_ms, or GC_STOPPED."""
        cdef int r
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        with nogil:
            r = rmq_gc_await(&self.g, end_offset, store_timestamp, timeout_ms * 1000000)
        return r

    def request(self, int64_t end_offset, int64_t store_timestamp, bint return_each_round=False,
                bint notify=False):
        """Ask for bytes below end_offset to become durable without waiting; return_each_round:
        the serving thread returns after the next round (it has Futures to resolve); notify: the
        attached loop resolves this request's Future - its descriptor is pinged after the round
        that covers it (at once when already durable)."""
        rmq_gc_request(&self.g, end_offset, store_timestamp, return_each_round, notify)

    def set_notify_fd(self, int fd):
        """Attach the descriptor (non-blocking eventfd or pipe) an event loop reads to resolve
        Futures itself (pinged once now), or detach with -1: once this returns, no write to the
        old descriptor is under way or will be."""
        with nogil:
            rmq_gc_set_notify_fd(&self.g, fd)

    def complete(self, int64_t flushed, int64_t store_timestamp=0):
        """The flush thread flushed through Python up to `flushed`: wake whoever that covers."""
        with nogil:
            rmq_gc_complete(&self.g, flushed, store_timestamp)

    def reset(self, int64_t flushed):
        """Set the durable offset (recovery, truncation), also below the current one."""
        with nogil:
            rmq_gc_reset(&self.g, flushed)

    def kick(self):
        """Make a running `serve` return (GC_OK) before its next round."""
        with nogil:
            rmq_gc_kick(&self.g)

    def halt(self):
        """Make `serve` return; awaiting writers keep waiting for the final flush."""
        with nogil:
            rmq_gc_halt(&self.g)

    def stop(self):
        """No more waiting: every waiter (now or later) gets GC_STOPPED unless already durable."""
        with nogil:
            rmq_gc_stop(&self.g)

    def serve(self, int fd, int64_t segment_from, int64_t segment_end, int64_t budget_ms,
              bint return_each_round=False):
        """The group-commit thread: serve rounds (fdatasync of fd, then wake the writers) while
        every request lies in the segment [segment_from, segment_end), for about budget_ms.
        Returns (code, requested offset): GC_OK / GC_TIMEOUT (budget used up, busy / idle),
        GC_RETURN (a round done and return_each_round), GC_NEED_FLUSH (requests outside the
        segment: flush through Python), GC_STOPPED (halted), GC_IO_ERROR (see last_errno)."""
        cdef int r
        cdef int64_t upto = 0
        with nogil:
            r = rmq_gc_serve(&self.g, fd, segment_from, segment_end, budget_ms * 1000000, return_each_round,
                             &upto)
        return r, upto


cdef class GroupCommitFutures:
    """The Futures of SYNC_FLUSH puts that do not wait themselves (put_message_nowait): the
    requests made while the same group-commit rounds have started share one Future (a round that
    starts after them covers them all), and the gate learns each request's end offset.  A Future
    is resolved once the durable offset passes the largest end offset it was asked for.
    Every method runs under the GIL without running Python code between its reads and writes (a
    Future is created before the open slot is looked at), so the GIL is the lock: the loop or
    threads that put and the thread or loop that resolves need no other.
    `notify`: an attached event loop resolves the Futures (the gate pings it after the round that
    covers a request); otherwise the serving thread returns after each round to resolve them."""


    def __init__(self, GroupCommitGate gate, future_cls):
        self.gate = gate
        self.future_cls = future_cls
        self.open_future = None
        self.open_end = 0
        self.open_epoch = -1
        self.sealed = []
        self.refused = None
        self.notify = False

    cdef object request_c(self, int64_t end, int64_t store_ts):
        if self.refused is not None:
            return self.refused
        cdef int64_t epoch = rmq_gc_epoch(&self.gate.g)
        fut = self.open_future
        if fut is None or self.open_epoch != epoch:
            new = self.future_cls()  # Python code: another thread may take the slot meanwhile
            fut = self.open_future
            epoch = rmq_gc_epoch(&self.gate.g)
            if fut is None or self.open_epoch != epoch:
                if fut is not None:  # a round started since: its requests are in the gate
                    self.sealed.append((fut, self.open_end))
                fut = self.open_future = new
                self.open_end = end
                self.open_epoch = epoch
        if end > self.open_end:
            self.open_end = end
        if self.notify:
            rmq_gc_request(&self.gate.g, end, store_ts, 0, 1)
        else:
            rmq_gc_request(&self.gate.g, end, store_ts, 1, 0)
        return fut

    def request(self, int64_t end_offset, int64_t store_timestamp=0):
        """The Future resolved once bytes below end_offset are durable (shared by every request
        until the round that covers them)."""
        return self.request_c(end_offset, store_timestamp)

    def refuse(self, refused_future):
        """The service stopped: every later request gets `refused_future` (already resolved)."""
        self.refused = refused_future

    def seal(self):
        """The open Future takes no more requests (the gate has them all): True when any sealed
        Future waits to be resolved."""
        if self.open_future is not None:
            self.sealed.append((self.open_future, self.open_end))
            self.open_future = None
        return len(self.sealed) > 0

    @property
    def pending(self):
        return self.open_future is not None or len(self.sealed) > 0

    def take_covered(self, int64_t flushed, bint fail=False):
        """Remove and return [(Future, end offset)] the durable offset `flushed` covers (the open
        one too: a later request makes a new one); `fail`: the sealed ones not covered as well."""
        cdef list done = []
        cdef list keep
        cdef tuple item
        if self.sealed:
            keep = []
            for item in self.sealed:
                if fail or <int64_t>item[1] <= flushed:
                    done.append(item)
                else:
                    keep.append(item)
            self.sealed = keep
        if self.open_future is not None and self.open_end <= flushed:
            done.append((self.open_future, self.open_end))
            self.open_future = None
        return done
