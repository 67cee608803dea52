"""SYNC_MASTER through the broker's native send lane: sends in flight share a replication round's
Future and the lane answers each group once a slave acknowledged it (or answers the group's
failure), byte for byte what the general path would answer."""
from __future__ import annotations

import time

from rmq_core.config import BrokerRole
from rmq_core.remoting.codes import ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.store import DefaultMessageStore
from tests.broker.test_send_lane import V2, RawSocket, _warm, frame, lane_of, v2_fields
from tests.store.conftest import make_config


def _slave_of(cluster, tmp_path):
    slave = DefaultMessageStore(make_config(tmp_path / "slave", broker_role=BrokerRole.SLAVE))
    slave.load()
    slave.start()
    slave.update_ha_master_address(f"127.0.0.1:{cluster.broker.store.ha_service.listen_port}")
    deadline = time.monotonic() + 30
    while not any(c.slave_request_offset >= 0 for c in cluster.broker.store.ha_service.connections):
        assert time.monotonic() < deadline, "the slave never connected"
        time.sleep(0.01)
    return slave


def test_sync_master_sends_take_the_lane_and_are_answered_once_acknowledged(make_cluster, tmp_path):
    cluster = make_cluster({"brokerRole": "SYNC_MASTER", "haListenPort": "0"}, store=tmp_path / "master")
    store = cluster.broker.store
    slave = _slave_of(cluster, tmp_path)
    s = RawSocket(cluster.broker_addr)
    try:
        _warm(s, "Replicated")
        rounds = store.ha_service.group_transfer.rounds_resolved
        s.send(b"".join(frame(V2, v2_fields("Replicated", i % 2), b"r" * 64, opaque=10 + i) for i in range(50)))
        for _ in range(50):
            ans = RemotingCommand.decode(s.recv_frame())
            assert ans.code == ResponseCode.SUCCESS, ans.remark
            # answered after a slave acknowledged the message's bytes
            phys = int(ans.ext_fields["msgId"][16:], 16)
            assert store.ha_service.push_to_slave_max_offset > phys
        lane = lane_of(cluster, s)
        assert lane.deferred == 50 and lane.handled == 0  # put by the lane, answered when acknowledged
        assert store.ha_service.group_transfer.rounds_resolved - rounds < 50  # groups shared rounds
    finally:
        s.close()
        slave.shutdown()


def test_sync_master_lane_answers_slave_not_available_without_a_slave(make_cluster, tmp_path):
    cluster = make_cluster({"brokerRole": "SYNC_MASTER", "haListenPort": "0"}, store=tmp_path / "alone")
    s = RawSocket(cluster.broker_addr)
    try:
        for opaque in (1, 2):
            s.send(frame(V2, v2_fields("Alone", 0), b"w", opaque=opaque))
            assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SLAVE_NOT_AVAILABLE
        s.send(b"".join(frame(V2, v2_fields("Alone", 0), b"a", opaque=10 + i) for i in range(20)))
        answers = [RemotingCommand.decode(s.recv_frame()) for _ in range(20)]
        assert {a.code for a in answers} == {ResponseCode.SLAVE_NOT_AVAILABLE}
        assert all(a.ext_fields["msgId"] for a in answers)  # stored: the answer names the message
        assert lane_of(cluster, s).deferred == 20
    finally:
        s.close()
    assert cluster.broker.store.get_max_offset_in_queue("Alone", 0) == 22
