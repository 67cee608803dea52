"""Replication in controller mode (docs/failover.md): stores in one process over loopback TCP,
driven through the calls the broker's ReplicasManager makes (change_to_master, change_to_slave,
set_sync_state_set, on_sync_state_set_change)."""
from __future__ import annotations

import socket
import threading

import pytest

from rmq_core.broker.processors.send import put_outcome
from rmq_core.config import BrokerRole
from rmq_core.remoting.codes import ResponseCode
from rmq_core.store import DefaultMessageStore, PutMessageStatus
from rmq_core.store.ha.epoch import EpochEntry
from rmq_core.store.ha.wire import HANDSHAKE, HANDSHAKE_REQUEST, REPORT
from tests.store.conftest import make_config, msg
from tests.store.ha.test_ha_service import _log_bytes, _wait


class Group:
    """Replicas of one group: open(name, **config) -> started store; master()/slave() change roles."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.opened: list[DefaultMessageStore] = []
        self.proposals: dict[str, list[set]] = {}

    def open(self, name, role=BrokerRole.SLAVE, **kw):
        kw.setdefault("ha_listen_port", 0)
        s = DefaultMessageStore(make_config(self.tmp_path / name, broker_role=role, **kw))
        s.load()
        s.ha_service.controller_mode = True  # (the broker sets it from enableControllerMode)
        s.start()
        self.opened.append(s)
        seen = self.proposals.setdefault(name, [])
        s.ha_service.on_sync_state_set_change = lambda proposed: seen.append(set(proposed))
        return s

    @staticmethod
    def master(store, epoch, broker_id, sss, sss_epoch):
        store.config.broker_role = BrokerRole.SYNC_MASTER
        store.ha_service.change_to_master(epoch, broker_id, set(sss), sss_epoch)
        return f"127.0.0.1:{store.ha_service.listen_port}"

    @staticmethod
    def slave(store, addr, epoch, broker_id):
        store.config.broker_role = BrokerRole.SLAVE
        store.ha_service.change_to_slave(addr, epoch, broker_id)

    def close(self):
        for s in reversed(self.opened):
            s.shutdown()


@pytest.fixture
def group(tmp_path):
    g = Group(tmp_path)
    yield g
    g.close()


def _connected(master, *ids):
    _wait(lambda: {c.slave_broker_id for c in master.ha_service.connections if c.slave_request_offset >= 0}
          >= set(ids), f"slaves {ids} connected")


def _same_log(master, slave):
    _wait(lambda: slave.get_max_phy_offset() == master.get_max_phy_offset() and not slave.dispatch_behind_bytes(),
          "the slave catching up")
    lo = master.get_min_phy_offset()
    assert _log_bytes(slave, lo, slave.get_max_phy_offset()) == _log_bytes(master, lo, master.get_max_phy_offset())


def _put(store, n, start=0, queues=4):
    out = []
    for i in range(start, start + n):
        out.append(store.put(msg(queue_id=i % queues, body=b"%06d" % i + b"z" * 150)))
    return out


def test_master_and_two_slaves_replicate_and_caught_up_slaves_are_proposed_in(group):
    a = group.open("a")
    addr = group.master(a, 1, 1, {1}, 1)
    b, c = group.open("b"), group.open("c")
    group.slave(b, addr, 1, 2)
    group.slave(c, addr, 1, 3)
    _connected(a, 2, 3)
    # minInSyncReplicas 1 without allAck: answered at once
    assert all(r.status is PutMessageStatus.PUT_OK for r in _put(a, 200))
    _same_log(a, b)
    _same_log(a, c)
    # caught up, not members: proposed in
    _wait(lambda: {1, 2, 3} in group.proposals["a"], "the proposal of {1, 2, 3}")
    a.ha_service.set_sync_state_set({1, 2, 3}, 2)
    info = a.ha_runtime_info()
    assert info["slaveBrokerIds"] == [2, 3] and info["syncStateSet"] == [1, 2, 3] and info["masterEpoch"] == 1
    assert {c_["brokerId"] for c_ in info["haConnectionInfo"]} == {2, 3}
    assert b.ha_runtime_info()["masterEpoch"] == 1
    for s in (a, b, c):
        assert s.ha_service.epoch_cache.entries() == [EpochEntry(1, 0)]


def test_handshake_with_another_epoch_or_none_is_refused(group):
    a = group.open("a")
    addr = group.master(a, 3, 1, {1}, 1)
    b = group.open("b")
    group.slave(b, addr, 2, 2)  # the controller told b of an older epoch
    _wait(lambda: b.ha_service.ha_client.refusals >= 2, "refused handshakes")
    assert b.ha_service.ha_client.handshakes == 0
    assert not any(c.slave_broker_id == 2 for c in a.ha_service.connections)
    # told the right epoch, it connects (the old connection attempt is dropped at once)
    group.slave(b, addr, 3, 2)
    _connected(a, 2)
    host, port = addr.split(":")
    # a manual-mode slave (a bare offset report) and a handshake of another epoch: closed
    for first in (REPORT.pack(0), HANDSHAKE_REQUEST.pack(HANDSHAKE, 9, 4)):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(first)
            assert sock.recv(64) == b""


def test_a_manual_mode_master_refuses_a_handshake(tmp_path):
    m = DefaultMessageStore(make_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER, ha_listen_port=0))
    with m:
        with socket.create_connection(("127.0.0.1", m.ha_service.listen_port), timeout=10) as sock:
            sock.sendall(HANDSHAKE_REQUEST.pack(HANDSHAKE, 2, 1))
            assert sock.recv(64) == b""


def test_a_slave_with_bytes_of_an_old_epoch_is_cut_to_the_consistent_point(group):
    x = group.open("x")
    addr_x = group.master(x, 1, 1, {1}, 1)
    y = group.open("y")
    group.slave(y, addr_x, 1, 2)
    _connected(x, 2)
    _put(x, 100)
    _same_log(x, y)
    common = y.get_max_phy_offset()
    y.ha_service.change_to_slave("127.0.0.1:1", 1, 2)  # y loses its master (nothing listens there)
    _put(x, 50, start=100)  # epoch 1 bytes only x holds
    x_end_old = x.get_max_phy_offset()
    # y becomes master of epoch 2 and writes; x follows it
    addr_y = group.master(y, 2, 2, {2}, 2)
    assert y.ha_service.epoch_cache.entries() == [EpochEntry(1, 0), EpochEntry(2, common)]
    _put(y, 30, start=1000)
    group.slave(x, addr_y, 2, 1)
    _connected(y, 1)
    _same_log(y, x)
    assert x.get_max_phy_offset() < x_end_old  # x's 50 records of epoch 1 are gone, y's 30 are there
    assert x.ha_service.epoch_cache.entries() == [EpochEntry(1, 0), EpochEntry(2, common)]
    for q in range(4):
        assert x.get_max_offset_in_queue("TopicA", q) == y.get_max_offset_in_queue("TopicA", q)
    # what x read at `common` is y's epoch-2 record, not its own old one
    got = x.get_message("g", "TopicA", 0, 25, 1)  # queue 0's 26th message: i=100 was x's, now 1000's
    assert b"001000" in got.buffer


def test_all_ack_waits_for_every_member_then_the_shrink_proposal(group):
    a = group.open("a", all_ack_in_sync_state_set=True, sync_flush_timeout=1000, ha_max_time_slave_not_catchup=1000)
    addr = group.master(a, 1, 1, {1, 2, 3}, 1)
    b, c = group.open("b"), group.open("c")
    group.slave(b, addr, 1, 2)
    group.slave(c, addr, 1, 3)
    _connected(a, 2, 3)
    for r in _put(a, 20):
        assert r.status is PutMessageStatus.PUT_OK
        end = r.append_result.wrote_offset + r.append_result.wrote_bytes
        # answered only once both members acknowledged it
        assert b.get_max_phy_offset() >= end and c.get_max_phy_offset() >= end
    c.shutdown()
    r = a.put(msg(body=b"c is gone"))
    assert r.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert "[1, 2, 3]" in r.error and "allAckInSyncStateSet=true" in r.error
    # c is proposed out once it was not caught up for haMaxTimeSlaveNotCatchup
    _wait(lambda: {1, 2} in group.proposals["a"], "the proposal of {1, 2}")
    assert all(p >= {1, 2} for p in group.proposals["a"])  # b, caught up, is never proposed out
    # a put waiting on c is answered once the controller confirms the smaller set
    a.config.sync_flush_timeout = 30_000  # (read per put: it waits for the set, not the clock)
    done = threading.Event()
    answers = []

    def put():
        answers.append(a.put(msg(body=b"after c")))
        done.set()

    t = threading.Thread(target=put)
    t.start()
    _wait(lambda: a.ha_service.group_transfer._rounds, "the put waiting")
    a.ha_service.set_sync_state_set({1, 2}, 2)
    t.join(10)
    assert answers[0].status is PutMessageStatus.PUT_OK
    assert b.get_max_phy_offset() >= answers[0].append_result.wrote_offset + answers[0].append_result.wrote_bytes


def test_min_in_sync_replicas_refuses_a_small_set(group):
    a = group.open("a", min_in_sync_replicas=2)
    addr = group.master(a, 1, 1, {1}, 1)
    before = a.get_max_phy_offset()
    r = a.put(msg(body=b"refused"))
    assert r.status is PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH
    assert "[1]" in r.error and "minInSyncReplicas 2" in r.error
    assert a.get_max_phy_offset() == before  # nothing stored
    assert put_outcome(r.status, r.error) == (int(ResponseCode.SYSTEM_ERROR), r.error, False)
    b = group.open("b")
    group.slave(b, addr, 1, 2)
    _connected(a, 2)
    a.ha_service.set_sync_state_set({1, 2}, 2)
    # minInSyncReplicas 2: one member besides the master acknowledges
    r = a.put(msg(body=b"taken"))
    assert r.status is PutMessageStatus.PUT_OK
    assert b.get_max_phy_offset() >= r.append_result.wrote_offset + r.append_result.wrote_bytes
