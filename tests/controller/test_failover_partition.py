"""Automatic failover across a network partition: the master of a three-replica group runs in a
network namespace of its own, joined to the root namespace (etcd, the name server with the
controller, the two other replicas, the producer) by a veth pair; the test cuts that link.

A new master is elected among the others; the cut-off master, once its lease lapsed, refuses
every write (a client inside its namespace still reaches it); no SEND_OK is lost; the name server
never routes the group to two masters.  Healed, the old master learns the new epoch, rejoins as a
slave with its log cut back to the new master's, and the sync state set is whole again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from rmq_core import Producer
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.broker.ha_group import commit_log_segments
from tests.controller.failover_group import GROUP, TOPIC, FailoverGroup
from tests.controller.failover_group import Stream, keys_on
from tests.netns import NetNs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A send from inside the namespace, by rmq's raw test client: prints the answer's code and remark.
_SEND_FROM_INSIDE = """
import json, sys
from tests.rawclient import RawClient
raw = RawClient()
try:
    r = raw.send(sys.argv[1], sys.argv[2], sys.argv[3].encode() + b"-payload", keys=sys.argv[3], queue_id=0)
    print(json.dumps({"code": r.code, "remark": r.remark}))
finally:
    raw.close()
"""


@pytest.fixture
def netns():
    try:
        ns = NetNs()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield ns
    finally:
        ns.close()


@pytest.fixture
def group(tmp_path, etcd, netns):
    # replica 0 (the first master) inside the namespace; the name server and the others on the
    # veth's root-side address, so that replica reaches them and they reach it.
    g = FailoverGroup(tmp_path, etcd.endpoints, hosts=[netns.ns_ip, netns.root_ip, netns.root_ip],
                      namesrv_host=netns.root_ip, prefixes={0: netns.exec_prefix})
    try:
        yield g
    finally:
        g.stop()


def wait_topic_on(g: FailoverGroup, addrs: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for addr in addrs:
        while True:
            r = g.raw.invoke(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
            if r.code == ResponseCode.SUCCESS and TOPIC in json.loads(r.body).get("topicConfigTable", {}):
                break
            assert time.monotonic() < deadline, f"{addr} has not synced {TOPIC} from its master in {timeout}s"
            time.sleep(0.2)


def send_from(netns: NetNs, addr: str, key: str) -> dict:
    r = subprocess.run([*netns.exec_prefix, sys.executable, "-c", _SEND_FROM_INSIDE, addr, TOPIC, key],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


class RouteWatch:
    """Polls the name server's route of TOPIC; keeps every distinct brokerId-0 address set of the
    group it saw, in order, with when."""

    def __init__(self, raw, namesrv):
        self.raw, self.namesrv = raw, namesrv
        self.seen: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                _resp, route = self.raw.route(self.namesrv, TOPIC)
            except (OSError, TimeoutError, RuntimeError):
                route = None
            if route:
                masters = [bd["brokerAddrs"][k] for bd in route["brokerDatas"] if bd["brokerName"] == GROUP
                           for k in bd["brokerAddrs"] if int(k) == 0]
                if not self.seen or self.seen[-1][1] != masters:
                    self.seen.append((time.monotonic(), masters))
            self._stop.wait(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join(10)


def test_partitioned_master_is_fenced_replaced_and_rejoins_as_slave(group, netns):
    g = group
    g.start(0)
    state = g.wait_master()
    old_addr = g.addr(0)
    assert state["masterAddress"] == old_addr, "the first master is not the namespaced replica"
    g.start(1)
    g.start(2)
    g.create_topic(old_addr)
    state = g.wait_full_sync_state_set()
    # Slaves learn topics from their master's config every 10 s (SlaveSynchronize), not through
    # replication: a new master that missed one registers without it and the name server drops
    # its route.  Cut only once both replicas hold the topic.
    wait_topic_on(g, [g.addr(1), g.addr(2)])
    epoch = state["masterEpoch"]
    producer = Producer("PG_PARTITION", namesrv=g.namesrv, send_msg_timeout=3.0).start()
    stream = Stream(producer)
    routes = RouteWatch(g.raw, g.namesrv)
    try:
        while len(stream.ok) < 200:
            assert stream._thread.is_alive()
            time.sleep(0.02)
        cut_at = time.monotonic()
        netns.cut()
        new = g.wait_master(not_addr=old_addr, timeout=30)
        elected = time.monotonic() - cut_at
        new_addr = new["masterAddress"]
        assert new["masterEpoch"] > epoch
        # The old master's lease has run out (that is what let the election happen): it refuses
        # every write now, from a client that still reaches it.
        refusals = []
        for i in range(3):
            answer = send_from(netns, old_addr, f"partitioned{i}")
            assert answer["code"] != ResponseCode.SUCCESS, f"the partitioned old master answered SEND_OK: {answer}"
            remark = answer["remark"] or ""
            assert "[FENCED]" in remark or "not master" in remark.lower(), answer
            refusals.append(answer)
        deadline = time.monotonic() + 60
        while stream.first_ok_after(cut_at, by=new_addr) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        first = stream.first_ok_after(cut_at, by=new_addr)
        assert first is not None, (f"no SEND_OK from the new master {new_addr} ({stream.failed} failed sends); "
                                   f"routes {routes.seen}; the producer's {producer.instance.broker_addr_table}")
        n = len(stream.ok)
        while len(stream.ok) < n + 100 and time.monotonic() < deadline:
            time.sleep(0.02)
        # heal: the old master learns the new epoch and rejoins as a slave in the sync state set
        netns.heal()
        healed_at = time.monotonic()
        g.wait(lambda s: any(x["address"] == old_addr and x["role"] == "SLAVE" and x["inSyncStateSet"]
                             for x in s["replicas"]), 60, "the old master back in the sync state set as a slave")
        converged = g.wait_full_sync_state_set(timeout=30)
        rejoined = time.monotonic() - healed_at
        assert converged["masterAddress"] == new_addr and converged["masterEpoch"] == new["masterEpoch"]
        n = len(stream.ok)
        while len(stream.ok) < n + 50 and time.monotonic() < deadline + 60:
            time.sleep(0.02)
    finally:
        stream.stop()
        producer.shutdown()
        routes.stop()
    # every SEND_OK is held by the new master; none of the refused writes is
    stored = keys_on(g.raw, new_addr)
    acknowledged = {k for _t, k in stream.ok}
    lost = acknowledged - stored
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    assert not {k for k in stored if k.startswith("partitioned")}
    # the name server never routed the group to two masters, nor back to the old one once the
    # new master registered
    assert all(len(m) <= 1 for _t, m in routes.seen), routes.seen
    shown = [m for _t, m in routes.seen]
    assert [new_addr] in shown, f"the name server never routed to the new master: {routes.seen}"
    assert all(m in ([], [new_addr]) for m in shown[shown.index([new_addr]):]), routes.seen
    # the old master's log is the new master's, byte for byte, up to its end: what it wrote
    # after losing leadership (the refused sends) was cut
    mine = commit_log_segments(g.tmp_path / "store0")
    theirs = commit_log_segments(g.tmp_path / f"store{g.index_of(new_addr)}")
    for name, data in mine.items():
        assert theirs[name][:len(data.rstrip(b"\0"))] == data.rstrip(b"\0"), f"segment {name} differs"
    print(f"\npartition: cut -> new master elected {elected:.2f} s, cut -> first SEND_OK on the new master "
          f"{first - cut_at:.2f} s; heal -> old master back in the sync state set {rejoined:.2f} s; "
          f"{len(acknowledged)} acknowledged, {stream.failed} failed sends; refusals: "
          f"{sorted({(a['remark'] or '')[:60] for a in refusals})}")
