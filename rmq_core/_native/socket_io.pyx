# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Socket kernels of the remoting connections: a descriptor and bytes in, ints out.

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

cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec* tp)
    int CLOCK_MONOTONIC


cdef inline double _monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


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
