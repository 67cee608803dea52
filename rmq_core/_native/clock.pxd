# The clocks of the native codecs and kernels, as the Python layer reads them on Linux:
# epoch_ms is int(time.time() * 1000) (a send's bornTimestamp, a UNIQ_KEY's time part),
# monotonic is time.monotonic() (deadlines and latencies).
from libc.stdint cimport int64_t

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec* tp)
    int CLOCK_REALTIME
    int CLOCK_MONOTONIC


cdef inline int64_t epoch_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef inline double monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9
