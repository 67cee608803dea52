"""The master's write fence (docs/failover.md, Fencing 2): a write is answered as stored only while
`time.monotonic() <= broker.writable_until`, checked again when the answer is written - by the
native send lane and by the general path alike.  A fenced write is answered SERVICE_NOT_AVAILABLE
with a remark starting [FENCED] that names the broker."""
import math
import struct
import time
from concurrent.futures import Future

import pytest

from rmq_core._native.send_lane import SendLane, SendLaneState, WriteFence
from rmq_core.broker.processors import send as send_module
from rmq_core.broker.processors.send import put_outcome
from tests.codec_oracle import encode_batch_items
from rmq_core.config import MessageStoreConfig
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.store import DefaultMessageStore, MessageExtBrokerInner, PutMessageStatus

from .test_send_lane import RawSocket, frame, lane_of, lanes, v2_fields

V2 = int(RequestCode.SEND_MESSAGE_V2)
TOPIC = "T_FENCE"


def fenced(answer, broker) -> bool:
    """The answer is the fence's refusal naming `broker` (a BrokerController)."""
    return (answer.code == ResponseCode.SERVICE_NOT_AVAILABLE and answer.remark.startswith("[FENCED]broker[")
            and f"{broker.broker_config.broker_name}, {broker.broker_addr}]" in answer.remark)


def decoded(frames: dict) -> dict:
    return {opaque: RemotingCommand.decode(f) for opaque, f in frames.items()}


def _batch_body(*bodies: bytes) -> bytes:
    """A SEND_BATCH_MESSAGE body of these messages."""
    return encode_batch_items((0, b, {"UNIQ_KEY": f"FENCE{time.time_ns()}{i}"}) for i, b in enumerate(bodies))


def _lapse(broker) -> None:
    broker.writable_until = time.monotonic() - 1.0


def _renew(broker) -> None:
    broker.writable_until = time.monotonic() + 3600.0


# --- the broker's one fence ------------------------------------------------------------------------
def test_writable_until_is_one_value_shared_by_every_lane_and_checked(cluster, raw):
    broker = cluster.broker
    assert broker.writable_until == math.inf  # manual mode: no fence
    assert raw.send(cluster.broker_addr, TOPIC, b"warm", queue_id=0, code=V2).code == ResponseCode.SUCCESS
    s = RawSocket(cluster.broker_addr)
    try:
        s.send(frame(V2, v2_fields(TOPIC, 0), b"lane", opaque=1))
        assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SUCCESS
        states = [lane.state for lane in lanes(cluster)]
        assert states and all(st.fence is broker.write_fence for st in states)
        broker.writable_until = 12.5
        assert [st.writable_until for st in states] == [12.5] * len(states)
    finally:
        s.close()
    for bad in (float("nan"), "soon", None, True):
        with pytest.raises(ValueError, match="writable_until"):
            broker.writable_until = bad
    broker.writable_until = -math.inf
    assert broker.write_fence.lapsed()


# --- every write refused while the fence has lapsed, answered again once renewed --------------------
def test_a_lapsed_fence_refuses_every_write_and_a_renewed_one_takes_them(cluster, raw):
    from rmq_core import Message, Producer
    from rmq_core.errors import MQBrokerError

    broker, addr = cluster.broker, cluster.broker_addr
    raw.heartbeat(addr, "c1", "CG_FENCE", TOPIC)
    first = raw.send(addr, TOPIC, b"before", queue_id=0, code=V2)
    assert first.code == ResponseCode.SUCCESS, first.remark
    half = raw.send(addr, TOPIC, b"half", queue_id=0, props={"TRAN_MSG": "true", "PGROUP": "PG_TX"}, sys_flag=4,
                    group="PG_TX")
    assert half.code == ResponseCode.SUCCESS, half.remark
    max_offset = broker.store.get_max_phy_offset()

    _lapse(broker)
    # the raw client: SEND_MESSAGE, SEND_MESSAGE_V2, a batch, a send-back, an END_TRANSACTION commit
    assert fenced(raw.send(addr, TOPIC, b"v1", queue_id=0), broker)
    assert fenced(raw.send(addr, TOPIC, b"v2", queue_id=0, code=V2), broker)
    batch_ext = {"a": "PG", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0",
                 "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false", "m": "true"}
    assert fenced(raw.invoke(addr, RequestCode.SEND_BATCH_MESSAGE, batch_ext, _batch_body(b"b1", b"b2")), broker)
    phys = int(first.ext_fields["msgId"][16:], 16)
    assert fenced(raw.invoke(addr, RequestCode.CONSUMER_SEND_MSG_BACK,
                             {"offset": str(phys), "group": "CG_FENCE", "delayLevel": "0"}), broker)
    end = {"producerGroup": "PG_TX", "tranStateTableOffset": half.ext_fields["queueOffset"],
           "commitLogOffset": str(int(half.ext_fields["msgId"][16:], 16)), "commitOrRollback": "8",
           "fromTransactionCheck": "false", "msgId": "x"}
    assert fenced(raw.invoke(addr, RequestCode.END_TRANSACTION, end), broker)
    # the native lane reads the fence with each read chunk: it hands the sends to the general path
    s = RawSocket(addr)
    try:
        s.send(b"".join(frame(V2, v2_fields(TOPIC, i % 2), b"p%d" % i, opaque=i + 1) for i in range(4)))
        answers = decoded(s.answers(4))
        assert all(fenced(a, broker) for a in answers.values()), answers
        assert lane_of(cluster, s).handled == 0 and lane_of(cluster, s).declined == 4
    finally:
        s.close()
    # rmq's Producer over TCP: sync, batch and async sends fail naming the fence
    with Producer("PG_FENCE", namesrv=cluster.tcp_namesrv, retry_times_when_send_failed=0,
                  retry_times_when_send_async_failed=0) as p:
        with pytest.raises(MQBrokerError, match=r"\[FENCED\]broker\[") as e:
            p.send(Message(TOPIC, b"sync"))
        assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
        with pytest.raises(MQBrokerError, match=r"\[FENCED\]"):
            p.send_batch([Message(TOPIC, b"x"), Message(TOPIC, b"y")])
        with pytest.raises(MQBrokerError, match=r"\[FENCED\]"):
            p.send_async(Message(TOPIC, b"async")).result(10)
        assert broker.store.get_max_phy_offset() == max_offset  # refused before any put

        _renew(broker)
        assert p.send(Message(TOPIC, b"sync")).status.name == "SEND_OK"
        assert p.send_batch([Message(TOPIC, b"x"), Message(TOPIC, b"y")]).status.name == "SEND_OK"
        assert p.send_async(Message(TOPIC, b"async")).result(10).status.name == "SEND_OK"
    assert raw.send(addr, TOPIC, b"v1", queue_id=0).code == ResponseCode.SUCCESS
    assert raw.invoke(addr, RequestCode.SEND_BATCH_MESSAGE, batch_ext, _batch_body(b"b1")).code == ResponseCode.SUCCESS
    assert raw.invoke(addr, RequestCode.CONSUMER_SEND_MSG_BACK,
                      {"offset": str(phys), "group": "CG_FENCE", "delayLevel": "0"}).code == ResponseCode.SUCCESS
    assert raw.invoke(addr, RequestCode.END_TRANSACTION, end).code == ResponseCode.SUCCESS
    s = RawSocket(addr)
    try:
        s.send(b"".join(frame(V2, v2_fields(TOPIC, i % 2), b"p%d" % i, opaque=i + 1) for i in range(4)))
        assert {a.code for a in decoded(s.answers(4)).values()} == {ResponseCode.SUCCESS}
        assert lane_of(cluster, s).handled == 4
    finally:
        s.close()


# --- the fence lapsing between the put and its answer ----------------------------------------------
@pytest.mark.parametrize("lane", [True, False], ids=["lane", "general-path"])
def test_a_sync_flush_answer_whose_fence_lapsed_while_flushing_is_refused(make_cluster, tmp_path, monkeypatch, lane):
    """SYNC_FLUSH sends wait on their flush Future (held here): the fence lapses meanwhile, so
    the sends, stored, are answered [FENCED], not SEND_OK - the lane's group answers and the
    general path's (process_send's batch, send_message's single send) alike."""
    monkeypatch.setattr(send_module, "NATIVE_SEND", lane)
    cluster = make_cluster({"flushDiskType": "SYNC_FLUSH"}, store=tmp_path / "sync")
    broker = cluster.broker
    s = RawSocket(cluster.broker_addr)
    try:
        for q in (0, 1):  # the topic checked once (the lane takes sends to known topics)
            s.send(frame(V2, v2_fields(TOPIC, q), b"warm", opaque=100 + q))
            assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SUCCESS
        _renew(broker)
        held: list[Future] = []

        def request_flush(next_offset, store_timestamp=0):
            fut = Future()
            held.append(fut)
            return fut

        monkeypatch.setattr(broker.store.commit_log, "request_flush", request_flush)
        frames = [frame(V2, v2_fields(TOPIC, i % 2), b"h%d" % i, opaque=i + 1) for i in range(4)]
        batch_ext = {"a": "PG", "b": TOPIC, "c": "TBW102", "d": "4", "e": "1", "f": "0",
                     "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false", "m": "true"}
        frames.append(frame(int(RequestCode.SEND_BATCH_MESSAGE), batch_ext, _batch_body(b"b1", b"b2"), opaque=5))
        s.send(b"".join(frames))
        deadline = time.monotonic() + 10
        while len(held) < 5:
            assert time.monotonic() < deadline, f"only {len(held)} puts"
            time.sleep(0.005)
        _lapse(broker)  # the lease lapsed while the flush ran
        for fut in held:
            fut.set_result(PutMessageStatus.PUT_OK)
        answers = decoded(s.answers(5))
        assert sorted(answers) == [1, 2, 3, 4, 5]
        assert all(fenced(a, broker) for a in answers.values()), answers
        if lane:
            assert lane_of(cluster, s).deferred >= 4
    finally:
        s.close()


# --- the lane's own check, as a kernel --------------------------------------------------------------
def test_the_lane_refuses_at_answer_time_a_send_it_read_before_the_fence_lapsed(tmp_path):
    """The lane reads a send while the fence holds; the fence lapses during its put (a master
    paused there): the answer written is the fence's refusal, for every answer of that write."""
    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=str(tmp_path / "store"),
                                                   mapped_file_size_commit_log=1 << 20))
    store.load()
    store.start()
    try:
        assert store.put(MessageExtBrokerInner("T", 1, b"warm", properties_bytes=b"",
                                               born_host=("127.0.0.1", 5555))).is_ok()
        token = object()
        fence = WriteFence(math.inf, "[FENCED]broker[b, 127.0.0.1:1] lapsed")
        puts = []

        def pausing_put(msg):
            fence.writable_until = time.monotonic() - 1.0  # (the pause: the lease ran out meanwhile)
            return store.put_nowait(msg)

        def refresh(state):  # read time: the fence holds (the lane takes the sends)
            state.put, state.data_version, state.counter, state.writable = pausing_put, token, 7, True

        state = SendLaneState({"T": (token, 7, 4, 4)}, b"CLUSTER\x01c1\x02", 401, PutMessageStatus.PUT_OK,
                              lambda topic, n, size: puts.append((topic, n)), put_outcome, refresh, fence)
        assert state.writable_until == math.inf
        emitted = []
        lane = SendLane(state, ("127.0.0.1", 5555), set(), 1000, lambda *a: pytest.fail(f"deferred {a}"))
        data = b"".join(frame(V2, v2_fields("T", 1), b"m%d" % i, opaque=i + 1) for i in range(3))
        assert lane.deliver(data, 1 << 20, lambda view: pytest.fail("handed back"), emitted.append) == (len(data), None)
        assert lane.handled == 3 and len(emitted) == 1  # one write of answers
        out, answers = emitted[0], []
        while out:
            (n,) = struct.unpack_from(">i", out)
            answers.append(RemotingCommand.decode(out[4:4 + n]))
            out = out[4 + n:]
        assert [(a.code, a.opaque, a.remark) for a in answers] == [
            (ResponseCode.SERVICE_NOT_AVAILABLE, i + 1, "[FENCED]broker[b, 127.0.0.1:1] lapsed") for i in range(3)]
        assert puts == []  # not acknowledged: not counted as sends
        assert store.get_max_offset_in_queue("T", 1) == 4  # (stored: a new master's log decides)

        fence.writable_until = math.inf  # renewed: answered SEND_OK again
        state.put = store.put_nowait
        emitted.clear()

        def refresh_ok(st):
            st.put, st.data_version, st.counter, st.writable = store.put_nowait, token, 7, True

        state.refresh = refresh_ok
        lane.deliver(data, 1 << 20, lambda view: pytest.fail("handed back"), emitted.append)
        assert [RemotingCommand.decode(f).code for f in _frames(b"".join(emitted))] == [ResponseCode.SUCCESS] * 3
        assert puts == [("T", 3)]
    finally:
        store.shutdown()


def _frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        (n,) = struct.unpack_from(">i", data)
        out.append(data[4:4 + n])
        data = data[4 + n:]
    return out


def test_put_outcome_of_the_fence_is_the_one_refusal():
    fence = WriteFence(-math.inf, "[FENCED]x")
    assert put_outcome(fence) == (int(ResponseCode.SERVICE_NOT_AVAILABLE), "[FENCED]x", False)
    assert fence.lapsed() and not WriteFence().lapsed()
    assert WriteFence().remark.startswith("[FENCED]")
