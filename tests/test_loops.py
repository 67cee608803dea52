"""rmq_core.loops: uvloop by default when installed, the standard loop on request, a clear error
for anything else; both loops run a real broker round trip."""
import asyncio

import pytest

from rmq_core import loops


def test_uvloop_by_default_and_asyncio_on_request(monkeypatch):
    uvloop = pytest.importorskip("uvloop")
    monkeypatch.delenv(loops.ENV, raising=False)
    assert loops.loop_kind() == "uvloop"
    loop = loops.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setenv(loops.ENV, "asyncio")
    loop = loops.new_event_loop()
    try:
        assert loops.loop_kind() == "asyncio" and not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_a_bad_choice_names_the_value(monkeypatch):
    monkeypatch.setenv(loops.ENV, "tokio")
    with pytest.raises(ValueError, match="RMQ_EVENT_LOOP='tokio'"):
        loops.new_event_loop()


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_run_serves_a_request_on_either_loop(monkeypatch, kind):
    if kind == "uvloop":
        pytest.importorskip("uvloop")
    monkeypatch.setenv(loops.ENV, kind)
    from rmq_core.remoting.client import RemotingClient
    from rmq_core.remoting.codes import ResponseCode
    from rmq_core.remoting.command import RemotingCommand
    from rmq_core.remoting.server import RemotingServer

    class Echo:
        async def process_request(self, ctx, request):
            r = request.make_response(ResponseCode.SUCCESS, None)
            r.body = request.body
            return r

    async def main():
        srv = RemotingServer("127.0.0.1:0", name="loops-test")
        srv.register_processor(7001, Echo())
        await srv.start()
        try:
            async with RemotingClient(name="loops-client") as client:
                resp = await client.invoke(srv.listen_address, RemotingCommand.create_request(7001, {}, b"ping"), 5.0)
                return type(asyncio.get_running_loop()).__module__, resp.body
        finally:
            await srv.stop()

    module, body = loops.run(main())
    assert body == b"ping"
    assert module.startswith("uvloop") == (kind == "uvloop")


def test_coalesced_job_serves_a_burst_in_two_runs_and_hands_errors_to_its_waiters():
    import asyncio

    from rmq_core.loops import CoalescedJob

    runs: list[int] = []
    fail = [False]

    async def job():
        runs.append(len(runs))
        await asyncio.sleep(0.01)
        if fail[0]:
            fail[0] = False
            raise OSError("disk full")

    async def main():
        group = CoalescedJob(job, "test")
        first = group.request()  # starts a run at once
        await asyncio.sleep(0)
        burst = [group.request() for _ in range(50)]  # all made while the first run is under way
        await asyncio.gather(first, *burst)
        assert len(runs) == 2
        fail[0] = True
        failed = group.request()
        with pytest.raises(OSError, match="disk full"):
            await failed
        await group.request()  # the next run is served normally
        assert len(runs) == 4
        await group.close()

    asyncio.run(main())
