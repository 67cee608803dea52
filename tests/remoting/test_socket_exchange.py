"""A sync request's round trip (rmq_core._native.socket_io.exchange) and the idle-connection exchange of
a PipelinedChannel built on it, against raw peers on 127.0.0.1: the answer read by one receive that
sleeps until it comes, no answer in time, a peer that hangs up or dies mid-exchange, a descriptor
made non-blocking by someone else (an event loop watching a duplicate of it), a bad frame length,
and other threads sending while one exchanges."""
import os
import socket
import struct
import threading
import time

import pytest

from rmq_core._native.socket_io import exchange
from rmq_core.errors import RemotingConnectError, RemotingTimeoutError
from rmq_core.remoting.blocking import set_kernel_timeouts
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.pipelined import PipelinedChannel
from tests.remoting.test_pipelined_channel import _answer, _echo, _frame, _Outcomes, _RawPeer, _read_frame


def _connected(peer, *, blocking=True, timeout=5.0):
    host, port = peer.addr.split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.settimeout(None)
    set_kernel_timeouts(sock, timeout)
    os.set_blocking(sock.fileno(), blocking)
    return sock


def _echo_script(delay=0.0, rounds=1):
    def script(conn):
        for _ in range(rounds):
            request = _read_frame(conn)
            time.sleep(delay)
            conn.sendall(_answer(request, echo=request.get_str("value")))
        time.sleep(0.5)
    return script


@pytest.mark.parametrize("blocking", [True, False])
def test_exchange_writes_the_request_and_receives_its_answer(blocking):
    peer = _RawPeer(_echo_script(delay=0.05, rounds=3))
    sock = _connected(peer, blocking=blocking)
    try:
        buf = bytearray(4096)
        for i in range(3):  # (a non-blocking descriptor waits for the answer with a poll)
            n = exchange(sock.fileno(), _frame(_echo(f"v{i}")), buf, 5.0)
            assert n > 4 and struct.unpack_from(">i", buf)[0] == n - 4
            assert RemotingCommand.decode(bytes(buf[4:n])).get_str("echo") == f"v{i}"
    finally:
        sock.close()
        peer.close()
    assert peer.errors == []


@pytest.mark.parametrize("blocking", [True, False])
def test_exchange_without_an_answer_in_time_returns_minus_one(blocking):
    def script(conn):
        _read_frame(conn)
        time.sleep(2.0)  # never answers while the caller waits

    peer = _RawPeer(script)
    sock = _connected(peer, blocking=blocking, timeout=0.1)
    try:
        assert exchange(sock.fileno(), _frame(_echo("q")), bytearray(64), 0.1) == -1
    finally:
        sock.close()
        peer.close()


def test_exchange_with_no_time_takes_only_what_is_there():
    peer = _RawPeer(lambda conn: (_read_frame(conn), time.sleep(1.0)))
    sock = _connected(peer)
    try:
        assert exchange(sock.fileno(), _frame(_echo("q")), bytearray(64), 0.0) == -1
    finally:
        sock.close()
        peer.close()


def test_exchange_with_a_peer_that_hangs_up_returns_zero_or_fails():
    peer = _RawPeer(lambda conn: _read_frame(conn))  # reads the request, then closes
    sock = _connected(peer)
    try:
        assert exchange(sock.fileno(), _frame(_echo("q")), bytearray(64), 5.0) == 0
        with pytest.raises(OSError):  # the next write finds the connection gone (EPIPE / ECONNRESET)
            for _ in range(10):
                exchange(sock.fileno(), _frame(_echo("again")), bytearray(64), 5.0)
    finally:
        sock.close()
        peer.close()


def test_exchange_names_a_bad_descriptor():
    with pytest.raises(OSError):
        exchange(-1, b"\x00\x00\x00\x04abcd", bytearray(8), 1.0)


# --- PipelinedChannel.exchange ----------------------------------------------------------------------
def test_channel_exchange_on_a_descriptor_someone_made_non_blocking():
    """uvloop's watch of a duplicate descriptor makes the connection non-blocking: the exchange
    still reads its own answer (waiting with a poll), and async sends beside it are answered."""
    peer = _RawPeer(_echo_script(delay=0.01, rounds=20))
    ch = PipelinedChannel(peer.addr)
    out = _Outcomes()
    try:
        os.set_blocking(ch._rsock.fileno(), False)
        for i in range(10):
            request = _echo(f"x{i}")
            ch.exchange(_frame(request), request.opaque, 5.0, out, i)
            assert i in out.done and out.done[i][0].get_str("echo") == f"x{i}"
        for i in range(10):
            ch.send_command(_echo(f"a{i}"), 5.0, out, ("a", i))
        assert out.wait_for(20)
        assert all(e is None for _, e in out.done.values())
    finally:
        ch.close()
        peer.close()


def test_channel_exchange_without_an_answer_times_out_and_others_are_answered():
    """The exchanging thread's receive ends at its timeout; its request then fails with
    RemotingTimeoutError, and another thread's request written meanwhile is answered."""
    def script(conn):
        _read_frame(conn)  # the exchange's: never answered
        other = _read_frame(conn)
        conn.sendall(_answer(other, echo="other"))
        time.sleep(1.5)

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr, sweep_interval=0.02)
    out = _Outcomes()
    try:
        def other():
            time.sleep(0.05)
            ch.send_command(_echo("other"), 5.0, out, "other")

        t = threading.Thread(target=other)
        t.start()
        request = _echo("lost")
        ch.exchange(_frame(request), request.opaque, 0.3, out, "lost")
        t.join(5)
        assert out.wait_for(2, timeout=10)
        response, error = out.done["lost"]
        assert response is None and isinstance(error, RemotingTimeoutError)
        assert out.done["other"][0].get_str("echo") == "other" and not ch.closed
    finally:
        ch.close()
        peer.close()


def test_channel_exchange_with_a_peer_that_dies_mid_exchange():
    def script(conn):
        _read_frame(conn)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr)
    out = _Outcomes()
    try:
        request = _echo("q")
        ch.exchange(_frame(request), request.opaque, 5.0, out, "q")
        assert out.wait_for(1, timeout=10)
        response, error = out.done["q"]
        assert response is None and isinstance(error, RemotingConnectError) and peer.addr in str(error)
        assert ch.closed
        request = _echo("after")
        ch.exchange(_frame(request), request.opaque, 5.0, out, "after")  # a closed channel fails at once
        assert isinstance(out.done["after"][1], RemotingConnectError)
    finally:
        ch.close()
        peer.close()


def test_channel_exchange_with_a_bad_frame_length_fails_cleanly():
    def script(conn):
        _read_frame(conn)
        conn.sendall(struct.pack(">i", 1 << 30) + b"\x00" * 16)
        time.sleep(0.5)

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr, max_frame_length=1 << 20)
    out = _Outcomes()
    try:
        request = _echo("q")
        ch.exchange(_frame(request), request.opaque, 5.0, out, "q")
        assert out.wait_for(1, timeout=10)
        error = out.done["q"][1]
        assert isinstance(error, RemotingConnectError) and f"frame length {1 << 30} outside" in str(error)
        assert ch.closed
    finally:
        ch.close()
        peer.close()


def test_close_while_a_thread_exchanges_fails_its_request():
    peer = _RawPeer(lambda conn: (_read_frame(conn), time.sleep(3.0)))
    ch = PipelinedChannel(peer.addr)
    out = _Outcomes()
    try:
        threading.Timer(0.2, ch.close).start()
        request = _echo("q")
        ch.exchange(_frame(request), request.opaque, 30.0, out, "q")  # returns when close() wakes it
        assert out.wait_for(1, timeout=10)
        assert isinstance(out.done["q"][1], RemotingConnectError)
    finally:
        ch.close()
        peer.close()


class _CountingStep:
    """An interception step (as RpcHookStep) that notes each request and answer it sees."""

    def __init__(self):
        self.before_calls, self.after_calls = [], []

    def before(self, frame):
        request = RemotingCommand.decode(memoryview(frame)[4:])
        self.before_calls.append(request.opaque)
        return frame, request

    def after(self, request, response):
        self.after_calls.append((request.opaque, response.opaque, response.get_str("echo")))


@pytest.mark.parametrize("hooked", [False, True])
def test_channel_exchange_whose_receive_ends_inside_the_next_frame(hooked):
    """The exchange's receive brings its answer and the start of a request from the peer: the
    answer completes at once (its hook step run once), the request is refused when it is whole."""
    refused = []

    def script(conn):
        request = _read_frame(conn)
        peer_request = RemotingCommand.create_request(39, {"x": "1"}).encode()
        conn.sendall(_answer(request, echo="mine") + peer_request[:7])
        time.sleep(0.1)
        conn.sendall(peer_request[7:])
        refused.append(_read_frame(conn))
        time.sleep(0.5)

    peer = _RawPeer(script)
    step = _CountingStep() if hooked else None
    ch = PipelinedChannel(peer.addr, intercept=step)
    out = _Outcomes()
    try:
        request = _echo("q")
        ch.exchange(_frame(request), request.opaque, 5.0, out, "q")
        assert out.done["q"][0].get_str("echo") == "mine"
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            time.sleep(0.01)
        assert refused and refused[0].flag & 1 and refused[0].opaque != request.opaque
        if hooked:
            assert step.before_calls == [request.opaque]
            assert step.after_calls == [(request.opaque, request.opaque, "mine")]
    finally:
        ch.close()
        peer.close()
