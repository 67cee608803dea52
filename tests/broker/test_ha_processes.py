"""Replication between real `rmq broker` processes (a master and its slave): byte-identical commit
logs, consume queues that answer the same messages, real kills (SIGKILL, SIGSTOP), a torn tail,
SYNC_MASTER's answers when its slave is gone or frozen, a restarted master."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rmq_core import Message, Producer
from rmq_core.codec import decode_messages
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.broker.ha_group import HAGroup, commit_log_segments, log_end, wait_replicated
from tests.rawclient import RawClient
from tests.servers import RmqProcess, free_port, freeze, write_conf

TOPIC = "HATopic"
QUEUES = 4
FAST = {"send_msg_timeout": 10}


@pytest.fixture
def raw():
    r = RawClient()
    yield r
    r.close()


@pytest.fixture
def group_of(tmp_path):
    made = []

    def make(**kw) -> HAGroup:
        g = HAGroup(tmp_path, **kw)
        made.append(g)
        return g

    yield make
    for g in made:
        g.stop()


def _create_topic(raw, *addrs):
    for addr in addrs:
        r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                       {"topic": TOPIC, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES), "perm": "6"})
        if r.code == ResponseCode.SYSTEM_ERROR and "from slave broker" in (r.remark or ""):
            continue  # a slave refuses admin writes: it copies its master's topics (slave_sync)
        assert r.code == ResponseCode.SUCCESS, r.remark


def _send_raw(raw, addr, n, start=0, size=300):
    codes = []
    for i in range(start, start + n):
        r = raw.send(addr, TOPIC, f"m{i:06d}".encode() + b"x" * size, queue_id=i % QUEUES, keys=f"k{i}")
        codes.append(r.code)
    return codes


def _queue_messages(raw, addr, queue_id):
    """Every message body of one queue, pulled from `addr` from offset 0."""
    out = []
    offset = 0
    while True:
        resp = raw.pull(addr, TOPIC, queue_id, offset, max_nums=32)
        if resp.code != ResponseCode.SUCCESS:
            return out
        msgs = decode_messages(resp.body)
        out += [m.body for m in msgs]
        offset = int(resp.ext_fields["nextBeginOffset"])


def _assert_same_queues(raw, group, expect_total):
    """Every queue answers the same messages on the slave as on the master (the slave's queues
    may trail its log by a moment: dispatched after the bytes are appended)."""
    total = 0
    for q in range(QUEUES):
        on_master = _queue_messages(raw, group.master_addr, q)
        deadline = time.monotonic() + 30
        while (on_slave := _queue_messages(raw, group.slave_addr, q)) != on_master and time.monotonic() < deadline:
            time.sleep(0.2)
        assert on_slave == on_master, f"queue {q}: slave has {len(on_slave)} messages, master {len(on_master)}"
        total += len(on_master)
    assert total == expect_total


def test_async_master_burst_slave_equal_byte_for_byte(group_of, raw):
    g = group_of()
    g.start_master()
    g.start_slave()
    _create_topic(raw, g.master_addr, g.slave_addr)
    with Producer("PG_HA_BURST", namesrv=g.namesrv, **FAST) as p:
        futs = [p.send_async(Message(TOPIC, f"b{i:06d}".encode() + b"y" * 400, keys=f"k{i}")) for i in range(6000)]
        results = [f.result(30) for f in futs]
    assert all(r.status.name == "SEND_OK" for r in results)
    segments = wait_replicated(g.master_store, g.slave_store)
    assert len(segments) >= 3  # several segments rolled: their end-of-file blanks were replicated too
    _assert_same_queues(raw, g, 6000)


def test_slave_killed_mid_stream_resumes_without_gap_or_duplicate(group_of, raw):
    g = group_of()
    g.start_master()
    g.start_slave()
    _create_topic(raw, g.master_addr, g.slave_addr)
    sent = {"n": 0}
    stop = threading.Event()

    def stream():
        r = RawClient("stream")
        try:
            while not stop.is_set():
                assert _send_raw(r, g.master_addr, 50, sent["n"]) == [0] * 50
                sent["n"] += 50
        finally:
            r.close()

    t = threading.Thread(target=stream)
    t.start()
    try:
        _wait(lambda: log_end(commit_log_segments(g.slave_store)) > 300_000, "the slave replicating")
        g.slave.kill()  # SIGKILL mid-stream
        mark = sent["n"]
        _wait(lambda: sent["n"] > mark + 500, "more sends while the slave is down")
        g.start_slave()
        _wait(lambda: sent["n"] > mark + 1500, "more sends after the slave is back")
    finally:
        stop.set()
        t.join(60)
    wait_replicated(g.master_store, g.slave_store)
    _assert_same_queues(raw, g, sent["n"])


def _replicated_group(group_of, raw, n) -> HAGroup:
    """A master and its slave, n messages sent and replicated."""
    g = group_of()
    g.start_master()
    g.start_slave()
    _create_topic(raw, g.master_addr, g.slave_addr)
    assert _send_raw(raw, g.master_addr, n) == [0] * n
    wait_replicated(g.master_store, g.slave_store)
    return g


def test_slave_with_torn_tail_repairs_itself_and_converges(group_of, raw):
    g = _replicated_group(group_of, raw, 1500)
    g.slave.kill()
    # tear the slave's last record: cut its last segment in the middle of that record
    segs = commit_log_segments(g.slave_store)
    last = max(segs)
    path = os.path.join(g.slave_store, "commitlog", last)
    end = len(segs[last].rstrip(b"\0"))
    os.truncate(path, end - 101)
    assert _send_raw(raw, g.master_addr, 500, 1500) == [0] * 500
    g.start_slave()
    g.slave.wait_for("bad record at offset")  # recovery cut the torn record
    wait_replicated(g.master_store, g.slave_store)
    _assert_same_queues(raw, g, 2000)


def test_sync_master_answers_slave_not_available_with_its_slave_stopped(group_of, raw):
    g = group_of(role="SYNC_MASTER")
    g.start_master()
    _create_topic(raw, g.master_addr)
    r = raw.send(g.master_addr, TOPIC, b"no slave yet")
    assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE
    g.start_slave()
    _create_topic(raw, g.slave_addr)
    _wait(lambda: raw.send(g.master_addr, TOPIC, b"with slave").code == ResponseCode.SUCCESS, "a slave acknowledging")
    g.slave.terminate()
    _wait(lambda: raw.send(g.master_addr, TOPIC, b"probe").code == ResponseCode.SLAVE_NOT_AVAILABLE,
          "the master noticing its slave left")
    r = raw.send(g.master_addr, TOPIC, b"slave stopped", keys="K_STOPPED")
    assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE  # never SEND_OK
    assert b"slave stopped" in _queue_messages(raw, g.master_addr, 0)  # stored on the master all the same


def test_sync_master_answers_flush_slave_timeout_with_its_slave_frozen(group_of, raw):
    g = group_of(role="SYNC_MASTER", master_props={"syncFlushTimeout": 800})
    g.start_master()
    g.start_slave()
    _create_topic(raw, g.master_addr, g.slave_addr)
    _wait(lambda: raw.send(g.master_addr, TOPIC, b"warm").code == ResponseCode.SUCCESS, "a slave acknowledging")
    freeze(g.slave.proc.pid)
    try:
        r = raw.send(g.master_addr, TOPIC, b"slave frozen")
        assert r.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert r.ext_fields["msgId"]  # answered with the stored message's id, as RocketMQ does
    finally:
        os.kill(g.slave.proc.pid, signal.SIGCONT)
    assert b"slave frozen" in _queue_messages(raw, g.master_addr, 0)
    # thawed, the slave catches up and acknowledges again
    _wait(lambda: raw.send(g.master_addr, TOPIC, b"thawed").code == ResponseCode.SUCCESS, "the slave back")
    wait_replicated(g.master_store, g.slave_store)


def test_restarted_master_continues_its_log_and_the_slave_follows_it_and_catches_up(group_of, raw):
    g = _replicated_group(group_of, raw, 800)
    g.master.kill()
    before = log_end(commit_log_segments(g.master_store))
    g.move_master_ha_port()  # the slave learns the new HA address from the name server
    g.start_master()
    assert _send_raw(raw, g.master_addr, 800, 800) == [0] * 800
    segments = wait_replicated(g.master_store, g.slave_store)
    assert log_end(segments) > before  # continued its own log, the slave followed
    _assert_same_queues(raw, g, 1600)


def _wait(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_slave_id_with_a_master_role_is_refused_naming_the_keys(tmp_path):
    conf = write_conf(tmp_path / "bad.conf", {"brokerName": "b", "brokerId": 1, "brokerRole": "ASYNC_MASTER",
                                              "listenPort": free_port(), "storePathRootDir": tmp_path / "s"})
    p = RmqProcess(["broker", "-n", "127.0.0.1:1", "-c", conf])
    assert p.proc.wait(30) == 2
    p._reader.join(5)
    assert any("brokerId=1" in line and "brokerRole=ASYNC_MASTER" in line for line in p.lines), p.lines
