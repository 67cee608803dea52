"""PipelinedChannel.wait: a thread waiting for an answer reads it itself while no other thread reads
(the read token), hands the token on when its own answer came, never waits forever while another
thread holds it, reads re-entrantly when a completion waits, and hears of a broken or closed
connection - against a real RemotingServer on 127.0.0.1 and raw socket peers."""
import asyncio
import concurrent.futures
import random
import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_core.client.futures import LeanFuture
from rmq_core.errors import RemotingConnectError
from rmq_core.remoting.codes import ResponseCode
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand
from rmq_core.remoting.pipelined import PipelinedChannel
from rmq_core.remoting.server import RemotingServer

ECHO, SLOW = 9201, 9202


class _Echo:
    async def process_request(self, ctx, request):
        resp = request.make_response(ResponseCode.SUCCESS, None)
        resp.ext_fields = {"echo": request.get_str("value", "")}
        return resp


class _Slow:
    async def process_request(self, ctx, request):
        await asyncio.sleep(float(request.get_str("sleep", "1")))
        resp = request.make_response(ResponseCode.SUCCESS, None)
        resp.ext_fields = {"echo": request.get_str("value", "")}
        return resp


async def _end_slow_requests():
    """The _Slow requests still sleeping (their callers gave up) ended before the loop closes."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in rest:
        t.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


@pytest.fixture(scope="module")
def server():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    srv = RemotingServer(["127.0.0.1:0"], name="pipelined-wait-test")
    srv.register_processor(ECHO, _Echo())
    srv.register_processor(SLOW, _Slow())
    asyncio.run_coroutine_threadsafe(srv.start(), loop).result(10)
    yield srv.listen_addresses[0]
    asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(10)
    asyncio.run_coroutine_threadsafe(_end_slow_requests(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


class _Completions:
    """on_done for the channel: the context is the request's LeanFuture; records which thread
    completed it and whether anything was completed twice."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count = {}
        self.thread = {}
        self.futures = []  # kept alive: ids stay unique

    def __call__(self, fut, response, error):
        with self.lock:
            self.count[id(fut)] = self.count.get(id(fut), 0) + 1
            self.futures.append(fut)
            self.thread[id(fut)] = threading.current_thread().name
        fut.finish(response, error)

    def twice(self):
        return [k for k, n in self.count.items() if n != 1]


def _send(ch, out, value, *, sleep=None, timeout=10.0):
    fut = LeanFuture(ch)
    ext = {"value": value}
    if sleep is not None:
        ext["sleep"] = str(sleep)
    ch.send_command(RemotingCommand.create_request(SLOW if sleep is not None else ECHO, ext), timeout, out, fut)
    return fut


def _wait_until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_a_waiting_caller_reads_its_answers_on_its_own_thread(server):
    # the reader leaves answers to a caller that is sending (for up to reader_defer): here all
    ch = PipelinedChannel(server, reader_defer=5.0, name="rmq-pipe-wait")
    out = _Completions()
    try:
        for round_ in range(5):
            futs = [_send(ch, out, f"{round_}-{i}", timeout=10.0) for i in range(30)]
            assert [f.result(10).get_str("echo") for f in futs] == [f"{round_}-{i}" for i in range(30)]
            assert {out.thread[id(f)] for f in futs} == {threading.current_thread().name}
        assert not out.twice() and ch.pending_count == 0 and not ch.closed
    finally:
        ch.close()


def test_answers_nobody_waits_for_are_read_by_the_reader_within_reader_defer(server):
    ch = PipelinedChannel(server, reader_defer=0.05, name="rmq-pipe-unwatched")
    out = _Completions()
    try:
        futs = [_send(ch, out, str(i)) for i in range(40)]
        # nobody calls result(): the reader completes them once the sender has been quiet a while
        assert _wait_until(lambda: all(f.done() for f in futs), 5.0)
        assert {out.thread[id(f)] for f in futs} == {"rmq-pipe-unwatched"}
        assert [f.result(0).get_str("echo") for f in futs] == [str(i) for i in range(40)]
    finally:
        ch.close()


def test_a_waiter_times_out_while_another_thread_holds_the_token_and_others_still_complete(server):
    ch = PipelinedChannel(server, reader_defer=5.0)
    out = _Completions()
    try:
        slow = _send(ch, out, "slow", sleep=0.8)
        holder = concurrent.futures.ThreadPoolExecutor(1)
        held = holder.submit(slow.result, 10)  # this thread takes the token and reads
        assert _wait_until(lambda: ch._token_owner not in (0, -1))
        owner = ch._token_owner
        later = _send(ch, out, "later", sleep=1.5)
        with pytest.raises(concurrent.futures.TimeoutError):
            later.result(0.3)
        with out.lock:  # its own timeout woke it: neither the holder's answer (0.8 s) nor its own came yet
            assert id(slow) not in out.count and id(later) not in out.count
        # an answer that comes while another thread reads reaches its waiter at once
        quick = _send(ch, out, "quick")
        assert quick.result(2).get_str("echo") == "quick"
        assert ch._token_owner == owner and out.thread[id(quick)] != threading.current_thread().name
        assert held.result(5).get_str("echo") == "slow"
        # the token was handed on: the later answer is read by whoever waits for it now
        assert later.result(5).get_str("echo") == "later"
        holder.shutdown()
        assert not out.twice()
    finally:
        ch.close()


def test_the_token_passes_to_a_waiter_when_its_holder_got_its_answer(server):
    ch = PipelinedChannel(server, reader_defer=5.0)
    out = _Completions()
    try:
        first = _send(ch, out, "first", sleep=0.3)
        second = _send(ch, out, "second", sleep=0.8)
        results = {}

        def wait(name, fut):
            results[name] = (fut.result(10).get_str("echo"), threading.current_thread().name)

        a = threading.Thread(target=wait, args=("a", first), name="waiter-a")
        a.start()
        assert _wait_until(lambda: ch._token_owner == a.ident)
        b = threading.Thread(target=wait, args=("b", second), name="waiter-b")
        b.start()
        a.join(5)
        b.join(5)
        assert results == {"a": ("first", "waiter-a"), "b": ("second", "waiter-b")}
        # b slept on its future while a read, then took the token and read its own answer
        assert out.thread[id(first)] == "waiter-a" and out.thread[id(second)] == "waiter-b"
    finally:
        ch.close()


class _CountedWakes(LeanFuture):
    wakes = 0

    def wake(self):
        self.wakes += 1
        super().wake()


def test_a_released_token_wakes_one_waiter_not_every_one(server):
    """Threads sharing a channel wait behind one reading: its release wakes one of them to read on,
    not all (which only had them race for the token and sleep again); the others are woken by
    their answers, and every one gets its own."""
    ch = PipelinedChannel(server, reader_defer=5.0)  # (the reader leaves the answers to the waiters)
    out = _Completions()
    try:
        first = _send(ch, out, "first", sleep=0.3)
        behind = []
        for i in range(6):
            fut = _CountedWakes(ch)
            ch.send_command(RemotingCommand.create_request(SLOW, {"value": f"b{i}", "sleep": "0.8"}), 10.0, out, fut)
            behind.append(fut)
        results = {}

        def wait(name, fut):
            results[name] = fut.result(10).get_str("echo")

        holder = threading.Thread(target=wait, args=("first", first))
        holder.start()
        assert _wait_until(lambda: ch._token_owner == holder.ident)
        threads = [threading.Thread(target=wait, args=(f"b{i}", f)) for i, f in enumerate(behind)]
        for t in threads:
            t.start()
        assert _wait_until(lambda: len(ch._token_waiters) == 6)
        for t in (holder, *threads):
            t.join(10)
        assert results == {"first": "first", **{f"b{i}": f"b{i}" for i in range(6)}}
        assert sum(f.wakes for f in behind) <= 2, [f.wakes for f in behind]  # (all six, woken at once before)
        assert not out.twice() and ch.pending_count == 0
    finally:
        ch.close()


@pytest.mark.parametrize("waiter", ["caller", "reader"])
def test_a_completion_that_waits_for_another_answer_reads_it_itself(server, waiter):
    ch = PipelinedChannel(server, reader_defer=5.0 if waiter == "caller" else 0.0, name="rmq-pipe-nested")
    out = _Completions()
    inner = []
    try:
        outer = LeanFuture(ch)

        def on_outer(fut, response, error):
            # runs on the thread holding the read token, in the middle of a chunk
            f = _send(ch, out, "inner")
            inner.append((f.result(5).get_str("echo"), threading.current_thread().name))
            out(fut, response, error)

        ch.send_command(RemotingCommand.create_request(ECHO, {"value": "outer"}), 10.0, on_outer, outer)
        if waiter == "caller":
            assert outer.result(10).get_str("echo") == "outer"
            assert inner == [("inner", threading.current_thread().name)]
        else:
            assert _wait_until(outer.done, 10.0)
            assert outer.result(0).get_str("echo") == "outer" and inner == [("inner", "rmq-pipe-nested")]
        # the channel goes on as usual afterwards
        assert _send(ch, out, "after").result(5).get_str("echo") == "after"
    finally:
        ch.close()


def test_cancelling_a_future_wakes_its_waiter(server):
    ch = PipelinedChannel(server, reader_defer=5.0)
    out = _Completions()
    try:
        holder_fut = _send(ch, out, "hold", sleep=1.0)
        holder = threading.Thread(target=lambda: holder_fut.exception(10))
        holder.start()
        assert _wait_until(lambda: ch._token_owner not in (0, -1))
        for own_token in (False, True):  # sleeping on the future while another reads / reading itself
            fut = _send(ch, out, "cancelled", sleep=5.0)
            if own_token:
                holder.join(5)
            threading.Timer(0.2, fut.cancel).start()
            with pytest.raises(concurrent.futures.CancelledError):
                fut.result(10)
            with out.lock:  # woken by the cancel, not by the answer (which comes seconds later)
                assert id(fut) not in out.count
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
    """A TCP peer on 127.0.0.1 running `script(conn)` for the one connection it accepts."""

    def __init__(self, script):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.addr = f"127.0.0.1:{self.lsock.getsockname()[1]}"

        def serve():
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            with conn:
                script(conn)

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def close(self):
        self.lsock.close()
        self.thread.join(5)


def test_a_connection_broken_while_a_caller_reads_fails_every_waiter_and_closes_the_socket():
    def script(conn):
        first = _read_frame(conn)
        for _ in range(3):
            _read_frame(conn)
        conn.sendall(_answer(first, echo="first"))
        time.sleep(0.2)  # the caller reads that one and waits for the rest
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr, reader_defer=5.0)
    out = _Completions()
    try:
        futs = [_send(ch, out, str(i)) for i in range(4)]
        assert futs[0].result(5).get_str("echo") == "first"
        for f in futs[1:]:
            with pytest.raises(RemotingConnectError):  # (not TimeoutError: the reset woke it)
                f.result(5)
        assert ch.closed and not out.twice()
        assert _wait_until(lambda: ch._rsock.fileno() == -1 and ch._wsock.fileno() == -1)
        # the next request on the closed channel fails at once
        with pytest.raises(RemotingConnectError):
            _send(ch, out, "after").result(1)
    finally:
        ch.close()
        peer.close()


def test_answers_split_across_reads_and_out_of_order_reach_their_waiters():
    def script(conn):
        requests = [_read_frame(conn) for _ in range(6)]
        data = b"".join(_answer(r, echo=r.get_str("value")) for r in reversed(requests))
        for i in range(0, len(data), 7):  # dribbled: frames span many reads
            conn.sendall(data[i:i + 7])
            time.sleep(0.001)
        time.sleep(0.3)

    peer = _RawPeer(script)
    ch = PipelinedChannel(peer.addr, reader_defer=5.0)
    out = _Completions()
    try:
        futs = [_send(ch, out, f"v{i}") for i in range(6)]
        assert [f.result(5).get_str("echo") for f in futs] == [f"v{i}" for i in range(6)]
    finally:
        ch.close()
        peer.close()


def test_close_with_drain_lets_a_waiting_caller_get_its_answer(server):
    ch = PipelinedChannel(server, reader_defer=5.0)
    out = _Completions()
    fut = _send(ch, out, "drained", sleep=0.3)
    box = {}
    waiter = threading.Thread(target=lambda: box.setdefault("r", fut.result(5)))
    waiter.start()
    assert _wait_until(lambda: ch._token_owner == waiter.ident)
    ch.close(drain_timeout=3.0)
    waiter.join(5)
    assert box["r"].get_str("echo") == "drained"
    # without a drain a waiter hears of the close at once
    ch2 = PipelinedChannel(server, reader_defer=5.0)
    fut2 = _send(ch2, out, "dropped", sleep=5.0)
    threading.Timer(0.2, ch2.close).start()
    with pytest.raises(RemotingConnectError):  # (not TimeoutError: woken by the close, not by its timeout)
        fut2.result(5)


# --- random schedules --------------------------------------------------------------------------------
_plans = st.lists(
    st.lists(st.tuples(st.sampled_from(["wait-each", "burst", "unwatched", "timeout"]),
                       st.integers(1, 12), st.sampled_from([None, 0.0, 0.02, 0.08])),
             min_size=1, max_size=4),
    min_size=1, max_size=5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plans=_plans, reader_defer=st.sampled_from([0.0, 0.0005, 0.002, 0.05]), seed=st.integers(0, 2**16))
def test_many_threads_waiting_and_reading_in_random_schedules_get_exactly_their_answers(
        server, plans, reader_defer, seed):
    """Threads send bursts, wait for each, leave some unwatched, give up on some by a short timeout,
    in random order: every future ends with exactly its own answer (or its waiter's timeout), none
    is completed twice, no thread hangs."""
    ch = PipelinedChannel(server, reader_defer=reader_defer)
    out = _Completions()
    failures = []
    futures = []
    lock = threading.Lock()

    def worker(plan, rnd):
        try:
            for kind, n, sleep in plan:
                futs = [(f"{threading.get_ident()}-{kind}-{i}", None) for i in range(n)]
                futs = [(v, _send(ch, out, v, sleep=sleep)) for v, _ in futs]
                with lock:
                    futures.extend(futs)
                if kind == "unwatched":
                    continue
                if kind == "burst":
                    rnd.shuffle(futs)
                for v, f in futs:
                    if kind == "timeout" and sleep:
                        try:
                            f.result(sleep / 4)
                        except concurrent.futures.TimeoutError:
                            continue
                    if f.result(10).get_str("echo") != v:
                        failures.append((v, f.result(0).get_str("echo")))
                if rnd.random() < 0.3:
                    time.sleep(rnd.random() * 0.003)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))

    rnd = random.Random(seed)
    threads = [threading.Thread(target=worker, args=(p, random.Random(rnd.random()))) for p in plans]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a thread hung"
        assert not failures
        for v, f in futures:  # the unwatched and timed-out ones complete too (the reader, or a later waiter)
            assert f.result(10).get_str("echo") == v
        assert not out.twice() and ch.pending_count == 0 and not ch.closed
    finally:
        ch.close()


class _CountedEvent(threading.Event):
    def __init__(self):
        super().__init__()
        self.waits = 0

    def wait(self, timeout=None):
        self.waits += 1
        return super().wait(timeout)


def test_the_reader_parks_while_a_caller_holds_the_token_long_and_reads_again_when_it_is_let_go(server):
    """A caller holding the read token for long (a long poll's wait) does not have the reader wake
    every reader_defer meanwhile; let go, the reader reads at once what nobody waits for."""
    ch = PipelinedChannel(server, reader_defer=0.002, name="rmq-pipe-parked")
    ch._reader_wake = wake = _CountedEvent()
    out = _Completions()
    try:
        poll = _send(ch, out, "poll", sleep=1.5)
        holder = concurrent.futures.ThreadPoolExecutor(1)
        held = holder.submit(poll.result, 10)  # this thread takes the token and reads for 1.5 s
        assert _wait_until(lambda: ch._token_owner not in (0, -1))
        assert held.result(10).get_str("echo") == "poll"
        # 1.5 s of 2 ms waits would be some 750: the reader waited a few times, then parked
        assert wake.waits < 150, wake.waits
        assert _wait_until(lambda: ch._token_owner == 0)
        unwatched = [_send(ch, out, str(i)) for i in range(5)]  # nobody calls result(): the reader reads
        assert _wait_until(lambda: all(f.done() for f in unwatched), 5.0)
        assert {out.thread[id(f)] for f in unwatched} == {"rmq-pipe-parked"}
        holder.shutdown()
        assert not out.twice()
    finally:
        ch.close()
