"""The remoting hot path: processors run without a task until they suspend, coalesced TCP writes,
frames split across reads, write back-pressure, and the per-channel timeout sweep."""
import asyncio
import struct
import uuid

import pytest

from plugins.transport.tcp import TcpChannel
from rmq_core.errors import RemotingError, RemotingTimeoutError
from rmq_core.remoting import RemotingClient, RemotingCommand, RemotingServer
from rmq_core.remoting.codes import ResponseCode

ECHO, HELD, STEPS, LATE_BOOM, COUNT = 1, 11, 12, 13, 14


def _address(kind: str) -> str:
    return "127.0.0.1:0" if kind == "tcp" else f"inproc://fast-{uuid.uuid4().hex[:8]}"


class Echo:
    """Answers after `sleep` seconds with the request's ext fields and body."""

    async def process_request(self, ctx, request):
        await asyncio.sleep(float(request.get_str("sleep", "0")))
        return request.make_response(ResponseCode.SUCCESS, ext_fields=dict(request.ext_fields), body=request.body)


class Held:
    """Suspends on a future the test resolves; records whether it was cancelled."""

    def __init__(self):
        self.release = None
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

    async def process_request(self, ctx, request):
        self.release = asyncio.get_running_loop().create_future()
        self.started.set()
        try:
            value = await self.release
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"value": value})


class Steps:
    """Suspends in every way asyncio allows (bare yield, a future, a timer, a task) before answering."""

    async def process_request(self, ctx, request):
        await asyncio.sleep(0)
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, "f")
        got = await fut
        await asyncio.sleep(0.001)
        got += await asyncio.create_task(asyncio.sleep(0, result="t"))
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"got": got})


class LateBoom:
    async def process_request(self, ctx, request):
        await asyncio.sleep(0)
        raise ValueError("failed after suspending")


class Count:
    """Answers at once; counts what it saw (order matters)."""

    def __init__(self):
        self.seen = []

    async def process_request(self, ctx, request):
        self.seen.append(request.get_int("i"))
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"i": request.get_str("i")})


@pytest.fixture(params=["tcp", "inproc"])
def transport(request):
    return request.param


async def _server(kind, **kw):
    server = RemotingServer(_address(kind), name="fast", **kw)
    held, count = Held(), Count()
    server.register_processor(ECHO, Echo())
    server.register_processor(HELD, held)
    server.register_processor(STEPS, Steps())
    server.register_processor(LATE_BOOM, LateBoom())
    server.register_processor(COUNT, count)
    await server.start()
    return server, held, count


async def test_processor_finishing_at_once_needs_no_task_and_keeps_arrival_order(transport):
    server, _, count = await _server(transport)
    client = RemotingClient()
    try:
        answers = await asyncio.gather(*(client.invoke(server.listen_address,
                                                       RemotingCommand.create_request(COUNT, {"i": i}), 3)
                                         for i in range(200)))
        assert [a.get_int("i") for a in answers] == list(range(200))
        assert count.seen == list(range(200))  # processed in the order sent
        assert all(ctx.inflight == 0 for ctx in server.channels)  # nothing was left in flight
    finally:
        await client.close()
        await server.stop()


async def test_processor_suspending_every_way_is_resumed_correctly(transport):
    server, _, _ = await _server(transport)
    client = RemotingClient()
    try:
        answers = await asyncio.gather(*(client.invoke(server.listen_address, RemotingCommand.create_request(STEPS), 3)
                                         for _ in range(20)))
        assert {a.get_str("got") for a in answers} == {"ft"}
    finally:
        await client.close()
        await server.stop()


async def test_failure_after_suspending_is_a_system_error(transport):
    server, _, _ = await _server(transport)
    client = RemotingClient()
    try:
        resp = await client.invoke(server.listen_address, RemotingCommand.create_request(LATE_BOOM), 3)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "failed after suspending" in resp.remark
    finally:
        await client.close()
        await server.stop()


async def test_suspended_processor_counts_in_flight_and_cancellation_reaches_it(transport):
    server, held, _ = await _server(transport, max_inflight_per_connection=1)
    client = RemotingClient()
    try:
        call = asyncio.ensure_future(client.invoke(server.listen_address, RemotingCommand.create_request(HELD), 5))
        await asyncio.wait_for(held.started.wait(), 3)
        busy = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO), 3)
        assert busy.code == ResponseCode.SYSTEM_BUSY  # the held one occupies the only slot
        held.release.set_result("done")
        assert (await call).get_str("value") == "done"
        ok = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO), 3)
        assert ok.code == ResponseCode.SUCCESS

        held.started.clear()
        call = asyncio.ensure_future(client.invoke(server.listen_address, RemotingCommand.create_request(HELD), 5))
        await asyncio.wait_for(held.started.wait(), 3)
    finally:
        await server.stop()  # cancels the held processor through its task
        await client.close()
    assert held.cancelled.is_set()
    with pytest.raises(RemotingError):
        await call


async def test_mixed_timeouts_each_fire_on_time(transport):
    server, held, _ = await _server(transport)
    client = RemotingClient()
    try:
        long_call = asyncio.ensure_future(client.invoke(server.listen_address, RemotingCommand.create_request(HELD), 30))
        await asyncio.wait_for(held.started.wait(), 3)
        slow = RemotingCommand.create_request(ECHO, {"sleep": "5"})
        with pytest.raises(RemotingTimeoutError, match=r"within 0.2s"):
            # The 30 s request armed the sweep first; the 0.2 s one must move it earlier.
            await asyncio.wait_for(client.invoke(server.listen_address, slow, 0.2), 3)
        held.release.set_result("late")
        assert (await asyncio.wait_for(long_call, 3)).get_str("value") == "late"
        ok = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"a": "b"}), 3)
        assert ok.get_str("a") == "b"
    finally:
        await client.close()
        await server.stop()


async def test_caller_cancelling_invoke_forgets_the_request(transport):
    server, held, _ = await _server(transport)
    client = RemotingClient()
    try:
        call = asyncio.ensure_future(client.invoke(server.listen_address, RemotingCommand.create_request(HELD), 30))
        await asyncio.wait_for(held.started.wait(), 3)
        ctx = await client.get_channel(server.listen_address)
        assert len(ctx._pending) == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert len(ctx._pending) == 0
        held.release.set_result("nobody listens")  # its late answer is dropped quietly
        ok = await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO, {"x": "y"}), 3)
        assert ok.get_str("x") == "y"
    finally:
        await client.close()
        await server.stop()


async def test_big_and_small_bodies_keep_their_order(transport):
    server, _, _ = await _server(transport)
    client = RemotingClient()
    sizes = [10, 200_000, 0, 70_000, 5, 1_000_000, 64 * 1024, 64 * 1024 - 1, 3]
    try:
        bodies = [bytes([i]) * n if n else None for i, n in enumerate(sizes)]
        answers = await asyncio.gather(*(client.invoke(server.listen_address,
                                                       RemotingCommand.create_request(ECHO, {"i": i}, body), 10)
                                         for i, body in enumerate(bodies)))
        for i, (answer, body) in enumerate(zip(answers, bodies)):
            assert answer.get_int("i") == i and answer.body == body
    finally:
        await client.close()
        await server.stop()


async def test_tcp_body_is_taken_when_sent_not_when_flushed():
    server, _, _ = await _server("tcp")
    client = RemotingClient()
    try:
        await client.invoke(server.listen_address, RemotingCommand.create_request(ECHO), 3)  # connected
        body = bytearray(b"original")
        call = asyncio.ensure_future(client.invoke(server.listen_address,
                                                   RemotingCommand.create_request(ECHO, {}, body), 3))
        await asyncio.sleep(0)  # invoke ran up to its await: the command is queued, not yet flushed
        body[:] = b"mutated!"
        assert (await call).body == b"original"
    finally:
        await client.close()
        await server.stop()


async def test_tcp_pipelined_burst_and_frames_split_at_every_byte():
    server, _, _ = await _server("tcp")
    host, port = server.listen_address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        cmds = [RemotingCommand.create_request(ECHO, {"n": str(i)}, b"b" * (i % 7)) for i in range(60)]
        stream = b"".join(c.encode() for c in cmds)
        writer.write(stream[:40])  # the rest byte by byte, then in one burst
        await writer.drain()
        for i in range(40, 400):
            writer.write(stream[i:i + 1])
            await writer.drain()
        writer.write(stream[400:])
        answers = {}
        while len(answers) < len(cmds):
            (n,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
            resp = RemotingCommand.decode(await reader.readexactly(n))
            answers[resp.opaque] = resp
        for c in cmds:
            assert answers[c.opaque].get_str("n") == c.get_str("n") and (answers[c.opaque].body or b"") == c.body
    finally:
        writer.close()
        await server.stop()


# --- TcpChannel as a Protocol, driven directly ------------------------------------------------------
class FakeTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.written = []
        self.closed = False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def write(self, data):
        self.written.append(bytes(data))

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed


def _channel():
    ch = TcpChannel(1024)
    transport = FakeTransport()
    ch.connection_made(transport)
    return ch, transport


async def test_bytes_and_close_before_start_are_delivered_at_start():
    ch, _ = _channel()
    cmds = [RemotingCommand.create_request(ECHO, {"i": i}) for i in range(3)]
    wire = b"".join(c.encode() for c in cmds)
    ch.data_received(wire[:10])
    ch.data_received(wire[10:])
    ch.connection_lost(None)
    got, closed = [], []
    ch.start(got.append, closed.append)
    assert [c.get_int("i") for c in got] == [0, 1, 2] and closed == [None]
    assert ch.done.done()


async def test_writes_are_coalesced_and_back_pressure_waits():
    ch, transport = _channel()
    ch.start(lambda c: None, lambda r: None)
    a, b, c = (RemotingCommand.create_request(ECHO, {"n": n}) for n in range(3))
    assert ch.send_nowait(a) and ch.send_nowait(b) and ch.send_nowait(c)
    assert transport.written == [a.encode()]  # the first at once, the others at the iteration's end
    await asyncio.sleep(0)
    assert transport.written == [a.encode(), b.encode() + c.encode()]
    assert ch.send_nowait(a)  # a new iteration: at once again
    await asyncio.sleep(0)
    del transport.written[2:]

    ch.pause_writing()  # the transport's buffer passed the high-water mark
    c = RemotingCommand.create_request(ECHO, {"c": 3})
    assert ch.send_nowait(c) is False  # declined: nothing queued
    waiting = asyncio.ensure_future(ch.send(c))
    await asyncio.sleep(0.01)
    assert not waiting.done() and len(transport.written) == 2
    ch.resume_writing()
    await waiting
    await asyncio.sleep(0)
    assert transport.written[-1] == c.encode()

    ch.pause_writing()
    waiting = asyncio.ensure_future(ch.send(c))
    await asyncio.sleep(0)
    ch.close()
    with pytest.raises(RemotingError, match="closed"):
        await waiting
    with pytest.raises(RemotingError):
        ch.send_nowait(c)


async def test_answers_written_inside_a_read_leave_in_one_write():
    ch, transport = _channel()
    n = 32

    def on_command(cmd):
        ch.send_nowait(cmd.make_response(ResponseCode.SUCCESS))

    ch.start(on_command, lambda r: None)
    ch.data_received(b"".join(RemotingCommand.create_request(ECHO, {"i": i}).encode() for i in range(n)))
    assert len(transport.written) == 1  # flushed at the end of the read, once
    data, opaques = transport.written[0], []
    while data:
        (length,) = struct.unpack(">i", data[:4])
        opaques.append(RemotingCommand.decode(data[4:4 + length]).opaque)
        data = data[4 + length:]
    assert len(opaques) == n


async def test_bad_length_closes_with_the_reason():
    ch, transport = _channel()
    reasons = []
    ch.start(lambda c: None, reasons.append)
    ch.data_received(struct.pack(">i", 5000) + b"x" * 8)
    await asyncio.sleep(0)
    assert transport.closed and ch.closed
    assert len(reasons) == 1 and "frame length 5000 outside 4..1024" in str(reasons[0])


async def test_plain_function_and_future_returning_processors(transport):
    server = RemotingServer(_address(transport), name="shapes")

    def plain(ctx, request):  # a callable, not a coroutine function: answers directly
        return request.make_response(ResponseCode.SUCCESS, remark="plain")

    class FutureReturning:
        def process_request(self, ctx, request):
            fut = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(0.01, fut.set_result,
                                                  request.make_response(ResponseCode.SUCCESS, remark="future"))
            return fut

    server.register_processor(21, plain)
    server.register_processor(22, FutureReturning())
    await server.start()
    client = RemotingClient()
    try:
        assert (await client.invoke(server.listen_address, RemotingCommand.create_request(21), 3)).remark == "plain"
        assert (await client.invoke(server.listen_address, RemotingCommand.create_request(22), 3)).remark == "future"
    finally:
        await client.close()
        await server.stop()


async def test_processor_answering_at_once_awaitably_or_raising_with_hooks(transport):
    """ProcessorTable.dispatch: a plain answer, a coroutine answer and a synchronous exception each
    reach the peer, and the request steps of each side see every request and every answer once,
    whichever way it came."""
    from rmq_core.plugins import get_plugin_manager, hookimpl

    seen = []

    class Hooks:
        @hookimpl
        def rmq_client_before_request(self, remote_addr, request):
            seen.append(("before", request.code, request.get_str("mode")))

        @hookimpl
        def rmq_broker_before_request(self, remote_addr, request, connection):
            seen.append(("before", request.code, request.get_str("mode")))

        @hookimpl
        def rmq_client_after_response(self, remote_addr, request, response):
            seen.append(("after", response.code, response.remark))

        @hookimpl
        def rmq_broker_after_response(self, remote_addr, request, response, connection):
            seen.append(("after", response.code, response.remark))

    async def later(request):
        await asyncio.sleep(0.001)
        return request.make_response(ResponseCode.SUCCESS, remark="awaited")

    def mixed(ctx, request):
        mode = request.get_str("mode")
        if mode == "now":
            return request.make_response(ResponseCode.SUCCESS, remark="now")
        if mode == "later":
            return later(request)
        if mode == "none":
            return None
        raise ValueError(f"unknown mode {mode!r}")

    pm = get_plugin_manager()
    hooks = Hooks()
    pm.register(hooks)
    server = RemotingServer(_address(transport), name="mixed", broker=True)
    server.register_processor(31, mixed)
    try:
        await server.start()
        client = RemotingClient()
        try:
            ask = lambda mode: client.invoke(  # noqa: E731
                server.listen_address, RemotingCommand.create_request(31, {"mode": mode}), 3)
            assert (await ask("now")).remark == "now"
            assert (await ask("later")).remark == "awaited"
            boom = await ask("boom")
            assert boom.code == ResponseCode.SYSTEM_ERROR and "unknown mode 'boom'" in boom.remark
            oneway = RemotingCommand.create_request(31, {"mode": "none"})
            await client.invoke_oneway(server.listen_address, oneway)
            assert (await ask("now")).remark == "now"  # the oneway left the connection healthy
        finally:
            await client.close()
        from collections import Counter

        # Each request: the client's and the server's before-hook; each answer: the server's and
        # the client's after-hook — except the synchronous failure (only the client sees its
        # answer, as before) and the oneway (no answer at all).
        assert Counter(seen) == Counter({
            ("before", 31, "now"): 4, ("after", 0, "now"): 4,
            ("before", 31, "later"): 2, ("after", 0, "awaited"): 2,
            ("before", 31, "boom"): 2, ("after", ResponseCode.SYSTEM_ERROR, boom.remark): 1,
            ("before", 31, "none"): 2,
        })
    finally:
        pm.unregister(hooks)
        await server.stop()


async def test_request_nowait_on_answer_sends_the_next_request_inside_the_read(transport):
    """request_nowait puts a request on the wire at once; its on_answer runs in the read that
    brought the answer, before the waiter resumes, and a request it sends there (a consumer's next
    pull) is answered too.  Without an open connection request_nowait sends nothing (None)."""
    server, _, count = await _server(transport)
    client = RemotingClient()
    addr = server.listen_address
    try:
        assert client.request_nowait(addr, RemotingCommand.create_request(COUNT, {"i": 0}), 3) is None
        assert count.seen == []
        await client.invoke(addr, RemotingCommand.create_request(COUNT, {"i": 0}), 3)  # connects
        order, chained = [], []

        def on_answer(resp):
            order.append(("on_answer", resp.get_int("i")))
            chained.append(client.request_nowait(addr, RemotingCommand.create_request(COUNT, {"i": 2}), 3))

        fut = client.request_nowait(addr, RemotingCommand.create_request(COUNT, {"i": 1}), 3, on_answer)
        assert fut is not None and not fut.done()
        resp = await fut
        order.append(("waiter", resp.get_int("i")))
        assert order == [("on_answer", 1), ("waiter", 1)]
        assert (await chained[0]).get_int("i") == 2
        assert count.seen == [0, 1, 2]
        cancelled = client.request_nowait(addr, RemotingCommand.create_request(COUNT, {"i": 3}), 3, on_answer)
        cancelled.cancel()  # a pull the consumer no longer wants: its answer is dropped, on_answer not run
        await client.invoke(addr, RemotingCommand.create_request(COUNT, {"i": 4}), 3)
        assert count.seen == [0, 1, 2, 3, 4] and len(chained) == 1
    finally:
        await client.close()
        await server.stop()
