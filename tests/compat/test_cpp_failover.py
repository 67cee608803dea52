"""The official C++ client (rocketmq==0.4.4) producing and consuming across an automatic failover.

Two broker groups share one name server (the controller embedded): `broker-fo`, three replicas in
controller mode (tests.controller.failover_group), and `broker-b`, a manual-mode master; the topic
has four queues on each.  The C++ producer streams sync sends with unique keys, the C++ push
consumer reads them; the controller group's master is SIGKILLed mid-stream.  The C++ client needs
no change: its sends go on to `broker-b` at once (a send to the dead master fails and its retry
picks another broker name), and reach `broker-fo` again once its route poll (fixed at 30 s in
librocketmq, not settable through its C API) finds the new master as brokerId 0.  Every key
answered SEND_OK is consumed (at least once: duplicates are counted, not failed)."""
from __future__ import annotations

import json
import time

import pytest

from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.common.fastjson import loads_lenient
from tests.broker.ha_cluster import consumer_offsets, queue_ends
from tests.compat.test_cpp_client import Driver
from tests.controller.conftest import etcd  # noqa: F401  (the fixture: one real etcd member)
from tests.controller.failover_group import CLUSTER, GROUP, FailoverGroup, keys_on
from tests.servers import RmqProcess, free_port, write_conf

pytestmark = pytest.mark.compat
pytest.importorskip("rocketmq.client", reason="the official C++ client (rocketmq==0.4.4) is a dev dependency")

TOPIC = "CppFailoverTopic"
OTHER = "broker-b"
CONSUMER_GROUP = "CID_CPP_FAILOVER"


def _start_other_group(g: FailoverGroup, tmp_path) -> tuple[RmqProcess, str]:
    """A plain manual-mode master of another broker name, registered to the same name server."""
    port = free_port()
    conf = write_conf(tmp_path / "other.conf", {
        "brokerClusterName": CLUSTER, "brokerName": OTHER, "brokerId": 0, "brokerRole": "ASYNC_MASTER",
        "brokerIP1": "127.0.0.1", "listenPort": port, "haListenPort": free_port(),
        "storePathRootDir": tmp_path / "store-other", "namesrvAddr": g.namesrv,
        "mappedFileSizeCommitLog": 4 * 1024 * 1024, "mappedFileSizeConsumeQueue": 6000 * 20,
        "maxHashSlotNum": 10000, "maxIndexNum": 40000, "registerNameServerPeriod": 1000})
    p = RmqProcess(["broker", "-c", conf, "--listen-host", "127.0.0.1"])
    p.wait_boot()
    return p, f"127.0.0.1:{port}"


def _wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not reached in {timeout}s")


def _topics(raw, addr) -> dict:
    r = raw.invoke(addr, RequestCode.GET_ALL_TOPIC_CONFIG, {})
    if r.code != ResponseCode.SUCCESS:
        return {}
    return (loads_lenient(r.body) or {}).get("topicConfigTable") or {}


def _route_masters(raw, namesrv) -> dict:
    _resp, route = raw.route(namesrv, TOPIC)
    return {b["brokerName"]: b["brokerAddrs"].get("0") for b in (route or {}).get("brokerDatas", [])}


# ~40 s: with the slow cases (suite time); the default run kills masters under rmq's own clients
# (tests/controller) and reads from a slave under the C++ client (test_cpp_ha)
@pytest.mark.slow
def test_cpp_client_produces_and_consumes_across_a_master_kill(tmp_path, etcd):  # noqa: F811
    g = FailoverGroup(tmp_path, etcd.endpoints)
    other = producer = consumer = None
    try:
        g.start_all()
        old_addr = g.wait_master()["masterAddress"]
        g.create_topic(old_addr, TOPIC)
        g.wait_full_sync_state_set()
        other, other_addr = _start_other_group(g, tmp_path)
        g.create_topic(other_addr, TOPIC)
        _wait(lambda: _route_masters(g.raw, g.namesrv) == {GROUP: old_addr, OTHER: other_addr}, 30,
              "the route naming both groups' masters")

        consumer = Driver(tmp_path / "c", "consume", g.namesrv, TOPIC, CONSUMER_GROUP, "*", "CLUSTERING", 0, 300)
        assert consumer.wait(lambda items: any(i.get("started") for i in items), 45), consumer.stderr_tail()
        producer = Driver(tmp_path / "p", "produce", g.namesrv, TOPIC,
                          json.dumps({"group": "PID_CPP_FAILOVER", "stream": {"seconds": 240, "prefix": "cpp"}}))
        before = lambda items: sum(1 for i in items if i.get("status") == 0)  # noqa: E731
        assert producer.wait(lambda items: before(items) >= 200, 60), producer.stderr_tail()

        for i in range(len(g.procs)):  # the slaves copied the topic config (the next master serves it)
            _wait(lambda: TOPIC in _topics(g.raw, g.addr(i)), 30, f"{TOPIC} on replica {g.addr(i)}")

        killed_at = time.monotonic()
        g.kill(g.index_of(old_addr))
        new_addr = g.wait_master(not_addr=old_addr)["masterAddress"]

        # the producer reaches broker-fo again: a key whose send began after the kill is on the new master
        def sent_after_kill():
            return {i["key"]: i for i in list(producer.items) if i.get("status") == 0 and i["t0"] > killed_at}

        _wait(lambda: sent_after_kill().keys() & keys_on(g.raw, new_addr, TOPIC), 90,
              "a C++ send after the kill stored on the new master")
        n = len(sent_after_kill())
        assert producer.wait(lambda items: len(sent_after_kill()) >= n + 100, 30)
        producer.proc.terminate()  # the stream stops at its next send
        producer.finish(60)
        assert producer.proc.returncode == 0, producer.stderr_tail()

        sends = [i for i in producer.items if "key" in i]
        acked = {i["key"]: i for i in sends if i.get("status") == 0}
        failed = [i for i in sends if "error" in i]
        on_new_master, on_other = keys_on(g.raw, new_addr, TOPIC), keys_on(g.raw, other_addr, TOPIC)
        assert set(acked) <= on_new_master | on_other, "a key answered SEND_OK is stored on neither group"
        after = sorted((i for k, i in acked.items() if i["t0"] > killed_at), key=lambda i: i["t"])
        first_fo = next(i for i in after if i["key"] in on_new_master)
        # the sends went on at once: those between the kill and the failed-over group's return all
        # went to the other group (the C++ client avoided the dead master, its route not yet polled)
        meanwhile = [i for i in after if i["t"] < first_fo["t"]]
        assert meanwhile and all(i["key"] in on_other for i in meanwhile)
        # and none failed: the one send the kill caught retried on the other group
        assert not failed, failed[:5]

        # every acknowledged key is consumed by the C++ consumer
        consumed = lambda: [m["keys"] for m in consumer.messages()]  # noqa: E731
        _wait(lambda: set(acked) <= set(consumed()), 120, "the C++ consumer reading every acknowledged key")
        consumer.proc.terminate()  # a clean shutdown commits the offsets
        consumer.finish(60)
        got = consumed()
        lost = set(acked) - set(got)
        assert not lost, f"{len(lost)} acknowledged keys never consumed, e.g. {sorted(lost)[:5]}"
        duplicates = len(got) - len(set(got))
        # its offsets are committed to the new master, at the end of each queue
        _wait(lambda: consumer_offsets(g.raw, new_addr, CONSUMER_GROUP, TOPIC) == queue_ends(g.raw, new_addr, TOPIC),
              30, "the consumer's offsets committed to the new master")
        print(f"\nC++ client across a failover: kill -> first C++ SEND_OK on {GROUP} (new master {new_addr}) "
              f"{first_fo['t'] - killed_at:.2f} s; {len(meanwhile)} sends to {OTHER} meanwhile, the first "
              f"{after[0]['t'] - killed_at:.2f} s after the kill; {len(acked)} acknowledged, {len(failed)} failed "
              f"sends, {len(got)} consumed ({duplicates} duplicates), 0 lost")
    finally:
        for d in (producer, consumer):
            if d is not None and d.proc.poll() is None:
                d.proc.kill()
        if other is not None:
            other.terminate()
        g.stop()
