"""A real cluster of `rmq namesrv` + `rmq broker` processes on loopback."""
import json
import os
import signal
import time

import pytest

from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.rawclient import RawClient
from tests.servers import NamesrvAndBroker, RmqProcess, free_port, write_conf


def _wait_route(raw, namesrv, topic, pred, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        resp, route = raw.route(namesrv, topic)
        if pred(resp, route):
            return resp, route
        time.sleep(0.1)
    raise AssertionError(f"route of {topic} never satisfied the condition; last: {resp.code} {route}")


@pytest.fixture
def raw():
    r = RawClient()
    yield r
    r.close()


def test_two_brokers_one_cluster_routes_and_traffic(tmp_path, raw):
    cl = NamesrvAndBroker(tmp_path, brokers=2)
    try:
        # TBW102 routes to both brokers; a topic created on both is routed to both.
        _, route = _wait_route(raw, cl.namesrv, "TBW102", lambda r, d: d and len(d["brokerDatas"]) == 2)
        names = sorted(b["brokerName"] for b in route["brokerDatas"])
        assert names == ["broker-a", "broker-b"]
        for addr in cl.broker_addrs:
            r = raw.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                           {"topic": "Both", "readQueueNums": "2", "writeQueueNums": "2", "perm": "6"})
            assert r.code == 0, r.remark
        _, route = _wait_route(raw, cl.namesrv, "Both", lambda r, d: d and len(d["queueDatas"]) == 2)
        for b in route["brokerDatas"]:
            addr = b["brokerAddrs"]["0"]
            for q in range(2):
                assert raw.send(addr, "Both", f"{b['brokerName']}-{q}".encode(), queue_id=q).code == 0
        for addr in cl.broker_addrs:
            r = raw.invoke(addr, RequestCode.GET_MAX_OFFSET, {"topic": "Both", "queueId": "1"})
            assert r.ext_fields["offset"] == "1"
        info = raw.invoke(cl.namesrv, RequestCode.GET_BROKER_CLUSTER_INFO, {})
        assert sorted(json.loads(info.body)["clusterAddrTable"]["DefaultCluster"]) == ["broker-a", "broker-b"]
    finally:
        cl.stop()


def test_route_disappears_when_broker_dies(tmp_path, raw):
    cl = NamesrvAndBroker(tmp_path, brokers=2)
    try:
        _wait_route(raw, cl.namesrv, "TBW102", lambda r, d: d and len(d["brokerDatas"]) == 2)
        cl.brokers[1].kill()  # SIGKILL: the connection closes, the name server drops the broker
        _, route = _wait_route(raw, cl.namesrv, "TBW102", lambda r, d: d and len(d["brokerDatas"]) == 1)
        assert route["brokerDatas"][0]["brokerName"] == "broker-a"
        cl.brokers[0].terminate()  # clean stop unregisters
        _wait_route(raw, cl.namesrv, "TBW102", lambda r, d: r.code == ResponseCode.TOPIC_NOT_EXIST)
    finally:
        cl.stop()


def test_broker_bad_config_exits_with_one_clear_line(tmp_path):
    conf = write_conf(tmp_path / "bad.conf", {"brokerName": "b", "listenPort": free_port(), "flushDiskTyp": "SYNC_FLUSH",
                                              "storePathRootDir": tmp_path / "s"})
    p = RmqProcess(["broker", "-n", "127.0.0.1:1", "-c", conf])
    assert p.proc.wait(30) == 2
    p._reader.join(5)
    assert any("unknown key 'flushDiskTyp'" in l for l in p.lines), p.lines
    conf = write_conf(tmp_path / "bad2.conf", {"listenPort": free_port(), "flushDiskType": "SOMETIMES",
                                               "storePathRootDir": tmp_path / "s"})
    p = RmqProcess(["broker", "-n", "127.0.0.1:1", "-c", conf])
    assert p.proc.wait(30) == 2
    p._reader.join(5)
    assert any("'SOMETIMES'" in l for l in p.lines), p.lines


def test_port_in_use_and_unwritable_store(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = RmqProcess(["namesrv", "--listen", f"127.0.0.1:{port}"])
        assert p.proc.wait(30) == 2
        p._reader.join(5)
        assert any("address already in use" in l for l in p.lines), p.lines
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    if os.geteuid() == 0:
        target = "/proc/rmq-cannot-write-here"  # root ignores mode bits; /proc refuses everyone
    else:
        target = str(ro / "store")
    p = RmqProcess(["standalone", "--store", target, "--namesrv-listen", f"127.0.0.1:{free_port()}",
                    "--broker-listen", f"127.0.0.1:{free_port()}"])
    assert p.proc.wait(30) == 2
    p._reader.join(5)
    assert any("not writable" in l for l in p.lines), p.lines


def test_standalone_stops_cleanly_on_sigterm(tmp_path):
    store = tmp_path / "sa"
    p = RmqProcess(["standalone", "--store", str(store), "--namesrv-listen", f"127.0.0.1:{free_port()}",
                    "--broker-listen", f"127.0.0.1:{free_port()}"], ("The Name Server boot success", "boot success. serializeType=JSON and name server is"))
    p.wait_boot()
    assert (store / "abort").exists()
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(30) == 0
    assert not (store / "abort").exists() and (store / "checkpoint").exists()


def test_broker_registers_with_every_name_server(tmp_path, raw):
    ns = [RmqProcess(["namesrv", "--listen", f"127.0.0.1:{p}"], ("The Name Server boot success",))
          for p in (free_port(), free_port())]
    addrs = []
    try:
        for p in ns:
            p.wait_boot()
            addrs.append(p.args[-1])
        port = free_port()
        conf = write_conf(tmp_path / "b.conf", {"brokerName": "broker-multi", "listenPort": port,
                                                "brokerIP1": "127.0.0.1", "storePathRootDir": tmp_path / "s",
                                                "mappedFileSizeCommitLog": 4194304})
        b = RmqProcess(["broker", "-n", ";".join(addrs), "-c", conf, "--listen-host", "127.0.0.1"], ("boot success",))
        try:
            b.wait_boot()
            for a in addrs:
                _, route = _wait_route(raw, a, "TBW102", lambda r, d: d is not None)
                assert route["brokerDatas"][0]["brokerAddrs"]["0"] == f"127.0.0.1:{port}"
        finally:
            b.terminate()
    finally:
        for p in ns:
            p.terminate()
