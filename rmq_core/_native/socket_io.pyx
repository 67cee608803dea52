# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The kernels of a remoting connection's write side: what a request does from the moment its frame
is made until the socket has it.

- PipelinedWrites: a pipelined connection's write state (rmq_core.remoting.pipelined) - the
  pending table's entries, the frames gathered while a write is in progress or answers are due,
  who writes them;
- exchange(): a descriptor and bytes in, ints out.


exchange() is a sync request's round trip on a connection nobody else reads at that moment (a
BlockingChannel's, or a PipelinedChannel's idle one): write the request, receive once - with the
GIL released once across both (one hand-off of it, not two; the answer usually comes whole in that
one receive).  The descriptor is expected in blocking mode with SO_RCVTIMEO / SO_SNDTIMEO set to
the call's timeout: then the receive is one system call that sleeps until the answer comes (a poll
first, then a receive, costs a second call and a second wake-up on every request).  Where the
descriptor is non-blocking after all (an event loop that watches a duplicate of it may have made
it so), EAGAIN is answered with a poll up to the deadline: slower, never wrong.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EAGAIN, EINTR, errno
from libc.string cimport strerror

cimport cython

from clock cimport monotonic as _monotonic

cdef extern from "<sys/socket.h>" nogil:
    ssize_t c_send "send"(int fd, const void* buf, size_t n, int flags)
    ssize_t c_recv "recv"(int fd, void* buf, size_t n, int flags)
    int MSG_NOSIGNAL
    int MSG_DONTWAIT

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int c_poll "poll"(pollfd* fds, unsigned long nfds, int timeout)
    short POLLIN
    short POLLOUT

cdef extern from "<errno.h>" nogil:
    int EWOULDBLOCK

cdef inline int _wait_ms(double deadline) noexcept nogil:
    """Milliseconds left until `deadline` (rounded up, so a poll never returns just before it)."""
    cdef double left = deadline - _monotonic()
    if left <= 0:
        return 0
    return <int>(left * 1000.0) + 1


cdef inline bint _would_block(int e) noexcept nogil:
    return e == EAGAIN or e == EWOULDBLOCK


def exchange(int fd, frame, into, double timeout):
    """Write all of `frame` to the socket `fd`, then receive once into the writable buffer `into`,
    the GIL released across both.  Returns the bytes received (0: the peer closed), or -1 when no
    answer came within `timeout` seconds (timeout <= 0: only what is there already).  A failed
    write, or one the socket did not take within `timeout`, raises OSError (BlockingIOError for
    the latter; part of the frame may be out); so does a failed receive."""
    cdef Py_buffer out, buf
    cdef const char* p
    cdef Py_ssize_t left
    cdef ssize_t n = -1
    cdef int failed = 0, ready
    cdef bint received = False
    cdef pollfd pfd
    cdef double deadline = _monotonic() + timeout
    PyObject_GetBuffer(frame, &out, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(into, &buf, PyBUF_WRITABLE)
        try:
            p = <const char*>out.buf
            left = out.len
            pfd.fd = fd
            while True:
                with nogil:
                    while left > 0:
                        n = c_send(fd, p, left, MSG_NOSIGNAL)
                        if n < 0:
                            if _would_block(errno):  # SO_SNDTIMEO expired, or a non-blocking socket
                                pfd.events = POLLOUT
                                ready = c_poll(&pfd, 1, _wait_ms(deadline))
                                if ready > 0:
                                    continue
                                failed = errno if ready < 0 else EAGAIN
                            else:
                                failed = errno
                            break
                        p += n
                        left -= n
                    if not failed and not received:
                        n = c_recv(fd, buf.buf, buf.len, 0 if timeout > 0 else MSG_DONTWAIT)
                        if n < 0 and _would_block(errno):
                            # SO_RCVTIMEO expired (then the deadline has passed), or the socket is
                            # non-blocking: wait for the rest of the time
                            n = -1
                            pfd.events = POLLIN
                            ready = c_poll(&pfd, 1, _wait_ms(deadline)) if timeout > 0 else 0
                            if ready > 0:
                                n = c_recv(fd, buf.buf, buf.len, MSG_DONTWAIT)
                                if n < 0 and _would_block(errno):
                                    n = -1
                                elif n < 0:
                                    failed = errno
                            elif ready < 0:
                                failed = errno
                        elif n < 0:
                            failed = errno
                        received = not failed
                if failed == EINTR:  # a signal: its handler runs (and may raise), then go on
                    PyErr_CheckSignals()
                    failed = 0
                    continue
                if failed:  # (OSError(errno, ...) is BlockingIOError for EAGAIN, and so on)
                    raise OSError(failed, strerror(failed).decode())
                return n
        finally:
            PyBuffer_Release(&buf)
    finally:
        PyBuffer_Release(&out)


# --- a pipelined connection's writes ----------------------------------------------------------------
@cython.final
cdef class PipelinedWrites:
    """A PipelinedChannel's write side (see rmq_core.remoting.pipelined): the pending table's entries
    made, frames gathered while a write is in progress or answers are due, and who writes them.
    No method calls Python code or lets go of the GIL, so each one is atomic for all the threads
    sharing the channel: no lock.  `writing` marks a thread in a socket write; it takes what
    gathered meanwhile (next_write) before it leaves."""

    def __init__(self, dict pending, Py_ssize_t coalesce_bytes, double coalesce_delay):
        self.pending = pending
        self._frames = []
        self.coalesce_bytes = coalesce_bytes
        self.coalesce_delay = coalesce_delay

    cdef object _take(self, list fresh):
        """What gathered, as one bytes, and `fresh` (an empty list its caller made before it read
        any state) in its place.  Nothing here allocates a container: a container's allocation may
        run the cyclic garbage collector, whose finalizers run Python code and so may hand the GIL
        to another thread - one appending to the list being taken would lose its frame."""
        cdef list frames = self._frames
        self._frames = fresh
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        self.unanswered += self._requests
        self._requests = 0
        self._bytes = 0
        self.held_since = 0.0
        return data

    @property
    def gathered(self):
        """True while frames wait to be written."""
        return len(self._frames) > 0

    cpdef object offer(self, frame, opaque, double timeout, on_done, context):
        """A request (its frame, length prefix included): None when it gathered (a write in
        progress or answers due - that writer, the reader, the next caller or a waiter writes it);
        False when the channel is closed or closing (nothing registered); else the bytes to write
        now (what gathered, then this frame) and this thread is the writer (next_write after)."""
        cdef double now
        cdef Py_ssize_t n = len(frame)
        if self.closed or self.closing:
            return False
        now = _monotonic()
        self.last_send = now
        # (the containers made first: a collection they may start can let other threads in -
        # before this one has read the state it decides on below, never in between)
        entry = (now + timeout, on_done, context)
        cdef list fresh = []
        self.pending[opaque] = entry
        if self.writing or (self.unanswered > 0 and self._bytes + n <= self.coalesce_bytes
                            and (self.held_since == 0.0 or now - self.held_since < self.coalesce_delay)):
            if not self._frames:
                self.held_since = now
            self._frames.append(frame)
            self._bytes += n
            self._requests += 1
            return None
        self._requests += 1
        if self._frames:  # what gathered goes first, in order
            self._frames.append(frame)
            frame = self._take(fresh)
        else:
            self._take(fresh)
        self.writing = True
        return frame

    cpdef object next_write(self):
        """The writer's next bytes after a write: what gathered meanwhile (it stays the writer), or
        None - nothing did, or the channel closed - and `writing` is cleared."""
        cdef list fresh = []
        if not self._frames or self.closed:
            self.writing = False
            return None
        return self._take(fresh)

    cpdef object start_flush(self, Py_ssize_t answered=0):
        """`answered` answers came; then what gathered, to write now (this thread is the writer),
        or None: a write is in progress, nothing gathered or the channel is closed."""
        cdef list fresh = []
        if answered:
            self.unanswered = max(0, self.unanswered - answered)
        if self.writing or not self._frames or self.closed:
            return None
        data = self._take(fresh)
        self.writing = True
        return data

    cpdef object end_flush(self, rest):
        """A non-blocking write ended: `rest`, the bytes it could not write (maybe part of a
        frame), goes first next time; `writing` is cleared."""
        self.writing = False
        if rest:
            self._frames.insert(0, rest)
            self._bytes += len(rest)
            if self.held_since == 0.0:
                self.held_since = _monotonic()
        return None

    cpdef object write_failed(self):
        """A write failed: `writing` cleared, what gathered dropped (the connection goes)."""
        cdef list fresh = []
        self.writing = False
        if self._frames:
            self._take(fresh)
        return None

    cpdef object answered(self, Py_ssize_t n):
        """n answers came (or n requests stopped counting on one: timed out)."""
        self.unanswered = max(0, self.unanswered - n)
        return None

    cpdef object add_response(self, response):
        """A frame that is no request of ours (a refusal), written with what gathered."""
        if not self._frames:
            self.held_since = _monotonic()
        self._frames.append(response)
        self._bytes += len(response)
        return None

    cpdef bint mark_closed(self, error):
        """Closed for good by `error` (the first call's is kept in `error`); True for the first call."""
        if self.closed:
            return False
        self.closed = True
        self.error = error
        return True
