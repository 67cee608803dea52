"""Automatic failover with real processes, real kills and a real etcd: a three-replica group in
controller mode (the controller embedded in the name server), rmq's producer streaming with
allAckInSyncStateSet=true.  Rounds of SIGKILL the master (three by default, ten in the slow soak), wait for the election, restart the
killed broker (it rejoins as a slave): every message answered SEND_OK is there afterwards."""
from __future__ import annotations

import statistics
import time

import pytest

from rmq_core import Producer
from rmq_core.remoting.codes import ResponseCode
from tests.controller.failover_group import QUEUES, TOPIC, FailoverGroup, Stream, keys_on, kill_rounds


@pytest.fixture
def group(tmp_path, etcd):
    g = FailoverGroup(tmp_path, etcd.endpoints)
    try:
        yield g
    finally:
        g.stop()


def test_three_master_kills_lose_no_acknowledged_message(group):
    """Every replica killed once as master (the ten-round soak runs with `make test-slow`)."""
    _kills(group, 3)


@pytest.mark.slow
def test_ten_master_kills_lose_no_acknowledged_message(group):
    _kills(group, 10)


@pytest.mark.slow
def test_ten_master_kills_over_three_etcd_members(tmp_path, etcd3):
    g = FailoverGroup(tmp_path, etcd3.endpoints)
    try:
        _kills(g, 10)
    finally:
        g.stop()


def _kills(g, rounds: int):
    failover_times, stream = kill_rounds(g, rounds)
    acknowledged = {k for _t, k in stream.ok}
    _mid, master_addr, _e = g.master()
    # the topic's route survived every election (a new master adopts the topics it holds
    # messages of, even when it never copied their configs from the master it replaced)
    route = g.raw.route(g.namesrv, TOPIC)[1]
    assert [(q["brokerName"], q["writeQueueNums"]) for q in route["queueDatas"]] == [("broker-fo", QUEUES)]
    stored = keys_on(g.raw, master_addr)
    lost = acknowledged - stored
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    print(f"\nfailover kill -> first SEND_OK over {len(failover_times)} rounds: "
          f"p50 {statistics.median(failover_times):.2f} s, max {max(failover_times):.2f} s; "
          f"{len(acknowledged)} acknowledged, {stream.failed} failed sends")


def _send(raw, addr, key, timeout=5.0):
    return raw.send(addr, TOPIC, key.encode() + b"-payload", keys=key, queue_id=0)


def _wait_writable(g, addr, timeout=30.0):
    """Until the elected master takes writes (its first heartbeat as master renewed its lease)."""
    deadline = time.monotonic() + timeout
    while True:
        r = _send(g.raw, addr, "probe")
        if r.code == ResponseCode.SUCCESS:
            return
        assert time.monotonic() < deadline, f"{addr} never took writes: {r.remark}"
        time.sleep(0.05)


def test_paused_master_never_answers_send_ok_again_and_rejoins_as_slave(tmp_path, etcd):
    """SIGSTOP the master past its lease: a new master is elected; SIGCONT: the old one refuses
    even the send it had read before the pause, becomes a slave, and its log is cut back to
    what the new master holds.  Its Prometheus series count the role changes."""
    import signal

    from rmq_core.remoting.codes import RequestCode
    from tests.metrics.test_prometheus import scrape, value
    from tests.servers import free_port
    metrics_ports = [free_port() for _ in range(3)]
    g = FailoverGroup(tmp_path, etcd.endpoints, replica_props=[
        {"metricsExporterType": "PROM", "metricsPromExporterPort": p} for p in metrics_ports])
    try:
        _paused_master(g, metrics_ports, signal, RequestCode, scrape, value)
    finally:
        g.stop()


def _paused_master(g, metrics_ports, signal, RequestCode, scrape, value):
    g.start_all()
    state = g.wait_master()
    old_addr = state["masterAddress"]
    g.create_topic(old_addr)
    g.wait_full_sync_state_set()
    for i in range(50):
        assert _send(g.raw, old_addr, f"before{i}").code == ResponseCode.SUCCESS
    old = g.index_of(old_addr)
    g.signal(old, signal.SIGSTOP)
    try:
        # read by the old master only once it resumes
        pending = g.raw.invoke_async(old_addr, RequestCode.SEND_MESSAGE_V2, {
            "producerGroup": "PG", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
            "properties": "KEYS\x01paused\x02", "reconsumeTimes": "0", "unitMode": "false", "batch": "false"},
            b"paused-send")
        new = g.wait_master(not_addr=old_addr)
        new_addr = new["masterAddress"]
        _wait_writable(g, new_addr)
        for i in range(20):
            assert _send(g.raw, new_addr, f"after{i}").code == ResponseCode.SUCCESS
    finally:
        g.signal(old, signal.SIGCONT)
    answer = pending.result(30)
    assert answer.code != ResponseCode.SUCCESS, "the paused master acknowledged a write after losing its lease"
    r = _send(g.raw, old_addr, "to-old-master")
    assert r.code != ResponseCode.SUCCESS
    # it rejoins as a slave and catches up: the group's sync state set is whole again
    g.wait(lambda s: any(x["address"] == old_addr and x["role"] == "SLAVE" and x["inSyncStateSet"]
                         for x in s["replicas"]), 60, "the old master back in the sync state set as a slave")
    assert "paused" not in keys_on(g.raw, new_addr)
    # its log is the new master's, byte for byte, up to its end
    from tests.broker.ha_group import commit_log_segments
    mine = commit_log_segments(g.tmp_path / f"store{old}")
    theirs = commit_log_segments(g.tmp_path / f"store{g.index_of(new_addr)}")
    for name, data in mine.items():
        assert theirs[name][:len(data.rstrip(b"\0"))] == data.rstrip(b"\0"), f"segment {name} differs"
    samples = scrape(metrics_ports[old])
    assert value(samples, "rocketmq_broker_role_changes_total", broker_role="SYNC_MASTER") == 1
    assert value(samples, "rocketmq_broker_role_changes_total", broker_role="SLAVE") == 1
    assert value(samples, "rocketmq_broker_master_epoch") == new["masterEpoch"]


# all_ack by default; async, the same elections with another replication mode, with the slow cases
@pytest.fixture(params=["all_ack", pytest.param("async", marks=pytest.mark.slow)])
def group3(request, tmp_path, etcd3):
    props = {} if request.param == "all_ack" else {"allAckInSyncStateSet": "false"}
    g = FailoverGroup(tmp_path, etcd3.endpoints, broker_props=props)
    try:
        yield g, etcd3, request.param == "all_ack"
    finally:
        g.stop()


def _sends_during(stream, seconds: float) -> int:
    n = len(stream.ok)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    return len(stream.ok) - n


def test_etcd_member_lost_changes_nothing_quorum_lost_never_elects(group3):
    """One etcd member of three lost: nothing changes.  Quorum lost: no election; reads go on;
    writes go on where the master's failsafe holds (allAckInSyncStateSet: every write waits for
    each sync-state-set member, the only replicas an election could pick), else they pause once
    its lease runs out; all resume when etcd returns."""
    g, etcd, failsafe = group3
    state = g.start_ready()
    producer = Producer("PG_ETCD", namesrv=g.namesrv, send_msg_timeout=3.0).start()
    stream = Stream(producer)
    try:
        leader = etcd.leader()
        etcd.kill(leader)  # one member of three
        assert _sends_during(stream, 4) > 50
        assert g.master()[2] == state["masterEpoch"], "an election without need"
        other = next(i for i in range(3) if i != leader)
        etcd.kill(other)  # quorum lost
        _sends_during(stream, 5)  # past the master's lease
        during = _sends_during(stream, 3)
        if failsafe:
            assert during > 20, "writes stopped although the failsafe holds"
        else:
            assert during == 0, "writes acknowledged without a lease while etcd has no quorum"
        r = g.raw.pull(state["masterAddress"], TOPIC, 0, 0, max_nums=1)
        assert r.code == ResponseCode.SUCCESS, r.remark
        etcd.restart(leader)
        etcd.restart(other)
        deadline = time.monotonic() + 60
        n = len(stream.ok)
        while len(stream.ok) <= n + 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(stream.ok) > n + 20, "writes did not resume after etcd came back"
        assert g.master()[1] == state["masterAddress"], "a new master although the old one never left"
    finally:
        stream.stop()
        producer.shutdown()
    acknowledged = {k for _t, k in stream.ok}
    assert acknowledged <= keys_on(g.raw, g.master()[1])


def test_elect_master_switch_over_under_load_loses_nothing(group):
    """electMaster: the chosen replica catches up, the old master steps down to a slave; no
    acknowledged write lost, and writes pause only for the switch (the pause is printed)."""
    import json

    from rmq_core.remoting.codes import RequestCode
    g = group
    state = g.start_ready()
    target = next(r for r in state["replicas"] if r["role"] == "SLAVE")
    producer = Producer("PG_SWITCH", namesrv=g.namesrv, send_msg_timeout=3.0).start()
    stream = Stream(producer)
    try:
        while len(stream.ok) < 300:
            time.sleep(0.02)
        asked = time.monotonic()
        r = g.raw.invoke(g.namesrv, RequestCode.CONTROLLER_ELECT_MASTER, {
            "clusterName": "FailoverCluster", "brokerName": "broker-fo", "brokerId": str(target["brokerId"])},
            timeout=20)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.ext_fields["masterAddress"] == target["address"]
        assert int(r.ext_fields["masterEpoch"]) == state["masterEpoch"] + 1
        n = len(stream.ok)
        while len(stream.ok) < n + 300:
            time.sleep(0.02)
    finally:
        stream.stop()
        producer.shutdown()
    times = [t for t, _k in stream.ok]
    pause = max(b - a for a, b in zip(times, times[1:]) if b > asked - 5)
    acknowledged = {k for _t, k in stream.ok}
    assert acknowledged <= keys_on(g.raw, target["address"])
    # the old master rejoins as a slave of the new one
    g.wait(lambda s: any(x["address"] == state["masterAddress"] and x["role"] == "SLAVE" for x in s["replicas"]),
           30, "the old master a slave")
    print(f"\nelectMaster under load: longest pause between acknowledged sends {pause * 1000:.0f} ms, "
          f"{len(acknowledged)} acknowledged, {stream.failed} failed sends; {json.dumps(r.ext_fields)}")


def _topic_known(g, addr, topic) -> bool:
    import json

    from rmq_core.remoting.codes import RequestCode
    r = g.raw.invoke(addr, RequestCode.GET_ALL_TOPIC_CONFIG, {})
    return r.code == ResponseCode.SUCCESS and topic in json.loads(r.body).get("topicConfigTable", {})


def test_new_master_keeps_a_topic_its_slaves_had_not_synced(group):
    """A topic created moments before the master dies (the slaves copy topic configs every 10 s):
    the new master adopts it from the messages it holds, so its route and messages stay."""
    g = group
    g.start_all()
    state = g.wait_master()
    g.wait_full_sync_state_set()
    old_addr = state["masterAddress"]
    slaves = [g.addr(i) for i in range(3) if g.addr(i) != old_addr]
    topic = "AdoptedTopic"
    g.create_topic(old_addr, topic)
    assert not any(_topic_known(g, a, topic) for a in slaves), "a slave synced already: nothing to show"
    for i in range(20):
        assert g.raw.send(old_addr, topic, b"m", keys=f"a{i}", queue_id=i % QUEUES).code == ResponseCode.SUCCESS
    g.kill(g.index_of(old_addr))
    new_addr = g.wait_master(not_addr=old_addr)["masterAddress"]

    def routed():
        _resp, route = g.raw.route(g.namesrv, topic)
        return route is not None and [(q["brokerName"], q["writeQueueNums"]) for q in route["queueDatas"]] == \
            [("broker-fo", QUEUES)] and route["brokerDatas"][0]["brokerAddrs"].get("0") == new_addr
    deadline = time.monotonic() + 30
    while not (routed() and _topic_known(g, new_addr, topic)):
        assert time.monotonic() < deadline, "the topic's route did not survive the failover"
        time.sleep(0.1)
    # and it never went away: the new master's registrations carried it from the first
    for _ in range(10):
        assert routed()
        time.sleep(0.1)
    assert keys_on(g.raw, new_addr, topic) == {f"a{i}" for i in range(20)}


def test_master_restarted_within_its_lease_faces_an_election(group):
    """A master killed and restarted before its lease ran out does not simply carry on: the
    controller sees a new incarnation, drops it as master and elects again at a new epoch among
    every member's logs; no acknowledged message is lost."""
    g = group
    state = g.start_ready()
    producer = Producer("PG_RESTART", namesrv=g.namesrv, send_msg_timeout=3.0).start()
    stream = Stream(producer)
    try:
        while len(stream.ok) < 200:
            time.sleep(0.02)
        victim = g.index_of(state["masterAddress"])
        g.kill(victim)
        g.start(victim)  # about a second: well within the 3 s lease
        after = g.wait(lambda s: s["masterEpoch"] > state["masterEpoch"] and s.get("masterAddress"), 30,
                       "an election after the restart")
        n = len(stream.ok)
        deadline = time.monotonic() + 30
        while len(stream.ok) < n + 100:
            assert time.monotonic() < deadline, "writes did not resume"
            time.sleep(0.02)
    finally:
        stream.stop()
        producer.shutdown()
    assert {k for _t, k in stream.ok} <= keys_on(g.raw, g.master()[1])
    assert after["masterEpoch"] == state["masterEpoch"] + 1


def test_standalone_controllers_any_answers_one_lost_changes_nothing(tmp_path, etcd):
    """Two `rmq controller` processes over one etcd: the brokers list both; with one killed the
    other renews every lease (no election without need) and elects when the master dies."""
    g = FailoverGroup(tmp_path, etcd.endpoints, standalone_controllers=2)
    try:
        state = g.start_ready()
        g.controllers[0].kill()
        producer = Producer("PG_CTRL", namesrv=g.namesrv, send_msg_timeout=3.0).start()
        stream = Stream(producer)
        try:
            end = time.monotonic() + 5  # past a lease: the other controller renews them
            while time.monotonic() < end:
                time.sleep(0.1)
            assert g.master()[2] == state["masterEpoch"], "an election without need"
            assert len(stream.ok) > 50
            killed = time.monotonic()
            g.kill(g.index_of(state["masterAddress"]))
            new = g.wait_master(not_addr=state["masterAddress"])
            deadline = time.monotonic() + 30
            while stream.first_ok_after(killed) is None:
                assert time.monotonic() < deadline, "writes did not resume on the new master"
                time.sleep(0.05)
        finally:
            stream.stop()
            producer.shutdown()
        assert new["masterEpoch"] == state["masterEpoch"] + 1
        assert {k for _t, k in stream.ok} <= keys_on(g.raw, new["masterAddress"])
    finally:
        g.stop()
