"""In-proc sends as encoded frames (the producer's InprocPipelinedChannel, and a blocking
InprocBlockingChannel.invoke_frame): the broker's native send lane answers plain sends on the
in-proc connection as it does on TCP; every other frame takes the general path, whose
RemotingCommand answer is encoded for the caller's reader.  Checked against
a real embedded broker: the answers of both ways, SYNC_FLUSH, RPC hooks, RMQ_NATIVE_SEND=0,
flow control, timeouts, a stopped broker or loop, bad frames, and many threads at once."""
import asyncio
import threading
import time

import attrs
import pytest

from rmq_core import Message, Producer, SendStatus
from rmq_core.broker.processors import send as send_module
from rmq_core.codec import decode_messages
from rmq_core.client.producer import _RESULTS
from rmq_core.errors import RemotingConnectError, RemotingTimeoutError
from rmq_core.message import MessageQueue
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand
from rmq_plugins.transport.inproc import InprocFrameChannel, InprocPipelinedChannel, InprocTransport
from tests.client.send_reference import read_send_response_frame

from .conftest import FAST

V2 = int(RequestCode.SEND_MESSAGE_V2)
_opaques = iter(range(1_000_000, 2_000_000))


def send_frame(topic, body=b"payload", queue_id=0, props="WAIT\x01true\x02", opaque=None, code=V2):
    """An encoded SEND_MESSAGE_V2 request (length prefix included) and its opaque."""
    ext = {"a": "PG_FRAMES", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": "0",
           "g": str(int(time.time() * 1000)), "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}
    cmd = RemotingCommand.create_request(code, ext, body)
    cmd.opaque = next(_opaques) if opaque is None else opaque
    cmd.language = "PYTHON"
    return cmd.encode(), cmd.opaque


def connect(cluster):
    """A blocking in-proc connection to the cluster's broker, as the client's direct pool makes."""
    return InprocTransport().connect_blocking(cluster.broker.inproc_name, max_frame_length=16 * 1024 * 1024,
                                              timeout=3.0)


def frame_contexts(cluster):
    """The broker's in-proc connections that take frames (blocking clients' server ends)."""
    inproc = cluster.broker.servers[1]
    return [ctx for ctx in inproc.channels if isinstance(ctx.channel, InprocFrameChannel)]


def lane_counts(cluster):
    handled = deferred = declined = 0
    for ctx in frame_contexts(cluster):
        lane = ctx.channel._fast_lane
        if lane is not None:
            handled, deferred, declined = handled + lane.handled, deferred + lane.deferred, declined + lane.declined
    return handled, deferred, declined


def warm(channel, topic):
    """Two sends by the general path: the first creates the topic, the second caches its checks."""
    for _ in range(2):
        frame, opaque = send_frame(topic)
        answer = channel.invoke_frame(frame, opaque, 5.0, RemotingCommand.decode, V2)
        assert answer.code == ResponseCode.SUCCESS, answer.remark


def shape(result):
    """A SendResult with what differs from send to send (ids, offset) reduced to its form."""
    d = attrs.asdict(result, recurse=False)
    assert len(d.pop("msg_id")) == 32 and len(d.pop("offset_msg_id")) == 32
    assert isinstance(d.pop("queue_offset"), int)
    return d


def test_plain_frames_are_answered_by_the_lane_and_others_by_the_general_path(make_cluster):
    cluster = make_cluster()
    channel = connect(cluster)
    try:
        warm(channel, "LaneT")
        before = lane_counts(cluster)
        mq = MessageQueue("LaneT", cluster.broker.broker_config.broker_name, 0)
        results = []
        for i in range(10):
            frame, opaque = send_frame("LaneT", b"m%d" % i)
            resp = channel.invoke_frame(frame, opaque, 5.0, read_send_response_frame, V2)
            assert resp.opaque == opaque and resp.flag & RESPONSE_FLAG
            results.append(_RESULTS.make(resp, mq, "0" * 32))
        after = lane_counts(cluster)
        assert after[0] - before[0] == 10  # every one answered natively on the in-proc connection
        offsets = [r.queue_offset for r in results]
        assert offsets == list(range(offsets[0], offsets[0] + 10))
        # a request the lane does not answer (not a send): the general path, its answer encoded
        req = RemotingCommand.create_request(RequestCode.GET_BROKER_CLUSTER_INFO, {})
        answer = channel.invoke_frame(req.encode(), req.opaque, 5.0, RemotingCommand.decode, req.code)
        assert answer.opaque == req.opaque and answer.flag & RESPONSE_FLAG
        assert lane_counts(cluster)[2] == after[2] + 1
    finally:
        channel.close()


def test_the_lane_and_the_general_path_give_the_same_send_result(make_cluster):
    cluster = make_cluster()
    channel = connect(cluster)
    mq = MessageQueue("SameT", cluster.broker.broker_config.broker_name, 0)
    try:
        warm(channel, "SameT")
        frame, opaque = send_frame("SameT", b"lane")
        by_lane = channel.invoke_frame(frame, opaque, 5.0, read_send_response_frame, V2)
        handled = lane_counts(cluster)[0]
        assert handled == 1
        for ctx in frame_contexts(cluster):  # from now on every frame takes the general path
            ctx.channel.set_fast_lane(None)
        frame, opaque = send_frame("SameT", b"general")
        by_general = channel.invoke_frame(frame, opaque, 5.0, read_send_response_frame, V2)
        assert lane_counts(cluster)[0] == 0  # (no lane left to count)
        r1, r2 = _RESULTS.make(by_lane, mq, "A" * 32), _RESULTS.make(by_general, mq, "B" * 32)
        assert r1.status is r2.status is SendStatus.SEND_OK
        assert shape(r1) == shape(r2)
        assert r2.queue_offset == r1.queue_offset + 1
        assert (by_lane.code, by_lane.remark) == (by_general.code, by_general.remark)
    finally:
        channel.close()


def test_producer_sync_sends_to_an_inproc_broker_take_the_lane(make_cluster):
    cluster = make_cluster()
    p = Producer("PG_INPROC_LANE", namesrv=cluster.namesrv, **FAST).start()
    try:
        p.send(Message("ProdLaneT", b"warm"))
        p.send(Message("ProdLaneT", b"warm again"))  # (the route cached, each queue's checks too)
        handled = lane_counts(cluster)[0]
        results = [p.send(Message("ProdLaneT", b"x%d" % i)) for i in range(20)]
        assert all(r.status is SendStatus.SEND_OK for r in results)
        assert lane_counts(cluster)[0] > handled
        assert len({r.msg_id for r in results}) == 20
        per_queue = {}
        for r in results:
            per_queue.setdefault(r.queue.queue_id, []).append(r.queue_offset)
        for offsets in per_queue.values():
            assert offsets == sorted(set(offsets))
    finally:
        p.shutdown()


def test_sync_flush_answers_come_after_the_group_commit(make_cluster):
    cluster = make_cluster({"flushDiskType": "SYNC_FLUSH"})
    store = cluster.broker.store
    channel = connect(cluster)
    try:
        warm(channel, "DurableT")
        for i in range(20):
            frame, opaque = send_frame("DurableT", b"d" * 64)
            answer = channel.invoke_frame(frame, opaque, 5.0, RemotingCommand.decode, V2)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            phys = int(answer.ext_fields["msgId"][16:], 16)
            assert store.commit_log.mapped_file_queue.flushed_where > phys
        handled, deferred, _ = lane_counts(cluster)
        assert deferred == 20 and handled == 0  # put by the lane, answered once flushed
    finally:
        channel.close()


def test_with_broker_steps_the_lane_stays_in_use(make_cluster):
    from rmq_core.plugins import get_plugin_manager, hookimpl

    seen = []

    class Hooks:
        @hookimpl
        def rmq_broker_before_request(self, remote_addr, request):
            if request.code == V2:
                seen.append(request.opaque)

    pm = get_plugin_manager()
    hooks = Hooks()
    pm.register(hooks)
    try:
        cluster = make_cluster()
        channel = connect(cluster)
        try:
            warm(channel, "HookedT")
            opaques = []
            for i in range(3):
                frame, opaque = send_frame("HookedT", b"h")
                opaques.append(opaque)
                answer = channel.invoke_frame(frame, opaque, 5.0, RemotingCommand.decode, V2)
                assert answer.code == ResponseCode.SUCCESS
            handled, deferred, _ = lane_counts(cluster)
            assert handled + deferred == 3  # the lane answered them, the steps part of it
        finally:
            channel.close()
    finally:
        pm.unregister(hooks)
    assert all(seen.count(opaque) == 1 for opaque in opaques)


def test_without_the_native_lane_frames_take_the_general_path(make_cluster, monkeypatch):
    monkeypatch.setattr(send_module, "NATIVE_SEND", False)  # what RMQ_NATIVE_SEND=0 does
    cluster = make_cluster()
    monkeypatch.undo()
    p = Producer("PG_NO_LANE", namesrv=cluster.namesrv, **FAST).start()
    try:
        results = [p.send(Message("NoLaneT", b"n%d" % i)) for i in range(10)]
        assert all(r.status is SendStatus.SEND_OK for r in results)
        contexts = frame_contexts(cluster)
        assert contexts and all(ctx.channel._fast_lane is None for ctx in contexts)
        channels = [c for cs in p.instance._send_channels.values() for c in cs]
        assert channels and all(type(c) is InprocPipelinedChannel for c in channels)
    finally:
        p.shutdown()


def test_at_the_inflight_limit_the_general_path_answers_system_busy(make_cluster):
    cluster = make_cluster()
    channel = connect(cluster)
    try:
        warm(channel, "BusyT")
    finally:
        channel.close()
    cluster.broker.servers[1].max_inflight_per_connection = 0  # for the connection made next
    channel = connect(cluster)
    try:
        frame, opaque = send_frame("BusyT")
        answer = channel.invoke_frame(frame, opaque, 5.0, read_send_response_frame, V2)
        assert answer.code == ResponseCode.SYSTEM_BUSY and "system busy" in answer.remark
        assert not channel.closed  # a refusal, not a broken connection
    finally:
        channel.close()


@pytest.mark.parametrize("native", [True, False], ids=["lane", "no-lane"])
@pytest.mark.parametrize("damage", ["overlong", "short", "unterminated-json"])
def test_a_bad_frame_closes_the_connection_and_the_caller_learns_it(make_cluster, monkeypatch, native, damage):
    monkeypatch.setattr(send_module, "NATIVE_SEND", native)
    cluster = make_cluster()
    monkeypatch.undo()
    channel = connect(cluster)
    warm(channel, "BadT")  # (the broker accepted the connection by now)
    assert (frame_contexts(cluster)[0].channel._fast_lane is not None) is native
    frame, opaque = send_frame("BadT")
    if damage == "overlong":  # a length beyond the bytes given
        bad = (len(frame) + 100).to_bytes(4, "big") + frame[4:]
    elif damage == "short":  # a length below the smallest frame
        bad = (2).to_bytes(4, "big") + frame[4:6]
    else:
        header = b'{"code":310,"extFields":{"b":"BadT"'
        bad = (4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header
    with pytest.raises(RemotingConnectError, match="closed before the response"):
        channel.invoke_frame(bad, opaque, 5.0, RemotingCommand.decode, V2)
    assert channel.closed
    with pytest.raises(RemotingConnectError, match="is closed"):
        channel.invoke_frame(frame, opaque, 5.0, RemotingCommand.decode, V2)


def test_a_stopped_broker_gives_a_connect_error(make_cluster):
    cluster = make_cluster()
    channel = connect(cluster)
    warm(channel, "StopT")
    cluster.stop()
    frame, opaque = send_frame("StopT")
    with pytest.raises(RemotingConnectError):
        channel.invoke_frame(frame, opaque, 5.0, RemotingCommand.decode, V2)
    assert channel.closed


class _SilentServer:
    """An in-proc listener on a loop of its own that accepts connections and answers nothing."""

    def __init__(self, name):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.channels = []

        def on_channel(channel):
            self.channels.append(channel)
            channel.start(lambda command: None, lambda reason: None)

        self.listener = asyncio.run_coroutine_threadsafe(
            InprocTransport().serve(name, on_channel, max_frame_length=1 << 20), self.loop).result(5)

    def stop(self, close_loop=True):
        asyncio.run_coroutine_threadsafe(self.listener.close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if close_loop:
            self.loop.close()


def test_no_answer_within_the_timeout_raises_and_closes_the_channel():
    server = _SilentServer(f"silent-{time.monotonic_ns()}")
    try:
        channel = InprocTransport().connect_blocking(server.listener.name, max_frame_length=1 << 20, timeout=1)
        frame, opaque = send_frame("SilentT")
        with pytest.raises(RemotingTimeoutError, match=f"opaque {opaque}.*within 0.2s"):
            channel.invoke_frame(frame, opaque, 0.2, RemotingCommand.decode, V2)
        assert channel.closed
    finally:
        server.stop()


def test_a_closed_server_loop_gives_a_connect_error():
    server = _SilentServer(f"gone-{time.monotonic_ns()}")
    channel = InprocTransport().connect_blocking(server.listener.name, max_frame_length=1 << 20, timeout=1)
    # the loop stops and closes without the listener being closed: the name is still registered
    server.loop.call_soon_threadsafe(server.loop.stop)
    server.thread.join(5)
    server.loop.close()
    frame, opaque = send_frame("GoneT")
    with pytest.raises(RemotingConnectError, match="event loop is gone"):
        channel.invoke_frame(frame, opaque, 1.0, RemotingCommand.decode, V2)
    assert channel.closed


def test_many_threads_each_get_their_own_answers(make_cluster):
    cluster = make_cluster()
    p = Producer("PG_INPROC_THREADS", namesrv=cluster.namesrv, **FAST).start()
    try:
        p.send(Message("ThreadsT", b"warm"))
        results, errors = [], []
        lock = threading.Lock()

        def run(t):
            try:
                mine = [(p.send(Message("ThreadsT", b"t%d-%d" % (t, i))), b"t%d-%d" % (t, i)) for i in range(100)]
                with lock:
                    results.extend(mine)
            except Exception as e:  # reported below, with the thread's number
                errors.append((t, e))

        threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert len(results) == 800 and all(r.status is SendStatus.SEND_OK for r, _ in results)
        assert len({r.msg_id for r, _ in results}) == 800
        positions = {(r.queue.queue_id, r.queue_offset) for r, _ in results}
        assert len(positions) == 800  # no two sends were handed the same place (or each other's answer)
        # each answer belongs to its own message: read back where the answers say they went
        store = cluster.broker.store
        for r, body in results[::37]:
            got = decode_messages(store.get_message("PG_READ", "ThreadsT", r.queue.queue_id, r.queue_offset, 1).buffer)
            assert got and got[0].body == body
    finally:
        p.shutdown()
