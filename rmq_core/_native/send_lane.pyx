# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The broker's native send lane: the common SEND_MESSAGE_V2 answered straight from a read chunk.

A read chunk of a TCP connection holds whole frames (docs/protocol.md §1):

    int32 length | int32 serializeType << 24 | headerLength | JSON header | body

`SendLane.deliver` walks them in order.  A frame whose JSON header (read by frame.pxd's
read_json_header, the one header reader) is a plain SEND_MESSAGE_V2 (code 310, the one-letter
header of SendMessageRequestHeaderV2) is read without building a RemotingCommand or a dict:

    {"code":310,"extFields":{"a":group,"b":topic,"c":defaultTopic,"d":defaultQueueNums,
     "e":queueId,"f":sysFlag,"g":bornTimestamp,"h":flag,"i":properties,"j":reconsumeTimes,
     "k":unitMode,"l":maxReconsumeTimes,"m":batch},"flag":0,"language":"JAVA","opaque":N,
     "serializeTypeCurrentRPC":"JSON","version":N}

(plus, on a signed send, the ACL fields AccessKey, Signature, SecurityToken and OnsChannel: the
broker's request steps check them - SignedSendCheck, or LaneRequest.signed_send / signed_by for
the access check's Python side - from the values as parsed here) and checked by the one send check, `_checked_queues` + `_special_properties` (the topic passed
every check of the send processor under the topic table's current data version, the broker is
writeable, the queue id is in range, no transaction flag, no delay or timer property) — the
functions the send processor's own path calls too (`checked_queues`, `plain_send_queues`,
`special_properties`), so a send is recognised alike whichever path reads it.  It is then put
through the store's one put path (`state.put`) and answered with a response frame written here —
every answer of a run of such frames joins one write.  Any other frame, and any send the lane is
not sure about (an escape it does not expect, a non-ASCII byte, an odd integer, a duplicate
field), goes to `on_frame` as a memoryview, in its place in the
order: the general path then checks it and makes every refusal, with its precise remark.  Nothing
is put before the last check passes, so declining is always safe.  Bytes from the network are
untrusted: every read is bounds-checked.

The lane reads nothing of the broker but its `SendLaneState`: plain values (the put to use, the
topic table's version, writeable or not, the checked-topics cache) that the send processor owns
and refreshes through `state.refresh` before the first send of each read chunk and before a send
following a frame handed back (a chunk of pops and acks costs no refresh).

The broker's request steps (rmq_core.remoting.steps) are part of the lane, not a reason to leave
it: with `state.check` set (a LaneCheck), each plain send is run through it just before its put
as a LaneRequest - the values parsed here over the read chunk's frame (copied only when a Python
step gets it), a str made of one only when a step reads it; the command decoded (`state.decode`)
only when a step asks for more.  A step may give a native check (SignedSendCheck: the ACL
validator's, a signed send checked here against the validator's per-connection cache); Python
steps run in a PyLaneCheck.  A refusal is answered by the steps.  With `state.after` set,
`after(request, answer frame)` follows each answer written here (a SYNC_FLUSH send is then
finished by on_deferred, one at a time, which runs the after steps itself).

The master's write fence (controller mode, docs/failover.md "Fencing"): `state.fence` is the
broker's one WriteFence.  A send is answered SEND_OK only while `monotonic() <= writable_until`,
checked when the answer is written - once per write of answers (the first answer of a run reads
the clock, the others of that run share it) and once per group of SYNC_FLUSH answers - so a
master paused between a put and its answer refuses it (`outcome(fence)`: SERVICE_NOT_AVAILABLE,
[FENCED]).  refresh() also makes the lane stand aside while the fence is lapsed (the general path
then refuses before any put).
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_REFCNT, Py_XDECREF
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.math cimport INFINITY
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy, memset

from concurrent.futures import Future as _ConcurrentFuture

cimport cython

cdef extern from "Python.h":
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    bint PyUnicode_CheckExact(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    void* PyUnicode_DATA(object o)
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    object PyUnicode_FromStringAndSize(const char* s, Py_ssize_t n)
    Py_ssize_t PySet_GET_SIZE(object s)

from record_layout cimport MAX_TOPIC as MAX_TOPIC_BYTES, TRANSACTION_MASK

cdef enum:
    SEND_MESSAGE_V2 = 310
    RESPONSE_FLAG = 1
    ONEWAY_FLAG = 2
    TOPIC_SLOTS = 256


cdef struct SendFields:
    int64_t code, flag, opaque
    const uint8_t* topic
    Py_ssize_t topic_len
    const uint8_t* props      # the raw (escaped) JSON text of "i", without quotes
    Py_ssize_t props_len
    bint props_escaped
    int64_t queue_id, sys_flag, born_ts, msg_flag, reconsume
    bint has_queue_id
    uint32_t seen             # the one-letter fields read
    const uint8_t* body
    Py_ssize_t body_len
    # a signed send: each field's value as it is in the frame (a..n by id 0..13, 14 AccessKey,
    # 15 Signature), the ids whose value is JSON-escaped, and whether other ACL fields came
    const uint8_t* vals[16]
    Py_ssize_t lens[16]
    uint32_t escaped
    bint acl_other


from rmq_core._native.frame cimport JsonHeader, header_int, plain_ascii, read_json_header, unescape_json
from rmq_core._native.hmac_sha1 cimport SHA_CTX, HmacSha1
from json_read cimport key_is
from clock cimport monotonic as _monotonic


cdef bint _is_int32(int64_t v) noexcept nogil:
    return -2147483648 <= v <= 2147483647


cdef bint _special_properties(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """True when a property name asks for the general path: DELAY, TRAN_MSG, DELIVER_TIME_MS or
    TIMER_* (delay levels, transactions, timers)."""
    cdef Py_ssize_t i = 0, j
    while i < n:
        j = i
        while j < n and p[j] != 1 and p[j] != 2:
            j += 1
        if j < n and p[j] == 1:
            if (key_is(p + i, j - i, "DELAY", 5) or key_is(p + i, j - i, "TRAN_MSG", 8)
                    or key_is(p + i, j - i, "DELIVER_TIME_MS", 15)
                    or (j - i >= 6 and memcmp(p + i, b"TIMER_", 6) == 0)):
                return True
            while j < n and p[j] != 2:
                j += 1
        i = j + 1
    return False


cdef inline bint _acl_field(const uint8_t* key, Py_ssize_t klen) noexcept nogil:
    """The fields a client signing for ACL adds (AclClientRPCHook: AccessKey, Signature,
    SecurityToken; the C++ client's OnsChannel)."""
    return (key_is(key, klen, "AccessKey", 9) or key_is(key, klen, "Signature", 9)
            or key_is(key, klen, "SecurityToken", 13) or key_is(key, klen, "OnsChannel", 10))


cdef int _send_field(void* target, const uint8_t* key, Py_ssize_t klen, bint kesc,
                     const uint8_t* v, Py_ssize_t vlen, bint esc) except -1:
    """One extFields entry of a SendMessageRequestHeaderV2 into the SendFields `target`: 1 for
    anything the lane is not sure about (the general path then reads the frame)."""
    cdef SendFields* f = <SendFields*>target
    cdef int64_t iv
    cdef uint8_t k
    if not kesc and klen > 1 and _acl_field(key, klen) and plain_ascii(v, vlen):
        # a signed send's ACL fields: kept for the broker's access check (SignedSendCheck)
        if esc or f.vals[14 if key[0] == 65 else 15] != NULL:
            f.acl_other = True
        elif key[0] == 65:  # AccessKey
            f.vals[14] = v
            f.lens[14] = vlen
        elif key[1] == 105:  # Signature
            f.vals[15] = v
            f.lens[15] = vlen
        else:  # SecurityToken, OnsChannel: the request steps read the request
            f.acl_other = True
        return 0
    if kesc or klen != 1 or key[0] < 97 or key[0] > 110 or not plain_ascii(v, vlen):
        return 1  # only the one-letter names a..n, ASCII values
    k = key[0]
    if f.seen & (1u << (k - 97)):
        return 1  # a repeat: the general decoder keeps the last
    f.seen |= 1u << (k - 97)
    f.vals[k - 97] = v
    f.lens[k - 97] = vlen
    if esc:
        f.escaped |= 1u << (k - 97)
    if k == 98:  # b: topic
        if esc or vlen == 0 or vlen > MAX_TOPIC_BYTES:
            return 1
        f.topic = v
        f.topic_len = vlen
    elif k == 105:  # i: properties
        f.props = v
        f.props_len = vlen
        f.props_escaped = esc
    elif k == 109:  # m: batch
        if not (vlen == 5 and memcmp(v, b"false", 5) == 0):
            return 1
    elif k == 97 or k == 99 or k == 107 or k == 110:
        # a, c, k, n: producer group, default topic, unit mode, broker name (sent by Java 4.9
        # clients and ours; a 4.x broker does not read it) — not read here
        pass
    else:  # d e f g h j l: integers, empty meaning the default
        if esc:
            return 1
        if vlen == 0:
            return 0
        if not header_int(v, vlen, &iv):
            return 1
        if k == 103:
            f.born_ts = iv
        elif k == 101 or k == 102 or k == 104 or k == 106:  # (the int fields)
            if not _is_int32(iv):
                return 1
            if k == 101:
                f.queue_id = iv
                f.has_queue_id = True
            elif k == 102:
                f.sys_flag = iv
            elif k == 104:
                f.msg_flag = iv
            else:
                f.reconsume = iv
    return 0


cdef bint _parse_send(const uint8_t* base, Py_ssize_t n, SendFields* f) except -1:
    """Read a SEND_MESSAGE_V2-shaped request frame (without its length prefix) into `f` through
    the one JSON header reader (frame.pxd); False when it is anything else or anything the lane is
    not sure about (a remark, a name RocketMQ does not send, a repeated name, an escaped or
    non-ASCII language)."""
    cdef JsonHeader h
    memset(f, 0, sizeof(SendFields))  # (no field read yet, no value, nothing escaped)
    f.queue_id = -1
    if read_json_header(base, n, &h, _send_field, f) != 1:
        return False
    if h.other or h.repeated or h.remark != NULL or f.topic == NULL:
        return False
    if h.language != NULL and (h.language_escaped or not plain_ascii(h.language, h.language_len)):
        return False
    f.code = h.code
    f.flag = h.flag
    f.opaque = h.opaque
    f.body = h.body
    f.body_len = h.body_len
    return True


# --- a send as the broker's request steps see it -------------------------------------------------
# the field ids of a parsed send (SendFields.vals): a..n 0..13, then the ACL fields 14 and 15
LANE_FIELDS = tuple("abcdefghijklmn") + ("AccessKey", "Signature")
cdef dict _LANE_IDS = {name: i for i, name in enumerate(LANE_FIELDS)}
cdef dict _signed_orders = {}  # order function -> the field ids it orders LANE_FIELDS in


cdef bytes _signed_ids(order):
    """The field ids of LANE_FIELDS (but Signature) in the signed order `order(names)` gives."""
    ids = _signed_orders.get(order)
    if ids is None:
        ids = _signed_orders[order] = bytes([_LANE_IDS[name] for name in order(LANE_FIELDS[:15])])
    return ids


cdef LaneRequest _lane_request(SendFields* f, const uint8_t* frame, Py_ssize_t n, str topic, bytes body, decode):
    """The request over the read chunk's frame (not copied: `own()` copies it before Python code
    may keep the request past the chunk - a Python step, an after step)."""
    cdef LaneRequest r = LaneRequest.__new__(LaneRequest)
    cdef int k
    cdef uint32_t present = f.seen
    r.base, r.n, r._frame = frame, n, None
    r.code, r.flag, r.opaque = f.code, f.flag, f.opaque
    r.topic, r.body = topic, body
    if f.vals[14] != NULL:
        present |= 1u << 14
    if f.vals[15] != NULL:
        present |= 1u << 15
    for k in range(16):
        if present & (1u << k):
            r.offs[k] = f.vals[k] - frame
            r.lens[k] = f.lens[k]
    r.present, r.escaped, r.acl_other = present, f.escaped, f.acl_other
    r.decode = decode
    return r


@cython.final
@cython.freelist(16)
cdef class LaneRequest:
    """A plain SEND_MESSAGE_V2 as the send lane parsed it, handed to the broker's request steps
    instead of a command decoded from its frame: code, flag, opaque and body are its own,
    `ext_fields` a mapping over the values the lane found (each a str only when read), `topic`
    the topic; anything else (language, version...) - and ext_fields once a step changes one, or
    when the send carries ACL fields the lane does not keep - comes from the command decoded then.
    signed_send() and signed_by() give a signed send's parsed values to the access check."""
    cdef bytes _frame               # the frame once owned (None: `base` points into the read chunk)
    cdef const uint8_t* base
    cdef Py_ssize_t n
    cdef readonly object code, flag, opaque, body
    cdef readonly str topic
    cdef Py_ssize_t offs[16]
    cdef Py_ssize_t lens[16]
    cdef uint32_t present, escaped  # the field ids in the frame, those JSON-escaped
    cdef bint acl_other             # SecurityToken / OnsChannel came too (not kept: decoded when read)
    cdef object decode, _command, _ext

    cdef int own(self) except -1:
        """Copy the frame out of the read chunk (once): the request may then outlive it."""
        if self._frame is None:
            self._frame = PyBytes_FromStringAndSize(<const char*>self.base, self.n)
            self.base = <const uint8_t*>PyBytes_AS_STRING(self._frame)
        return 0

    @property
    def frame(self):
        self.own()
        return self._frame

    def command(self):
        """The request decoded from its frame (once)."""
        if self._command is None:
            self._command = self.decode(self.frame)
            self._ext = None
        return self._command

    @property
    def ext_fields(self):
        if self._command is not None or self.acl_other:
            return self.command().ext_fields
        if self._ext is None:
            self._ext = LaneFields.__new__(LaneFields)
            (<LaneFields>self._ext).r = self
        return self._ext

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.command(), name)

    def is_oneway(self):
        return bool(self.flag & ONEWAY_FLAG)

    def is_response(self):
        return False

    def get_str(self, name, default=None):
        value = self.ext_fields.get(name)
        return default if value is None else value

    cdef bytes raw(self, int k):
        """Field k's value as UTF-8 (escapes decoded: the properties')."""
        cdef const uint8_t* p = self.base + self.offs[k]
        cdef Py_ssize_t m
        if not (self.escaped & (1u << k)):
            return PyBytes_FromStringAndSize(<const char*>p, self.lens[k])
        out = PyBytes_FromStringAndSize(NULL, self.lens[k])
        m = unescape_json(p, self.lens[k], <uint8_t*>PyBytes_AS_STRING(out))  # (checked by the lane: >= 0)
        return out[:m]

    cdef str value(self, int k):
        if not (self.escaped & (1u << k)):  # (ASCII: checked by the parser)
            return PyUnicode_FromStringAndSize(<const char*>self.base + self.offs[k], self.lens[k])
        return self.raw(k).decode("utf-8")

    cdef bint signed_plain(self):
        """A send whose signature can be told from the values parsed here: AccessKey and Signature,
        no other ACL field, no escaped value but the properties', not changed by a step."""
        return ((self.present & 0xC000) == 0xC000 and not self.acl_other and not (self.escaped & ~(1u << 8))
                and self._command is None)

    cdef bint matches(self, HmacSha1 key, const unsigned char* ids, Py_ssize_t nids) except -1:
        """Whether the Signature is `key`'s keyed hash of the values in the signed order (field ids
        `ids`, those present; properties unescaped) then the body - fed to it piece by piece."""
        cdef SHA_CTX c
        cdef Py_ssize_t i
        cdef int k
        cdef bytes props
        key.begin(&c)
        for i in range(nids):
            k = ids[i]
            if self.present & (1u << k):
                if k == 8 and self.escaped & (1u << 8):
                    props = self.raw(8)
                    key.update(&c, PyBytes_AS_STRING(props), len(props))
                else:
                    key.update(&c, self.base + self.offs[k], self.lens[k])
        if self.body is not None:
            key.update(&c, PyBytes_AS_STRING(<bytes>self.body), len(<bytes>self.body))
        return key.matches(&c, <const char*>self.base + self.offs[15], self.lens[15])

    def signed_send(self):
        """A signed send's (topic, AccessKey) for the access check, or None when the send is not one
        the lane can tell the signature of (another ACL field, an escaped value, no AccessKey or
        Signature) - then the check reads ext_fields."""
        if not self.signed_plain():
            return None
        return self.topic, PyUnicode_FromStringAndSize(<const char*>self.base + self.offs[14], self.lens[14])

    def signed_by(self, HmacSha1 key, order):
        """Whether a signed_send()'s Signature is `key`'s over its values in the order
        `order(field names)` gives (rmq_core.acl.signed_order) and its body (compared in constant time)."""
        ids = _signed_ids(order)
        return self.matches(key, <const unsigned char*>PyBytes_AS_STRING(ids), len(ids))

    def __repr__(self):
        return f"LaneRequest(code={self.code}, opaque={self.opaque}, topic={self.topic!r})"


@cython.final
@cython.freelist(16)
cdef class LaneFields:
    """LaneRequest.ext_fields: a mapping over the parsed values; a change makes them the decoded
    command's (which the request then is)."""
    cdef LaneRequest r

    cdef int _id(self, key) except -2:
        cdef PyObject* found = PyDict_GetItemWithError(_LANE_IDS, key)
        if found == NULL:
            return -1
        k = <int><object>found
        return k if self.r.present & (1u << k) else -1

    cdef dict _dict(self):
        cdef int k
        out = {}
        for k in range(16):
            if self.r.present & (1u << k):
                out[LANE_FIELDS[k]] = self.r.value(k)
        return out

    def __len__(self):
        cdef int k, c = 0
        for k in range(16):
            if self.r.present & (1u << k):
                c += 1
        return c

    def __bool__(self):
        return self.r.present != 0

    def __contains__(self, key):
        return self._id(key) >= 0

    def __getitem__(self, key):
        cdef int k = self._id(key)
        if k < 0:
            raise KeyError(key)
        return self.r.value(k)

    def get(self, key, default=None):
        cdef int k = self._id(key)
        return default if k < 0 else self.r.value(k)

    def __iter__(self):
        return iter(self._dict())

    def keys(self):
        return self._dict().keys()

    def values(self):
        return self._dict().values()

    def items(self):
        return self._dict().items()

    def copy(self):
        return self._dict()

    def __eq__(self, other):
        return self._dict() == other

    def __repr__(self):
        return repr(self._dict())

    def __setitem__(self, key, value):
        self.r.command().ext_fields[key] = value

    def __delitem__(self, key):
        del self.r.command().ext_fields[key]

    def pop(self, key, *default):
        return self.r.command().ext_fields.pop(key, *default)

    def setdefault(self, key, default=None):
        return self.r.command().ext_fields.setdefault(key, default)

    def update(self, other=(), **kw):
        self.r.command().ext_fields.update(other, **kw)


# --- the broker's request steps in the lane -------------------------------------------------------
cdef class LaneCheck:
    """The broker's request steps as the lane runs them on each plain send (SendLaneState.check):
    run(request) -> 1 to go on, 0 when a step refused it (and answered the refusal).  A step may
    give a native check (SignedSendCheck); Python steps are run by a PyLaneCheck; a connection's
    steps are one check, or a LaneChecks of them in order."""

    cdef int run(self, LaneRequest r) except -1:
        return 1


@cython.final
cdef class PyLaneCheck(LaneCheck):
    """Python steps of a connection `ctx` (remoting's channel context): each `fn(remote address,
    request, ctx)` in order; one that raises refused the send - answered as dispatch answers a
    failing step (`ctx.answer_failure(command, error)`: RequestRefused's code and remark)."""
    cdef list before
    cdef object ctx

    def __init__(self, list before, ctx):
        self.before, self.ctx = before, ctx

    cdef int run(self, LaneRequest r) except -1:
        cdef Py_ssize_t refs = Py_REFCNT(r)
        ctx = self.ctx
        try:
            addr = ctx.remote_address
            for fn in self.before:
                fn(addr, r, ctx)
        except Exception as e:
            ctx.answer_failure(r.command(), e)
            return 0
        finally:
            # the ext_fields view refers to the request (dropped: no cycle left for the collector);
            # a step that kept the request, or its view, has it copy its frame out of the read chunk
            r._ext = None
            if Py_REFCNT(r) > refs:
                r.own()
        return 1


@cython.final
cdef class LaneChecks(LaneCheck):
    """Checks run in order until one refuses."""
    cdef tuple checks

    def __init__(self, checks):
        self.checks = tuple(checks)
        for c in self.checks:
            if not isinstance(c, LaneCheck):
                raise TypeError(f"{c!r} is not a LaneCheck")

    cdef int run(self, LaneRequest r) except -1:
        for c in self.checks:
            if (<LaneCheck>c).run(r) == 0:
                return 0
        return 1


@cython.final
cdef class SignedSendCheck(LaneCheck):
    """An access check of a connection's signed sends (plugins/acl's plain validator), natively:
    `sends` is the validator's cache for the connection - (accessKey, topic) -> the account's
    HmacSha1 when the account and its permission passed, None when it passes unsigned - valid
    while `source.rules` is `rules`.  A cached send is checked here (its Signature against the key's
    hash of the parsed values in the signed order `order` gives); a miss, a changed rule set, a
    wrong signature or any send the lane cannot tell the signature of runs `fallback` (the
    validator's Python check, which refuses with its remark or fills the cache), after which
    `refill(self)` sets `sends` and `rules` anew."""
    cdef public dict sends
    cdef public object rules
    cdef object source, refill
    cdef LaneCheck fallback
    cdef bytes ids
    cdef object last_topic, last_entry  # the last cache hit (a connection's sends repeat it)
    cdef bytes last_key

    def __init__(self, source, order, LaneCheck fallback, refill):
        self.source, self.fallback, self.refill = source, fallback, refill
        self.ids = _signed_ids(order)
        self.sends, self.rules = {}, None
        self.last_topic = self.last_entry = self.last_key = None

    cdef int _fall_back(self, LaneRequest r) except -1:
        cdef int rc = self.fallback.run(r)
        self.last_topic = self.last_entry = self.last_key = None
        self.refill(self)
        return rc

    cdef int run(self, LaneRequest r) except -1:
        cdef PyObject* found
        cdef const uint8_t* ak
        cdef Py_ssize_t akn
        if not r.signed_plain() or self.source.rules is not self.rules:
            return self._fall_back(r)
        ak, akn = r.base + r.offs[14], r.lens[14]
        if (r.topic is self.last_topic and len(self.last_key) == akn
                and memcmp(PyBytes_AS_STRING(self.last_key), ak, akn) == 0):
            entry = self.last_entry
        else:
            key = PyBytes_FromStringAndSize(<const char*>ak, akn)
            found = PyDict_GetItemWithError(self.sends, (key.decode("ascii"), r.topic))
            if found == NULL:
                return self._fall_back(r)
            entry = <object>found
            self.last_topic, self.last_entry, self.last_key = r.topic, entry, key
        if entry is None:  # (passes unsigned)
            return 1
        if not r.matches(<HmacSha1?>entry, <const unsigned char*>PyBytes_AS_STRING(self.ids), len(self.ids)):
            return self._fall_back(r)  # (refused there, with its remark)
        return 1


cdef class PlainSend:
    """The message of one lane send, in the attribute names the store's single put reads
    (MessageExtBrokerInner's); one instance per lane, refilled per send (the put keeps none of it)."""
    cdef public object topic, body, properties_bytes, born_host
    cdef public int queue_id, sys_flag, flag, reconsume_times
    cdef public long long born_timestamp
    cdef readonly object properties, store_host, tags_code
    cdef readonly long long prepared_transaction_offset

    def __cinit__(self):
        self.properties = None
        self.store_host = None
        self.tags_code = None
        self.prepared_transaction_offset = 0


from json_text cimport Out, out_reserve as _reserve, rmq_json_escaped, rmq_json_int


cdef inline char* _lit(char* w, const char* s, Py_ssize_t n) noexcept nogil:
    memcpy(w, s, n)
    return w + n


cdef int _write_send_response(Out* o, int64_t code, const char* msg_id, Py_ssize_t id_len, int64_t queue_id,
                              int64_t queue_offset, int64_t opaque, int64_t version) except -1:
    """A send's answer with its fields, byte for byte what RemotingCommand's JSON encoder writes
    for new_response(request, code, None, {msgId, queueId, queueOffset, MSG_REGION, TRACE_ON}, None)."""
    cdef char* start
    cdef char* w
    _reserve(o, id_len + 320)
    start = o.buf + o.n
    w = start + 8
    w = _lit(w, b'{"code":', 8)
    w = rmq_json_int(w, code)
    w = _lit(w, b',"extFields":{"msgId":"', 23)
    w = _lit(w, msg_id, id_len)
    w = _lit(w, b'","queueId":"', 13)
    w = rmq_json_int(w, queue_id)
    w = _lit(w, b'","queueOffset":"', 17)
    w = rmq_json_int(w, queue_offset)
    w = _lit(w, b'","MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"flag":1,"language":"JAVA","opaque":', 86)
    w = rmq_json_int(w, opaque)
    w = _lit(w, b',"serializeTypeCurrentRPC":"JSON","version":', 44)
    w = rmq_json_int(w, version)
    w[0] = 125  # }
    _seal_frame(o, start, w + 1)
    return 0


cdef int _write_failure(Out* o, int64_t code, bytes remark, int64_t opaque, int64_t version) except -1:
    """A send's answer without fields: make_response(code, remark) as the JSON encoder writes it
    (`remark`: UTF-8, escaped by the encoder's own json_text writer)."""
    cdef char* start
    cdef char* w
    _reserve(o, len(remark) * 6 + 200)
    start = o.buf + o.n
    w = start + 8
    w = _lit(w, b'{"code":', 8)
    w = rmq_json_int(w, code)
    w = _lit(w, b',"flag":1,"language":"JAVA","opaque":', 37)
    w = rmq_json_int(w, opaque)
    w = _lit(w, b',"remark":"', 11)
    w = rmq_json_escaped(w, PyBytes_AS_STRING(remark), len(remark))
    w = _lit(w, b'","serializeTypeCurrentRPC":"JSON","version":', 45)
    w = rmq_json_int(w, version)
    w[0] = 125  # }
    _seal_frame(o, start, w + 1)
    return 0


cdef inline void _seal_frame(Out* o, char* start, char* end) noexcept:
    """Fill the length prefix and header length of the frame written at start..end (no body)."""
    cdef Py_ssize_t hl = end - start - 8
    cdef Py_ssize_t total = 4 + hl
    start[0] = <char>(total >> 24); start[1] = <char>(total >> 16); start[2] = <char>(total >> 8); start[3] = <char>total
    start[4] = 0; start[5] = <char>(hl >> 16); start[6] = <char>(hl >> 8); start[7] = <char>hl
    o.n += end - start


@cython.final
cdef class WriteFence:
    """A master's write fence, one per broker, read by its send lanes and its general path alike:
    a write may be answered as stored only while `time.monotonic() <= writable_until` (seconds;
    +inf: no fence - manual mode; -inf: not a writable master).  `remark`: the refusal's remark
    (the broker names itself in it)."""
    cdef public double writable_until
    cdef public str remark

    def __init__(self, double writable_until=INFINITY, str remark=None):
        self.writable_until = writable_until
        self.remark = remark if remark is not None else (
            "[FENCED]the broker is no longer sure it is the master (its controller lease lapsed): "
            "the write is not acknowledged; the new master takes writes")

    cpdef bint lapsed(self):
        """Whether a write answered now must be refused (read with the lane's clock)."""
        return _monotonic() > self.writable_until

    def __repr__(self):
        return f"WriteFence(writable_until={self.writable_until!r})"


cdef class SendLaneState:
    """What a send lane knows of the broker, as plain values, owned by the send processor
    (broker/processors/send.py): `refresh(state)` sets `put`, `data_version`, `counter` and
    `writable` from the broker's current state; the lane calls it before each read chunk and after
    each frame it hands back, so the general path's changes are seen by the next frame."""
    cdef public object put           # the store's put (put_nowait), or None: the lane stands aside
    cdef public dict topics          # topic -> (data version, its counter, write queues, queue id bound)
    cdef public object data_version  # the topic table's DataVersion (compared by identity)
    cdef public int64_t counter      # ... and its counter
    cdef public bint writable        # the broker's permission allows writes
    cdef public bytes cluster_prop   # "CLUSTER\x01<name>\x02", appended to every message's properties
    cdef public int64_t version      # this broker's MQVersion, written in every answer
    cdef public object put_ok        # PutMessageStatus.PUT_OK
    cdef public object on_put        # on_put(topic, messages, bytes): the broker's put statistics
    cdef public object outcome       # outcome(status) -> (code, remark or None, with fields)
    cdef public object refresh       # refresh(state)
    cdef public LaneCheck check      # the broker's steps on each plain send (a LaneRequest), or None
    cdef public object decode        # decode(frame) -> the command of a frame (a LaneRequest's, when asked)
    cdef public object after         # after(request, answer frame), or None
    cdef public WriteFence fence     # the broker's write fence (outcome(fence): the refusal's answer)

    def __init__(self, dict topics, bytes cluster_prop, int64_t version, put_ok, on_put, outcome, refresh,
                 WriteFence fence=None):
        self.put = self.check = self.decode = self.after = self.data_version = None
        self.counter, self.writable = 0, False
        self.topics, self.cluster_prop, self.version = topics, cluster_prop, version
        self.put_ok, self.on_put, self.outcome, self.refresh = put_ok, on_put, outcome, refresh
        self.fence = fence if fence is not None else WriteFence()

    @property
    def writable_until(self):
        """The fence's writable_until (the broker's: its lanes share one WriteFence)."""
        return self.fence.writable_until

    @writable_until.setter
    def writable_until(self, double value):
        self.fence.writable_until = value


cdef int64_t _checked_queues(SendLaneState st, topic, int64_t queue_id) except -1:
    """The write queue count of `topic` when every check of the send processor passed for it under
    the topic table's current version, the broker is writeable and `queue_id` (< 0: any queue) is
    below the topic's bound; 0 when the send must take the general path (which checks everything
    and names what is wrong)."""
    entry = st.topics.get(topic)
    if entry is None:
        return 0
    if (<tuple>entry)[0] is not st.data_version or (<tuple>entry)[1] != st.counter:
        return 0
    if not st.writable or queue_id >= <int64_t>(<tuple>entry)[3]:
        return 0
    return <int64_t>(<tuple>entry)[2]


def checked_queues(SendLaneState state, topic, int64_t queue_id):
    """The check the lane makes of every send, for the send processor's own sends (a batch, a
    send read as a RemotingCommand): the topic's write queue count, or 0 for the general path."""
    if type(topic) is not str:
        return 0
    return _checked_queues(state, topic, queue_id)


def plain_send_queues(SendLaneState state, topic, int64_t queue_id, int64_t sys_flag, properties):
    """checked_queues for one message, 0 as well when it is not plain: a transaction flag, or a
    delay, timer or transaction property (`properties`: the encoded properties string)."""
    cdef const uint8_t* p
    if sys_flag & TRANSACTION_MASK or type(topic) is not str:
        return 0
    p = <const uint8_t*>PyBytes_AS_STRING(<bytes?>properties)
    if _special_properties(p, len(properties)):
        return 0
    return _checked_queues(state, topic, queue_id)


def special_properties(bytes properties):
    """Whether an encoded properties string asks for delay, timer or transaction handling."""
    return _special_properties(<const uint8_t*>PyBytes_AS_STRING(properties), len(properties))


cdef class SendLane


cdef class _SyncGroup:
    """The lane's SYNC_FLUSH sends that share one group-commit Future: answered together when
    it resolves, in one write (no Task, no asyncio future per send)."""
    cdef SendLane lane
    cdef object future
    cdef list items  # (opaque, flag, queue id, queue offset, wrote bytes, msg id, topic)

    def __init__(self, SendLane lane, future):
        self.lane = lane
        self.future = future
        self.items = []

    def _done(self, future):
        # in the group-commit thread (or here, when already resolved): answer in the loop's thread
        try:
            self.lane.call_soon_threadsafe(self.lane._complete, self)
        except RuntimeError:  # the loop is closed: the broker stopped, nobody to answer
            pass


cdef class SendLane:
    """One connection's native send lane (see the module doc).  Built by the send processor for
    a TCP connection of the broker; the transport calls `deliver` with each read chunk."""

    cdef readonly SendLaneState state
    cdef object on_deferred, tasks, call_soon_threadsafe, write_frames, on_json_peer
    cdef _SyncGroup group  # SYNC_FLUSH sends of this read waiting on one Future
    cdef Py_ssize_t sync_waiting  # sends put and not yet answered (counted as in flight)
    cdef Py_ssize_t max_inflight
    cdef PlainSend msg
    cdef PyObject* topics[TOPIC_SLOTS]  # direct-mapped cache: topic bytes -> str
    cdef Out out
    cdef bytearray props_buf
    # stats of the answered sends not yet handed to BrokerStats (one call per topic run)
    cdef object stat_topic
    cdef int64_t stat_n, stat_bytes
    # frames answered here / handed back / put here and answered by on_deferred (for tests, stats)
    cdef public int64_t handled, declined, deferred, failed
    cdef object on_error
    cdef bint run_fenced  # the fence had lapsed when the first answer of the pending write was written

    def __cinit__(self):
        cdef int i
        for i in range(TOPIC_SLOTS):
            self.topics[i] = NULL
        self.out.buf = NULL
        self.out.n = 0
        self.out.cap = 0
        self.out.heap = True

    def __dealloc__(self):
        cdef int i
        for i in range(TOPIC_SLOTS):
            Py_XDECREF(self.topics[i])
            self.topics[i] = NULL
        free(self.out.buf)

    def __init__(self, SendLaneState state, born_host, tasks, Py_ssize_t max_inflight, on_deferred, *,
                 call_soon_threadsafe=None, write_frames=None, on_error=None, on_json_peer=None):
        """`state`: the broker's side (SendLaneState); `born_host`: the peer's (host, port);
        `tasks`/`max_inflight`: the connection's requests in flight and its limit (at the limit the
        general path answers SYSTEM_BUSY); `on_deferred(frame, result, future, topic, queue_id)`
        finishes a send whose put must be waited for (SYNC_FLUSH) or failed.  SYNC_FLUSH puts whose
        Future is a concurrent Future are answered in groups instead, when given
        `call_soon_threadsafe` (the loop's) and `write_frames(bytes)` (answers written outside a
        read).  `on_error(frame, exception)` answers a send whose handling raised (without it,
        deliver raises and the transport drops the connection); `on_json_peer()` is told once that
        the peer speaks JSON headers (after its first send answered here)."""
        self.state, self.tasks, self.max_inflight, self.on_deferred = state, tasks, max_inflight, on_deferred
        self.call_soon_threadsafe, self.write_frames = call_soon_threadsafe, write_frames
        self.on_error, self.on_json_peer = on_error, on_json_peer
        self.group, self.sync_waiting = None, 0
        self.msg = PlainSend()
        self.msg.born_host = born_host
        self.props_buf = bytearray(512)
        self.stat_topic, self.stat_n, self.stat_bytes = None, 0, 0
        self.handled = self.declined = self.deferred = self.failed = 0
        self.run_fenced = False

    cdef object _topic_str(self, const uint8_t* p, Py_ssize_t n):
        cdef uint32_t h = 2166136261u
        cdef Py_ssize_t i
        cdef PyObject* cur
        for i in range(n):
            h = (h ^ p[i]) * 16777619u
        h &= TOPIC_SLOTS - 1
        cur = self.topics[h]
        if cur != NULL and PyUnicode_GET_LENGTH(<object>cur) == n and memcmp(PyUnicode_DATA(<object>cur), p, n) == 0:
            return <object>cur
        s = PyUnicode_FromStringAndSize(<const char*>p, n)  # ASCII: checked by the parser
        Py_XDECREF(cur)
        Py_INCREF(s)
        self.topics[h] = <PyObject*>s
        return s

    cdef int _flush_stats(self) except -1:
        if self.stat_n:
            topic, n, size = self.stat_topic, self.stat_n, self.stat_bytes
            self.stat_topic = None
            self.stat_n = 0
            self.stat_bytes = 0
            self.state.on_put(topic, n, size)
        return 0

    cdef int _flush(self, emit) except -1:
        """Hand the answers written so far to the transport and the counts to BrokerStats: done
        before any other frame is handled, so what it sees (and writes) follows ours."""
        cdef Py_ssize_t n = self.out.n
        self._flush_stats()
        if n:
            self.out.n = 0
            emit(PyBytes_FromStringAndSize(self.out.buf, n))
        return 0

    cdef int _try_send(self, const uint8_t* frame, Py_ssize_t n, bint* stale, view, Py_ssize_t pos,
                       Py_ssize_t end, emit) except -1:
        """1: answered here; 0: declined (nothing done); 2: put, finished by on_deferred; 3: refused
        by a request step (answered by it).  `stale`: the state is refreshed first (only a send
        needs it: a pop or an ack handed back costs no refresh)."""
        cdef SendFields f
        cdef SendLaneState st
        cdef Py_ssize_t plen, total_props
        cdef uint8_t* pb
        cdef const char* idp
        cdef Py_ssize_t idn, start
        if not _parse_send(frame, n, &f):
            return 0
        if f.code != SEND_MESSAGE_V2 or f.flag & RESPONSE_FLAG or not f.has_queue_id or f.queue_id < 0:
            return 0
        st = self.state
        if stale[0]:
            st.refresh(st)
            stale[0] = False
        fast_put = st.put
        if fast_put is None:
            return 0
        topic = self._topic_str(f.topic, f.topic_len)
        if f.sys_flag & TRANSACTION_MASK or _checked_queues(st, topic, f.queue_id) == 0:
            return 0
        # properties: unescaped, then CLUSTER appended (as the general path does)
        cluster_prop = st.cluster_prop
        total_props = f.props_len + len(cluster_prop)
        if len(self.props_buf) < total_props:
            self.props_buf = bytearray(total_props * 2)
        pb = <uint8_t*><char*>self.props_buf
        if f.props_escaped:
            plen = unescape_json(f.props, f.props_len, pb)
            if plen < 0:
                return 0
        else:
            plen = f.props_len
            if plen:
                memcpy(pb, f.props, plen)
        if _special_properties(pb, plen):
            return 0
        memcpy(pb + plen, PyBytes_AS_STRING(cluster_prop), len(cluster_prop))
        request = None
        body = PyBytes_FromStringAndSize(<const char*>f.body, f.body_len)
        if st.check is not None:  # the broker's request steps, on what was parsed here: a refusal is answered by them
            request = _lane_request(&f, frame, n, topic, body, st.decode)
            if st.after is not None:
                (<LaneRequest>request).own()  # (after() gets it past this chunk)
            if st.check.run(<LaneRequest>request) == 0:
                return 3
        msg = self.msg
        msg.topic = topic
        msg.queue_id = <int>f.queue_id
        msg.sys_flag = <int>f.sys_flag
        msg.flag = <int>f.msg_flag
        msg.reconsume_times = <int>f.reconsume
        msg.born_timestamp = f.born_ts
        msg.body = body
        msg.properties_bytes = PyBytes_FromStringAndSize(<const char*>pb, plen + len(cluster_prop))
        r = fast_put(msg)
        msg.body = None
        result, fut = <tuple>r
        if fut is not None and result.status is st.put_ok and self.write_frames is not None \
                and st.after is None and isinstance(fut, _ConcurrentFuture):
            # SYNC_FLUSH: joins the group of its Future, answered when the Future resolves
            if self.group is not None and self.group.future is not fut:
                self._seal_group()
            if self.group is None:
                self.group = _SyncGroup(self, fut)
            ar = result.append_result
            self.group.items.append((f.opaque, f.flag, f.queue_id, ar.logics_offset, ar.wrote_bytes, ar.msg_id, topic))
            self.sync_waiting += 1
            return 2
        if fut is not None or result.status is not st.put_ok:
            self._flush(emit)
            self.on_deferred(view[pos:end], result, fut, topic, f.queue_id)
            return 2
        ar = result.append_result
        if not (f.flag & ONEWAY_FLAG):
            if self.out.n == 0:  # the first answer of a write: the fence is read once for the run
                self.run_fenced = _monotonic() > st.fence.writable_until
            start = self.out.n
            if self.run_fenced:  # stored, but not acknowledged: the master's lease lapsed
                code_o, remark, _ = <tuple>st.outcome(st.fence)
                _write_failure(&self.out, code_o, (<str>remark).encode("utf-8", "replace"), f.opaque, st.version)
            else:
                self._count(topic, ar.wrote_bytes)
                msg_id = ar.msg_id
                if not PyUnicode_CheckExact(msg_id) or not PyUnicode_IS_COMPACT_ASCII(msg_id):
                    raise TypeError(f"msg id {msg_id!r} is not an ASCII str")
                idp = <const char*>PyUnicode_DATA(msg_id)
                idn = PyUnicode_GET_LENGTH(msg_id)
                _write_send_response(&self.out, 0, idp, idn, f.queue_id, <int64_t>ar.logics_offset, f.opaque, st.version)
            if st.after is not None and request is not None:
                st.after(request, PyBytes_FromStringAndSize(self.out.buf + start + 4, self.out.n - start - 4))
        else:
            self._count(topic, ar.wrote_bytes)
        return 1

    cdef inline int _count(self, topic, wrote) except -1:
        """One answered put in the stats of its topic's run (handed to BrokerStats by _flush_stats)."""
        if self.stat_topic is not topic:
            self._flush_stats()
            self.stat_topic = topic
        self.stat_n += 1
        self.stat_bytes += <int64_t>wrote
        return 0

    cdef int _seal_group(self) except -1:
        group, self.group = self.group, None
        if group is not None:
            group.future.add_done_callback(group._done)
        return 0

    def _complete(self, _SyncGroup group):
        """The loop's thread: answer a group whose Future resolved (with its status)."""
        cdef Out o
        cdef int64_t code
        cdef bint fields
        cdef Py_ssize_t k
        cdef const char* idp
        cdef SendLaneState st
        self.sync_waiting -= len(group.items)
        try:
            status = group.future.result()
        except BaseException as e:  # cancelled or failed: answered as a flush that never finished
            status = e
        st = self.state
        if status is st.put_ok:
            code, remark, fields = 0, None, True
        else:
            code_o, remark, fields = st.outcome(status)
            code = code_o
        if fields and _monotonic() > st.fence.writable_until:  # the lease lapsed while the flush ran
            code_o, remark, fields = st.outcome(st.fence)
            code = code_o
        if remark is not None:
            remark = (<str>remark).encode("utf-8", "replace")
        o.buf = NULL
        o.n = 0
        o.cap = 0
        o.heap = True
        try:
            for item in group.items:
                opaque, flag, queue_id, qoff, wrote, msg_id, topic = <tuple>item
                if fields:
                    self._count(topic, wrote)
                if <int64_t>flag & ONEWAY_FLAG:
                    continue
                if fields:
                    idp = <const char*>PyUnicode_DATA(msg_id)
                    _write_send_response(&o, code, idp, PyUnicode_GET_LENGTH(msg_id), queue_id, qoff, opaque, st.version)
                else:
                    _write_failure(&o, code, remark, opaque, st.version)
            self._flush_stats()
            if o.n:
                self.write_frames(PyBytes_FromStringAndSize(o.buf, o.n))
        finally:
            free(o.buf)

    @property
    def waiting(self):
        """Sends put here and answered when their flush is done (in flight on the connection)."""
        return self.sync_waiting

    def deliver(self, data, Py_ssize_t max_frame_length, on_frame, emit):
        """Handle every whole frame of `data` in order: plain sends here, the others through
        `on_frame(memoryview of the frame without its length prefix)` — which returns False to
        stop (the connection closed meanwhile).  Answers go out through `emit(bytes)`.  Returns
        (consumed, error): error names a frame length outside 4..max_frame_length (the frames
        before it are handled; the caller closes the connection), else None."""
        cdef Py_buffer pb
        cdef const uint8_t* buf
        cdef Py_ssize_t n, pos = 0, end
        cdef int64_t length = 0
        cdef int rc
        cdef bint stale = True, answered = False
        error = None
        view = None
        PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
        try:
            buf = <const uint8_t*>pb.buf
            n = pb.len
            while n - pos >= 4:
                length = <int32_t>((<uint32_t>buf[pos] << 24) | (<uint32_t>buf[pos + 1] << 16)
                                   | (<uint32_t>buf[pos + 2] << 8) | <uint32_t>buf[pos + 3])
                if length < 4 or length > max_frame_length:
                    error = f"frame length {length} outside 4..{max_frame_length}"
                    break
                end = pos + 4 + length
                if end > n:
                    break
                rc = 0
                if PySet_GET_SIZE(self.tasks) + self.sync_waiting < self.max_inflight:
                    if view is None:
                        view = memoryview(data)
                    try:
                        rc = self._try_send(buf + pos + 4, length, &stale, view, pos + 4, end, emit)
                    except Exception as e:  # e.g. the store's write failed: answered as dispatch would
                        if self.on_error is None:
                            raise
                        self._seal_group()
                        self._flush(emit)
                        self.on_error(view[pos + 4:end], e)
                        rc = 4
                if rc == 1 or rc == 3:
                    self.handled += 1
                    answered = True
                else:
                    if rc == 2:
                        self.deferred += 1
                        answered = True
                    elif rc == 0:
                        self.declined += 1
                        self._seal_group()
                        self._flush(emit)
                        if view is None:
                            view = memoryview(data)
                        if not on_frame(view[pos + 4:end]):
                            pos = end
                            break
                    else:
                        self.failed += 1
                    stale = True  # the general path may have changed what the lane may do
                pos = end
            if answered and self.on_json_peer is not None:
                self.on_json_peer()  # the answers written here were JSON
            self._seal_group()
            self._flush(emit)
        finally:
            PyBuffer_Release(&pb)
        return pos, error
