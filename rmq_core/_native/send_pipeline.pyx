# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The send pipeline's kernel (rmq_core.client.producer.SendAttempts' usual case, natively).

- PipelinedSender: a plain message's first attempt - its queue picked, its request frame written
  by frame.pyx's SendHeader, the LeanFuture and its context, the write on the broker's pipelined
  connection;
- deliver_responses and PipelinedCompletion: answers (frame.pyx: read_send_responses) matched to
  their requests and finished as SendResults (SendResultMaker; finish_batch for auto_batch);

Everything here works from plain values the Python layer owns and hands over (dicts, sets,
callables, ints) and from the typed objects of the send decision (send_route.pxd: the route,
the fault strategy, the completion a sync send waits on) - never a Producer, a client instance or
a state object whose attributes it reads by name.  An async send's Future (a LeanFuture, a
concurrent.futures.Future) is finished through its own public finish(result, error), never
through concurrent.futures' private state: its lean path (no Condition made for a Future nobody
waits on yet) costs about 1 us where set_result on it costs over 10 (a Condition made and
notified per send).
Settings that change while a producer runs are pushed through PipelinedSender.configure.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.object cimport PyObject
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport int64_t

cimport cython

from clock cimport monotonic as _monotonic
from rmq_core._native.frame cimport RESPONSE_FLAG, SendHeader, SendRequest, SendResponse, run_send_steps
from rmq_core._native.send_route cimport MQFaultStrategy, SendWait, TopicPublishInfo
from rmq_core._native.socket_io cimport PipelinedWrites
from rmq_core._native.trace cimport TraceBuffer


# --- the SendResult --------------------------------------------------------------------------------
cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    PyObject* PyDict_GetItem(object d, object key)


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


@cython.final
cdef class PipelinedCompletion:
    """SendAttempts.answered's usual case on the reader thread, natively: a send answered with
    a send status becomes its SendResult, the broker's fault item is noted as SendPolicy.note
    does (a fast answer at most once per millisecond per broker, in the same `noted` table), and the
    send's future is finished.  Anything else (a failure, a refusal) goes to
    `fallback(context, response, error)`, the Python method.  context: the tuple
    (message, uniq, mode, queue, address, timeout, begin, future) PipelinedSender made; future:
    a SendWait (a sync send's, finished natively) or an object with finish(result, error) (an
    async send's LeanFuture, rmq_core.aio's loop Future).

    maker: the SendResults' maker; fault: the producer's fault strategy; noted: broker -> the ms
    of its last fast note (SendPolicy.noted); traced: the producer's message trace buffer
    (trace.pyx TraceBuffer, offered each answered send, as TraceDispatcher.on_send does), None
    when not traced."""

    cdef SendResultMaker _maker
    cdef MQFaultStrategy _fault
    cdef dict _noted
    cdef object _fallback
    cdef TraceBuffer _traced

    def __init__(self, *, SendResultMaker maker, MQFaultStrategy fault, dict noted, fallback,
                 TraceBuffer traced=None):
        self._maker = maker
        self._fault = fault
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
            self._fault.update_fault_item(broker, latency, False)
        elif last == NULL or <int64_t><object>last != now_ms:
            self._noted[broker] = now_ms
            self._fault.update_fault_item(broker, latency, False)
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
                if type(future) is SendWait:
                    (<SendWait>future).finish(result)
                else:  # (a LeanFuture's own finish: see the module doc)
                    future.finish(result)
                return 0
        self._fallback(context, response, error)
        return 0


# --- the pipelined send path -------------------------------------------------------------------------
DEF _INT32_MAX = 0x7FFFFFFF


@cython.final
cdef class PipelinedSender:
    """The first attempt of a plain send (rmq_core.client.producer.SendAttempts.write's usual
    case) natively: the topic's route, a queue picked by the fault strategy (the same
    MQFaultStrategy.select_one_message_queue SendAttempts calls), the broker's master address,
    the cached SendHeader, a UNIQ_KEY, the whole frame, the send's future and its context, written
    on the broker's pipelined connection (tcp or in-proc) - the same steps and calls, without a
    Python frame for each.  Its answer is finished by `completion`; a failure goes to `failed`,
    which retries as the policy says.

    send(message, timeout, mode, future=None) returns the send's future: a SendWait for a SYNC
    send (its caller waits on it at once), else a `future_cls(channel)` (a concurrent Future) -
    or `future`, when given: an object with finish(result, error) and set_channel(channel), which
    the completion finishes.  None when it declined before picking a queue (the caller's general
    attempt decides).  Where it declines after picking a queue for a reason the Python path
    handles (no address, no cached native header, a body to compress, properties the native writer
    leaves to Python) it calls send_general(message, timeout, queue, address, mode) and returns
    what that returns.

    What it works from, all handed over at construction (the Python layer keeps the tables
    current):
      routes          topic -> TopicPublishInfo (send_route.pxd)
      fault           the producer's MQFaultStrategy (send_route.pxd): the queue choice
      headers         (topic, broker, queue id, batch) -> SendHeader
      broker_addrs    broker name -> {broker id: address};  master_id: a master's broker id
      checked_topics  topic names check_message passed;  check_message(message, max_size)
      new_uniq, opaques (an iterator of ints), future_cls, message_cls, remoting_error
      channel_for(address) -> (channel, its PipelinedWrites or None (another kind of channel),
                      closed(): whether it closed - asked of a cached channel without writes)
      completion, send_general, failed: see above;  one_channel_per_broker: cache the channel
      the client's request steps, as plain values (none: steps_on False): header_signer (the
      steps are only this signer), before_steps (they have no after(): run here), encode_send
    and the settings pushed through configure() whenever they change: max_message_size,
    compress_over, and open (False once the client shuts down: every send declines)."""

    cdef dict _routes
    cdef MQFaultStrategy _fault
    cdef dict _headers
    cdef dict _broker_addrs
    cdef object _master_id
    cdef set _checked_topics
    cdef object _check_message
    cdef object _new_uniq
    cdef object _opaques
    cdef object _future_cls
    cdef object _message_cls
    cdef object _channel_for
    cdef object _remoting_error
    cdef object _completion
    cdef object _send_general
    cdef object _failed
    cdef dict _channels  # address -> what channel_for gave for it, while open (None: not cached)
    cdef bint _steps  # the connections have request steps: a send is handed to them before it is written
    cdef object _signer  # ... which are only this signer: the header signs as it writes (steps applied)
    cdef list _before    # ... which have no after(): run here (run_send_steps), the frame goes applied
    cdef object _encode_send  # (a send its steps changed a header field of: the Python codec's frame)
    # the settings (configure)
    cdef Py_ssize_t _max_message_size
    cdef Py_ssize_t _compress_over
    cdef bint _open

    def __init__(self, *, dict routes, MQFaultStrategy fault, dict headers, dict broker_addrs, master_id,
                 set checked_topics, check_message, new_uniq, opaques, future_cls, message_cls, channel_for,
                 remoting_error, completion, send_general, failed, bint one_channel_per_broker, bint steps_on=False,
                 header_signer=None, list before_steps=None, encode_send=None,
                 Py_ssize_t max_message_size, Py_ssize_t compress_over):
        # the route: tables the client instance keeps current
        self._routes, self._fault, self._headers = routes, fault, headers
        self._broker_addrs, self._master_id = broker_addrs, master_id
        self._checked_topics, self._check_message = checked_topics, check_message
        self._new_uniq, self._opaques, self._message_cls = new_uniq, opaques, message_cls
        self._future_cls = future_cls
        # the write, its answer and what a failure falls back to
        self._channel_for, self._remoting_error, self._completion = channel_for, remoting_error, completion
        self._send_general, self._failed = send_general, failed
        self._steps, self._signer, self._before, self._encode_send = steps_on, header_signer, before_steps, encode_send
        # with one connection per broker, the one channel_for gave for an address
        # (a tcp or in-proc one) serves until it closes; with more, channel_for takes them in turn
        self._channels = {} if one_channel_per_broker else None
        self._max_message_size, self._compress_over = max_message_size, compress_over
        self._open = True

    def configure(self, *, max_message_size=None, compress_over=None, open=None):
        """The settings that change while the producer runs, pushed by the Python layer that owns
        them when they change (None: unchanged)."""
        if max_message_size is not None:
            self._max_message_size = max_message_size
        if compress_over is not None:
            self._compress_over = compress_over
        if open is not None:
            self._open = open

    cdef TopicPublishInfo _route_of(self, message):
        """The cached route of a plain Message's topic when it has queues; else None (the
        Python way decides: a user's Message subclass, a route not fetched yet or empty)."""
        cdef PyObject* found
        cdef TopicPublishInfo info
        if type(message) is not self._message_cls:
            return None
        found = PyDict_GetItem(self._routes, message.topic)
        if found == NULL:
            return None
        info = <TopicPublishInfo?><object>found
        return info if info.queues else None

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
        cdef TopicPublishInfo info
        cdef SendWait wait
        cdef tuple entry
        if not self._open:
            return None
        info = self._route_of(message)
        if info is None:
            return None
        topic = message.topic
        body = message.body
        n = len(body) if type(body) is bytes else -1
        if not self._passes_inline(message, topic, n):
            try:  # (check_message's usual case passed inline: a topic it passed, a body of fitting size)
                self._check_message(message, self._max_message_size)
            except Exception:  # the general path fails the Future with it
                return None
        mq = self._fault.select_one_message_queue(info, None)
        broker = mq.broker_name
        addr = self._master_addr(broker)
        if addr is None:
            return self._send_general(message, timeout, mq, None, mode)
        channel = writes = None
        if self._channels is not None:
            found = PyDict_GetItem(self._channels, addr)
            if found != NULL:
                entry = <tuple>found
                writes = entry[1]
                if not ((<PipelinedWrites>writes).closed if type(writes) is PipelinedWrites else entry[2]()):
                    channel = entry[0]
                else:
                    writes = None
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
        error = None
        if channel is None:
            try:
                entry = self._channel_for(addr)
                channel, writes = entry[0], entry[1]
            except self._remoting_error as e:  # cannot connect: counted against the broker, retried elsewhere
                error = e
            else:
                if self._channels is not None:
                    if len(self._channels) >= 1024:  # brokers come and go with routes: keep it bounded
                        self._channels.clear()
                    self._channels[addr] = entry
        # the send's future, told the connection its answer comes on (a waiter reads it itself)
        if future is not None:  # the caller's own (rmq_core.aio's): finished through its finish(result, error)
            fut = future
            if channel is not None:
                fut.set_channel(channel)
        elif mode == "SYNC":
            wait = SendWait()
            wait.channel = channel
            fut = wait
        else:
            fut = self._future_cls(channel)
        context = (message, uniq, mode, mq, addr, timeout, _monotonic(), fut)
        if error is not None:
            self._failed(context, None, error)
            return fut
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
        future.finish(result)
