"""Fixtures for client tests: a real embedded name server + broker (in-proc and TCP addresses),
short client timers, and a thread-leak check."""
import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

# Short timers so rebalances, heartbeats and offset flushes happen within a test.
FAST = dict(poll_name_server_interval=1.0, heartbeat_broker_interval=1.0, persist_consumer_offset_interval=0.5)
FAST_CONSUMER = dict(rebalance_interval=1.0, pull_time_delay_when_exception=0.2, **FAST)

SMALL_BROKER = {
    "mappedFileSizeCommitLog": str(4 * 1024 * 1024),
    "mappedFileSizeConsumeQueue": str(1000 * 20),
    "maxHashSlotNum": "1000",
    "maxIndexNum": "4000",
    "messageDelayLevel": "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
    "enablePropertyFilter": "true",
    "registerNameServerPeriod": "1000",
    "rebalanceLockMaxLiveTime": "3000",
}


def wait_until(pred, timeout=20.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


CHILD_CONSUMER = textwrap.dedent("""
    import itertools, json, os, signal, sys, time
    from rmq_core import PushConsumer, ConsumeStatus
    namesrv, group, topic, out_path, options = sys.argv[1:6]
    options = json.loads(options)
    pause = options.pop("listener_sleep_per_message", 0.0)
    kill_after = options.pop("kill_after", 0)
    consumed = itertools.count(1)
    out = open(out_path, "a", buffering=1)
    def listener(msgs):
        for m in msgs:
            out.write(f"{m.body.decode()} {m.queue_id} {m.queue_offset}\\n")
            if next(consumed) == kill_after:  # SIGKILL ourselves inside a listener call
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(pause)
        return ConsumeStatus.CONSUME_SUCCESS
    c = PushConsumer(group, namesrv=namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     rebalance_interval=1.0, heartbeat_broker_interval=1.0, poll_name_server_interval=1.0,
                     **options)
    c.subscribe(topic, "*")
    c.register_message_listener(listener)
    c.start()
    print("READY", flush=True)
    while True:
        time.sleep(1)
""")


class ChildConsumer:
    """A PushConsumer in a child process (for real SIGKILLs) that appends one line per consumed
    message to `out`: body, queue id, queue offset.  `options` go to PushConsumer, plus
    listener_sleep_per_message and kill_after (the child SIGKILLs itself in the listener call of
    its kill_after-th message)."""

    def __init__(self, tmp_path, namesrv, group, topic, **options):
        self.script = tmp_path / "child_consumer.py"
        self.script.write_text(CHILD_CONSUMER)
        self.out = tmp_path / f"consumed-{group}.txt"
        self.args = [sys.executable, str(self.script), namesrv, group, topic, str(self.out), json.dumps(options)]
        self.proc = None

    def spawn(self, **options) -> "ChildConsumer":
        """Start the child; `options` replace the constructor's for this run."""
        args = self.args if not options else self.args[:-1] + [json.dumps({**json.loads(self.args[-1]), **options})]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
        assert self.proc.stdout.readline().strip() == "READY"
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def lines(self) -> list[tuple[str, int, int]]:
        """(body, queue id, queue offset) of every consumption so far."""
        text = self.out.read_text() if self.out.exists() else ""
        return [(b, int(q), int(o)) for b, q, o in (line.split() for line in text.splitlines() if line.count(" ") == 2)]


def drain_topic(namesrv, topic, group, want, timeout=20.0):
    """Every message of `topic` a new lite pull consumer group reads from the start, until `want`
    arrived or `timeout` passed."""
    from rmq_core import PullConsumer

    got = []
    c = PullConsumer(group, namesrv=namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
    c.subscribe(topic, "*")
    with c:
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            got += c.poll(0.2)
    return got


@pytest.fixture
def make_cluster(tmp_path):
    from rmq_core.embedded import Cluster

    started = []

    def make(config=None, **overrides):
        c = Cluster(str(tmp_path / f"store{len(started)}"), {**SMALL_BROKER, **(config or {})}, **overrides)
        c.start()
        started.append(c)
        # the broker registers with the name server on a timer; wait until its routes are served
        from tests.rawclient import RawClient
        raw = RawClient("route-check")
        try:
            wait_until(lambda: raw.route(c.tcp_namesrv, "TBW102")[0].code == 0, timeout=15,
                       what="the broker's routes on the name server")
        finally:
            raw.close()
        return c

    yield make
    for c in started:
        c.stop()


@pytest.fixture
def cluster(make_cluster):
    return make_cluster()


@pytest.fixture(params=["inproc", "tcp"])
def namesrv(request, cluster):
    """The name server address for each transport."""
    return cluster.namesrv if request.param == "inproc" else cluster.tcp_namesrv


@pytest.fixture
def no_thread_leak():
    before = {t.ident for t in threading.enumerate()}
    yield
    def leaked():
        return [t for t in threading.enumerate() if t.ident not in before and t.is_alive()
                and t.name.startswith("rmq-")]
    deadline = time.monotonic() + 10
    while leaked() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not leaked(), f"client threads left running: {[t.name for t in leaked()]}"


@pytest.fixture
def namesrv_only(tmp_path):
    """Just a name server (TCP), no broker."""
    from rmq_core.config import NamesrvConfig
    from rmq_core.namesrv import NamesrvController

    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    ctl = NamesrvController(NamesrvConfig(kv_config_path=str(tmp_path / "kv.json")), "127.0.0.1:0")
    asyncio.run_coroutine_threadsafe(ctl.start(), loop).result(10)
    yield ctl.listen_address
    asyncio.run_coroutine_threadsafe(ctl.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)
    loop.close()
