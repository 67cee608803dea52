"""Every transport passes the same contract (rmq_core.remoting.transport): tcp, inproc and a
test-only Unix-socket transport (tests/remoting/unix_transport.py, registered through the
rmq_transports hook) each carry request/response, oneway, a timeout, a request the server pushes
to its client, a large body, a closed connection and many requests at once through the one
remoting layer (RemotingServer / RemotingClient / ChannelContext) - and each side's request steps
run once per request on every one of them."""
import asyncio
import collections
import os
import tempfile
import uuid

import pytest

from rmq_core.errors import RemotingConnectError, RemotingTimeoutError
from rmq_core.plugins import get_plugin_manager
from rmq_core.remoting import RemotingClient, RemotingCommand, RemotingServer, RequestStep
from rmq_core.remoting.codes import ResponseCode
from tests.client.conftest import make_cluster  # noqa: F401 (a fixture)
from tests.remoting.unix_transport import UnixTransportPlugin

ECHO, HOLD, SINK, ASK_BACK, QUESTION = 1, 2, 3, 4, 307
TRANSPORTS = ["tcp", "inproc", "unix"]


@pytest.fixture(scope="module", autouse=True)
def unix_transport():
    plugin = UnixTransportPlugin()
    get_plugin_manager().register(plugin, name="test-unix-transport")
    yield
    get_plugin_manager().unregister(plugin)


def _address(kind: str) -> str:
    if kind == "tcp":
        return "127.0.0.1:0"
    if kind == "inproc":
        return f"inproc://conf-{uuid.uuid4().hex[:8]}"
    return f"unix://{os.path.join(tempfile.gettempdir(), f'rmq-conf-{uuid.uuid4().hex[:8]}.sock')}"


class _Counting(RequestStep):
    def __init__(self, side):
        self.side, self.seen = side, collections.Counter()

    def before(self, remote_addr, request, connection=None):
        self.seen[self.side, "before", request.opaque] += 1

    def after(self, remote_addr, request, response, connection=None):
        self.seen[self.side, "after", request.opaque] += 1


class _Server:
    def __init__(self, kind, **kw):
        self.oneways = asyncio.Queue()
        self.release = asyncio.Event()
        self.steps = _Counting("broker")
        self.server = RemotingServer(_address(kind), name=f"conf-{kind}", broker=True, request_steps=[self.steps],
                                     **kw)
        self.server.register_processor(ECHO, self._echo)
        self.server.register_processor(HOLD, self._hold)
        self.server.register_processor(SINK, self._sink)
        self.server.register_processor(ASK_BACK, self._ask_back)

    def _echo(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, ext_fields=dict(request.ext_fields), body=request.body)

    async def _hold(self, ctx, request):
        await self.release.wait()
        return request.make_response(ResponseCode.SUCCESS)

    async def _sink(self, ctx, request):
        await self.oneways.put(request)

    async def _ask_back(self, ctx, request):  # a request the server pushes to its client
        answer = await ctx.invoke(RemotingCommand.create_request(QUESTION, {"q": request.get_str("q")}), 5)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"answer": answer.get_str("a")})


async def _pair(kind, **kw):
    s = _Server(kind, **kw)
    await s.server.start()
    steps = _Counting("client")
    client = RemotingClient(name=f"conf-client-{kind}", request_steps=[steps])
    client.register_processor(QUESTION, lambda ctx, r: r.make_response(
        ResponseCode.SUCCESS, ext_fields={"a": r.get_str("q").upper()}))
    return s, client, steps


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_request_response_oneway_push_and_steps(kind):
    s, client, steps = await _pair(kind)
    addr = s.server.listen_address
    try:
        answer = await client.invoke(addr, RemotingCommand.create_request(ECHO, {"k": "v"}, b"body"), 5)
        assert (answer.code, answer.get_str("k"), answer.body) == (ResponseCode.SUCCESS, "v", b"body")
        await client.invoke_oneway(addr, RemotingCommand.create_request(SINK, {"n": "1"}))
        got = await asyncio.wait_for(s.oneways.get(), 10)
        assert got.get_str("n") == "1" and got.is_oneway
        pushed = await client.invoke(addr, RemotingCommand.create_request(ASK_BACK, {"q": "hi"}), 5)
        assert pushed.get_str("answer") == "HI"
        # request_nowait: out at once, the answer through its future
        future = client.request_nowait(addr, RemotingCommand.create_request(ECHO, {"k": "later"}), 5)
        assert future is not None and (await future).get_str("k") == "later"
    finally:
        await client.close()
        await s.server.stop()
    # each side's step ran once per request it sent / served (the push is the client's to serve)
    assert set(steps.seen.values()) == {1} and set(s.steps.seen.values()) == {1}
    sent = {k[2] for k in steps.seen if k[1] == "before"}
    assert len(sent) == 4 and {k[2] for k in s.steps.seen if k[1] == "before"} == sent


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_timeout_then_the_connection_serves_on(kind):
    s, client, _ = await _pair(kind)
    addr = s.server.listen_address
    try:
        with pytest.raises(RemotingTimeoutError, match="no response to"):
            await client.invoke(addr, RemotingCommand.create_request(HOLD), 0.2)
        s.release.set()
        assert (await client.invoke(addr, RemotingCommand.create_request(ECHO, {"k": "v"}), 5)).get_str("k") == "v"
    finally:
        await client.close()
        await s.server.stop()


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_large_body_and_many_requests_at_once(kind):
    s, client, _ = await _pair(kind)
    addr = s.server.listen_address
    try:
        body = bytes(range(256)) * (5 * 4096)  # 5 MiB
        assert (await client.invoke(addr, RemotingCommand.create_request(ECHO, {}, body), 20)).body == body
        answers = await asyncio.gather(*(
            client.invoke(addr, RemotingCommand.create_request(ECHO, {"i": str(i)}, b"x%d" % i), 20) for i in range(300)))
        assert [a.get_str("i") for a in answers] == [str(i) for i in range(300)]
        assert all(a.body == b"x%d" % i for i, a in enumerate(answers))
    finally:
        await client.close()
        await s.server.stop()


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_closed_connection_fails_its_pending_requests_and_a_new_one_connects(kind):
    s, client, _ = await _pair(kind)
    addr = s.server.listen_address
    try:
        held = asyncio.ensure_future(client.invoke(addr, RemotingCommand.create_request(HOLD), 30))
        while not s.server.channels:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        for ctx in s.server.channels:  # the server drops the connection
            ctx.close()
        with pytest.raises(RemotingConnectError, match="closed"):
            await held
        s.release.set()
        answer = await client.invoke(addr, RemotingCommand.create_request(ECHO, {"k": "again"}), 5)
        assert answer.get_str("k") == "again"  # reconnected
    finally:
        await client.close()
        await s.server.stop()


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_frame_above_the_limit_closes_that_connection_only(kind):
    s, client, _ = await _pair(kind, max_frame_length=64 * 1024)
    addr = s.server.listen_address
    try:
        with pytest.raises(RemotingConnectError):
            await client.invoke(addr, RemotingCommand.create_request(ECHO, {}, b"x" * 100_000), 5)
        assert (await client.invoke(addr, RemotingCommand.create_request(ECHO, {"k": "v"}), 5)).get_str("k") == "v"
    finally:
        await client.close()
        await s.server.stop()


def test_a_producer_sends_and_a_consumer_pulls_over_the_unix_transport(make_cluster):
    """The client's thread-driven routes (the producer's pipelined send connection, the blocking
    pool) come from the transport interface too: a transport that only gives a byte stream
    (open_socket) carries them with remoting's own machinery."""
    from rmq_core import Message, Producer, SendStatus
    from rmq_core.remoting.aliases import register_inproc_alias
    from tests.client.conftest import FAST, drain_topic

    # the broker served over a Unix socket too (listenAddresses): the same processors and native send lane
    cluster = make_cluster({"listenAddresses": _address("unix")})
    server, inproc_server = cluster.broker.servers
    tcp_address, unix_address = server.listen_addresses
    assert unix_address.startswith("unix://")
    # clients of the in-proc name server reach the broker through its alias: the Unix socket
    register_inproc_alias(cluster.broker_addr, unix_address)
    p = Producer("PG_UNIX", namesrv=cluster.namesrv, **FAST).start()
    try:
        results = [p.send(Message("UnixT", b"m%d" % i)) for i in range(10)]
        # the producer's connections are the Unix listener's
        assert server.channels and {"unix://" + ctx.channel.local_address for ctx in server.channels} == {unix_address}
    finally:
        p.shutdown()
    assert [r.status for r in results] == [SendStatus.SEND_OK] * 10
    got = drain_topic(cluster.namesrv, "UnixT", "CG_UNIX", want=10)
    assert sorted(m.body for m in got) == sorted(b"m%d" % i for i in range(10))
    assert not inproc_server.channels  # nothing went in-proc to the broker
