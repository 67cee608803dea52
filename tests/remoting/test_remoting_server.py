"""RemotingServer / RemotingClient over real TCP sockets on 127.0.0.1 and over inproc."""
import asyncio
import json
import os
import socket
import struct
import threading
import time
import uuid

import pytest

from rmq_core.errors import PluginNotFoundError, RemotingConnectError, RemotingTimeoutError
from rmq_core.remoting import ChannelContext, RemotingClient, RemotingCommand, RemotingServer, SerializeType
from rmq_core.remoting.codes import ResponseCode
from rmq_core.remoting.command import ManyMessageTransfer

ECHO, SLOW, BOOM, CALLBACK, ONEWAY_SINK, REVERSED, VIEWS = 1, 2, 3, 4, 5, 6, 7


class Echo:
    """Answers after `sleep` seconds with the request's ext fields and body."""

    async def process_request(self, ctx, request):
        await asyncio.sleep(float(request.get_str("sleep", "0")))
        return request.make_response(ResponseCode.SUCCESS, ext_fields=dict(request.ext_fields), body=request.body)


class Reversed:
    """Holds requests until `n` (numbered by ext field i from 0) have arrived, then answers them
    last-numbered first, each once the later one's answer has been handed to the connection."""

    def __init__(self, n):
        self.n = n
        self.turns: dict[int, asyncio.Event] = {}

    async def process_request(self, ctx, request):
        i = request.get_int("i")
        turn = self.turns.setdefault(i, asyncio.Event())
        if len(self.turns) == self.n:
            self.turns[self.n - 1].set()
        await turn.wait()
        if i > 0:  # runs after this answer is written (a processor's answer goes out when it returns)
            asyncio.get_running_loop().call_soon(self.turns[i - 1].set)
        return request.make_response(ResponseCode.SUCCESS, ext_fields=dict(request.ext_fields))


class Boom:
    async def process_request(self, ctx, request):
        raise ValueError("disk on fire")


class Sink:
    def __init__(self):
        self.received = asyncio.Queue()

    async def process_request(self, ctx, request):
        await self.received.put(request)
        return request.make_response(ResponseCode.SUCCESS)


class CallBack:
    """Server -> client: asks the calling client a question and relays its answer."""

    async def process_request(self, ctx, request):
        question = RemotingCommand.create_request(307, {"q": request.get_str("q")})
        answer = await ctx.invoke(question, timeout=3)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"answer": answer.get_str("a")})


def _address(kind: str) -> str:
    return "127.0.0.1:0" if kind == "tcp" else f"inproc://test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["tcp", "inproc"])
def transport(request):
    return request.param


async def _server(kind: str, **kw) -> RemotingServer:
    server = RemotingServer(_address(kind), name="test-server", **kw)
    server.register_processor(ECHO, Echo())
    server.register_processor(BOOM, Boom())
    server.register_processor(CALLBACK, CallBack())
    await server.start()
    return server


async def test_request_response(transport):
    server = await _server(transport)
    client = RemotingClient()
    try:
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"k": 7}, b"payload"), 3)
        assert resp.code == ResponseCode.SUCCESS and resp.is_response
        assert resp.get_int("k") == 7 and resp.body == b"payload"
    finally:
        await client.close()
        await server.stop()


async def test_pipelined_requests_answered_out_of_order_matched_by_opaque(transport):
    server = await _server(transport)
    server.register_processor(REVERSED, Reversed(20))
    client = RemotingClient()
    order = []
    try:
        async def call(i):
            resp = await client.invoke(server.listen_address, RemotingCommand.create_request(REVERSED, {"i": i}), 10)
            order.append(i)
            return resp.get_int("i")

        # 20 requests on one connection; the server answers the last sent first.
        results = await asyncio.gather(*(call(i) for i in range(20)))
        assert results == list(range(20))
        assert order == list(reversed(range(20)))
        assert len(client.connected_addresses()) == 1
    finally:
        await client.close()
        await server.stop()


async def test_slow_processor_does_not_block_fast_one_on_same_connection(transport):
    server = await _server(transport)
    server.register_processor(SLOW, Echo())
    client = RemotingClient()
    try:
        slow = asyncio.ensure_future(client.invoke(
            server.listen_address, RemotingCommand.create_request(SLOW, {"sleep": 2}), 5))
        await asyncio.sleep(0.05)
        fast = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"n": 1}), 5)
        assert fast.get_int("n") == 1
        assert not slow.done()  # the fast answer overtook the held one
        slow.cancel()
    finally:
        await client.close()
        await server.stop()


async def test_timeout_names_address_and_connection_stays_usable(transport):
    server = await _server(transport)
    client = RemotingClient()
    try:
        with pytest.raises(RemotingTimeoutError) as err:
            await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"sleep": 1}), 0.1)
        assert server.listen_address in str(err.value)
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"x": "y"}), 3)
        assert resp.get_str("x") == "y"
    finally:
        await client.close()
        await server.stop()


async def test_oneway_gets_no_response(transport, monkeypatch):
    server = await _server(transport)
    sink = Sink()
    server.register_processor(ONEWAY_SINK, sink)
    client = RemotingClient()
    answers = []
    original = ChannelContext._on_command

    def spy(self, cmd):  # sees every command either side receives
        if cmd.is_response:
            answers.append(cmd)
        return original(self, cmd)

    monkeypatch.setattr(ChannelContext, "_on_command", spy)
    try:
        await client.invoke_oneway(server.listen_address, RemotingCommand.create_request(ONEWAY_SINK, {"n": 1}))
        got = await asyncio.wait_for(sink.received.get(), 3)
        assert got.get_int("n") == 1 and got.is_oneway
        # a normal request afterwards is answered, and nothing arrived for the oneway
        await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO), 3)
        assert [a.code for a in answers] == [ResponseCode.SUCCESS]
    finally:
        await client.close()
        await server.stop()


async def test_server_to_client_invoke(transport):
    server = await _server(transport)
    client = RemotingClient()

    class Answer:
        async def process_request(self, ctx, request):
            return request.make_response(ResponseCode.SUCCESS, ext_fields={"a": request.get_str("q").upper()})

    client.register_processor(307, Answer())
    try:
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(CALLBACK, {"q": "hi"}), 5)
        assert resp.get_str("answer") == "HI"
    finally:
        await client.close()
        await server.stop()


async def test_server_oneway_to_client_and_channel_lookup(transport):
    server = await _server(transport)
    client = RemotingClient()
    sink = Sink()
    client.register_processor(40, sink)
    try:
        await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO), 3)
        (ctx,) = server.channels
        await ctx.invoke_oneway(RemotingCommand.create_request(40, {"consumerGroup": "G"}))
        got = await asyncio.wait_for(sink.received.get(), 3)
        assert got.get_str("consumerGroup") == "G" and got.flag == 2
    finally:
        await client.close()
        await server.stop()


async def test_unknown_code_and_processor_error(transport):
    server = await _server(transport)
    client = RemotingClient()
    try:
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(9999), 3)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in resp.remark
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(BOOM), 3)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "disk on fire" in resp.remark
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"a": 1}), 3)
        assert resp.code == ResponseCode.SUCCESS  # same connection still serves
    finally:
        await client.close()
        await server.stop()


async def test_reject_request_gives_system_busy(transport):
    server = await _server(transport)

    class Busy(Echo):
        def reject_request(self):
            return True

    server.register_processor(SLOW, Busy())
    client = RemotingClient()
    try:
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(SLOW), 3)
        assert resp.code == ResponseCode.SYSTEM_BUSY
    finally:
        await client.close()
        await server.stop()


async def test_too_many_in_flight_requests_get_system_busy(transport):
    server = await _server(transport, max_inflight_per_connection=3)
    client = RemotingClient()
    try:
        calls = [client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"sleep": 0.3}), 5)
                 for _ in range(6)]
        codes = sorted(r.code for r in await asyncio.gather(*calls))
        assert codes == [0, 0, 0, 2, 2, 2]
    finally:
        await client.close()
        await server.stop()


async def test_binary_request_answered_in_binary(transport):
    server = await _server(transport)
    client = RemotingClient()
    try:
        req = RemotingCommand.create_request(ECHO, {"k": "v"}, b"b")
        req.serialize_type = SerializeType.ROCKETMQ
        resp = await client.invoke(server.listen_address, req, 3)
        assert resp.serialize_type == SerializeType.ROCKETMQ and resp.get_str("k") == "v" and resp.body == b"b"
    finally:
        await client.close()
        await server.stop()


async def test_connection_close_callbacks_and_pending_failures(transport):
    server = await _server(transport)
    server.register_processor(SLOW, Echo())
    client = RemotingClient()
    closed_server_side, closed_client_side = asyncio.Event(), asyncio.Event()
    server.on_channel_close.append(lambda ctx: closed_server_side.set())
    client.on_channel_close.append(lambda ctx: closed_client_side.set())
    try:
        pending = asyncio.ensure_future(client.invoke(
            server.listen_address, RemotingCommand.create_request(SLOW, {"sleep": 10}), 10))
        await asyncio.sleep(0.05)
        server.channels[0].close()
        with pytest.raises(RemotingConnectError, match="closed"):
            await pending
        await asyncio.wait_for(closed_server_side.wait(), 3)
        await asyncio.wait_for(closed_client_side.wait(), 3)
        # the client reconnects on the next call
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"n": 2}), 3)
        assert resp.get_int("n") == 2
    finally:
        await client.close()
        await server.stop()


async def test_connect_errors_name_the_address(transport):
    client = RemotingClient(connect_timeout=1)
    if transport == "tcp":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            addr = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
    else:
        addr = "inproc://nobody-listens-here"
    try:
        with pytest.raises(RemotingConnectError) as err:
            await client.invoke(addr, RemotingCommand.create_request(ECHO), 2)
        assert addr.split("://")[-1] in str(err.value)
    finally:
        await client.close()


async def test_unknown_scheme_lists_available():
    with pytest.raises(PluginNotFoundError) as err:
        RemotingServer("carrier-pigeon://x")
    assert "inproc" in str(err.value) and "tcp" in str(err.value) and "carrier-pigeon" in str(err.value)
    client = RemotingClient()
    with pytest.raises(PluginNotFoundError):
        await client.invoke("carrier-pigeon://x", RemotingCommand.create_request(ECHO), 1)


async def test_tcp_scheme_prefix_and_stop_is_clean():
    server = RemotingServer("tcp://127.0.0.1:0")
    server.register_processor(ECHO, Echo())
    await server.start()
    client = RemotingClient()
    try:
        resp = await client.invoke("tcp://" + server.listen_address, RemotingCommand.create_request(ECHO, {"a": "b"}), 3)
        assert resp.get_str("a") == "b"
    finally:
        await client.close()
        await server.stop()
    with pytest.raises(RemotingConnectError):
        await RemotingClient(connect_timeout=1).invoke(server.listen_address, RemotingCommand.create_request(ECHO), 1)


# --- TCP robustness: bad frames close only the offending connection -----------------------------------
async def _raw_exchange(addr: str, payload: bytes) -> bytes:
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(), 3)  # until the server closes
    finally:
        writer.close()
    return data


@pytest.mark.parametrize("payload", [
    struct.pack(">i", 0x7FFFFFF0) + b"\x00" * 16,  # absurd length
    struct.pack(">i", -5),  # negative length
    struct.pack(">i", 2) + b"\x00\x00",  # shorter than the header-length field
    struct.pack(">iI", 12, 8) + b"{not json",  # bad JSON header
    struct.pack(">iI", 10, 6) + b'{"a":1}',  # header without code
    struct.pack(">iI", 8, 0x05000004) + b"abcd",  # unknown serialize type
], ids=["absurd-length", "negative-length", "too-short", "bad-json", "no-code", "bad-type"])
async def test_bad_frame_closes_that_connection_only(payload):
    server = await _server("tcp")
    client = RemotingClient()
    try:
        await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO), 3)
        data = await _raw_exchange(server.listen_address, payload)
        assert data == b""  # closed without an answer
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"still": 1}), 3)
        assert resp.get_int("still") == 1
    finally:
        await client.close()
        await server.stop()


async def test_raw_cpp_style_request_gets_json_string_fields():
    server = await _server("tcp")
    try:
        header = (json.dumps({"code": ECHO, "extFields": {"queueId": 3, "topic": "T"}, "flag": 0,
                              "language": "CPP", "opaque": 0, "remark": "", "version": 63},
                             sort_keys=True, separators=(",", ":")) + "\n").encode()
        frame = struct.pack(">iI", 4 + len(header), len(header)) + header
        host, port = server.listen_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(frame)
        (length,) = struct.unpack(">i", await reader.readexactly(4))
        body = await reader.readexactly(length)
        writer.close()
        (len_and_type,) = struct.unpack(">I", body[:4])
        assert len_and_type >> 24 == 0
        resp_header = json.loads(body[4:4 + len_and_type])
        assert resp_header["opaque"] == 0 and resp_header["flag"] == 1
        assert resp_header["extFields"] == {"queueId": "3", "topic": "T"}
    finally:
        await server.stop()


# --- inproc specifics -------------------------------------------------------------------------------
async def test_inproc_receiver_does_not_see_sender_mutation():
    server = RemotingServer(_address("inproc"))
    seen = asyncio.Queue()

    class Keep:
        async def process_request(self, ctx, request):
            await seen.put(request)
            return request.make_response(ResponseCode.SUCCESS)

    server.register_processor(ECHO, Keep())
    await server.start()
    client = RemotingClient()
    try:
        body = bytearray(b"original")
        req = RemotingCommand.create_request(ECHO, {"k": "v1"}, body)
        call = asyncio.ensure_future(client.invoke(server.listen_address, req, 3))
        await asyncio.sleep(0)  # the command has been handed over
        req.ext_fields["k"] = "v2"
        body[:] = b"mutated!"
        await call
        got = await seen.get()
        assert got.get_str("k") == "v1" and got.body == b"original"
    finally:
        await client.close()
        await server.stop()


def test_inproc_across_event_loops_in_different_threads():
    name = f"inproc://xloop-{uuid.uuid4().hex[:8]}"
    ready, stop = threading.Event(), threading.Event()
    box = {}

    def serve():
        async def main():
            server = RemotingServer(name)
            server.register_processor(ECHO, Echo())
            server.register_processor(CALLBACK, CallBack())
            await server.start()
            box["server_thread"] = threading.get_ident()
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
            await server.stop()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(5)

    class Answer:
        async def process_request(self, ctx, request):
            return request.make_response(ResponseCode.SUCCESS,
                                         ext_fields={"a": f"{request.get_str('q')}@{threading.get_ident()}"})

    async def client_side():
        client = RemotingClient()
        client.register_processor(307, Answer())
        try:
            results = await asyncio.gather(*(
                client.invoke(name, RemotingCommand.create_request(ECHO, {"i": i, "sleep": (5 - i) * 0.01}), 5)
                for i in range(5)))
            assert [r.get_int("i") for r in results] == list(range(5))
            resp = await client.invoke(name, RemotingCommand.create_request(CALLBACK, {"q": "x"}), 5)
            # the client's processor ran on the client's own thread
            assert resp.get_str("answer") == f"x@{threading.get_ident()}"
        finally:
            await client.close()

    try:
        asyncio.run(client_side())
        assert box["server_thread"] != threading.get_ident()
    finally:
        stop.set()
        thread.join(5)


async def test_inproc_name_in_use_and_freed_after_stop():
    addr = _address("inproc")
    first = RemotingServer(addr)
    await first.start()
    second = RemotingServer(addr)
    with pytest.raises(Exception, match="already in use"):
        await second.start()
    await first.stop()
    await second.start()
    await second.stop()


async def test_rpc_hooks_from_plugins_see_requests_and_responses():
    from rmq_core.plugins import get_plugin_manager, hookimpl

    seen = []

    class AclLikePlugin:
        @hookimpl
        def rmq_client_before_request(self, remote_addr, request):
            request.ext_fields.setdefault("Signature", "signed")
            seen.append(("client before", request.code))

        @hookimpl
        def rmq_broker_before_request(self, remote_addr, request, connection):
            seen.append(("broker before", request.code, request.ext_fields.get("Signature")))

        @hookimpl
        def rmq_client_after_response(self, remote_addr, request, response):
            seen.append(("client after", response.code))

        @hookimpl
        def rmq_broker_after_response(self, remote_addr, request, response, connection):
            seen.append(("broker after", response.code))

    pm = get_plugin_manager()
    plugin = AclLikePlugin()
    pm.register(plugin)
    try:
        server = await _server("tcp", broker=True)
        client = RemotingClient()
        try:
            resp = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"a": 1}), 3)
            assert resp.get_str("Signature") == "signed"  # added by the client-side hook, echoed back
            assert seen == [("client before", ECHO), ("broker before", ECHO, "signed"), ("broker after", 0),
                            ("client after", 0)]
        finally:
            await client.close()
            await server.stop()
    finally:
        pm.unregister(plugin)


async def test_large_bodies_round_trip(transport):
    server = await _server(transport)
    client = RemotingClient()
    try:
        body = bytes(range(256)) * (6 * 4096)  # 6 MiB, beyond the stream reader's buffer limit
        results = await asyncio.gather(*(
            client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"i": i}, body), 20)
            for i in range(3)))
        assert all(r.body == body for r in results)
    finally:
        await client.close()
        await server.stop()


class Views:
    """Answers with a body of views of one buffer (as a pull answer sends the mapped log):
    ext field `parts` views of `size` bytes each, back to back."""

    def __init__(self, data):
        self.data = data

    async def process_request(self, ctx, request):
        n, size = request.get_int("parts"), request.get_int("size")
        view = memoryview(self.data).toreadonly()
        buffers = [view[i * size:(i + 1) * size] for i in range(n)]
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"i": request.get_str("i")},
                                     body=ManyMessageTransfer(buffers, n * size))


async def test_body_of_many_buffers_arrives_whole_and_in_order(transport):
    """Bodies of several buffers (views, never joined on the way) beside small answers, more than
    the socket takes at once: each arrives exactly, every answer to its request."""
    data = os.urandom(1 << 22)
    server = await _server(transport)
    server.register_processor(VIEWS, Views(data))
    client = RemotingClient()
    try:
        calls = [client.invoke(server.listen_address, RemotingCommand.create_request(
                     VIEWS, {"i": i, "parts": 1 + i % 4, "size": (1 << 20) - i}), 20) if i % 2 == 0 else
                 client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"i": i}, b"small-%d" % i), 20)
                 for i in range(12)]
        for i, r in enumerate(await asyncio.gather(*calls)):
            assert r.code == ResponseCode.SUCCESS and r.get_int("i") == i
            if i % 2 == 0:
                parts, size = 1 + i % 4, (1 << 20) - i
                assert r.body == b"".join(data[k * size:(k + 1) * size] for k in range(parts))
            else:
                assert r.body == b"small-%d" % i
    finally:
        await client.close()
        await server.stop()


async def test_frame_above_server_limit_closes_connection(transport):
    server = await _server(transport, max_frame_length=64 * 1024)
    client = RemotingClient()
    try:
        with pytest.raises(RemotingConnectError):
            await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {}, b"x" * 100_000), 5)
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {}, b"x" * 1000), 5)
        assert len(resp.body) == 1000  # a new connection, within the limit, works
    finally:
        await client.close()
        await server.stop()


async def test_one_server_on_tcp_and_inproc_at_once():
    inproc = _address("inproc")
    server = RemotingServer(["127.0.0.1:0", inproc], name="dual")
    server.register_processor(ECHO, Echo())
    await server.start()
    client = RemotingClient()
    try:
        assert server.listen_addresses[1] == inproc and server.listen_address == server.listen_addresses[0]
        for addr in server.listen_addresses:
            resp = await client.invoke(addr, RemotingCommand.create_request(ECHO, {"via": addr}), 3)
            assert resp.get_str("via") == addr
        assert len(server.channels) == 2
    finally:
        await client.close()
        await server.stop()
    # a listener that cannot start releases the ones already bound
    taken = RemotingServer(inproc)
    await taken.start()
    clash = RemotingServer(["127.0.0.1:0", inproc])
    with pytest.raises(Exception, match="already in use"):
        await clash.start()
    assert not clash.started
    await taken.stop()


async def test_same_command_sent_twice_concurrently_gets_both_answers(transport):
    server = await _server(transport)
    client = RemotingClient()
    try:
        req = RemotingCommand(ECHO, opaque=5, ext_fields={"sleep": "0.05"})
        again = RemotingCommand(ECHO, opaque=5, ext_fields={"sleep": "0"})
        a, b = await asyncio.gather(client.invoke(server.listen_address, req, 3),
                                    client.invoke(server.listen_address, again, 3))
        assert a.get_str("sleep") == "0.05" and b.get_str("sleep") == "0"
    finally:
        await client.close()
        await server.stop()


async def test_server_stop_fails_held_requests_fast_and_cancels_processors(transport):
    server = await _server(transport)
    cancelled = asyncio.Event()

    class LongPoll:
        async def process_request(self, ctx, request):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    server.register_processor(SLOW, LongPoll())
    client = RemotingClient()
    try:
        held = asyncio.ensure_future(client.invoke(server.listen_address, RemotingCommand.create_request(SLOW), 30))
        await asyncio.sleep(0.05)
        await server.stop()
        with pytest.raises(RemotingConnectError):
            await asyncio.wait_for(held, 5)  # not after the 30 s timeout
        assert cancelled.is_set()
    finally:
        await client.close()


async def test_client_close_fails_its_pending_requests(transport):
    server = await _server(transport)
    server.register_processor(SLOW, Echo())
    client = RemotingClient()
    try:
        held = asyncio.ensure_future(client.invoke(server.listen_address,
                                                   RemotingCommand.create_request(SLOW, {"sleep": 30}), 30))
        deadline = time.monotonic() + 20
        while not client.is_connected(server.listen_address):  # (a close before the connect is another case)
            assert time.monotonic() < deadline, "the client never connected"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        await client.close()
        with pytest.raises(RemotingConnectError):
            await asyncio.wait_for(held, 5)
        with pytest.raises(RemotingConnectError, match="closed"):
            await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO), 1)
    finally:
        await server.stop()
