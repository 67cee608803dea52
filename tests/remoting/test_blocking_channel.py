"""BlockingChannel / BlockingChannelPool (the caller-thread path of a sync send) against a real
RemotingServer on 127.0.0.1, and against a raw socket peer that misbehaves."""
import asyncio
import socket
import struct
import threading
import time

import pytest

from rmq_core.errors import RemotingConnectError, RemotingTimeoutError
from rmq_core.remoting.blocking import BlockingChannel, BlockingChannelPool
from rmq_core.remoting.codes import ResponseCode
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand
from rmq_core.remoting.server import RemotingServer
from tests.servers import free_port

ECHO, SLOW = 9001, 9002


class _Echo:
    async def process_request(self, ctx, request):
        resp = request.make_response(ResponseCode.SUCCESS, None)
        resp.ext_fields = {"echo": request.get_str("value", "")}
        resp.body = request.body
        return resp


class _Slow:
    async def process_request(self, ctx, request):
        await asyncio.sleep(float(request.get_str("sleep", "1")))
        return request.make_response(ResponseCode.SUCCESS, None)


class _Running:
    """A RemotingServer on its own loop thread (TCP on a free port, plus an in-proc name)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.srv = RemotingServer(["127.0.0.1:0", f"inproc://blocking-{time.monotonic_ns()}"], name="blocking-test")
        self.srv.register_processor(ECHO, _Echo())
        self.srv.register_processor(SLOW, _Slow())
        asyncio.run_coroutine_threadsafe(self.srv.start(), self.loop).result(10)
        self.tcp, self.inproc = self.srv.listen_addresses

    def stop_server(self):
        asyncio.run_coroutine_threadsafe(self.srv.stop(), self.loop).result(10)

    def close(self):
        self.stop_server()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def running():
    r = _Running()
    yield r
    r.close()


@pytest.fixture
def server(running):
    return running.tcp


def _echo(value: str, body: bytes | None = None) -> RemotingCommand:
    return RemotingCommand.create_request(ECHO, {"value": value}, body)


def test_request_and_response_over_one_connection(server):
    ch = BlockingChannel(server)
    try:
        for i in range(50):
            body = bytes([i]) * (i * 997)  # up to ~49 KB: responses that take several reads
            resp = ch.invoke(_echo(f"v{i}", body or None), 5.0)
            assert resp.code == ResponseCode.SUCCESS and resp.get_str("echo") == f"v{i}"
            assert (resp.body or b"") == body
    finally:
        ch.close()


def test_timeout_names_the_request_and_closes_the_channel(server):
    ch = BlockingChannel(server)
    req = RemotingCommand.create_request(SLOW, {"sleep": "2"})
    with pytest.raises(RemotingTimeoutError, match=f"from {server}"):  # (its answer comes at 2 s)
        ch.invoke(req, 0.3)
    assert ch.closed  # a late answer must never be read as the next call's
    with pytest.raises(RemotingConnectError, match="closed"):
        ch.invoke(_echo("x"), 1.0)


def test_connect_refused_names_the_address():
    addr = f"127.0.0.1:{free_port()}"
    with pytest.raises(RemotingConnectError, match=addr):
        BlockingChannel(addr)


def test_only_tcp_addresses():
    with pytest.raises(RemotingConnectError, match="inproc://x"):
        BlockingChannel("inproc://x")


def test_pool_reuses_idle_channels_and_declines_beyond_its_limit(server):
    pool = BlockingChannelPool(max_per_address=2)
    try:
        for i in range(20):
            assert pool.invoke(server, _echo(str(i)), 5.0).get_str("echo") == str(i)
        assert pool.open_count(server) == 1  # one caller at a time: one connection

        # two slow calls hold both channels; a third caller is declined (None), not queued
        slow = [threading.Thread(target=pool.invoke, args=(server, RemotingCommand.create_request(SLOW, {"sleep": "0.8"}), 5.0))
                for _ in range(2)]
        for t in slow:
            t.start()
        deadline = time.monotonic() + 5
        while pool.open_count(server) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert pool.invoke(server, _echo("third"), 5.0) is None
        for t in slow:
            t.join(5)
        assert pool.invoke(server, _echo("after"), 5.0).get_str("echo") == "after"
        assert pool.open_count(server) == 2
    finally:
        pool.close()
    assert pool.open_count(server) == 0
    with pytest.raises(RemotingConnectError, match="closed"):
        pool.invoke(server, _echo("x"), 1.0)


def test_pool_forgets_a_broken_channel(server):
    pool = BlockingChannelPool(max_per_address=1)
    try:
        with pytest.raises(RemotingTimeoutError):
            pool.invoke(server, RemotingCommand.create_request(SLOW, {"sleep": "1"}), 0.2)
        assert pool.open_count(server) == 0
        assert pool.invoke(server, _echo("fresh"), 5.0).get_str("echo") == "fresh"
    finally:
        pool.close()


def test_many_threads_share_a_pool(server):
    pool = BlockingChannelPool(max_per_address=3)
    answered, declined, errors = [], [], []

    def caller(n):
        for i in range(30):
            try:
                resp = pool.invoke(server, _echo(f"{n}-{i}"), 5.0)
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)
                continue
            if resp is None:
                declined.append(n)
            else:
                assert resp.get_str("echo") == f"{n}-{i}"  # never another caller's answer
                answered.append(n)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    pool.close()
    assert not errors
    assert len(answered) + len(declined) == 180 and answered
    assert pool.open_count(server) == 0


# --- a raw peer that misbehaves -------------------------------------------------------------------
def _raw_peer(script):
    """A one-connection TCP peer on 127.0.0.1: script(conn, request_frame) writes what it likes."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    seen = []

    def serve():
        conn, _ = lsock.accept()
        with conn:
            hdr = conn.recv(4, socket.MSG_WAITALL)
            (n,) = struct.unpack(">i", hdr)
            frame = conn.recv(n, socket.MSG_WAITALL)
            seen.append(RemotingCommand.decode(frame))
            script(conn, seen)
        lsock.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"127.0.0.1:{lsock.getsockname()[1]}", seen, t


def _response_to(request: RemotingCommand, **ext) -> bytes:
    resp = RemotingCommand.create_response(ResponseCode.SUCCESS, None, ext)
    resp.opaque = request.opaque
    resp.flag |= RESPONSE_FLAG
    return resp.encode()


def _read_one(conn) -> RemotingCommand:
    (n,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
    return RemotingCommand.decode(conn.recv(n, socket.MSG_WAITALL))


def test_a_request_from_the_peer_is_refused_and_the_response_still_arrives():
    refused = []

    def script(conn, seen):
        check = RemotingCommand.create_request(39, {"x": "1"})  # e.g. CHECK_TRANSACTION_STATE
        conn.sendall(check.encode())
        refused.append(_read_one(conn))
        # the answer split in two writes: the channel must reassemble it
        data = _response_to(seen[0], ok="yes")
        conn.sendall(data[:7])
        time.sleep(0.05)
        conn.sendall(data[7:])

    addr, seen, t = _raw_peer(script)
    ch = BlockingChannel(addr)
    try:
        resp = ch.invoke(_echo("q"), 5.0)
        assert resp.get_str("ok") == "yes"
    finally:
        ch.close()
        t.join(5)
    assert refused and refused[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "not served on this connection" in refused[0].remark


@pytest.mark.parametrize("length", [-1, 0, 1 << 30])
def test_a_bad_frame_length_breaks_the_channel_with_a_clear_error(length):
    def script(conn, seen):
        conn.sendall(struct.pack(">i", length) + b"\x00" * 16)
        time.sleep(0.2)

    addr, _, t = _raw_peer(script)
    ch = BlockingChannel(addr, max_frame_length=1 << 20)
    try:
        with pytest.raises(RemotingConnectError, match=f"frame length {length} outside"):
            ch.invoke(_echo("q"), 5.0)
        assert ch.closed
    finally:
        t.join(5)


def test_the_peer_closing_mid_call_is_a_connect_error():
    addr, _, t = _raw_peer(lambda conn, seen: None)  # reads the request, then hangs up
    ch = BlockingChannel(addr)
    with pytest.raises(RemotingConnectError, match="closed by"):
        ch.invoke(_echo("q"), 5.0)
    t.join(5)


# --- the in-proc transport's blocking connections --------------------------------------------------
def test_in_proc_pool_answers_without_a_client_loop(running):
    pool = BlockingChannelPool(max_per_address=2)
    try:
        for i in range(30):
            resp = pool.invoke(running.inproc, _echo(f"v{i}", b"payload"), 5.0)
            assert resp.get_str("echo") == f"v{i}" and resp.body == b"payload"
        assert pool.open_count(running.inproc) == 1
        with pytest.raises(RemotingTimeoutError, match=running.inproc):
            pool.invoke(running.inproc, RemotingCommand.create_request(SLOW, {"sleep": "1"}), 0.2)
        assert pool.open_count(running.inproc) == 0
        assert pool.invoke(running.inproc, _echo("again"), 5.0).get_str("echo") == "again"
    finally:
        pool.close()


def test_in_proc_server_stopping_wakes_a_waiting_caller(running):
    pool = BlockingChannelPool(max_per_address=1)
    outcome = []

    def call():
        try:
            pool.invoke(running.inproc, RemotingCommand.create_request(SLOW, {"sleep": "30"}), 20.0)
        except Exception as e:  # noqa: BLE001 - asserted below
            outcome.append(e)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.3)
    running.stop_server()
    t.join(10)
    assert not t.is_alive()  # (ended by the stop, as its error says, not by its 20 s timeout)
    assert outcome and isinstance(outcome[0], RemotingConnectError) and "closed before the response" in str(outcome[0])
    with pytest.raises(RemotingConnectError, match="no in-process server"):
        pool.invoke(running.inproc, _echo("x"), 1.0)
    pool.close()
