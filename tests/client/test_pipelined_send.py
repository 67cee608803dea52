"""Sends on the one send pipeline: written from the caller's thread on the broker's pipelined
connection (sync sends then read their own answer), without the client's event loop; against real
brokers (embedded on TCP and in-proc, and broker subprocesses where one is killed)."""
import socket
import threading
import time

import pytest

from rmq_core import Message, Producer
from rmq_core.client import producer as producer_module
from rmq_core.client.producer import CommunicationMode
from rmq_core.errors import MQBrokerError, MQClientError
from rmq_core.message import MessageQueue, SendResult, SendStatus
from rmq_core.plugins import get_plugin_manager, hookimpl
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from tests.client.conftest import FAST, drain_topic, wait_until


def _broker_addr(p: Producer, topic: str) -> str:
    mq = p.fetch_publish_message_queues(topic)[0]
    return p.instance.find_broker_addr_in_publish(mq.broker_name)


def _shape(r: SendResult) -> tuple:
    return (type(r), r.status, len(r.msg_id), len(r.offset_msg_id), type(r.queue), type(r.queue_offset),
            r.transaction_id, r.region_id)


def test_async_sends_are_pipelined_land_once_and_call_back_off_the_reader(cluster):
    topic = "PipeT"
    calls, errors = [], []
    with Producer("PG_PIPE", namesrv=cluster.tcp_namesrv, **FAST) as p:
        sync_result = p.send(Message(topic, b"sync", tags="TagP"))  # route cached, the connection open
        addr = _broker_addr(p, topic)

        def callback(result, error):
            calls.append((result, error, threading.current_thread().name))

        futures = [p.send_async(Message(topic, f"a{i}".encode(), tags="TagP", keys=f"k{i}"), callback)
                   for i in range(60)]
        results = [f.result(10) for f in futures]
        wait_until(lambda: len(calls) == 60, what="every callback")
        assert p.instance.send_channel_count(addr) == 1
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert {_shape(r) for r in results} == {_shape(sync_result)}  # the same kind of result as a sync send
    assert sorted(c[0].msg_id for c in calls) == sorted(r.msg_id for r in results)
    assert not [c for c in calls if c[1] is not None]
    # callbacks run on the client's blocking executor, never on the connection's reader thread
    assert {c[2].split("_")[0] for c in calls} <= {f"rmq-io-{p.client_id}"} and not errors
    per_queue = {}
    for r in sorted(results, key=lambda r: r.queue_offset):
        per_queue.setdefault(r.queue.queue_id, []).append(r.queue_offset)
    assert all(offsets == sorted(set(offsets)) for offsets in per_queue.values())
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_PIPE", 61)
    assert sorted(m.body for m in got) == sorted([b"sync"] + [f"a{i}".encode() for i in range(60)])
    by_id = {r.msg_id: r for r in results}
    for m in got:
        if m.body != b"sync":
            r = by_id[m.msg_id]
            assert (m.queue_id, m.queue_offset, m.tags, m.keys) == (r.queue.queue_id, r.queue_offset, "TagP",
                                                                    f"k{m.body.decode()[1:]}")


def test_many_threads_share_one_pipelined_connection(cluster):
    topic = "PipeThreadsT"
    results, errors = [], []
    with Producer("PG_PIPE_THREADS", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message(topic, b"warm"))

        def sender(n):
            futures = [p.send_async(Message(topic, f"{n}-{i}".encode())) for i in range(50)]
            for f in futures:
                try:
                    results.append(f.result(20))
                except Exception as e:  # noqa: BLE001 - asserted below
                    errors.append(e)

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert p.instance.send_channel_count(_broker_addr(p, topic)) == 1
    assert not errors and len(results) == 300
    assert len({(r.queue.queue_id, r.queue_offset) for r in results}) == 300
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_PIPE_THREADS", 301)
    assert sorted(m.body for m in got if m.body != b"warm") == sorted(
        f"{n}-{i}".encode() for n in range(6) for i in range(50))


def test_in_proc_brokers_take_the_same_pipeline(cluster):
    from rmq_plugins.transport.inproc import InprocPipelinedChannel

    with Producer("PG_PIPE_INPROC", namesrv=cluster.namesrv, **FAST) as p:
        p.send(Message("PipeInprocT", b"warm"))
        assert p.send_async(Message("PipeInprocT", b"x")).result(10).status is SendStatus.SEND_OK
        assert p.send_batch([Message("PipeInprocT", b"b1"), Message("PipeInprocT", b"b2")]).status is SendStatus.SEND_OK
        channels = [c for cs in p.instance._send_channels.values() for c in cs]
        assert len(channels) == 1 and type(channels[0]) is InprocPipelinedChannel


def test_a_connection_broken_mid_flight_retries_and_the_next_send_reconnects(cluster, monkeypatch):
    topic = "PipeBreakT"
    lost, broken = [], threading.Event()

    def rewrite(items):  # answers read before the break are lost with the connection, as a reset loses them
        if broken.is_set():
            return items
        lost.extend(item for item in items if not isinstance(item, bytes))
        return [item for item in items if isinstance(item, bytes)]

    with Producer("PG_PIPE_BREAK", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message(topic, b"warm"))
        p.send_async(Message(topic, b"warm-async")).result(10)
        addr = _broker_addr(p, topic)
        _rewrite_responses(monkeypatch, rewrite, p)
        futures = [p.send_async(Message(topic, f"b{i}".encode())) for i in range(30)]
        wait_until(lambda: len(lost) == 30, what="the 30 answers to be read (and lost)")
        (channel,) = p.instance._send_channels[addr]
        assert not any(f.done() for f in futures)  # all 30 in flight when the connection breaks
        broken.set()
        channel._rsock.shutdown(socket.SHUT_RDWR)  # as a reset connection would leave it
        results = [f.result(15) for f in futures]
        assert all(r.status is SendStatus.SEND_OK for r in results)
        assert channel.closed
        after = p.send_async(Message(topic, b"after")).result(10)
        assert after.status is SendStatus.SEND_OK
        (fresh,) = p.instance._send_channels[addr]
        assert fresh is not channel and not fresh.closed
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_PIPE_BREAK", 63, timeout=4)
    # at least once: each of the 30 was stored, its answer lost with the connection, and sent again
    assert sorted(m.body for m in got) == sorted(
        [b"warm", b"warm-async", b"after"] + [f"b{i}".encode() for i in range(30)] * 2)


def test_a_connection_broken_while_idle_is_replaced_by_the_next_send(cluster):
    topic = "PipeIdleBreakT"
    with Producer("PG_PIPE_IDLE_BREAK", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message(topic, b"warm"))
        addr = _broker_addr(p, topic)
        (channel,) = p.instance._send_channels[addr]
        channel._rsock.shutdown(socket.SHUT_RDWR)  # nothing in flight: no answer tells of the break
        assert p.send(Message(topic, b"sync after")).status is SendStatus.SEND_OK
        assert p.send_async(Message(topic, b"async after")).result(10).status is SendStatus.SEND_OK
        assert channel.closed
        (fresh,) = p.instance._send_channels[addr]
        assert fresh is not channel and not fresh.closed
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_PIPE_IDLE_BREAK", 3, timeout=4)
    assert sorted(m.body for m in got) == [b"async after", b"sync after", b"warm"]


def _rewrite_responses(monkeypatch, rewrite, p=None):
    """Make the pipelined connections read send responses through rewrite(items) first (those
    of producer `p` open already are closed: their successors read so)."""
    real = producer_module.read_send_response_frames

    def read(data, max_frame_length):
        items, consumed = real(data, max_frame_length)
        return rewrite(items), consumed

    monkeypatch.setattr(producer_module, "read_send_response_frames", read)
    if p is not None:
        p.instance._close_send_channels(1.0)


def test_a_busy_answer_is_retried_and_a_refusal_is_not(cluster, monkeypatch):
    codes = [ResponseCode.SYSTEM_BUSY, None, ResponseCode.MESSAGE_ILLEGAL]  # (None: the retry's answer stands)

    def rewrite(items):
        for item in items:
            if codes and not isinstance(item, bytes):
                code = codes.pop(0)
                if code is not None:
                    item.code, item.remark = code, "injected"
        return items

    with Producer("PG_PIPE_BUSY", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message("PipeBusyT", b"warm"))
        _rewrite_responses(monkeypatch, rewrite, p)
        busy = p.send_async(Message("PipeBusyT", b"busy once")).result(10)  # retried on the pipeline
        assert busy.status is SendStatus.SEND_OK
        with pytest.raises(MQBrokerError, match="code 13 .*injected"):
            p.send_async(Message("PipeBusyT", b"illegal")).result(10)
    # every request was stored (only its answer was rewritten): the busy one twice, as it was sent again
    got = drain_topic(cluster.tcp_namesrv, "PipeBusyT", "CG_PIPE_BUSY", 4, timeout=5)
    assert sorted(m.body for m in got) == [b"busy once", b"busy once", b"illegal", b"warm"]


def test_an_unanswered_send_times_out_within_its_timeout(cluster, monkeypatch):
    dropped = []

    def rewrite(items):
        if not dropped and items:
            dropped.append(items[0])
            return items[1:]
        return items

    with Producer("PG_PIPE_TIMEOUT", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message("PipeTimeoutT", b"warm"))
        _rewrite_responses(monkeypatch, rewrite, p)
        t0 = time.monotonic()
        fut = p.send_async(Message("PipeTimeoutT", b"lost answer"), timeout=0.5)
        with pytest.raises(MQClientError, match="no response .* in time"):
            fut.result(10)
        assert time.monotonic() - t0 > 0.4  # not before its timeout (the error says it ran out)
        assert dropped
        assert p.send_async(Message("PipeTimeoutT", b"next")).result(10).status is SendStatus.SEND_OK


def test_shutdown_with_sends_in_flight_leaves_none_hanging(cluster):
    p = Producer("PG_PIPE_SHUT", namesrv=cluster.tcp_namesrv, **FAST).start()
    p.send(Message("PipeShutT", b"warm"))
    futures = [p.send_async(Message("PipeShutT", f"s{i}".encode())) for i in range(300)]
    p.shutdown()
    outcomes = []
    for f in futures:
        try:
            outcomes.append(f.result(5).status)
        except Exception as e:  # noqa: BLE001 - a send failed by the shutdown says so
            outcomes.append(type(e).__name__)
    assert len(outcomes) == 300 and outcomes.count(SendStatus.SEND_OK) > 0
    assert not [t for t in threading.enumerate() if t.name.startswith(f"rmq-send-{p.client_id}")]


def test_a_pipelined_send_to_a_dead_broker_is_retried_on_the_other(tmp_path):
    from tests.servers import NamesrvAndBroker

    servers = NamesrvAndBroker(tmp_path, brokers=2, broker_props={"registerNameServerPeriod": "1000"})
    try:
        with Producer("PG_PIPE_FAILOVER", namesrv=servers.namesrv, send_msg_timeout=5.0, **FAST) as p:
            for b in ("broker-a", "broker-b"):
                p.send(Message("PipeFailover", b"seed"), queue=MessageQueue("PipeFailover", b, 0))
            wait_until(lambda: {q.broker_name for q in p.fetch_publish_message_queues("PipeFailover")} ==
                       {"broker-a", "broker-b"}, what="the topic on both brokers")
            warm = [p.send_async(Message("PipeFailover", b"w")) for _ in range(8)]
            assert {f.result(10).queue.broker_name for f in warm} == {"broker-a", "broker-b"}
            servers.brokers[1].kill()  # SIGKILL broker-b
            results = [p.send_async(Message("PipeFailover", f"m{i}".encode())).result(15) for i in range(40)]
            assert all(r.status is SendStatus.SEND_OK for r in results)
            assert {r.queue.broker_name for r in results} == {"broker-a"}
            assert p.fault_strategy.tolerance.is_available("broker-b") is False
    finally:
        servers.stop()


class _SendRecorder:
    def __init__(self):
        self.modes = []

    @hookimpl
    def rmq_before_send(self, context):
        self.modes.append(context.mode)

    @hookimpl
    def rmq_after_send(self, context):
        self.modes.append("after")


def test_send_hooks_run_on_the_send_connections(cluster, monkeypatch):
    rec = _SendRecorder()
    pm = get_plugin_manager()
    pm.register(rec, name="test-pipe-recorder")
    try:
        with Producer("PG_PIPE_HOOK", namesrv=cluster.tcp_namesrv, **FAST) as p:
            assert p.send(Message("PipeHookT", b"warm")).status is SendStatus.SEND_OK  # (route look-up)
            loop_sends = []
            real = p.instance.invoke

            async def invoke(addr, request, timeout):
                if request.code == RequestCode.SEND_MESSAGE_V2:
                    loop_sends.append(request.code)
                return await real(addr, request, timeout)

            monkeypatch.setattr(p.instance, "invoke", invoke)
            assert p.send_async(Message("PipeHookT", b"h")).result(10).status is SendStatus.SEND_OK
            assert p.send(Message("PipeHookT", b"s")).status is SendStatus.SEND_OK
            # the hooks ran on the pipelined and the direct connection: not one send took the loop's route
            assert loop_sends == [] and p.instance._send_channels
    finally:
        pm.unregister(rec)
    assert rec.modes == [CommunicationMode.SYNC.value, "after", CommunicationMode.ASYNC.value, "after",
                         CommunicationMode.SYNC.value, "after"]


def test_auto_batch_still_gathers_over_tcp(cluster, monkeypatch):
    with Producer("PG_PIPE_AB", namesrv=cluster.tcp_namesrv, auto_batch=True, **FAST) as p:
        p.send(Message("PipeAutoBatchT", b"warm"))
        batches = []
        real = p._write_batch

        def counting(topic, wait, body, *rest):  # gathered batches go out on the pipelined connection
            batches.append(body)
            return real(topic, wait, body, *rest)

        monkeypatch.setattr(p, "_write_batch", counting)
        futures = [p.send_async(Message("PipeAutoBatchT", f"ab{i}".encode())) for i in range(40)]
        results = [f.result(10) for f in futures]
        assert p.instance._send_channels and len(batches) < 40
    assert all(r.status is SendStatus.SEND_OK for r in results) and batches
    assert len({r.msg_id for r in results}) == 40


def test_plain_sync_sends_never_build_a_remoting_command(cluster, monkeypatch):
    with Producer("PG_LEAN_SYNC", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message("LeanSyncT", b"warm"))  # the route look-up goes through the loop

        real = RemotingCommand.create_request

        def no_send_command(code, *a, **kw):
            if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE):
                raise AssertionError("a plain send built a RemotingCommand")
            return real(code, *a, **kw)

        monkeypatch.setattr(RemotingCommand, "create_request", staticmethod(no_send_command))
        results = [p.send(Message("LeanSyncT", f"l{i}".encode(), tags="T", properties={"a": "1"})) for i in range(10)]
        results += [p.send_async(Message("LeanSyncT", f"la{i}".encode())).result(10) for i in range(10)]
        monkeypatch.undo()
        big = p.send(Message("LeanSyncT", b"z" * 10000))  # compressed: SendAttempts, the same connection
    assert all(r.status is SendStatus.SEND_OK for r in results + [big])
    got = drain_topic(cluster.tcp_namesrv, "LeanSyncT", "CG_LEAN_SYNC", 22)
    by_body = {m.body: m for m in got}
    assert by_body[b"z" * 10000].msg_id == big.msg_id
    assert all(by_body[f"l{i}".encode()].properties.get("a") == "1" for i in range(10))


def test_a_failed_connect_is_not_tried_per_message(cluster, monkeypatch):
    """After a pipelined connection could not be opened, sends to that broker fail at once for a
    while (each attempt counted against the broker) instead of each trying to connect again."""
    from rmq_core.errors import RemotingConnectError

    with Producer("PG_PIPE_NOCONN", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message("PipeNoConnT", b"warm"))
        tries = []

        def refuse(addr, read_frames, from_command):
            tries.append(addr)
            raise RemotingConnectError(f"injected: connect to {addr} refused")

        monkeypatch.setattr(p.instance, "_open_send_channel", refuse)
        p.instance._close_send_channels(1.0)
        for i in range(20):
            with pytest.raises(MQClientError, match="connect to .* refused|failed moments ago"):
                p.send_async(Message("PipeNoConnT", f"n{i}".encode())).result(10)
        assert len(tries) == 1
        monkeypatch.undo()
        p.instance._connect_failed.clear()  # (the retry moment reached)
        assert p.send_async(Message("PipeNoConnT", b"again")).result(10).status is SendStatus.SEND_OK
        assert p.instance.send_channel_count(_broker_addr(p, "PipeNoConnT")) == 1
