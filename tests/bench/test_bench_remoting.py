"""Remoting round trips and the frame codec, each beside a baseline measured in the same run.

* roundtrip (group remoting-roundtrip): 100 sequential small request/response pairs on one
  connection.  Baseline: a bare asyncio-streams ping-pong of the same frame size (4-byte length
  prefix, echo server, no header parsing, no opaque matching).  Ours: RemotingClient.invoke to a
  RemotingServer over TCP, and over inproc.
* pipelined (group remoting-pipelined): 64 requests in flight on one connection.  Baseline: the
  bare echo server fed 64 frames at once.
* codec (group remoting-codec): encode + decode of a C++-style SEND response header.  Baseline:
  json.dumps + json.loads of the same header dict; beside ours (the native codec) the pure-Python
  reference codec it falls back to.
* read path (group remoting-read): split one TCP read of 64 pipelined SEND_MESSAGE_V2 frames and
  decode them, native vs the pure-Python reference.
"""
import asyncio
import json
import struct

import pytest

from rmq_core.remoting import RemotingClient, RemotingCommand, RemotingServer
from rmq_core.remoting.codes import ResponseCode

BATCH = 100


class _Echo:
    async def process_request(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"offset": "42"})


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _small_request() -> RemotingCommand:
    return RemotingCommand.create_request(14, {"consumerGroup": "CID_BENCH", "topic": "BenchTopic", "queueId": 1})


@pytest.mark.benchmark(group="remoting-roundtrip")
def test_roundtrip_baseline_bare_socket_pingpong(benchmark, loop):
    frame = _small_request().encode()  # same bytes on the wire as a real request

    async def handle(reader, writer):
        try:
            while True:
                (n,) = struct.unpack(">i", await reader.readexactly(4))
                writer.write(struct.pack(">i", n) + await reader.readexactly(n))
        except asyncio.IncompleteReadError:
            writer.close()

    async def setup():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return server, reader, writer

    server, reader, writer = loop.run_until_complete(setup())

    async def batch():
        for _ in range(BATCH):
            writer.write(frame)
            (n,) = struct.unpack(">i", await reader.readexactly(4))
            await reader.readexactly(n)

    try:
        benchmark(lambda: loop.run_until_complete(batch()))
        benchmark.extra_info["roundtrips_per_call"] = BATCH
    finally:
        writer.close()
        server.close()
        loop.run_until_complete(server.wait_closed())


@pytest.mark.parametrize("kind", ["tcp", "inproc"])
@pytest.mark.benchmark(group="remoting-roundtrip")
def test_roundtrip_remoting_invoke(benchmark, loop, kind):
    async def setup():
        server = RemotingServer("127.0.0.1:0" if kind == "tcp" else "inproc://bench-roundtrip")
        server.register_processor(14, _Echo())
        await server.start()
        client = RemotingClient()
        await client.invoke(server.listen_address, _small_request(), 5)  # connect outside the timing
        return server, client

    server, client = loop.run_until_complete(setup())

    async def batch():
        for _ in range(BATCH):
            resp = await client.invoke(server.listen_address, _small_request(), 5)
        assert resp.get_int("offset") == 42

    try:
        benchmark(lambda: loop.run_until_complete(batch()))
        benchmark.extra_info["roundtrips_per_call"] = BATCH
    finally:
        loop.run_until_complete(client.close())
        loop.run_until_complete(server.stop())


PIPELINE = 64


@pytest.mark.benchmark(group="remoting-pipelined")
def test_pipelined_baseline_bare_socket(benchmark, loop):
    """64 frames written back to back, then 64 echoes read: the bare-socket ceiling for pipelining."""
    frame = _small_request().encode()

    async def handle(reader, writer):
        try:
            while True:
                (n,) = struct.unpack(">i", await reader.readexactly(4))
                writer.write(struct.pack(">i", n) + await reader.readexactly(n))
        except asyncio.IncompleteReadError:
            writer.close()

    async def setup():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        return server, reader, writer

    server, reader, writer = loop.run_until_complete(setup())

    async def batch():
        writer.write(frame * PIPELINE)
        for _ in range(PIPELINE):
            (n,) = struct.unpack(">i", await reader.readexactly(4))
            await reader.readexactly(n)

    try:
        benchmark(lambda: loop.run_until_complete(batch()))
        benchmark.extra_info["requests_per_call"] = PIPELINE
    finally:
        writer.close()
        server.close()
        loop.run_until_complete(server.wait_closed())


@pytest.mark.benchmark(group="remoting-pipelined")
def test_pipelined_remoting_invoke_tcp(benchmark, loop):
    """64 concurrent invokes on one connection, matched by opaque."""
    async def setup():
        server = RemotingServer("127.0.0.1:0")
        server.register_processor(14, _Echo())
        await server.start()
        client = RemotingClient()
        await client.invoke(server.listen_address, _small_request(), 5)
        return server, client

    server, client = loop.run_until_complete(setup())

    async def batch():
        results = await asyncio.gather(*(client.invoke(server.listen_address, _small_request(), 5)
                                         for _ in range(PIPELINE)))
        assert len(results) == PIPELINE

    try:
        benchmark(lambda: loop.run_until_complete(batch()))
        benchmark.extra_info["requests_per_call"] = PIPELINE
    finally:
        loop.run_until_complete(client.close())
        loop.run_until_complete(server.stop())


_HEADER = {"code": 0, "extFields": {"msgId": "7F00000100002A9F00000000000007E7", "queueId": "3",
                                    "queueOffset": "1234", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"},
           "flag": 1, "language": "JAVA", "opaque": 77, "serializeTypeCurrentRPC": "JSON", "version": 407}


@pytest.mark.benchmark(group="remoting-codec")
def test_codec_baseline_json_dumps_loads(benchmark):
    def run():
        text = json.dumps(_HEADER, separators=(",", ":")).encode()
        return json.loads(text)

    assert benchmark(run)["opaque"] == 77


@pytest.mark.benchmark(group="remoting-codec")
def test_codec_remoting_command_encode_decode(benchmark):
    cmd = RemotingCommand.create_response(0, ext_fields=_HEADER["extFields"], opaque=77)

    def run():
        return RemotingCommand.decode(memoryview(cmd.encode())[4:])

    assert benchmark(run).opaque == 77


@pytest.mark.benchmark(group="remoting-codec")
def test_codec_python_reference_encode_decode(benchmark):
    cmd = RemotingCommand.create_response(0, ext_fields=_HEADER["extFields"], opaque=77)

    def run():
        return RemotingCommand.decode_py(memoryview(cmd.encode_header_py(0))[4:])

    assert benchmark(run).opaque == 77


def _send_v2_frames(n: int) -> bytes:
    return b"".join(RemotingCommand.create_request(310, {
        "a": "PG_BENCH", "b": "BenchSend", "c": "TBW102", "d": "4", "e": str(i % 4), "f": "0",
        "g": "1700000000000", "h": "0", "i": "UNIQ_KEY\x01BENCH\x02WAIT\x01true\x02", "j": "0",
        "k": "false", "m": "false"}, b"x" * 128).encode() for i in range(n))


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.benchmark(group="remoting-read")
def test_read_path_split_and_decode_64_frames(benchmark, impl):
    from rmq_core.remoting import frames

    data = _send_v2_frames(PIPELINE)
    split = frames.split_frames if impl == "native" else frames.split_frames_py
    decode = RemotingCommand.decode if impl == "native" else RemotingCommand.decode_py

    def run():
        got, consumed = split(data, 1 << 24)
        return [decode(f) for f in got]

    cmds = benchmark(run)
    assert len(cmds) == PIPELINE and cmds[-1].get_str("b") == "BenchSend" and len(cmds[0].body) == 128
    benchmark.extra_info["frames_per_call"] = PIPELINE
