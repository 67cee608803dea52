# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The send pipeline's kernel (rmq_core.client.producer.SendAttempts' usual case, natively).

- PipelinedSender: a plain message's first attempt - its queue picked, its request frame written
  by frame.pyx's SendHeader, the LeanFuture and its context, the write on the broker's pipelined
  connection;
- deliver_responses and PipelinedCompletion: answers (frame.pyx: read_send_responses) matched to
  their requests and finished as SendResults (SendResultMaker; finish_batch for auto_batch);
- the LeanFuture steps (finish_unwatched, lean_result, subscribe_unwatched).

Everything here works from plain values the Python layer owns and hands over: dicts, sets,
callables, ints - never a Producer, a client instance or a state object whose attributes it reads.
Settings that change while a producer runs are pushed through PipelinedSender.configure.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.object cimport PyObject
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport int64_t

cimport cython

from clock cimport monotonic as _monotonic
from rmq_core._native.frame cimport RESPONSE_FLAG, SendHeader, SendRequest, SendResponse, run_send_steps
from rmq_core._native.socket_io cimport PipelinedWrites
from rmq_core._native.trace cimport TraceBuffer


# --- the SendResult --------------------------------------------------------------------------------
cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL


@cython.final
cdef class SendResultMaker:
    """SendResults built from SendResponses without the attrs __init__ (which sets each field
    through object.__setattr__ from Python): the same object.__setattr__, from C.  Built for the
    attrs class `send_result_cls` and its field names, in order."""

    cdef object _cls
    cdef object _new
    cdef tuple _names
    cdef object _queue_cls
    cdef dict _status
    cdef object _default_region

    def __init__(self, send_result_cls, tuple field_names, message_queue_cls, dict status_by_code,
                 str default_region="DefaultRegion"):
        if field_names != ("status", "msg_id", "offset_msg_id", "queue", "queue_offset", "transaction_id",
                           "region_id"):
            raise ValueError(f"SendResultMaker: unexpected SendResult fields {field_names!r}")
        self._cls, self._new, self._names = send_result_cls, send_result_cls.__new__, field_names
        self._queue_cls, self._status, self._default_region = message_queue_cls, status_by_code, default_region

    cpdef object make(self, SendResponse response, mq, str msg_id):
        """The SendResult of a successful answer; None when its code is not a send status (the
        caller raises MQBrokerError)."""
        cdef PyObject* status = PyDict_GetItemWithError(self._status, response.code)
        if status == NULL:
            return None
        queue_id = response.queue_id
        if queue_id is not None and queue_id != mq.queue_id:
            mq = self._queue_cls(mq.topic, mq.broker_name, queue_id)
        queue_offset = response.queue_offset
        region = response.region_id
        result = self._new(self._cls)
        names = self._names
        PyObject_GenericSetAttr(result, names[0], <object>status)
        PyObject_GenericSetAttr(result, names[1], msg_id)
        PyObject_GenericSetAttr(result, names[2], response.msg_id or "")
        PyObject_GenericSetAttr(result, names[3], mq)
        PyObject_GenericSetAttr(result, names[4], -1 if queue_offset is None else queue_offset)
        PyObject_GenericSetAttr(result, names[5], response.transaction_id)
        PyObject_GenericSetAttr(result, names[6], region if region else self._default_region)
        return result


# --- futures ---------------------------------------------------------------------------------------
cdef extern from "Python.h":
    object PyObject_GenericGetDict(object o, void* context)
    int PyDict_SetItem(object d, object key, object value) except -1
    int PyDict_DelItem(object d, object key) except -1
    PyObject* PyDict_GetItem(object d, object key)

cdef object _PENDING = None
cdef object _RUNNING = None
cdef object _FINISHED = None


def init_future_states(pending, running, finished):
    """Bind concurrent.futures' state constants (called once by rmq_core.client.instance)."""
    global _PENDING, _RUNNING, _FINISHED
    _PENDING, _RUNNING, _FINISHED = pending, running, finished


def finish_unwatched(future, result, exception):
    """Finish a LeanFuture nobody waits on or subscribed to yet, in one step no other thread can
    come between (no Python code runs here): when its __dict__ has no `_condition` and its state is
    PENDING or RUNNING, store the result (or exception), set FINISHED and return True.  Anyone who
    comes later makes the Condition first and then reads the final state.  False: the caller takes
    Future.set_result / set_exception (a Condition exists, or the Future is already done)."""
    return _finish_unwatched(future, result, exception)


def lean_result(future, timeout=None):
    """LeanFuture.result: a Future finished without an exception answers from its __dict__ here;
    anything else goes to future._result_slow(timeout) (waiting, raising, cancelled)."""
    cdef PyObject* found
    d = PyObject_GenericGetDict(future, NULL)  # (the public way to an instance's own __dict__)
    found = PyDict_GetItem(d, "_state")
    if found != NULL and <object>found is _FINISHED:
        found = PyDict_GetItem(d, "_exception")
        if found == NULL or <object>found is None:
            found = PyDict_GetItem(d, "_result")
            return None if found == NULL else <object>found
    return future._result_slow(timeout)


def subscribe_unwatched(future, callback):
    """LeanFuture.add_lean_callback: when the Future is pending, has no Condition and no lean
    callback yet, record `callback` (called once with the Future when it finishes, by whoever
    finishes it) in one step no other thread can come between, and return True.  False: the caller
    subscribes the usual way (add_done_callback) or reads the finished Future."""
    cdef PyObject* state
    d = PyObject_GenericGetDict(future, NULL)
    if PyDict_GetItem(d, "_condition") != NULL or PyDict_GetItem(d, "_lean_callback") != NULL:
        return False
    state = PyDict_GetItem(d, "_state")
    if state == NULL or (<object>state is not _PENDING and <object>state is not _RUNNING):
        return False
    PyDict_SetItem(d, "_lean_callback", callback)
    return True


cdef bint _finish_unwatched(future, result, exception) except -1:
    cdef PyObject* state
    cdef PyObject* found
    d = PyObject_GenericGetDict(future, NULL)  # (the public way to an instance's own __dict__)
    if PyDict_GetItem(d, "_condition") != NULL:
        return False
    state = PyDict_GetItem(d, "_state")
    if state == NULL or (<object>state is not _PENDING and <object>state is not _RUNNING):
        return False
    if exception is None:
        PyDict_SetItem(d, "_result", result)
    else:
        PyDict_SetItem(d, "_exception", exception)
    PyDict_SetItem(d, "_state", _FINISHED)
    found = PyDict_GetItem(d, "_lean_callback")  # (recorded before the state changed: see above)
    if found != NULL:
        callback = <object>found
        PyDict_DelItem(d, "_lean_callback")
        try:
            callback(future)
        except Exception:  # a subscriber's failure is not the finisher's (Future._invoke_callbacks)
            _log_callback_error(future)
    return True


cdef _log_callback_error(future):
    import logging
    logging.getLogger("concurrent.futures").exception("exception calling callback for %r", future)


cdef object _LOOP_FUTURE = None


def set_loop_future_class(cls):
    """The asyncio Future class of rmq_core.aio's sends (an `inbox` whose `thread` is its loop's):
    PipelinedCompletion sets one's result itself when it reads the answer on that loop's thread,
    and calls its finish(result) elsewhere."""
    global _LOOP_FUTURE
    _LOOP_FUTURE = cls


@cython.final
cdef class PipelinedCompletion:
    """SendAttempts.answered's usual case on the reader thread, natively: a send answered with
    a send status becomes its SendResult, the broker's fault item is noted as SendPolicy.note
    does (a fast answer at most once per millisecond per broker, in the same `noted` table), and the
    LeanFuture is finished.  Anything else (a failure, a refusal, a watched Future) goes to
    `fallback(context, response, error)`, the Python method.  context: the tuple
    (message, uniq, mode, queue, address, timeout, begin, future) PipelinedSender made.

    maker: the SendResults' maker; update_fault_item(broker, latency ms, isolation): the fault
    strategy's; noted: broker -> the ms of its last fast note (SendPolicy.noted); traced: the
    producer's message trace buffer (trace.pyx TraceBuffer, offered each answered send, as
    TraceDispatcher.on_send does), None when not traced."""

    cdef SendResultMaker _maker
    cdef object _update_fault_item
    cdef dict _noted
    cdef object _fallback
    cdef TraceBuffer _traced

    def __init__(self, *, SendResultMaker maker, update_fault_item, dict noted, fallback, TraceBuffer traced=None):
        self._maker = maker
        self._update_fault_item = update_fault_item
        self._noted = noted
        self._fallback = fallback
        self._traced = traced

    def __call__(self, tuple context, response, error):
        self.complete(context, response, error)

    cdef int _note(self, broker, double begin) except -1:
        """SendPolicy.note(broker, begin, False): a fast answer at most once per ms."""
        cdef double now = _monotonic()
        cdef int64_t latency = <int64_t>((now - begin) * 1000.0)
        cdef int64_t now_ms = <int64_t>(now * 1000.0)
        cdef PyObject* last = PyDict_GetItem(self._noted, broker)
        if latency >= 50:
            self._noted.pop(broker, None)
            self._update_fault_item(broker, latency, False)
        elif last == NULL or <int64_t><object>last != now_ms:
            self._noted[broker] = now_ms
            self._update_fault_item(broker, latency, False)
        return 0

    cdef int complete(self, tuple context, response, error) except -1:
        if error is None and type(response) is SendResponse and len(context) == 8:
            mq = context[3]
            result = self._maker.make(<SendResponse>response, mq, context[1])
            if result is not None:
                self._note(mq.broker_name, context[6])
                if self._traced is not None:
                    self._traced.offer_pub(context, result)
                future = context[7]
                if type(future) is _LOOP_FUTURE:
                    if PyThread_get_thread_ident() == future.inbox.thread:  # read on its own loop
                        if not future.done():  # (else its awaiting task was cancelled)
                            future.set_result(result)
                    else:
                        future.finish(result)
                elif not _finish_unwatched(future, result, None):
                    future.finish(result)
                return 0
        self._fallback(context, response, error)
        return 0


# --- the pipelined send path -------------------------------------------------------------------------
DEF _INT32_MAX = 0x7FFFFFFF


@cython.final
cdef class PipelinedSender:
    """The first attempt of a plain send (rmq_core.client.producer.SendAttempts.write's usual
    case) natively: the topic's route, a queue picked as MQFaultStrategy.select_one_message_queue
    does (round robin past benched brokers), the broker's master address, the cached SendHeader,
    a UNIQ_KEY, the whole frame, the LeanFuture and its context, written on the broker's
    pipelined connection (tcp or in-proc) - the same steps and calls, without a Python frame for
    each.  Its answer is finished by `completion`; a failure goes to `failed`, which retries as the
    policy says.

    send(message, timeout, mode, future=None) returns the LeanFuture (or `future`, when given: an
    object with finish(result, error) and a settable `channel`, which the completion finishes);
    None when it declined before picking a queue (the caller's general attempt decides).  Where it
    declines after picking a queue for a reason the Python path handles (no address, no cached
    native header, a body to compress, properties the native writer leaves to Python) it calls
    send_general(message, timeout, queue, address, mode) and returns what that returns.

    What it works from, all handed over at construction (the Python layer keeps the tables
    current):
      routes          topic -> TopicPublishInfo (queues, the round-robin `index` it advances)
      headers         (topic, broker, queue id, batch) -> SendHeader
      broker_addrs    broker name -> {broker id: address};  master_id: a master's broker id
      benched         broker name -> FaultItem (start_timestamp: benched until), read with `clock`
      select_queue    (route, last broker) -> queue: the fault strategy's own pick
      checked_topics  topic names check_message passed;  check_message(message, max_size)
      new_uniq, opaques, future_cls, message_cls, channel_for(address), remoting_error
      completion, send_general, failed: see above;  one_channel_per_broker: cache the channel
    and the settings pushed through configure() whenever they change: max_message_size,
    compress_over, fault_enabled, and open (False once the client shuts down: every send declines)."""

    cdef dict _routes
    cdef dict _headers
    cdef dict _broker_addrs
    cdef object _master_id
    cdef dict _benched
    cdef object _clock
    cdef object _select_queue
    cdef set _checked_topics
    cdef object _check_message
    cdef object _new_uniq
    cdef object _opaques
    cdef object _future_cls
    cdef object _new_future
    cdef object _message_cls
    cdef object _channel_for
    cdef object _remoting_error
    cdef object _completion
    cdef object _send_general
    cdef object _failed
    cdef dict _channels  # address -> its one pipelined connection while open (None: not cached)
    cdef bint _steps  # the connections have request steps: a send is handed to them before it is written
    cdef object _signer  # ... which are only this signer: the header signs as it writes (steps applied)
    cdef list _before    # ... which have no after(): run here (run_send_steps), the frame goes applied
    cdef object _encode_send  # (a send its steps changed a header field of: the Python codec's frame)
    # the settings (configure)
    cdef Py_ssize_t _max_message_size
    cdef Py_ssize_t _compress_over
    cdef bint _fault_enabled
    cdef bint _open

    def __init__(self, *, dict routes, dict headers, dict broker_addrs, master_id, dict benched, clock, select_queue,
                 set checked_topics, check_message, new_uniq, opaques, future_cls, message_cls, channel_for,
                 remoting_error, completion, send_general, failed, bint one_channel_per_broker, steps=None,
                 Py_ssize_t max_message_size, Py_ssize_t compress_over, bint fault_enabled=True):
        # the route: tables the client instance keeps current
        self._routes, self._headers, self._broker_addrs, self._master_id = routes, headers, broker_addrs, master_id
        self._benched, self._clock, self._select_queue = benched, clock, select_queue  # (the fault strategy's)
        self._checked_topics, self._check_message = checked_topics, check_message
        self._new_uniq, self._opaques, self._message_cls = new_uniq, opaques, message_cls
        # a LeanFuture made without its __init__: its class holds the defaults, only _state is set
        self._future_cls, self._new_future = future_cls, future_cls.__new__
        # the write, its answer and what a failure falls back to
        self._channel_for, self._remoting_error, self._completion = channel_for, remoting_error, completion
        self._send_general, self._failed = send_general, failed
        # the client's request steps (rmq_core.remoting.steps.RequestSteps) or None
        self._steps = steps is not None
        self._signer = None if steps is None else steps.header_signer
        self._before = None if steps is None or steps.after else steps.before
        self._encode_send = None if steps is None else steps.encode_send
        # with one connection per broker, the one channel_for gave for an address
        # (a tcp or in-proc one) serves until it closes; with more, channel_for takes them in turn
        self._channels = {} if one_channel_per_broker else None
        self._max_message_size, self._compress_over = max_message_size, compress_over
        self._fault_enabled, self._open = fault_enabled, True

    def configure(self, *, max_message_size=None, compress_over=None, fault_enabled=None, open=None):
        """The settings that change while the producer runs, pushed by the Python layer that owns
        them when they change (None: unchanged)."""
        if max_message_size is not None:
            self._max_message_size = max_message_size
        if compress_over is not None:
            self._compress_over = compress_over
        if fault_enabled is not None:
            self._fault_enabled = fault_enabled
        if open is not None:
            self._open = open

    cdef object _route_of(self, message):
        """The cached route of a plain Message's topic when it has queues; else None (the
        Python way decides: a user's Message subclass, a route not fetched yet or empty)."""
        cdef PyObject* found
        if type(message) is not self._message_cls:
            return None
        found = PyDict_GetItem(self._routes, message.topic)
        if found == NULL:
            return None
        info = <object>found
        return info if info.queues else None

    cdef object _pick_queue(self, info, queues):
        """The queue MQFaultStrategy.select_one_message_queue picks, its usual case inline."""
        cdef Py_ssize_t n, i, index
        cdef PyObject* found
        if self._fault_enabled:
            n = len(queues)
            # TopicPublishInfo.next_index without its lock: this step is atomic under the GIL (a
            # locked Python step interleaved with it may lose one turn of the round robin: harmless)
            index = (info.index + 1) & _INT32_MAX
            info.index = index
            items = self._benched
            now = None
            for i in range(n):
                candidate = queues[(index + i) % n]
                found = PyDict_GetItem(items, candidate.broker_name)
                if found != NULL:
                    item = <object>found  # (a strong reference before any Python code runs)
                    if now is None:
                        now = self._clock()
                    if not now >= item.start_timestamp:
                        continue
                return candidate
        # not enabled, or every broker benched: the strategy's own way
        return self._select_queue(info, None)

    cdef object _master_addr(self, broker):
        """MQClientInstance.find_broker_addr_in_publish: the broker's master address, or None."""
        cdef PyObject* found = PyDict_GetItem(self._broker_addrs, broker)
        if found != NULL:
            addrs = <object>found
            if addrs:
                return addrs.get(self._master_id)
        return None

    cdef inline bint _passes_inline(self, message, topic, Py_ssize_t n):
        """True only when check_message surely passes `message` (the usual case, decided
        without a call): a body of fitting size, a topic check_message passed before, no
        properties (their reserved names are check_message's to refuse) and a delay level >= 0.
        Anything else goes through check_message itself, so every send route refuses the same
        messages with the same error."""
        return (0 < n <= self._max_message_size and topic in self._checked_topics and not message.properties
                and message.delay_time_level >= 0)

    def send(self, message, double timeout, mode="ASYNC", future=None):
        cdef Py_ssize_t n
        cdef PyObject* found
        if not self._open:
            return None
        info = self._route_of(message)
        if info is None:
            return None
        topic = message.topic
        queues = info.queues
        body = message.body
        n = len(body) if type(body) is bytes else -1
        if not self._passes_inline(message, topic, n):
            try:  # (check_message's usual case passed inline: a topic it passed, a body of fitting size)
                self._check_message(message, self._max_message_size)
            except Exception:  # the general path fails the Future with it
                return None
        mq = self._pick_queue(info, queues)
        broker = mq.broker_name
        addr = self._master_addr(broker)
        if addr is None:
            return self._send_general(message, timeout, mq, None, mode)
        channel = None
        if self._channels is not None:
            found = PyDict_GetItem(self._channels, addr)
            if found != NULL:
                channel = <object>found
                if channel.closed:
                    channel = None
        found = PyDict_GetItem(self._headers, (mq.topic, broker, mq.queue_id, False))
        if found == NULL or type(<object>found) is not SendHeader or n >= self._compress_over:
            return self._send_general(message, timeout, mq, addr, mode)
        header = <SendHeader><object>found
        opaque = next(self._opaques) & _INT32_MAX
        uniq = self._new_uniq()
        if self._signer is not None:  # the steps are one signer: applied as the header writes (request True)
            header.prepare_signer(self._signer)
            frame = header._frame(0, message.flag, None, message, opaque, body, None, 0, None, uniq, False, True)
            if frame is None:
                return self._send_general(message, timeout, mq, addr, mode)
            request = True
        elif self._steps:  # the connection's request steps get it before it is written (FrameStep.before_request)
            request = header.new_request(0, message.flag, None, message, uniq, opaque, body, 0, None, False)
            if request is None:
                return self._send_general(message, timeout, mq, addr, mode)
            frame = None
        else:
            request = None
            frame = header._frame(0, message.flag, None, message, opaque, body, None, 0, None, uniq)
            if frame is None:
                return self._send_general(message, timeout, mq, addr, mode)
        if future is None:
            fut = self._new_future(self._future_cls)
            PyObject_GenericSetAttr(fut, "_state", _PENDING)
        else:  # the caller's own Future (rmq_core.aio's): finished through its finish(result, error)
            fut = future
        context = (message, uniq, mode, mq, addr, timeout, _monotonic(), fut)
        if channel is None:
            try:
                channel = self._channel_for(addr)
            except self._remoting_error as e:  # cannot connect: counted against the broker, retried elsewhere
                self._failed(context, None, e)
                return fut
            if self._channels is not None:
                if len(self._channels) >= 1024:  # brokers come and go with routes: keep it bounded
                    self._channels.clear()
                self._channels[addr] = channel
        fut.channel = channel  # result() reads the answer itself when no other thread does
        if self._before is not None and request is not True and request is not None:
            # steps with no after(): run here, no connection step call (one that raises fails the send)
            try:
                frame = run_send_steps(self._before, addr, <SendRequest>request)
                if frame is None:
                    frame = self._encode_send(addr, request)
            except Exception as e:
                self._completion(context, None, e)
                return fut
            request = True
        writes = getattr(channel, "writes", None)
        if mode == "SYNC":  # this thread waits for the answer at once: it writes and reads it itself
            if request is not None:
                channel.exchange(frame, opaque, timeout, self._completion, context, request=request)
            else:
                channel.exchange(frame, opaque, timeout, self._completion, context)
        elif type(writes) is PipelinedWrites:  # PipelinedChannel.send without its Python frame
            if request is not None and request is not True:  # its request steps first (one that raises failed it)
                frame = channel.intercept(frame, opaque, self._completion, context, request)
                if frame is None:
                    return fut
            data = (<PipelinedWrites>writes).offer(frame, opaque, timeout, self._completion, context)
            if data is not None:
                channel.after_offer(data, opaque, self._completion, context)
        elif request is not None:
            channel.send(frame, opaque, timeout, self._completion, context, request=request)
        else:
            channel.send(frame, opaque, timeout, self._completion, context)
        return fut


def deliver_responses(list items, dict pending, failed):
    """A PipelinedChannel's usual completions natively: every SendResponse answer among `items`
    whose request waits in `pending` (opaque -> (deadline, on_done, context)) is taken out and
    on_done(context, response, None) called (a PipelinedCompletion directly); an on_done that
    raises is reported to failed(opaque) from inside its except clause (log.exception there) and
    the rest go on.  Returns (answers completed, the other items in order) - frames the channel
    decodes itself, requests, and answers nobody waits for."""
    cdef list rest = []
    cdef Py_ssize_t answers = 0
    cdef SendResponse response
    cdef PyObject* found
    for item in items:
        if type(item) is not SendResponse or not (<SendResponse>item).flag & RESPONSE_FLAG:
            rest.append(item)
            continue
        response = <SendResponse>item
        key = response.opaque
        found = PyDict_GetItem(pending, key)
        if found == NULL:
            rest.append(item)
            continue
        entry = <tuple>found
        del pending[key]  # (the dict is only popped, never re-filled for an opaque: no race with a sweep)
        answers += 1
        on_done = entry[1]
        try:
            if type(on_done) is PipelinedCompletion:
                (<PipelinedCompletion>on_done).complete(entry[2], item, None)
            else:
                on_done(entry[2], item, None)
        except Exception:  # one bad completion must not stop the others
            failed(key)
    return answers, rest


def finish_batch(SendResultMaker maker, list batch, status, queue, int64_t base, offset_ids, region):
    """Finish the Futures of a batch the broker took (PipelinedAccumulator): batch holds
    (item, uniq, future, timeout) tuples in sending order; each future gets its SendResult -
    msg_id its uniq, queue offset base + its index (-1 when base is), offset msg id the answer's
    comma-separated one at its index - built and set without Python code per message."""
    cdef Py_ssize_t i, n = len(batch), n_ids
    cdef list ids = offset_ids.split(",") if offset_ids else []
    cdef tuple names = maker._names
    n_ids = len(ids)
    if not region:
        region = maker._default_region
    for i in range(n):
        entry = <tuple>batch[i]
        result = maker._new(maker._cls)
        PyObject_GenericSetAttr(result, names[0], status)
        PyObject_GenericSetAttr(result, names[1], entry[1])
        PyObject_GenericSetAttr(result, names[2], ids[i] if i < n_ids else "")
        PyObject_GenericSetAttr(result, names[3], queue)
        PyObject_GenericSetAttr(result, names[4], base + i if base >= 0 else -1)
        PyObject_GenericSetAttr(result, names[5], None)
        PyObject_GenericSetAttr(result, names[6], region)
        future = entry[2]
        if not _finish_unwatched(future, result, None):
            future.finish(result)
