"""The official RocketMQ C++ client (PyPI rocketmq==0.4.4, bundled librocketmq) against
`rmq namesrv` + `rmq broker` processes.  Each client runs in its own child process."""
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tests.servers import NamesrvAndBroker

pytestmark = pytest.mark.compat
DRIVER = os.path.join(os.path.dirname(__file__), "cpp_driver.py")
rocketmq = pytest.importorskip("rocketmq.client", reason="the official C++ client (rocketmq==0.4.4) is a dev dependency")


class Driver:
    """A cpp_driver.py child; collects its JSON lines."""

    def __init__(self, home, *args):
        env = {**os.environ, "HOME": str(home)}  # the C++ client keeps logs and broadcast offsets under ~
        os.makedirs(home, exist_ok=True)
        # the child's stderr (a traceback, the native library's prints) is kept for failure messages
        self._stderr = tempfile.TemporaryFile(dir=home)
        self.proc = subprocess.Popen([sys.executable, DRIVER, *map(str, args)], stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, env=env)
        self.items, self._cond = [], threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:  # kept, so a garbled line shows in a failure instead of a message gone missing
                obj = {"unparsed": line}
            with self._cond:
                self.items.append(obj)
                self._cond.notify_all()

    def wait(self, pred, timeout):
        deadline = time.time() + timeout
        with self._cond:
            while not pred(self.items):
                left = deadline - time.time()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))
        return True

    def messages(self):
        return [i for i in self.items if "body" in i]

    def finish(self, timeout=60):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)  # the pipe may still hold lines the child wrote before exiting
        return self.items

    def stderr_tail(self, limit=2000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    cl = NamesrvAndBroker(tmp_path_factory.mktemp("cpp"), brokers=1,
                          broker_props={"defaultTopicQueueNums": 4})
    yield cl
    cl.stop()


@pytest.fixture
def home(tmp_path):
    return tmp_path


def produce(home, namesrv, topic, messages, **spec):
    d = Driver(home, "produce", namesrv, topic, json.dumps({"messages": messages, **spec}))
    items = d.finish(90)
    assert d.proc.returncode == 0, (items, d.stderr_tail())
    return items


def _msgs(prefix, n, **extra):
    out = []
    for i in range(n):
        out.append({"body": f"{prefix}-{i}", "tags": "TagA" if i % 2 == 0 else "TagB", "keys": f"{prefix}-key-{i}",
                    "props": {"userProp": f"v{i}"}, **extra})
    return out


def test_send_modes_and_clustering_split(servers, home):
    topic = "CppCluster"
    produce(home, servers.namesrv, topic, [{"body": "warmup", "tags": "TagW"}])  # creates the topic
    c1 = Driver(home / "c1", "consume", servers.namesrv, topic, "CID_CPP", "*", "CLUSTERING", 0, 60)
    c2 = Driver(home / "c2", "consume", servers.namesrv, topic, "CID_CPP", "*", "CLUSTERING", 0, 60)
    for c in (c1, c2):
        assert c.wait(lambda items: any(i.get("started") for i in items), 45)  # a C++ start on a loaded 2-core VM
    time.sleep(4.0)  # the second member's heartbeat makes the broker notify the first: both rebalance
    sent = _msgs("sync", 8) + _msgs("oneway", 4, mode="oneway") + [
        {"body": f"ord-{i}", "tags": "TagA", "keys": "ok", "mode": "orderly", "arg": 7} for i in range(4)]
    res = produce(home, servers.namesrv, topic, sent)
    assert len(res) == len(sent) and all(r["status"] == 0 for r in res)
    assert all(len(r["msg_id"]) == 32 for r in res if r["msg_id"])
    want = {m["body"] for m in sent}
    everything = lambda: want <= {m["body"] for m in c1.messages() + c2.messages()}  # noqa: E731
    deadline = time.time() + 40
    while time.time() < deadline and not everything():
        time.sleep(0.2)
    for c in (c1, c2):
        c.proc.terminate()
        c.finish(30)
    got = [m for m in c1.messages() + c2.messages() if m["body"] != "warmup"]
    bodies = [m["body"] for m in got]
    assert set(bodies) == want, "every message reaches the group"
    assert len(bodies) == len(set(bodies)), "each message once: no duplicates in a stable group"
    q1 = {m["queue_id"] for m in c1.messages() if m["body"] != "warmup"}
    q2 = {m["queue_id"] for m in c2.messages() if m["body"] != "warmup"}
    assert q1 and q2 and not (q1 & q2), f"the two members split the queues: {q1} / {q2}"
    by_body = {m["body"]: m for m in got}
    for m in sent:
        g = by_body[m["body"]]
        assert g["topic"] == topic and g["tags"] == m["tags"] and g["keys"] == m["keys"]
        if "props" in m:
            assert g["props"]["userProp"] == m["props"]["userProp"]
    # ordered sends with the same arg land on one queue in order (arg 7 % 4 = 3)
    ords = sorted((m for m in got if m["body"].startswith("ord-")), key=lambda m: m["queue_offset"])
    assert {m["queue_id"] for m in ords} == {3}
    assert [m["body"] for m in ords] == [f"ord-{i}" for i in range(4)]


def test_tag_expression_filters(servers, home):
    topic = "CppTags"
    sent = [{"body": f"t-{i}", "tags": ["TagA", "TagB", "TagC"][i % 3], "keys": "k"} for i in range(12)]
    produce(home, servers.namesrv, topic, sent)
    c = Driver(home, "consume", servers.namesrv, topic, "CID_CPP_TAGS", "TagA || TagB", "CLUSTERING", 8, 30)
    c.wait(lambda items: len([i for i in items if "body" in i]) >= 8, 30)
    time.sleep(1.0)
    c.proc.terminate()
    c.finish(30)
    got = sorted(m["body"] for m in c.messages())
    assert set(got) == {m["body"] for m in sent if m["tags"] in ("TagA", "TagB")}


def test_broadcasting_each_consumer_gets_all(servers, home):
    topic = "CppBroadcast"
    produce(home, servers.namesrv, topic, [{"body": "warmup", "tags": "TagA"}])  # create the topic
    c1 = Driver(home / "b1", "consume", servers.namesrv, topic, "CID_CPP_BC", "*", "BROADCASTING", 6, 40)
    c2 = Driver(home / "b2", "consume", servers.namesrv, topic, "CID_CPP_BC", "*", "BROADCASTING", 6, 40)
    for c in (c1, c2):
        assert c.wait(lambda items: any(i.get("started") for i in items), 45)  # a C++ start on a loaded 2-core VM
    time.sleep(3.0)  # a broadcast consumer starts at the queue end (no local offsets yet): let it get there
    sent = _msgs("bc", 6)
    produce(home, servers.namesrv, topic, sent)
    for c in (c1, c2):
        c.wait(lambda items: len([i for i in items if "body" in i and i["body"].startswith("bc-")]) >= 6, 30)
        c.proc.terminate()
        c.finish(30)
        assert sorted(m["body"] for m in c.messages() if m["body"].startswith("bc-")) == sorted(m["body"] for m in sent)


def test_offsets_survive_consumer_restart(servers, home):
    topic = "CppRestart"
    first = _msgs("r1", 6)
    produce(home, servers.namesrv, topic, first)
    c = Driver(home, "consume", servers.namesrv, topic, "CID_CPP_RS", "*", "CLUSTERING", 6, 30)
    assert c.wait(lambda items: len([i for i in items if "body" in i]) >= 6, 30)
    time.sleep(6.0)  # the C++ client persists offsets every 5 s and at shutdown
    c.proc.terminate()
    c.finish(30)
    first_run = c.messages()
    second = _msgs("r2", 4)
    sent_r2 = produce(home, servers.namesrv, topic, second)
    c = Driver(home, "consume", servers.namesrv, topic, "CID_CPP_RS", "*", "CLUSTERING", 4, 30)
    c.wait(lambda items: len([i for i in items if "body" in i]) >= 4, 30)
    time.sleep(2.0)
    c.proc.terminate()
    c.finish(30)
    got = [m["body"] for m in c.messages()]
    where = [(m["body"], m["queue_id"], m["queue_offset"]) for m in first_run + c.messages()]
    assert sorted(got) == sorted(m["body"] for m in second), (
        f"committed messages were not replayed: (body, queue, offset) of both runs {where}; sent {sent_r2}; "
        f"the C++ clients' offset lines: {_cpp_offset_log(home)}")


def _cpp_offset_log(home) -> list[str]:
    """What the C++ clients logged about offsets (where each consumer started a queue, what it
    committed at shutdown): tells a broker-side loss from a client-side start."""
    lines = []
    for path in sorted((home / "logs" / "rocketmq-cpp").glob("*.log*")):
        for line in path.read_text(errors="replace").splitlines():
            if "CppRestart" in line and ("lastOffset" in line or "updateConsumeOffsetToBroker" in line):
                lines.append(f"{path.name.split('_')[0]}: {line[:200]}")
    return lines


def test_pull_consumer_and_delay_level(servers, home):
    topic = "CppPull"
    # "held" (level 18: 2 h) cannot come due during the test, "soon" (level 1: 1 s) comes due while
    # we pull again: how long a C++ start takes on a busy machine changes neither answer
    produce(home, servers.namesrv, topic, [{"body": "now", "tags": "TagA"}, {"body": "held", "tags": "TagA", "delay": 18},
                                           {"body": "soon", "tags": "TagA", "delay": 1}])
    d = Driver(home, "pull", servers.namesrv, topic, "CID_CPP_PULL", "*")
    d.finish(60)
    first = sorted(m["body"] for m in d.messages())
    assert first in (["now"], ["now", "soon"]), first
    got, deadline = first, time.time() + 60
    for attempt in itertools.count(2):  # until "soon" is due: a new group pulls every queue from offset 0
        if "soon" in got or time.time() > deadline:
            break
        time.sleep(0.5)
        d = Driver(home, "pull", servers.namesrv, topic, f"CID_CPP_PULL{attempt}", "*")
        d.finish(60)
        got = sorted(m["body"] for m in d.messages())
    assert got == ["now", "soon"], got


def test_rmq_producer_defaults_reach_the_official_consumer(servers, home):
    """rmq's producer compresses large bodies with LZ4 by default (sysFlag 0x101, stored so); the
    official 4.x client only inflates with zlib, and the broker serves it such records rewritten to
    zlib: its pull reads the exact bodies, large and small."""
    from rmq_core import Message, Producer

    topic, big = "CppFromRmq", "lz4 body " * 2000
    produce(home, servers.namesrv, topic, [{"body": "warmup", "tags": "TagW"}])  # creates the topic
    with Producer("PG_RMQ_TO_CPP", namesrv=servers.namesrv) as p:
        p.send(Message(topic, big.encode(), tags="TagA"))
        p.send(Message(topic, b"small", tags="TagA"))
    stored = {m.body_crc: m.sys_flag for m in servers.stored_messages(topic)}
    assert sorted(stored.values()) == [0, 0, 0x101], stored  # the big one stored as rmq sent it: LZ4
    d = Driver(home, "pull", servers.namesrv, topic, "CID_CPP_FROM_RMQ", "TagA")
    d.finish(60)
    assert sorted(m["body"] for m in d.messages()) == sorted([big, "small"]), d.stderr_tail()
