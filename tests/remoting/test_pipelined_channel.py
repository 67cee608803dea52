"""PipelinedChannel (the producer's send pipeline): many requests in flight on one connection, written
by any thread, answered on the channel's reader thread; against a real RemotingServer on 127.0.0.1
and against raw socket peers that answer out of order, stall, hang up or send requests."""
import asyncio
import random
import socket
import struct
import threading
import time

import pytest

from rmq_core.errors import RemotingConnectError, RemotingTimeoutError
from rmq_core.remoting.codes import ResponseCode
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand
from rmq_core.remoting.pipelined import PipelinedChannel
from rmq_core.remoting.server import RemotingServer
from tests.servers import free_port

ECHO, SLOW = 9101, 9102


class _Echo:
    async def process_request(self, ctx, request):
        resp = request.make_response(ResponseCode.SUCCESS, None)
        resp.ext_fields = {"echo": request.get_str("value", "")}
        resp.body = request.body
        return resp


class _Slow:
    async def process_request(self, ctx, request):
        await asyncio.sleep(float(request.get_str("sleep", "1")))
        resp = request.make_response(ResponseCode.SUCCESS, None)
        resp.ext_fields = {"echo": request.get_str("value", "")}
        return resp


@pytest.fixture
def server():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    srv = RemotingServer(["127.0.0.1:0"], name="pipelined-test")
    srv.register_processor(ECHO, _Echo())
    srv.register_processor(SLOW, _Slow())
    asyncio.run_coroutine_threadsafe(srv.start(), loop).result(10)
    yield srv.listen_addresses[0]
    asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


class _Outcomes:
    """on_done for the channel: records (context, response, error, thread name) and counts down."""

    def __init__(self):
        self.cond = threading.Condition()
        self.done = {}
        self.order = []  # contexts in the order they completed
        self.at = {}  # context -> time.monotonic() of its completion
        self.twice = []
        self.threads = set()

    def __call__(self, context, response, error):
        with self.cond:
            if context in self.done:
                self.twice.append(context)
            self.done[context] = (response, error)
            self.order.append(context)
            self.at[context] = time.monotonic()
            self.threads.add(threading.current_thread().name)
            self.cond.notify_all()

    def wait_for(self, n, timeout=20.0):
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.done) >= n, timeout)
        assert not self.twice, f"completed twice: {self.twice!r}"
        return ok


def _echo(value: str, body: bytes | None = None) -> RemotingCommand:
    return RemotingCommand.create_request(ECHO, {"value": value}, body)


def test_many_threads_send_concurrently_and_every_answer_reaches_its_request(server):
    ch = PipelinedChannel(server, name="rmq-pipe-test")
    out = _Outcomes()
    try:
        def sender(n):
            for i in range(200):
                body = bytes([i % 256]) * random.randrange(0, 3000)
                ch.send_command(_echo(f"{n}-{i}", body or None), 10.0, out, (n, i, len(body)))

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert out.wait_for(1200)
        for (n, i, size), (response, error) in out.done.items():
            assert error is None
            assert response.code == ResponseCode.SUCCESS and response.get_str("echo") == f"{n}-{i}"
            assert len(response.body or b"") == size
        assert out.threads == {"rmq-pipe-test"}  # answers complete on the reader thread
        assert ch.pending_count == 0 and not ch.closed
    finally:
        ch.close()


def test_large_responses_span_many_reads_and_grow_the_buffer(server):
    ch = PipelinedChannel(server)
    out = _Outcomes()
    try:
        sizes = [1, 300_000, 2_000_000, 10]
        for i, size in enumerate(sizes):
            ch.send_command(_echo(str(i), b"z" * size), 10.0, out, i)
        assert out.wait_for(len(sizes))
        assert [len(out.done[i][0].body) for i in range(len(sizes))] == sizes
    finally:
        ch.close()


# --- raw peers -------------------------------------------------------------------------------------
def _read_frame(conn) -> RemotingCommand:
    (n,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
    return RemotingCommand.decode(conn.recv(n, socket.MSG_WAITALL))


def _answer(request: RemotingCommand, **ext) -> bytes:
    resp = RemotingCommand.create_response(ResponseCode.SUCCESS, None, ext, opaque=request.opaque)
    resp.flag |= RESPONSE_FLAG
    return resp.encode()


class _RawPeer:
    """A TCP peer on 127.0.0.1 whose behaviour is a function of each accepted connection."""

    def __init__(self, script):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(4)
        self.addr = f"127.0.0.1:{self.lsock.getsockname()[1]}"
        self.connections = 0
        self.errors = []

        def serve():
            while True:
                try:
                    conn, _ = self.lsock.accept()
                except OSError:
                    return
                self.connections += 1
                threading.Thread(target=self._run, args=(script, conn), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()

    def _run(self, script, conn):
        with conn:
            try:
                script(conn)
            except Exception as e:  # noqa: BLE001 - the test asserts on it
                self.errors.append(e)

    def close(self):
        self.lsock.close()


def test_responses_out_of_order_complete_the_right_requests():
    def script(conn):
        requests = [_read_frame(conn) for _ in range(20)]
        random.Random(7).shuffle(requests)
        conn.sendall(b"".join(_answer(r, echo=r.get_str("value")) for r in requests))
        time.sleep(0.5)

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr)
    out = _Outcomes()
    try:
        for i in range(20):
            ch.send_command(_echo(f"v{i}"), 10.0, out, i)
        assert out.wait_for(20)
        assert {i: r.get_str("echo") for i, (r, e) in out.done.items()} == {i: f"v{i}" for i in range(20)}
    finally:
        ch.close()
        peer.close()


def test_an_unanswered_request_times_out_and_the_connection_stays_usable():
    def script(conn):
        first = _read_frame(conn)  # never answered
        second = _read_frame(conn)
        time.sleep(0.4)  # past the first one's deadline
        conn.sendall(_answer(second, echo="late-but-in-time") + _answer(first, echo="too late"))
        third = _read_frame(conn)
        conn.sendall(_answer(third, echo="third"))
        time.sleep(0.5)

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr, sweep_interval=0.02)
    out = _Outcomes()
    try:
        t0 = time.monotonic()
        ch.send_command(_echo("first"), 0.2, out, "first")
        ch.send_command(_echo("second"), 5.0, out, "second")
        assert out.wait_for(2)
        response, error = out.done["first"]
        assert response is None and isinstance(error, RemotingTimeoutError) and peer.addr in str(error)
        # the sweep failed it at its deadline, never before, and before the peer's late answers came
        assert out.at["first"] >= t0 + 0.2
        assert out.order[:2] == ["first", "second"]
        assert out.done["second"][0].get_str("echo") == "late-but-in-time"
        ch.send_command(_echo("third"), 5.0, out, "third")
        assert out.wait_for(3)
        assert out.done["third"][0].get_str("echo") == "third" and not ch.closed
    finally:
        ch.close()
        peer.close()


def test_a_connection_killed_mid_flight_fails_every_pending_request():
    def script(conn):
        for _ in range(5):
            _read_frame(conn)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr)
    out = _Outcomes()
    try:
        for i in range(5):
            ch.send_command(_echo(str(i)), 10.0, out, i)
        assert out.wait_for(5, timeout=5)
        assert all(r is None and isinstance(e, RemotingConnectError) for r, e in out.done.values())
        deadline = time.monotonic() + 5
        while not ch.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ch.closed
        # a request to a closed channel fails at once, on the caller's thread
        ch.send_command(_echo("after"), 10.0, out, "after")
        assert isinstance(out.done["after"][1], RemotingConnectError) and "closed" in str(out.done["after"][1])
    finally:
        ch.close()
        peer.close()


def test_a_request_from_the_peer_is_refused_and_answers_still_arrive():
    refused = []

    def script(conn):
        request = _read_frame(conn)
        conn.sendall(RemotingCommand.create_request(39, {"x": "1"}).encode())  # e.g. CHECK_TRANSACTION_STATE
        oneway = RemotingCommand.create_request(40, {"y": "2"})
        oneway.mark_oneway()
        conn.sendall(oneway.encode())  # no answer expected for this one
        refused.append(_read_frame(conn))
        data = _answer(request, echo="ok")
        conn.sendall(data[:9])  # the answer split in two writes
        time.sleep(0.05)
        conn.sendall(data[9:])
        time.sleep(0.5)

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr)
    out = _Outcomes()
    try:
        ch.send_command(_echo("q"), 5.0, out, "q")
        assert out.wait_for(1)
        assert out.done["q"][0].get_str("echo") == "ok"
    finally:
        ch.close()
        peer.close()
    assert len(refused) == 1 and refused[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert refused[0].flag & RESPONSE_FLAG and "not served on this connection" in refused[0].remark


@pytest.mark.parametrize("length", [-1, 0, 1 << 30])
def test_a_bad_frame_length_breaks_the_channel_with_a_clear_error(length):
    def script(conn):
        _read_frame(conn)
        conn.sendall(struct.pack(">i", length) + b"\x00" * 16)
        time.sleep(0.5)

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr, max_frame_length=1 << 20)
    out = _Outcomes()
    try:
        ch.send_command(_echo("q"), 5.0, out, "q")
        assert out.wait_for(1)
        error = out.done["q"][1]
        assert isinstance(error, RemotingConnectError) and f"frame length {length} outside" in str(error)
    finally:
        ch.close()
        peer.close()


def test_close_drains_what_is_answered_in_time_and_fails_the_rest(server):
    ch = PipelinedChannel(server)
    out = _Outcomes()
    slow = RemotingCommand.create_request(SLOW, {"sleep": "0.2", "value": "slow"})
    stuck = RemotingCommand.create_request(SLOW, {"sleep": "30", "value": "stuck"})
    ch.send_command(slow, 10.0, out, "slow")
    ch.send_command(stuck, 60.0, out, "stuck")
    t0 = time.monotonic()
    ch.close(drain_timeout=2.0)
    assert 1.9 < time.monotonic() - t0 < 30  # drained for its 2 s, not for the stuck one's 60 s
    assert out.done["slow"][0] is not None, out.done["slow"]
    assert out.done["slow"][0].get_str("echo") == "slow"
    error = out.done["stuck"][1]
    assert isinstance(error, RemotingConnectError) and "closed with the request pending" in str(error)
    assert not ch._reader.is_alive() and ch.closed
    ch.send_command(_echo("after"), 1.0, out, "after")
    assert isinstance(out.done["after"][1], RemotingConnectError)


def test_close_without_drain_fails_pending_at_once(server):
    ch = PipelinedChannel(server)
    out = _Outcomes()
    ch.send_command(RemotingCommand.create_request(SLOW, {"sleep": "30"}), 60.0, out, "stuck")
    t0 = time.monotonic()
    ch.close()
    assert time.monotonic() - t0 < 30  # at once: not the stuck request's 60 s
    assert isinstance(out.done["stuck"][1], RemotingConnectError)
    assert not ch._reader.is_alive()


def test_a_burst_leaves_in_few_writes(server):
    """While answers are due, requests gather and leave together (Nagle's rule with a short timer),
    so a burst of small requests is not one system call each; every one is still answered."""
    ch = PipelinedChannel(server)
    writes = []

    class CountingSocket:
        def __init__(self, sock):
            self.sock = sock

        def sendall(self, data):
            writes.append(len(data))
            return self.sock.sendall(data)

        def __getattr__(self, name):
            return getattr(self.sock, name)

    ch._wsock = CountingSocket(ch._wsock)
    out = _Outcomes()
    try:
        for i in range(200):
            ch.send_command(_echo(str(i)), 10.0, out, i)
        assert out.wait_for(200)
        assert all(e is None and r.get_str("echo") == str(i) for i, (r, e) in out.done.items())
        assert len(writes) < 100  # the callers' writes; the reader writes the rest in bulk
    finally:
        ch.close()


def test_connect_refused_names_the_address():
    addr = f"127.0.0.1:{free_port()}"
    with pytest.raises(RemotingConnectError, match=addr):
        PipelinedChannel(addr)


def test_only_tcp_addresses():
    with pytest.raises(RemotingConnectError, match="inproc://x"):
        PipelinedChannel("inproc://x")


def test_gathered_requests_never_wait_for_a_timer(server):
    """Requests gather only while answers are due, and the reader writes them when the next
    answer comes: with both timers (sweep, coalesce delay) far away, bursts from several threads
    and lone requests are all answered long before either would fire."""
    ch = PipelinedChannel(server, sweep_interval=30.0, coalesce_delay=30.0)
    out = _Outcomes()
    try:
        def burst(n):
            for i in range(150):
                ch.send_command(_echo(f"{n}-{i}"), 60.0, out, (n, i))

        threads = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert out.wait_for(600, timeout=20)
        for k in range(20):  # one at a time: nothing in flight, written at once
            ch.send_command(_echo(f"lone{k}"), 60.0, out, ("lone", k))
            assert out.wait_for(601 + k, timeout=20)
        assert all(e is None for _, e in out.done.values())
    finally:
        ch.close()


def _frame(request: RemotingCommand) -> bytes:
    body = request.body
    return request.encode_header(len(body)) + bytes(body) if body else request.encode_header(0)


def test_exchange_answers_on_the_calling_thread_and_beside_requests_in_flight_is_a_send(server):
    """A sync send's exchange: on an idle connection the calling thread writes and reads its own
    answer (completed before exchange returns); with a slow request in flight it is an ordinary
    send, answered once it comes, and the slow one is answered too."""
    ch = PipelinedChannel(server, name="rmq-pipe-exchange")
    out = _Outcomes()
    try:
        for i in range(50):
            request = _echo(f"x{i}", b"b" * i)
            ch.exchange(_frame(request), request.opaque, 10.0, out, i)
            assert i in out.done  # read by this thread within the call (the answer comes whole)
        assert out.threads == {threading.current_thread().name}
        slow = RemotingCommand.create_request(SLOW, {"sleep": "0.3", "value": "slow"})
        ch.send_command(slow, 10.0, out, "slow")
        request = _echo("beside")
        ch.exchange(_frame(request), request.opaque, 10.0, out, "beside")
        assert out.wait_for(52)
        assert out.done["beside"][0].get_str("echo") == "beside"
        assert out.done["slow"][0].get_str("echo") == "slow"
        assert all(e is None for _, e in out.done.values()) and ch.pending_count == 0
    finally:
        ch.close()
