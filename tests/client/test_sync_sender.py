"""PipelinedSender.sync_frame (Producer._send_plain_direct's queue, address and frame in one
native call) against the Python path it replaces, and the sync send around it, with a recording
stand-in for the client instance whose direct exchange answers from a script."""
import itertools
import signal
import socket
import struct
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_core._native import client_native
from rmq_core.client import producer as producer_module
from rmq_core.client.instance import LeanFuture
from rmq_core.client.producer import Producer, SendResponse
from rmq_core.client.route import TopicPublishInfo
from rmq_core.client.selector import check_message
from rmq_core.errors import (
    IllegalArgumentError, MQBrokerError, RemotingConnectError, RemotingError, RemotingTimeoutError)
from rmq_core.remoting.blocking import BlockingChannel, BlockingChannelPool
from rmq_core.message import Message, MessageQueue, SendResult, SendStatus
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand


class _Instance:
    """What Producer._send_plain_direct and PipelinedSender.sync_frame ask of an MQClientInstance;
    invoke_frame_direct records each frame and answers with the next scripted outcome."""

    def __init__(self, addrs):
        self.broker_addr_table = {b: {0: a} for b, a in addrs.items()}
        self.direct = True
        self._loop_thread = None
        self._stopping = False
        self.exchanged = []  # (addr, frame, opaque, timeout, code)
        self.script = []  # per exchange: a response code, an exception, or None (all connections busy)
        self.ran = []  # coroutines handed to run(): the loop's path

    def direct_send_possible(self):
        return self.direct

    def pipelined_send_possible(self):
        return True

    def find_broker_addr_in_publish(self, broker_name):
        addrs = self.broker_addr_table.get(broker_name)
        return addrs.get(0) if addrs else None

    def in_proc(self, addr):
        return False

    def invoke_frame_direct(self, addr, frame, opaque, timeout, read, code=0):
        self.exchanged.append((addr, frame, opaque, timeout, code))
        outcome = self.script.pop(0) if self.script else ResponseCode.SUCCESS
        if outcome is None or isinstance(outcome, BaseException):
            if outcome is not None:
                raise outcome
            return None
        response = RemotingCommand.create_response(
            outcome, "refused" if outcome else None,
            {"msgId": "0A000001000000000000002A", "queueId": "1", "queueOffset": "7"})
        response.opaque = opaque
        response.flag |= RESPONSE_FLAG
        return read(memoryview(response.encode())[4:])

    def run(self, coro, timeout=None):
        self.ran.append(coro.cr_frame.f_locals.get("resume"))
        coro.close()
        return "loop's result"


def _setup(brokers=("broker-a", "broker-b"), queues=2, cache_headers=True, **kw):
    p = Producer("PG_SYNC", namesrv="127.0.0.1:9876", **kw)
    inst = _Instance({b: f"127.0.0.1:{10911 + i}" for i, b in enumerate(brokers)})
    p.instance = inst
    p._started = True
    p._plain_direct = True
    p.topic_publish_info["T"] = TopicPublishInfo(
        "T", [MessageQueue("T", b, q) for b in brokers for q in range(queues)], None)
    if cache_headers:
        for mq in p.topic_publish_info["T"].queues:  # the headers a started producer caches on first use
            p._send_header(mq, False)
    p._pipelined_sender = client_native.PipelinedSender(
        p, inst, LeanFuture, Message, check_message, producer_module.create_uniq_id, p._pipelined_completion,
        producer_module.read_send_response_frames, SendResponse.from_command, itertools.count(1), RemotingError, 0)
    return p, inst


def _request(frame):
    return RemotingCommand.decode(memoryview(frame)[4:])


_messages = st.builds(
    lambda body, tags, keys, props, flag: Message("T", body, tags=tags, keys=keys, flag=flag, properties=props),
    st.binary(min_size=1, max_size=300),
    st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)),
    st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)),
    st.dictionaries(st.sampled_from(["color", "size", "ü-key"]), st.text(max_size=6), max_size=2),
    st.integers(0, 2**31 - 1))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=_messages)
def test_the_native_frame_is_the_one_the_python_header_builds(msg):
    p, inst = _setup()
    index = p.topic_publish_info["T"]._index
    mq, addr, frame, opaque, uniq, code = p._pipelined_sender.sync_frame(msg)
    assert p.topic_publish_info["T"]._index == (index + 1) & 0x7FFFFFFF  # one turn of the round robin
    assert mq == p.topic_publish_info["T"].queues[(index + 1) % 4]
    assert addr == inst.find_broker_addr_in_publish(mq.broker_name) and code == RequestCode.SEND_MESSAGE_V2
    header = p._send_header(mq, False)
    python = header.build_message_frame(msg, uniq, opaque)
    a, b = _request(frame), _request(python)
    assert (a.code, a.body, a.opaque) == (b.code, b.body, opaque)
    fa, fb = dict(a.ext_fields), dict(b.ext_fields)
    assert abs(int(fa.pop("g")) - int(fb.pop("g"))) < 5000  # born timestamps, ms
    assert fa == fb and f"UNIQ_KEY\x01{uniq}" in fa["i"]


def test_what_it_declines_before_picking_a_queue_is_none_and_a_bad_message_raises():
    p, inst = _setup()
    sender = p._pipelined_sender
    index = p.topic_publish_info["T"]._index

    class Sub(Message):
        """A user's Message subclass: the native path leaves it to Python."""

    assert sender.sync_frame(Message("Unknown", b"x")) is None  # no route cached
    assert sender.sync_frame(Sub("T", b"x")) is None
    assert sender.sync_frame(Message("T", b"z" * p.compress_msg_body_over_howmuch)) is None  # to compress
    inst.direct = False
    assert sender.sync_frame(Message("T", b"x")) is None
    inst.direct = True
    inst._loop_thread = threading.current_thread()  # the loop's thread never blocks on a socket
    assert sender.sync_frame(Message("T", b"x")) is None
    inst._loop_thread = None
    with pytest.raises(IllegalArgumentError, match="empty body"):
        sender.sync_frame(Message("T", b""))
    assert p.topic_publish_info["T"]._index == index  # none of them advanced the round robin


def test_after_picking_a_queue_it_leaves_the_address_and_header_to_python():
    p, inst = _setup(cache_headers=False)
    picked = p._pipelined_sender.sync_frame(Message("T", b"x"))
    assert len(picked) == 2 and picked[1] == inst.find_broker_addr_in_publish(picked[0].broker_name)
    del inst.broker_addr_table["broker-a"], inst.broker_addr_table["broker-b"]
    mq, addr = p._pipelined_sender.sync_frame(Message("T", b"x"))
    assert addr is None and mq in p.topic_publish_info["T"].queues
    # the producer caches the header then, and the next send to that queue is native throughout
    p2, inst2 = _setup(cache_headers=False)
    result = p2.send(Message("T", b"x"))
    assert isinstance(result, SendResult) and len(inst2.exchanged) == 1
    assert _request(inst2.exchanged[0][1]).ext_fields["b"] == "T"
    p2.topic_publish_info["T"]._index -= 1
    assert len(p2._pipelined_sender.sync_frame(Message("T", b"x"))) == 6


def test_queues_go_round_robin_past_benched_brokers():
    p, inst = _setup()
    picked = [p._pipelined_sender.sync_frame(Message("T", b"x"))[0] for _ in range(8)]
    assert len({(q.broker_name, q.queue_id) for q in picked}) == 4
    p.fault_strategy.update_fault_item("broker-a", 600, False)  # benched for 30 s
    picked = [p._pipelined_sender.sync_frame(Message("T", b"x"))[0] for _ in range(8)]
    assert {q.broker_name for q in picked} == {"broker-b"}


def test_a_sync_send_answers_its_result_and_notes_a_fast_answer_at_most_once_per_ms():
    p, inst = _setup()
    noted = []
    real_update = p.fault_strategy.update_fault_item
    p.fault_strategy.update_fault_item = lambda broker, latency, failed: (
        noted.append((broker, failed)), real_update(broker, latency, failed))
    msgs = [Message("T", f"m{i}".encode(), tags="A") for i in range(50)]
    results = [p.send(m) for m in msgs]
    assert len(inst.exchanged) == 50 and not inst.ran
    for result, (addr, frame, opaque, timeout, code), msg in zip(results, inst.exchanged, msgs):
        request = _request(frame)
        assert result.status is SendStatus.SEND_OK and result.queue_offset == 7
        assert result.queue.queue_id == 1 and result.queue.broker_name == request.ext_fields["n"]
        assert f"UNIQ_KEY\x01{result.msg_id}" in request.ext_fields["i"] and request.body == msg.body
        assert timeout == p.send_msg_timeout and code == RequestCode.SEND_MESSAGE_V2
    assert 1 <= len(noted) <= 50 and all(not failed for _, failed in noted)
    assert set(p.send_policy.noted) <= {"broker-a", "broker-b"}


def test_a_refusal_raises_a_retryable_failure_resumes_on_the_loop_and_busy_connections_decline():
    p, inst = _setup()
    inst.script = [ResponseCode.MESSAGE_ILLEGAL]
    with pytest.raises(MQBrokerError) as refused:
        p.send(Message("T", b"x"))
    assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert not inst.ran and p.fault_strategy.tolerance._items  # the failure was noted
    broken = RemotingTimeoutError("no answer")
    inst.script = [broken]
    assert p.send(Message("T", b"x")) == "loop's result"
    begin, broker, error = inst.ran[-1]  # the loop goes on from the second attempt, elsewhere
    assert error is broken and broker == _request(inst.exchanged[-1][1]).ext_fields["n"]
    inst.script = [ResponseCode.SYSTEM_BUSY]
    assert p.send(Message("T", b"x")) == "loop's result"
    assert inst.ran[-1][2].code == ResponseCode.SYSTEM_BUSY
    inst.script = [None]  # every direct connection busy: the loop's path from the first attempt
    assert p.send(Message("T", b"x")) == "loop's result" and inst.ran[-1] is None


# --- the blocking exchange under it (client_native.blocking_exchange in BlockingChannel) -----------
def _raw_peer(script):
    """A one-connection TCP peer on a free port: reads one request frame, then runs script(conn, request)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def serve():
        conn, _ = lsock.accept()
        with conn:
            (n,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
            script(conn, RemotingCommand.decode(conn.recv(n, socket.MSG_WAITALL)))
            time.sleep(0.1)
        lsock.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"127.0.0.1:{lsock.getsockname()[1]}", t


def _answer_to(request, body=None):
    response = RemotingCommand.create_response(ResponseCode.SUCCESS, None, {"queueId": "3"})
    response.opaque = request.opaque
    response.flag |= RESPONSE_FLAG
    response.body = body
    return response.encode()


def test_an_answer_larger_than_one_receive_is_reassembled_and_a_signal_does_not_break_the_wait():
    big = bytes(range(256)) * 1024  # 256 KiB: several receives past the first
    addr, t = _raw_peer(lambda conn, request: (time.sleep(0.3), conn.sendall(_answer_to(request, big))))
    alarms = []
    previous = signal.signal(signal.SIGALRM, lambda *_: alarms.append(1))
    channel = BlockingChannel(addr)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # lands while the exchange waits in recv (EINTR)
        request = RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {"a": "b"}, b"payload")
        response = channel.invoke(request, 5.0)
        assert alarms == [1] and response.body == big and response.get_str("queueId") == "3"
        assert not channel.closed
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        channel.close()
        t.join(5)


def test_an_exchange_that_times_out_names_it_and_a_closed_peer_is_a_connect_error():
    addr, t = _raw_peer(lambda conn, request: time.sleep(0.6))
    channel = BlockingChannel(addr)
    with pytest.raises(RemotingTimeoutError, match="SEND_MESSAGE_V2"):
        channel.invoke_frame(RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {}, b"x").encode(),
                             0, 0.2, RemotingCommand.decode, RequestCode.SEND_MESSAGE_V2)
    assert channel.closed
    t.join(5)
    addr, t = _raw_peer(lambda conn, request: None)  # reads the request, then hangs up
    channel = BlockingChannel(addr)
    with pytest.raises(RemotingConnectError, match="closed by"):
        channel.invoke(RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {}, b"x"), 5.0)
    t.join(5)
    with pytest.raises(OSError):  # a bad descriptor: the call's own OSError
        client_native.blocking_exchange(-1, b"\x00\x00\x00\x01x", bytearray(16))


class _FakeChannel:
    """A channel whose exchange answers at once (the pool's bookkeeping is what is tested)."""

    def __init__(self, made):
        self.closed = False
        self.in_use = 0
        made.append(self)

    def invoke_frame(self, frame, opaque, timeout, read, code=0):
        self.in_use += 1
        assert self.in_use == 1, "a channel lent to two callers at once"
        time.sleep(0)  # let other threads interleave
        self.in_use -= 1
        return read(frame)

    def close(self):
        self.closed = True


def test_the_pool_lends_each_channel_to_one_caller_and_counts_every_one_through_racing_closes():
    made = []

    class Pool(BlockingChannelPool):
        def _connect(self, addr):
            return _FakeChannel(made)

    pool = Pool(max_per_address=3)
    addrs = ["127.0.0.1:1", "127.0.0.1:2"]
    stop = threading.Event()
    answered = []
    errors = []

    def caller(i):
        n = 0
        while not stop.is_set():
            try:
                r = pool.invoke_frame(addrs[(i + n) % 2], n, n, 1.0, lambda f: f)
            except RemotingConnectError:  # the pool closed
                return
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            if r is not None:
                assert r == n
                answered.append(1)
            n += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: the unlocked steps interleave
    try:
        for t in threads:
            t.start()
        for _ in range(200):
            pool.close_address(addrs[0])
            time.sleep(0.0005)
            assert 0 <= pool.open_count(addrs[0]) <= 3 and 0 <= pool.open_count(addrs[1]) <= 3
        pool.close()
        stop.set()
        for t in threads:
            t.join(10)
    finally:
        sys.setswitchinterval(old)
    assert not errors and answered
    assert pool.open_count(addrs[0]) == 0 and pool.open_count(addrs[1]) == 0
    assert all(c.closed for c in made)  # every channel made was closed exactly by its count
    with pytest.raises(RemotingConnectError, match="closed"):
        pool.invoke_frame(addrs[1], b"", 1, 1.0, lambda f: f)


class _RacingIdle(dict):
    """The pool's idle table, running `race` right after its `at`-th get (a close landing between
    the lock-free give-back's steps: after it found the list, after it appended)."""

    def __init__(self, race, at):
        super().__init__()
        self.race, self.at, self.gets = race, at, 0

    def get(self, key, default=None):
        found = super().get(key, default)
        self.gets += 1
        if self.gets == self.at:
            self.race()
        return found


@pytest.mark.parametrize("closing", ["close_address", "close"])
@pytest.mark.parametrize("at", [2, 3])  # (get 1: the borrow; 2: the give-back finds the list; 3: re-checks it)
def test_a_close_between_the_give_backs_steps_leaves_no_channel_open_or_uncounted(at, closing):
    made = []

    class Pool(BlockingChannelPool):
        def _connect(self, addr):
            return _FakeChannel(made)

    pool = Pool(max_per_address=2)
    addr = "127.0.0.1:1"
    pool.invoke_frame(addr, b"a", 1, 1.0, lambda f: f)  # a channel made and given back: its list exists
    (channel,) = made
    racing = _RacingIdle(lambda: pool.close_address(addr) if closing == "close_address" else pool.close(), at)
    racing[addr] = pool._idle[addr]
    pool._idle = racing
    assert pool._borrow(addr) is channel
    pool._give_back(addr, channel)
    if closing == "close_address" and at == 2:  # dropped before it came back: it stays the pool's
        assert not channel.closed and pool._idle.get(addr) == [channel] and pool.open_count(addr) == 1
    else:  # the close found it (or it found the close): closed and counted out, once
        assert channel.closed and pool.open_count(addr) == 0 and not pool._idle.get(addr)


def test_what_the_native_checks_pass_inline_still_fails_with_check_messages_error():
    p, inst = _setup()
    check_message(Message("T", b"x"))  # the topic's name passed once: later sends skip that check
    cases = [(Message("T", b"x", properties={"TAGS": "a"}), "'TAGS' is reserved by RocketMQ; use the Message field"),
             (Message("T", b"x", properties={"WAIT": "false"}), "'WAIT' is reserved by RocketMQ"),
             (Message("T", b"x", delay_time_level=-1), "bad delay_time_level -1"),
             (Message("T", b"z" * (p.max_message_size + 1)), "exceeds max_message_size")]
    for msg, error in cases:
        with pytest.raises(IllegalArgumentError, match=error):
            p.send(msg)
    assert not inst.exchanged  # nothing of them went out
