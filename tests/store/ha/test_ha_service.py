"""Replication between two stores in one process over real loopback TCP (rmq_core/store/ha), and
against fake peers speaking the wire protocol: a master that sends a frame at the wrong offset, a
slave that never acknowledges."""
from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from rmq_core.broker.controller import check_broker_role
from tests.codec_oracle import encode_batch_items
from rmq_core.config import BrokerConfig, BrokerRole, FlushDiskType
from rmq_core.errors import ConfigError
from rmq_core.store import DefaultMessageStore, MessageExtBatch, PutMessageStatus
from rmq_core.store.ha.wire import HEADER, REPORT
from tests.store.conftest import hold_python_rounds, make_config, msg

SEGMENT = 64 * 1024


@pytest.fixture
def pair(tmp_path):
    """make(master_kw, slave_kw) -> (master, slave): started stores, the slave pointed at the master."""
    opened = []

    def open_store(name, **kw):
        s = DefaultMessageStore(make_config(tmp_path / name, **kw))
        s.load()
        s.start()
        opened.append(s)
        return s

    def make(role=BrokerRole.ASYNC_MASTER, connect=True, master_kw=None, slave_kw=None):
        master = open_store("master", broker_role=role, ha_listen_port=0, **(master_kw or {}))
        slave = open_store("slave", broker_role=BrokerRole.SLAVE, **(slave_kw or {}))
        if connect:
            slave.update_ha_master_address(f"127.0.0.1:{master.ha_service.listen_port}")
            # connected and its first report read: the transfer starts where the log ends now
            _wait(lambda: any(c.slave_request_offset >= 0 for c in master.ha_service.connections), "the slave connected")
        return master, slave

    make.open_store = open_store
    yield make
    for s in reversed(opened):
        s.shutdown()


def _wait(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _caught_up(master, slave):
    _wait(lambda: slave.get_max_phy_offset() == master.get_max_phy_offset() and not slave.dispatch_behind_bytes(),
          "the slave catching up")


def _put_many(store, n, start=0, queues=4, size=200):
    for i in range(start, start + n):
        r = store.put(msg(queue_id=i % queues, body=b"%06d" % i + b"z" * size, keys=f"key{i}"))
        assert r.status in (PutMessageStatus.PUT_OK, PutMessageStatus.SLAVE_NOT_AVAILABLE), r


def _log_bytes(store, start, end):
    out = b""
    cl = store.commit_log
    while start < end:
        mf = cl.mapped_file_queue.find_mapped_file_by_offset(start)
        n = min(end, mf.end_offset) - start
        out += cl.get_data(start, n)
        start += n
    return out


def _assert_same_queues(master, slave, topic="TopicA", queues=4):
    for q in range(queues):
        lo = slave.get_min_offset_in_queue(topic, q)
        hi = master.get_max_offset_in_queue(topic, q)
        assert slave.get_max_offset_in_queue(topic, q) == hi
        off = lo
        while off < hi:
            a = master.get_message("g", topic, q, off, 32)
            b = slave.get_message("g", topic, q, off, 32)
            assert a.status.name == b.status.name == "FOUND"
            assert a.buffer == b.buffer and a.next_begin_offset == b.next_begin_offset
            off = a.next_begin_offset


def test_async_master_replicates_bytes_queues_and_index(pair):
    master, slave = pair()
    _put_many(master, 1500)
    _caught_up(master, slave)
    assert _log_bytes(slave, 0, slave.get_max_phy_offset()) == _log_bytes(master, 0, master.get_max_phy_offset())
    assert len(slave.commit_log.mapped_file_queue.mapped_files) > 3  # segments rolled, blanks replicated
    _assert_same_queues(master, slave)
    found = slave.query_message("TopicA", "key777", 4, 0, 2**62)  # the slave built its own index
    assert found.message_count == 1
    _wait(lambda: master.ha_service.push_to_slave_max_offset == master.get_max_phy_offset(), "the last acknowledgement")
    info = master.ha_runtime_info()
    assert info["haConnectionNum"] == 1 and info["haConnectionInfo"][0]["slaveAckOffset"] == master.get_max_phy_offset()
    assert master.slave_fall_behind_bytes() == 0
    sinfo = slave.ha_runtime_info()
    assert sinfo["masterAddr"] == f"127.0.0.1:{master.ha_service.listen_port}" and sinfo["haConnected"]
    assert master.ha_service.connection_count() == 1


def test_empty_slave_starts_at_the_masters_last_segment(pair):
    master, slave = pair(connect=False)
    _put_many(master, 1000)
    last = master.commit_log.mapped_file_queue.mapped_files[-1].file_from_offset
    assert last > 0
    slave.update_ha_master_address(f"127.0.0.1:{master.ha_service.listen_port}")
    _caught_up(master, slave)
    assert slave.get_min_phy_offset() == last
    assert _log_bytes(slave, last, slave.get_max_phy_offset()) == _log_bytes(master, last, master.get_max_phy_offset())
    _assert_same_queues(master, slave)  # the slave's queues start where its log does


def test_a_slave_whose_only_segment_is_empty_starts_at_the_masters_log_after_retention(pair, tmp_path):
    """The slave's log holds one empty segment (at offset 0, from an earlier start); the master's
    log starts later (retention deleted its first segments): the slave starts at the master's
    last segment, on its first connection, rather than reconnecting forever."""
    master, _ = pair(connect=False)
    _put_many(master, 1500)
    assert master.commit_log.mapped_file_queue.delete_expired_files_by_time(0, clean_immediately=True, max_batch=3) == 3
    assert master.get_min_phy_offset() == 3 * SEGMENT
    last = master.commit_log.mapped_file_queue.mapped_files[-1].file_from_offset
    first = pair.open_store("slave-empty", broker_role=BrokerRole.SLAVE)
    first.commit_log.mapped_file_queue.get_last_mapped_file(0, need_create=True)  # as an append makes it
    first.shutdown()
    slave = pair.open_store("slave-empty", broker_role=BrokerRole.SLAVE)
    assert slave.commit_log.mapped_file_queue.holds_no_bytes() and slave.get_min_phy_offset() == 0
    slave.update_ha_master_address(f"127.0.0.1:{master.ha_service.listen_port}")
    _caught_up(master, slave)
    client = slave.ha_service.ha_client
    assert client.reconnects == 1 and client.bad_frames == 0
    assert slave.get_min_phy_offset() == last
    assert _log_bytes(slave, last, slave.get_max_phy_offset()) == _log_bytes(master, last, master.get_max_phy_offset())
    _assert_same_queues(master, slave)
    # the empty segment and the one pre-allocated after it are gone from disk: a restart loads
    # the log from `last` on
    names = sorted(int(n) for n in os.listdir(tmp_path / "slave-empty" / "commitlog"))
    assert names[0] == last
    slave.shutdown()
    again = pair.open_store("slave-empty", broker_role=BrokerRole.SLAVE)
    assert again.get_min_phy_offset() == last and again.get_max_phy_offset() == master.get_max_phy_offset()


def test_records_cut_by_a_chunk_are_dispatched_once_whole_and_listeners_fire(pair):
    master, slave = pair(connect=False)
    _put_many(master, 20, queues=1)
    arrived = []
    slave.register_message_arriving_listener(lambda topic, qid, max_offset, *rest: arrived.append((topic, qid, max_offset)))
    data = _log_bytes(master, 0, master.get_max_phy_offset())
    cut = len(data) // 2 + 7  # inside a record
    assert slave.append_to_commit_log(0, data[:cut])
    whole = slave.get_max_offset_in_queue("TopicA", 0)
    assert 0 < whole < 20
    assert not slave.append_to_commit_log(cut + 1, b"x")  # not where the log ends: refused
    assert slave.append_to_commit_log(cut, data[cut:])
    assert slave.get_max_offset_in_queue("TopicA", 0) == 20
    assert arrived == [("TopicA", 0, whole), ("TopicA", 0, 20)]
    _assert_same_queues(master, slave, queues=1)


def test_sync_master_answers_after_the_slave_acknowledged(pair):
    master, slave = pair(BrokerRole.SYNC_MASTER)
    _wait(lambda: master.put(msg(body=b"first")).status is PutMessageStatus.PUT_OK, "a first acknowledged put")
    r = master.put(msg(body=b"blocking"))
    assert r.status is PutMessageStatus.PUT_OK
    assert master.ha_service.push_to_slave_max_offset >= r.append_result.wrote_offset + r.append_result.wrote_bytes
    items = [(0, b"batch-%d" % i, {"UNIQ_KEY": f"B{i}"}) for i in range(30)]
    b = master.put(MessageExtBatch("TopicA", 0, encode_batch_items(items)))
    assert b.status is PutMessageStatus.PUT_OK
    assert master.ha_service.push_to_slave_max_offset >= b.append_result.wrote_offset + b.append_result.wrote_bytes

    async def many():
        return await asyncio.gather(*(master.put_async(msg(queue_id=i % 4, body=b"a%d" % i)) for i in range(400)))

    before = master.ha_service.group_transfer.rounds_resolved
    results = asyncio.run(many())
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    rounds = master.ha_service.group_transfer.rounds_resolved - before
    assert rounds < 400  # puts in flight shared acknowledgements
    _caught_up(master, slave)


def test_sync_master_nowait_futures_are_shared_by_puts_in_flight(pair):
    master, slave = pair(BrokerRole.SYNC_MASTER)
    _wait(lambda: master.put(msg(body=b"first")).status is PutMessageStatus.PUT_OK, "a first acknowledged put")
    futs = [master.put_nowait(msg(body=b"n%d" % i))[1] for i in range(200)]
    assert len({id(f) for f in futs}) < 200
    assert all(f.result(30) is PutMessageStatus.PUT_OK for f in futs)


def test_sync_master_with_sync_flush_waits_for_both(pair):
    master, slave = pair(BrokerRole.SYNC_MASTER, master_kw={"flush_disk_type": FlushDiskType.SYNC_FLUSH})
    _wait(lambda: master.put(msg(body=b"first")).status is PutMessageStatus.PUT_OK, "a first acknowledged put")

    async def many():
        return await asyncio.gather(*(master.put_async(msg(body=b"s%d" % i)) for i in range(200)))

    results = asyncio.run(many())
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    assert master.commit_log.mapped_file_queue.flushed_where >= results[-1].append_result.wrote_offset


def test_sync_master_without_a_slave_answers_slave_not_available_and_keeps_the_message(pair):
    master, slave = pair(BrokerRole.SYNC_MASTER, connect=False)
    r = master.put(msg(body=b"alone"))
    assert r.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert "haSlaveFallbehindMax" in r.error
    got = master.get_message("g", "TopicA", 0, 0, 1)
    assert got.status.name == "FOUND" and b"alone" in got.buffer

    async def one():
        return await master.put_async(msg(body=b"alone-async"))

    assert asyncio.run(one()).status is PutMessageStatus.SLAVE_NOT_AVAILABLE


class FakeSlave:
    """A slave that reports one offset and then never acknowledges again (a frozen slave)."""

    def __init__(self, port, offset=0):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(REPORT.pack(offset))
        self.received = 0
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()

    def _drain(self):
        try:
            while data := self.sock.recv(65536):
                self.received += len(data)
        except OSError:
            pass

    def close(self):
        self.sock.close()


def test_sync_master_with_a_silent_slave_answers_flush_slave_timeout(pair):
    master, _ = pair(BrokerRole.SYNC_MASTER, connect=False, master_kw={"sync_flush_timeout": 300})
    fake = FakeSlave(master.ha_service.listen_port)
    try:
        _wait(lambda: master.ha_service.connection_count() == 1, "the fake slave connected")
        r = master.put(msg(body=b"never acknowledged"))
        assert r.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        assert "syncFlushTimeout 300 ms" in r.error
        assert r.append_result is not None  # stored: its offsets are in the answer
        got = master.get_message("g", "TopicA", 0, 0, 1)
        assert b"never acknowledged" in got.buffer

        async def one():
            return await master.put_async(msg(body=b"async never acknowledged"))

        assert asyncio.run(one()).status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    finally:
        fake.close()


def test_a_slave_too_far_behind_is_not_waited_for(pair):
    master, _ = pair(BrokerRole.SYNC_MASTER, connect=False, master_kw={"ha_slave_fallbehind_max": 1000})
    _put_many(master, 20)  # 20 puts, no slave: stored, answered SLAVE_NOT_AVAILABLE
    fake = FakeSlave(master.ha_service.listen_port, offset=0)
    try:
        _wait(lambda: master.ha_service.connection_count() == 1, "the fake slave connected")
        assert master.slave_fall_behind_bytes() > 1000
        assert master.put(msg(body=b"far behind")).status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    finally:
        fake.close()


def test_a_frame_at_the_wrong_offset_makes_the_slave_reconnect(pair, tmp_path):
    master, slave = pair(connect=False)
    _put_many(master, 30, queues=1)
    data = _log_bytes(master, 0, master.get_max_phy_offset())
    first = data[:4096]
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)
    reports = []
    try:
        slave.update_ha_master_address(f"127.0.0.1:{server.getsockname()[1]}")
        conn, _ = server.accept()
        conn.settimeout(30)
        reports.append(REPORT.unpack(_recv_exact(conn, 8))[0])
        conn.sendall(HEADER.pack(0, len(first)) + first)
        _wait(lambda: slave.get_max_phy_offset() == len(first), "the first chunk appended")
        conn.sendall(HEADER.pack(len(first) + 100, 10) + b"\0" * 10)  # not where the slave's log ends
        conn2, _ = server.accept()  # the slave dropped the connection and came back
        conn2.settimeout(30)
        reports.append(REPORT.unpack(_recv_exact(conn2, 8))[0])
        conn.close()
        conn2.close()
    finally:
        server.close()
    assert reports == [0, len(first)]
    assert slave.ha_service.ha_client.bad_frames == 1
    assert slave.get_max_phy_offset() == len(first)  # nothing of the bad frame was written


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "peer closed"
        buf += chunk
    return buf


def test_heartbeats_flow_both_ways_when_idle(pair):
    master, slave = pair(master_kw={"ha_send_heartbeat_interval": 50}, slave_kw={"ha_send_heartbeat_interval": 50})
    _put_many(master, 5)
    _caught_up(master, slave)
    conn = master.ha_service.connections[0]
    seen = conn.last_read_time
    _wait(lambda: conn.last_read_time > seen, "a slave heartbeat")
    seen = slave.ha_service.ha_client.last_read_time
    _wait(lambda: slave.ha_service.ha_client.last_read_time > seen, "a master heartbeat")


def test_broker_role_and_id_must_agree(tmp_path):
    sc = make_config(tmp_path, broker_role=BrokerRole.SLAVE)
    with pytest.raises(ConfigError, match="brokerRole=SLAVE needs brokerId > 0"):
        check_broker_role(BrokerConfig(broker_id=0), sc)
    with pytest.raises(ConfigError, match="brokerId=1 is a slave's id but brokerRole=SYNC_MASTER"):
        check_broker_role(BrokerConfig(broker_id=1), make_config(tmp_path, broker_role=BrokerRole.SYNC_MASTER))
    with pytest.raises(ConfigError, match="haMasterAddress=1.2.3.4:5 is for a slave"):
        check_broker_role(BrokerConfig(broker_id=0), make_config(tmp_path, ha_master_address="1.2.3.4:5"))
    check_broker_role(BrokerConfig(broker_id=2), sc)


def test_a_bad_master_address_is_named(pair):
    _, slave = pair(connect=False)
    with pytest.raises(ValueError, match="'nowhere' is not host:port"):
        slave.update_ha_master_address("nowhere")


def test_a_silent_slave_is_dropped_after_the_housekeeping_interval(pair):
    master, _ = pair(BrokerRole.SYNC_MASTER, connect=False, master_kw={"ha_housekeeping_interval": 300})
    fake = FakeSlave(master.ha_service.listen_port)
    try:
        _wait(lambda: master.ha_service.connection_count() == 1, "the fake slave connected")
        _wait(lambda: master.ha_service.connection_count() == 0, "the silent slave dropped")
        assert master.put(msg(body=b"after")).status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    finally:
        fake.close()


def test_a_silent_master_makes_the_slave_reconnect(pair):
    _, slave = pair(connect=False, slave_kw={"ha_housekeeping_interval": 300, "ha_send_heartbeat_interval": 100})
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)
    try:
        slave.update_ha_master_address(f"127.0.0.1:{server.getsockname()[1]}")
        first, _ = server.accept()  # then says nothing
        second, _ = server.accept()  # the slave gave up on the silent master and came back
        second.settimeout(30)
        assert REPORT.unpack(_recv_exact(second, 8)) == (0,)
        first.close()
        second.close()
    finally:
        server.close()
    assert slave.ha_service.ha_client.reconnects >= 2


def test_a_taken_ha_port_fails_when_configured_and_falls_back_when_defaulted(pair, tmp_path):
    from rmq_core.errors import StoreError

    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        explicit = DefaultMessageStore(make_config(tmp_path / "explicit", ha_listen_port=port))
        explicit.load()
        with pytest.raises(StoreError, match=f"cannot listen for slaves on 127.0.0.1:{port} .haListenPort"):
            explicit.start()
        explicit.shutdown()
        defaulted = DefaultMessageStore(make_config(tmp_path / "defaulted"))
        defaulted.ha_service.default_listen_port = port  # the broker's listenPort + 1, taken
        defaulted.load()
        defaulted.start()
        try:
            assert defaulted.ha_service.listen_port not in (None, port)
        finally:
            defaulted.shutdown()
    finally:
        taken.close()


def test_sync_master_and_sync_flush_name_the_part_that_timed_out(pair, monkeypatch):
    """Both waits: a slave acknowledged but the disk did not flush in time -> FLUSH_DISK_TIMEOUT;
    neither happened -> FLUSH_SLAVE_TIMEOUT (the replica's answer wins, as RocketMQ's)."""
    master, slave = pair(BrokerRole.SYNC_MASTER,
                         master_kw={"flush_disk_type": FlushDiskType.SYNC_FLUSH, "sync_flush_timeout": 400})
    _wait(lambda: master.put(msg(body=b"first")).status is PutMessageStatus.PUT_OK, "a first acknowledged put")
    release, _ = hold_python_rounds(master, monkeypatch)
    try:
        r = master.put(msg(body=b"acknowledged, not flushed"))
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT, r
        assert master.ha_service.push_to_slave_max_offset >= r.append_result.wrote_offset + r.append_result.wrote_bytes

        async def one():
            return await master.put_async(msg(body=b"async: acknowledged, not flushed"))

        assert asyncio.run(one()).status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        slave.shutdown()  # (the fixture's second shutdown does nothing)
        fake = FakeSlave(master.ha_service.listen_port, offset=slave.get_max_phy_offset())
        try:
            mine = f"127.0.0.1:{fake.sock.getsockname()[1]}"
            _wait(lambda: [c.client_addr for c in master.ha_service.connections] == [mine],
                  "only the silent slave connected")
            assert master.put(msg(body=b"neither")).status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        finally:
            fake.close()
    finally:
        release.set()
