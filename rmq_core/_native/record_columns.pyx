# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A pull body as Arrow columns, for the Spark data source (spark_plugin/arrow.py): the records'
fields written straight into column buffers, no object per message.  Framing is record.pyx's
(read_record_fields), the layout docs/protocol.md §5."""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_AsUTF8String
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcmp, memcpy

from record_layout cimport *
from rmq_core._native.record cimport (BufferView, RecordFields, decompress_record_body, find_property,
                                      put_offset_msg_id, read_record_fields)

cdef extern from "Python.h":
    bint PyUnicode_CheckExact(object o)
    object PyIter_Next(object o)
    str PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)


# --- columns: a pull body in Arrow's memory layout --------------------------------------------------
# Spark's "rmq" data source hands Arrow record batches to the JVM.  Building them from MessageExt
# objects costs a Python object per message and per field; this decoder writes each field of every
# record straight into column buffers laid out as Arrow wants them (little-endian fixed-width
# values; int32 offsets + data for strings and binaries; a validity bitmap where a value may be
# missing).  It returns bytes only; the caller wraps them (pyarrow stays out of rmq_core).
@cython.final
cdef class _Buf:
    cdef char* p
    cdef Py_ssize_t n
    cdef Py_ssize_t cap

    def __cinit__(self, Py_ssize_t cap):
        self.cap = cap if cap > 16 else 16
        self.p = <char*>PyMem_Malloc(self.cap)
        if self.p == NULL:
            raise MemoryError()
        self.n = 0

    def __dealloc__(self):
        PyMem_Free(self.p)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t cap = self.cap
        cdef char* q
        if self.n + extra <= cap:
            return 0
        while cap < self.n + extra:
            cap *= 2
        q = <char*>PyMem_Realloc(self.p, cap)
        if q == NULL:
            raise MemoryError()
        self.p = q
        self.cap = cap
        return 0

    cdef inline int put(self, const void* src, Py_ssize_t size) except -1:
        if self.n + size > self.cap:
            self.reserve(size)
        memcpy(self.p + self.n, src, size)
        self.n += size
        return 0

    cdef inline int put_i32(self, int32_t v) except -1:
        return self.put(&v, 4)

    cdef inline int put_i64(self, int64_t v) except -1:
        return self.put(&v, 8)

    cdef bytes take(self):
        return PyBytes_FromStringAndSize(self.p, self.n)


@cython.final
cdef class _VarColumn:
    """A string / binary column: int32 offsets (rows + 1), data, and a validity bitmap."""
    cdef _Buf offsets
    cdef _Buf data
    cdef _Buf validity
    cdef Py_ssize_t rows
    cdef Py_ssize_t nulls

    def __cinit__(self, Py_ssize_t rows_hint, Py_ssize_t data_hint):
        self.offsets = _Buf((rows_hint + 1) * 4)
        self.data = _Buf(data_hint)
        self.validity = _Buf(rows_hint // 8 + 1)
        self.rows = 0
        self.nulls = 0
        self.offsets.put_i32(0)

    cdef int add(self, const void* src, Py_ssize_t size, bint valid) except -1:
        cdef Py_ssize_t byte = self.rows >> 3
        if byte >= self.validity.n:
            self.validity.reserve(1)
            self.validity.p[byte] = 0
            self.validity.n = byte + 1
        if valid:
            self.validity.p[byte] |= <char>(1 << (self.rows & 7))
            if size:
                self.data.put(src, size)
        else:
            self.nulls += 1
        if self.data.n > 0x7FFFFFFF:
            raise OverflowError("a column of one pull is over 2 GiB")
        self.offsets.put_i32(<int32_t>self.data.n)
        self.rows += 1
        return 0

    cdef tuple take(self):
        return (self.validity.take() if self.nulls else None, self.offsets.take(), self.data.take(), self.nulls)


cdef inline Py_ssize_t _prop_value(const unsigned char* props, Py_ssize_t plen, const char* name,
                                   Py_ssize_t nlen, Py_ssize_t* vlen) noexcept nogil:
    # position of the value of `name` (the one lookup, record.pxd), -1 when absent
    cdef Py_ssize_t vs = 0
    if find_property(props, plen, name, nlen, &vs, vlen):
        return vs
    return -1


# decode_columns' column mask bits (the order of spark_plugin.arrow.COLUMNS)
COL_TOPIC, COL_BROKER_NAME, COL_QUEUE_ID, COL_QUEUE_OFFSET, COL_MSG_ID, COL_TAGS, COL_KEYS, COL_BODY, \
    COL_PROPERTIES, COL_BORN_TIMESTAMP, COL_STORE_TIMESTAMP, COL_RECONSUME_TIMES = [1 << i for i in range(12)]


def decode_columns(buf, str broker_name, int64_t until_offset=-1, tuple skip_properties=(), int64_t columns=-1):
    """Decode concatenated v1 records (a PULL body) into column buffers; records whose queue
    offset is >= until_offset (when >= 0) and BLANK records are left out.  Framing is checked as
    decode_messages checks it; compressed bodies are inflated.  `columns`: a mask of COL_* bits;
    a column left out is not decoded (its buffers hold no rows; a body left out is not even
    inflated).

    Returns a dict of bytes: "rows"; fixed-width little-endian "queue_id" (int32),
    "queue_offset" (int64), "born_timestamp" / "store_timestamp" (int64 microseconds since the
    epoch), "reconsume_times" (int32); variable-width (validity or None, offsets, data, null count)
    "topic", "broker_name", "msg_id" (UNIQ_KEY, else the offset message id), "tags", "keys",
    "body"; and "properties" as a map: (entry offsets, key column, value column) of every property
    whose name is not in skip_properties (at most 64 names, str)."""
    cdef BufferView b = BufferView(buf)
    cdef const unsigned char* base = b.ptr
    cdef const unsigned char* p
    cdef const unsigned char* props
    cdef Py_ssize_t size = b.size, pos = 0, rows_hint = size // 200 + 1, i, k, v, vlen = 0, entries = 0
    cdef RecordFields r
    cdef bytes bn = PyUnicode_AsUTF8String(broker_name)
    cdef bytes body
    cdef char mid_text[2 * (HOST_V6_LEN + 8)]
    cdef _Buf queue_id = _Buf(rows_hint * 4), queue_offset = _Buf(rows_hint * 8)
    cdef _Buf born = _Buf(rows_hint * 8), stored = _Buf(rows_hint * 8), reconsume = _Buf(rows_hint * 4)
    cdef _Buf entry_offsets = _Buf((rows_hint + 1) * 4)
    cdef _VarColumn topic = _VarColumn(rows_hint, 64), broker = _VarColumn(rows_hint, rows_hint * 8)
    cdef _VarColumn msg_id = _VarColumn(rows_hint, rows_hint * 32), tags = _VarColumn(rows_hint, rows_hint * 8)
    cdef _VarColumn keys = _VarColumn(rows_hint, rows_hint * 8), bodies = _VarColumn(rows_hint, size)
    cdef _VarColumn pkeys = _VarColumn(rows_hint * 4, rows_hint * 32), pvalues = _VarColumn(rows_hint * 4, rows_hint * 32)
    cdef const char* skip_ptr[64]
    cdef Py_ssize_t skip_len[64]
    cdef Py_ssize_t n_skip = len(skip_properties), j
    cdef list skip_names = [PyUnicode_AsUTF8String(name) for name in skip_properties]  # (owns the bytes)
    cdef bint skipped
    cdef Py_ssize_t rows = 0
    cdef bint want_topic = columns & COL_TOPIC, want_broker = columns & COL_BROKER_NAME
    cdef bint want_msg_id = columns & COL_MSG_ID, want_tags = columns & COL_TAGS, want_keys = columns & COL_KEYS
    cdef bint want_body = columns & COL_BODY, want_props = columns & COL_PROPERTIES
    if n_skip > 64:
        raise ValueError(f"skip_properties holds {n_skip} names; at most 64")
    for j in range(n_skip):
        skip_ptr[j] = PyBytes_AS_STRING(skip_names[j])
        skip_len[j] = PyBytes_GET_SIZE(skip_names[j])
    entry_offsets.put_i32(0)
    while pos < size:
        p = base + pos
        if not read_record_fields(p, size - pos, pos, &r):
            pos += r.total
            continue
        pos += r.total
        if until_offset >= 0 and r.queue_offset >= until_offset:
            continue
        rows += 1
        queue_id.put_i32(r.queue_id)
        queue_offset.put_i64(r.queue_offset)
        born.put_i64(r.born_timestamp * 1000)
        stored.put_i64(r.store_timestamp * 1000)
        reconsume.put_i32(r.reconsume_times)
        if want_topic:
            topic.add(p + r.topic_pos, r.topic_len, True)
        if want_broker:
            broker.add(PyBytes_AS_STRING(bn), PyBytes_GET_SIZE(bn), True)
        props = p + r.props_pos
        # TAGS / KEYS / UNIQ_KEY have columns of their own; every property is in the map as well
        if want_tags:
            v = _prop_value(props, r.props_len, "TAGS", 4, &vlen)
            tags.add(props + v, vlen, v >= 0)
        if want_keys:
            v = _prop_value(props, r.props_len, "KEYS", 4, &vlen)
            keys.add(props + v, vlen, v >= 0)
        if want_msg_id:
            v = _prop_value(props, r.props_len, "UNIQ_KEY", 8, &vlen)
            if v >= 0:
                msg_id.add(props + v, vlen, True)
            else:
                # the store host's address and port lie together in the record, as the id wants them
                msg_id.add(mid_text, put_offset_msg_id(mid_text, p + r.store_ip_pos, store_host_len(r.sys_flag),
                                                       r.commit_log_offset), True)
        if want_body:
            if r.sys_flag & COMPRESSED:
                body = decompress_record_body(PyBytes_FromStringAndSize(<const char*>p + r.body_pos, r.body_len),
                                              r.sys_flag, pos - r.total)
                bodies.add(PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), True)
            else:
                bodies.add(p + r.body_pos, r.body_len, True)
        if not want_props:
            continue
        i = 0
        while i < r.props_len:
            k = i
            while i < r.props_len and props[i] != 1:
                i += 1
            if i >= r.props_len:
                break  # a trailing name without a value (never written by RocketMQ): ignored
            v = i + 1
            i = v
            while i < r.props_len and props[i] != 2:
                i += 1
            skipped = False
            for j in range(n_skip):
                if skip_len[j] == v - 1 - k and memcmp(skip_ptr[j], props + k, v - 1 - k) == 0:
                    skipped = True
                    break
            if not skipped:
                pkeys.add(props + k, v - 1 - k, True)
                pvalues.add(props + v, i - v, True)
                entries += 1
            i += 1
        entry_offsets.put_i32(<int32_t>entries)
    return {
        "rows": rows,
        "queue_id": queue_id.take(), "queue_offset": queue_offset.take(),
        "born_timestamp": born.take(), "store_timestamp": stored.take(),
        "reconsume_times": reconsume.take(),
        "topic": topic.take(), "broker_name": broker.take(), "msg_id": msg_id.take(),
        "tags": tags.take(), "keys": keys.take(), "body": bodies.take(),
        "properties": (entry_offsets.take(), pkeys.take(), pvalues.take()),
    }
