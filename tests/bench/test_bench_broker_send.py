"""One SEND_MESSAGE_V2 (128-byte body) answered by an `rmq broker` (ASYNC_FLUSH) subprocess, asked
from a plain blocking socket — the broker's side of a sync send, with no client library in the way.

Baseline in the same run: the same frame to a minimal asyncio Protocol server in another process,
answering every frame with a fixed send response (the floor for any asyncio server over loopback).
Both sides read the answer frame the same way; `extra_info["p99_us"]` records the tail.

Pipelined group: PIPELINE sends written at once and all answers read back — the broker's native
send lane beside the same broker with the lane off (RMQ_NATIVE_SEND=0, the general processor
path) and beside the asyncio answer server; `extra_info["msgs_per_s"]` is the throughput.

SYNC_FLUSH group: 16 sends in flight on one connection against a SYNC_FLUSH broker (each answered
once its record is durable, each answer letting one more send go), against the raw fdatasync/s of
one writer on the same disk (records/s compared).
"""
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from rmq_core.remoting.codes import RequestCode
from rmq_core.remoting.command import RemotingCommand
from tests.servers import NamesrvAndBroker

BODY = b"x" * 128
ROUNDS = 3000

ASYNCIO_ECHO = r"""
import asyncio, socket, struct
HEADER = (b'{"code":0,"extFields":{"msgId":"7F00000100002A9F0000000000000000","queueId":"1",'
          b'"queueOffset":"12","MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"flag":1,"language":"JAVA",'
          b'"opaque":1,"serializeTypeCurrentRPC":"JSON","version":407}')
ANSWER = struct.pack(">ii", 4 + len(HEADER), len(HEADER)) + HEADER

class Answer(asyncio.Protocol):
    def connection_made(self, transport):
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport, self.buf = transport, b""

    def data_received(self, data):
        buf, out = self.buf + data, []
        while len(buf) >= 4:
            (n,) = struct.unpack_from(">i", buf)
            if len(buf) < 4 + n:
                break
            out.append(ANSWER)
            buf = buf[4 + n:]
        self.buf = buf
        if out:
            self.transport.write(b"".join(out))

async def main():
    server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


PIPELINE = 2000


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _recv_frame(s: socket.socket) -> bytes:
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("server closed the connection")
        head += chunk
    (n,) = struct.unpack(">i", head)
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    return bytes(buf)


def _send_frame(i: int) -> bytes:
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {
        "a": "PG_BENCH", "b": "BenchSendRtt", "c": "TBW102", "d": "4", "e": str(i % 4), "f": "0",
        "g": str(int(time.time() * 1000)), "h": "0", "i": f"UNIQ_KEY\x01{i:032X}\x02WAIT\x01true\x02",
        "j": "0", "k": "false", "m": "false"}, BODY).encode()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cluster = NamesrvAndBroker(tmp_path_factory.mktemp("bench-send-rtt"), broker_props={"flushDiskType": "ASYNC_FLUSH"})
    yield int(cluster.broker_addrs[0].rpartition(":")[2])
    cluster.stop()


@pytest.fixture(scope="module")
def broker_without_lane(tmp_path_factory):
    old = os.environ.get("RMQ_NATIVE_SEND")
    os.environ["RMQ_NATIVE_SEND"] = "0"  # inherited by the broker subprocess only
    try:
        cluster = NamesrvAndBroker(tmp_path_factory.mktemp("bench-send-nolane"), broker_props={"flushDiskType": "ASYNC_FLUSH"})
    finally:
        if old is None:
            del os.environ["RMQ_NATIVE_SEND"]
        else:
            os.environ["RMQ_NATIVE_SEND"] = old
    yield int(cluster.broker_addrs[0].rpartition(":")[2])
    cluster.stop()


@pytest.fixture(scope="module")
def asyncio_echo():
    proc = subprocess.Popen([sys.executable, "-c", ASYNCIO_ECHO], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    yield port
    proc.kill()
    proc.wait()


def _pingpong(benchmark, port: int, check) -> None:
    frames = [_send_frame(i) for i in range(ROUNDS + 200)]
    s = _connect(port)
    it = iter(frames)

    def one():
        s.sendall(next(it))
        check(_recv_frame(s))

    try:
        benchmark.pedantic(one, rounds=ROUNDS, warmup_rounds=200)
    finally:
        s.close()
    data = sorted(benchmark.stats.stats.data)
    benchmark.extra_info["p50_us"] = round(data[len(data) // 2] * 1e6, 1)
    benchmark.extra_info["p99_us"] = round(data[int(len(data) * 0.99)] * 1e6, 1)


@pytest.mark.benchmark(group="broker-send-rtt-blocking")
def test_send_rtt_baseline_asyncio_echo(benchmark, asyncio_echo):
    _pingpong(benchmark, asyncio_echo, lambda frame: None)


@pytest.mark.benchmark(group="broker-send-rtt-blocking")
def test_send_rtt_broker_async_flush(benchmark, broker):
    def check(frame):
        response = RemotingCommand.decode(frame)
        assert response.code == 0, response.remark

    _pingpong(benchmark, broker, check)


def _pipelined(benchmark, port: int, check) -> None:
    """PIPELINE frames in one write (a writer thread, so neither side's socket buffer stalls the
    other), then every answer read; the answers are checked after the timing."""
    import threading

    payload = b"".join(_send_frame(i) for i in range(PIPELINE))
    s = _connect(port)
    answers = []

    def one():
        writer = threading.Thread(target=s.sendall, args=(payload,))
        writer.start()
        got = [_recv_frame(s) for _ in range(PIPELINE)]
        writer.join()
        answers.append(got[-1])

    try:
        for _ in range(2):  # warm-up: topic auto-creation and the send cache
            one()
        benchmark.pedantic(one, rounds=15, warmup_rounds=1)
    finally:
        s.close()
    for frame in answers:
        check(frame)
    benchmark.extra_info["msgs_per_s"] = round(PIPELINE / benchmark.stats.stats.median)


def _check_send(frame):
    response = RemotingCommand.decode(frame)
    assert response.code == 0, response.remark


@pytest.mark.benchmark(group="broker-send-pipelined-raw")
def test_send_pipelined_baseline_asyncio_echo(benchmark, asyncio_echo):
    _pipelined(benchmark, asyncio_echo, lambda frame: None)


@pytest.mark.benchmark(group="broker-send-pipelined-raw")
def test_send_pipelined_broker_without_native_lane(benchmark, broker_without_lane):
    _pipelined(benchmark, broker_without_lane, _check_send)


@pytest.mark.benchmark(group="broker-send-pipelined-raw")
def test_send_pipelined_broker_native_lane(benchmark, broker):
    _pipelined(benchmark, broker, _check_send)


# --- SYNC_FLUSH: 16 sends in flight, each answered once durable -------------------------------------
SYNC_WRITERS = 16
SYNC_SENDS = 4000


@pytest.fixture(scope="module")
def sync_broker(tmp_path_factory):
    cluster = NamesrvAndBroker(tmp_path_factory.mktemp("bench-send-sync"), broker_props={"flushDiskType": "SYNC_FLUSH"})
    yield int(cluster.broker_addrs[0].rpartition(":")[2]), cluster.tmp_path
    cluster.stop()


@pytest.mark.benchmark(group="broker-sync-flush-16-in-flight")
def test_sync_send_baseline_fdatasync(benchmark, sync_broker):
    """One durable write at a time on the broker's disk: write 256 bytes + fdatasync."""
    path = os.path.join(str(sync_broker[1]), "raw.log")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        def one():
            os.write(fd, b"r" * 256)
            os.fdatasync(fd)

        benchmark.pedantic(one, rounds=300, warmup_rounds=5)
    finally:
        os.close(fd)
    benchmark.extra_info["records_per_s"] = 1 / benchmark.stats.stats.median


@pytest.mark.benchmark(group="broker-sync-flush-16-in-flight")
def test_sync_send_broker_16_in_flight(benchmark, sync_broker):
    """16 sync sends in flight on one connection, as 16 producers each waiting for its answer:
    every answer (given once the record is durable) lets one more send go."""
    frames = [_send_frame(i) for i in range(SYNC_SENDS + SYNC_WRITERS)]
    s = _connect(sync_broker[0])
    codes = set()

    def run():
        s.sendall(b"".join(frames[:SYNC_WRITERS]))
        sent, got, buf = SYNC_WRITERS, 0, bytearray()
        while got < sent:
            chunk = s.recv(1 << 16)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
            answered = 0
            while len(buf) >= 8:
                (n,) = struct.unpack_from(">i", buf)
                if len(buf) < 4 + n:
                    break
                codes.add(bytes(buf[8:8 + min(n - 4, 12)]).split(b",")[0])
                del buf[:4 + n]
                answered += 1
            got += answered
            more = min(answered, SYNC_SENDS - sent)
            if more > 0:
                s.sendall(b"".join(frames[sent:sent + more]))
                sent += more

    try:
        run()  # warm-up: topic auto-creation and the send cache
        benchmark.pedantic(run, rounds=7, warmup_rounds=1)
    finally:
        s.close()
    assert codes == {b'{"code":0'}, codes  # every send answered SUCCESS (durable)
    benchmark.extra_info["records_per_s"] = SYNC_SENDS / benchmark.stats.stats.median


def test_bench_broker_send_file_is_importable():
    assert os.path.basename(__file__).startswith("test_bench_")
