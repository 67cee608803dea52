"""PipelinedSender (a plain send's first attempt, natively) against SendAttempts' first attempt
(the general path it is the kernel of), with a recording stand-in for the client instance and its pipelined connection; and
deliver_responses (a chunk of send answers completed in one native call)."""
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_core._native import send_pipeline
from rmq_core.client import producer as producer_module
from rmq_core.client.futures import LeanFuture
from rmq_core.client.producer import Producer, SendResponse
from rmq_core.client.route import TopicPublishInfo
from rmq_core.client.selector import check_message
from rmq_core.errors import RemotingConnectError, RemotingError
from rmq_core.message import Message, MessageQueue, SendResult
from rmq_core.remoting.command import RemotingCommand


class _Channel:
    def __init__(self, addr, log):
        self.addr = addr
        self.sent = []
        self.log = log  # every channel's sends, in order
        self.closed = False

    def send(self, frame, opaque, timeout, on_done, context):
        self.sent.append((frame, opaque, timeout, on_done, context))
        self.log.append(self.sent[-1])


class _Instance:
    """What PipelinedSender and SendAttempts ask of an MQClientInstance."""

    def __init__(self, addrs, inproc=()):
        self.broker_addr_table = {b: {0: a} for b, a in addrs.items()}
        self.log = []
        self.channels = {a: _Channel(a, self.log) for a in addrs.values()}
        self.inproc = set(inproc)
        self.refuse_connect = False
        self._stopping = False
        self.loop_thread_ident = None
        self.connects = 0  # send_channel calls
        self.in_proc_calls = 0

    def find_broker_addr_in_publish(self, broker_name):
        addrs = self.broker_addr_table.get(broker_name)
        return addrs.get(0) if addrs else None

    def in_proc(self, addr):
        self.in_proc_calls += 1
        return addr in self.inproc

    def send_channel(self, addr, read_frames, from_command):
        self.connects += 1
        if self.refuse_connect:
            raise RemotingConnectError(f"connect to {addr} failed")
        return self.channels[addr]


def _setup(brokers=("broker-a", "broker-b"), queues=2, inproc=(), connections=None, **kw):
    p = Producer("PG_SENDER", namesrv="127.0.0.1:9876", **kw)
    inst = _Instance({b: f"127.0.0.1:{10911 + i}" for i, b in enumerate(brokers)},
                     inproc={f"127.0.0.1:{10911 + i}" for i, b in enumerate(brokers) if b in inproc})
    if connections is not None:
        inst.config = type("Config", (), {"pipelined_send_connections": connections})()
    p.instance = inst
    p.topic_publish_info["T"] = TopicPublishInfo(
        "T", [MessageQueue("T", b, q) for b in brokers for q in range(queues)], None)
    for mq in p.topic_publish_info["T"].queues:  # the headers a started producer caches on first use
        p._send_header(mq, False)
    sender = p._pipelined_sender = p._make_pipelined_sender()  # (what start() makes, from this instance)
    return p, inst, sender


def _all_sent(inst):
    return inst.log


def _request(frame):
    return RemotingCommand.decode(frame[4:])


_messages = st.builds(
    lambda body, tags, keys, props, flag: Message("T", body, tags=tags, keys=keys, flag=flag, properties=props),
    st.binary(min_size=1, max_size=300),
    # (text the properties format holds: no separator \x02; a message with one fails on either path)
    st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x02"),
                                 min_size=1, max_size=8)),
    st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x02"),
                                 min_size=1, max_size=8)),
    st.dictionaries(st.sampled_from(["color", "size", "ü-key"]),
                    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x02"), max_size=6),
                    max_size=2),
    st.integers(0, 2**31 - 1))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=_messages)
def test_the_native_send_writes_what_the_python_path_writes(msg):
    p, inst, sender = _setup()
    index = p.topic_publish_info["T"].index
    fut = sender.send(msg, 3.0)
    assert isinstance(fut, LeanFuture) and not fut.done()
    ctx = _all_sent(inst)[0][4]
    fut_py = p._send_general(msg, 3.0, ctx[3], ctx[4], "ASYNC")  # SendAttempts' first attempt to that queue
    native, python = _all_sent(inst)
    assert native[0] != python[0]  # (own opaque, UNIQ_KEY and born time)
    a, b = _request(native[0]), _request(python[0])
    assert (a.code, a.body, a.opaque) == (b.code, b.body, native[1]) and b.opaque == python[1]
    fa, fb = dict(a.ext_fields), dict(b.ext_fields)
    for f in (fa, fb):
        f.pop("g")  # born timestamp
    props_a, props_b = fa.pop("i"), fb.pop("i")
    assert fa == fb
    uniq_a, uniq_b = native[4][1], python[4].uniq
    assert props_a.replace(uniq_a, "U") == props_b.replace(uniq_b, "U")
    # the same attempt: message, mode, queue, address, timeout, future
    ctx, attempts = native[4], python[4]
    assert ctx[0] is msg is attempts.msg and ctx[2] == "ASYNC" == attempts.mode.value
    assert (ctx[3], ctx[4], ctx[5]) == (attempts.mq, attempts.addr, attempts.timeout)
    assert ctx[7] is fut and fut.channel is inst.channels[ctx[4]] and fut_py.channel is fut.channel
    assert native[3] is p._pipelined_completion and native[2] == 3.0
    assert python[3] is producer_module.SendAttempts.answered and 0 < python[2] <= 3.0


def test_queues_go_round_robin_past_benched_brokers_and_as_the_strategy_picks_when_all_are():
    p, inst, sender = _setup(queues=2)
    picked = [sender.send(Message("T", b"x"), 3.0) and _all_sent(inst)[-1][4][3] for _ in range(8)]
    assert len({(q.broker_name, q.queue_id) for q in picked}) == 4  # every queue in turn
    p.fault_strategy.update_fault_item("broker-a", 600, False)  # benched for 30 s
    picked = [sender.send(Message("T", b"x"), 3.0) and _all_sent(inst)[-1][4][3] for _ in range(8)]
    assert {q.broker_name for q in picked} == {"broker-b"}
    p.fault_strategy.update_fault_item("broker-b", 600, False)
    picked = [sender.send(Message("T", b"x"), 3.0) and _all_sent(inst)[-1][4][3] for _ in range(8)]
    assert {q.broker_name for q in picked} <= {"broker-a", "broker-b"} and len(picked) == 8


def test_what_it_declines_before_picking_a_queue_returns_none_and_after_it_the_python_way():
    p, inst, sender = _setup()
    assert sender.send(Message("Unknown", b"x"), 3.0) is None  # no route cached
    assert sender.send(Message("T", b""), 3.0) is None  # fails validation: the general path names it

    class Sub(Message):
        """A user's Message subclass: the native path leaves it to Python."""

    assert sender.send(Sub("T", b"x"), 3.0) is None
    p.on_client_stopping()  # the client shuts down: nothing more goes natively
    assert sender.send(Message("T", b"x"), 3.0) is None
    sender.configure(open=True)
    # a body to compress and a UNIQ_KEY of the user's: the Python encoder, same future kind
    p2, inst2, sender2 = _setup(compress_msg_body_over_howmuch=100)
    fut = sender2.send(Message("T", b"z" * 500), 3.0)
    (frame, opaque, _, _, ctx), = _all_sent(inst2)
    assert isinstance(fut, LeanFuture) and isinstance(ctx, producer_module.SendAttempts)  # prepared by _prepare
    assert _request(frame).ext_fields["f"] != "0"  # compressed
    own = Message("T", b"x", properties={"UNIQ_KEY": "MYOWNID"})
    sender2.send(own, 3.0)
    assert _all_sent(inst2)[-1][4].uniq == "MYOWNID"


def test_a_connection_that_cannot_be_opened_goes_to_the_failure_path():
    p, inst, sender = _setup()
    inst.refuse_connect = True
    seen = []
    p._native_failed = lambda context, response, error: seen.append((context, response, error))
    sender = p._make_pipelined_sender()  # (handed the failure path above)
    fut = sender.send(Message("T", b"x"), 3.0)
    ((ctx, response, error),) = seen
    assert ctx[7] is fut and response is None and isinstance(error, RemotingConnectError)
    assert fut.channel is None


# --- deliver_responses -------------------------------------------------------------------------------
def _answer(opaque, flag=1):
    return SendResponse(0, flag, opaque, None, "OFFSETID", 1, 7, None, None)


def test_deliver_responses_completes_what_waits_and_hands_back_the_rest_in_order(caplog):
    calls = []
    failed = []

    def on_done(context, response, error):
        if context == "boom":
            raise RuntimeError("a completion failed")
        calls.append((context, response.opaque, error))

    pending = {1: (0.0, on_done, "one"), 2: (0.0, on_done, "boom"), 3: (0.0, on_done, "three")}
    request = _answer(9, flag=0)
    raw = b"\x00\x00\x00\x05frame"
    items = [_answer(1), raw, _answer(2), _answer(42), request, _answer(3)]

    def report(opaque):
        logging.getLogger("test").exception("completion of %d", opaque)
        failed.append(opaque)

    with caplog.at_level(logging.ERROR):
        answers, rest = send_pipeline.deliver_responses(items, pending, report)
    assert answers == 3 and not pending
    assert calls == [("one", 1, None), ("three", 3, None)]
    assert failed == [2] and "a completion failed" in caplog.text  # the traceback reached the log
    assert rest[0] is raw and rest[1].opaque == 42 and rest[2] is request and len(rest) == 3


def test_deliver_responses_finishes_futures_through_the_pipelined_completion():
    p, inst, sender = _setup()
    fut = sender.send(Message("T", b"x"), 3.0)
    frame, opaque, _, completion, ctx = _all_sent(inst)[0]
    pending = {opaque: (0.0, completion, ctx)}
    answers, rest = send_pipeline.deliver_responses([_answer(opaque)], pending, print)
    assert (answers, rest) == (1, [])
    result = fut.result(0)
    assert isinstance(result, SendResult) and result.msg_id == ctx[1] and result.queue_offset == 7


def test_with_one_connection_per_broker_it_is_asked_for_once_and_again_after_it_closed():
    p, inst, sender = _setup(brokers=("broker-a",), connections=1)
    for _ in range(5):
        sender.send(Message("T", b"x"), 3.0)
    assert inst.connects == 1 and len(inst.log) == 5
    inst.channels["127.0.0.1:10911"].closed = True  # broke: the instance opens another
    fresh = _Channel("127.0.0.1:10911", inst.log)
    inst.channels["127.0.0.1:10911"] = fresh
    sender.send(Message("T", b"x"), 3.0)
    assert inst.connects == 2 and len(fresh.sent) == 1
    # with more connections per broker every send asks the instance (it takes them in turn)
    p2, inst2, sender2 = _setup(brokers=("broker-a",), connections=2)
    for _ in range(3):
        sender2.send(Message("T", b"x"), 3.0)
    assert inst2.connects == 3


def test_settings_changed_while_the_producer_runs_reach_the_native_sender():
    p, inst, sender = _setup()
    sender.send(Message("T", b"z" * 500), 3.0)
    assert type(_all_sent(inst)[-1][4]) is tuple  # the native attempt's context
    p.compress_msg_body_over_howmuch = 100  # pushed through configure: this body is now compressed
    sender.send(Message("T", b"z" * 500), 3.0)
    frame, _, _, _, ctx = _all_sent(inst)[-1]
    assert isinstance(ctx, producer_module.SendAttempts) and _request(frame).ext_fields["f"] != "0"
    p.max_message_size = 200  # too big now: declined, and the general path names it
    assert sender.send(Message("T", b"z" * 500), 3.0) is None
    with pytest.raises(Exception, match="exceeds max_message_size 200"):
        p._prepare(Message("T", b"z" * 500))
    p.send_latency_fault_enable = False  # the strategy's own pick, benched brokers or not
    p.fault_strategy.tolerance.update_fault_item("broker-a", 600, 30_000)
    picked = {sender.send(Message("T", b"x"), 3.0) and _all_sent(inst)[-1][4][3].broker_name for _ in range(8)}
    assert picked == {"broker-a", "broker-b"}
