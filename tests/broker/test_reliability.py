"""Reliability against real processes (issue 13): a full disk refuses writes and the broker lives
on; a restarted broker answers retryably; one broker per store; recovery after SIGKILL touches
only the written part of a big segment; a SYNC_FLUSH broker killed over and over loses nothing it
acknowledged."""
from __future__ import annotations

import os
import random
import threading
import time

import pytest

from rmq_core import Message, Producer
from rmq_core.client.producer import RETRY_RESPONSE_CODES
from rmq_core.codec import decode_messages
from rmq_core.errors import MQBrokerError
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.rawclient import RawClient
from tests.servers import RmqProcess, Tmpfs, free_port, write_conf

TOPIC = "Reliable"
QUEUES = 2


class Rig:
    """`rmq namesrv` + one `rmq broker` whose store and port survive restarts."""

    def __init__(self, tmp_path, store, props=None):
        self.tmp_path = tmp_path
        self.namesrv = f"127.0.0.1:{free_port()}"
        self.ns = RmqProcess(["namesrv", "--listen", self.namesrv], ("The Name Server boot success",))
        self.ns.wait_boot()
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.store = str(store)
        self.conf = write_conf(tmp_path / "broker.conf", {
            "brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "listenPort": self.port,
            "brokerIP1": "127.0.0.1", "storePathRootDir": self.store,
            "mappedFileSizeCommitLog": 1024 * 1024, "mappedFileSizeConsumeQueue": 1000 * 20,
            "maxHashSlotNum": 1000, "maxIndexNum": 4000, "registerNameServerPeriod": 2000,
            **(props or {})})
        self.broker: RmqProcess | None = None
        self.raw = RawClient()
        self.start_broker()
        r = self.raw.invoke(self.addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                            {"topic": TOPIC, "readQueueNums": str(QUEUES), "writeQueueNums": str(QUEUES), "perm": "6"})
        assert r.code == 0, r.remark
        deadline = time.time() + 15
        while True:
            resp, route = self.raw.route(self.namesrv, TOPIC)
            if route and route["queueDatas"]:
                break
            assert time.time() < deadline, "the topic never got a route"
            time.sleep(0.1)

    def start_broker(self, wait: bool = True) -> RmqProcess:
        self.broker = RmqProcess(["broker", "-n", self.namesrv, "-c", self.conf, "--listen-host", "127.0.0.1"],
                                 ("boot success",))
        if wait:
            self.broker.wait_boot(60)
        return self.broker

    def pull_all(self) -> list[bytes]:
        bodies = []
        for q in range(QUEUES):
            off = 0
            while True:
                r = self.raw.pull(self.addr, TOPIC, q, off, max_nums=32)
                if r.code != ResponseCode.SUCCESS:
                    break
                msgs = decode_messages(r.body)
                bodies += [m.body for m in msgs]
                off = int(r.ext_fields["nextBeginOffset"])
        return bodies

    def close(self) -> None:
        self.raw.close()
        if self.broker is not None:
            self.broker.terminate()
        self.ns.terminate()


def _non_retryable(e: BaseException) -> bool:
    return isinstance(e, MQBrokerError) and e.code not in RETRY_RESPONSE_CODES


# --- a full disk ------------------------------------------------------------------------------
@pytest.mark.parametrize("flush,filled_by", [("ASYNC_FLUSH", "burst"), ("SYNC_FLUSH", "burst"),
                                             ("ASYNC_FLUSH", "other_process")])
def test_full_disk_refuses_writes_keeps_serving_and_resumes(tmp_path, flush, filled_by):
    """Producers send until refused on an 8 MiB tmpfs with 1 MiB segments: the broker stays up
    (no SIGBUS), the refusal names the store path and the free bytes, every acknowledged message
    stays consumable, and writes resume on their own once space is freed - whether the producers
    filled the disk or another process filled it while the broker was idle."""
    disk = Tmpfs.mount(tmp_path / "disk", "8m")
    rig = None
    try:
        ballast = os.path.join(disk.path, "ballast")
        if filled_by == "burst":
            with open(ballast, "wb") as f:  # what the operator frees later
                f.write(b"\x01" * (3 * 1024 * 1024))
        rig = Rig(tmp_path, os.path.join(disk.path, "store"), {"flushDiskType": flush})
        acked: list[bytes] = []
        refusal = None
        with Producer("PG_DISK", namesrv=rig.namesrv, send_msg_timeout=10) as p:
            def send_until_refused(limit):
                for i in range(limit):
                    body = b"m%06d-" % len(acked) + b"x" * 1000
                    try:
                        p.send(Message(TOPIC, body))
                    except MQBrokerError as e:
                        return e
                    acked.append(body)
                return None

            if filled_by == "other_process":
                assert send_until_refused(50) is None
                disk.fill()  # dd, while the broker is idle
                ballast = os.path.join(disk.path, "filler")
            refusal = send_until_refused(20000)
            assert refusal is not None, "the disk never filled"
            assert rig.broker.proc.poll() is None, "the broker died when the disk filled:\n" + "\n".join(rig.broker.lines[-20:])
            assert refusal.code == ResponseCode.SERVICE_NOT_AVAILABLE, refusal
            assert "bytes free" in refusal.remark and rig.store in refusal.remark, refusal.remark
            # reads, pulls and admin keep working while writes are refused
            got = rig.pull_all()
            missing = set(acked) - set(got)
            assert not missing, (len(acked), len(got), sorted(m[:8] for m in missing)[:10],
                                 [rig.raw.invoke(rig.addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(q)}).ext_fields for q in range(QUEUES)],
                                 [rig.raw.invoke(rig.addr, RequestCode.GET_MIN_OFFSET, {"topic": TOPIC, "queueId": str(q)}).ext_fields for q in range(QUEUES)],
                                 rig.broker.lines[-10:])
            assert sorted(got) == sorted(acked)
            r = rig.raw.invoke(rig.addr, RequestCode.GET_BROKER_RUNTIME_INFO, {})
            assert r.code == ResponseCode.SUCCESS
            # the operator frees space: writes resume by themselves
            os.remove(ballast)
            deadline = time.time() + 30
            while True:
                body = b"after-%d" % len(acked)
                try:
                    p.send(Message(TOPIC, body))
                    acked.append(body)
                    break
                except MQBrokerError as e:
                    assert not _non_retryable(e), e
                    assert time.time() < deadline, f"writes did not resume: {e}"
                    time.sleep(0.2)
            for i in range(20):
                body = b"after-%d" % len(acked)
                p.send(Message(TOPIC, body))
                acked.append(body)
        assert sorted(rig.pull_all()) == sorted(acked)
        assert rig.broker.proc.poll() is None
    finally:
        if rig is not None:
            rig.close()
        disk.close()


# --- one broker per store ---------------------------------------------------------------------
def test_second_broker_on_the_same_store_exits_naming_the_holder(tmp_path):
    rig = Rig(tmp_path, tmp_path / "store")
    try:
        conf2 = write_conf(tmp_path / "second.conf", {
            "brokerName": "broker-b", "listenPort": free_port(), "brokerIP1": "127.0.0.1",
            "storePathRootDir": rig.store})
        second = RmqProcess(["broker", "-n", rig.namesrv, "-c", conf2, "--listen-host", "127.0.0.1"])
        assert second.proc.wait(60) == 2
        second._reader.join(5)
        errors = [line for line in second.lines if "error" in line]
        assert len(errors) == 1, second.lines
        assert f"pid {rig.broker.proc.pid}" in errors[0] and rig.store in errors[0], errors
        # an embedded cluster on the same store is refused the same way
        from rmq_core.embedded import Cluster
        from rmq_core.store.lock_file import StoreLockedError

        with pytest.raises(StoreLockedError, match=f"pid {rig.broker.proc.pid}"):
            Cluster(rig.store, {}).start()
        assert rig.broker.proc.poll() is None
        assert rig.raw.send(rig.addr, TOPIC, b"still-serving").code == ResponseCode.SUCCESS
    finally:
        rig.close()


# --- restart on the same port -----------------------------------------------------------------
def _senders(rig: Rig, n: int, acked: list, failures: list, stop: threading.Event):
    def run(k):
        with Producer(f"PG_R{k}", namesrv=rig.namesrv, send_msg_timeout=3) as p:
            i = 0
            while not stop.is_set():
                body = b"p%d-%d" % (k, i)
                i += 1
                try:
                    p.send(Message(TOPIC, body))
                    acked.append(body)
                except Exception as e:  # noqa: BLE001 - every failure is classified below
                    failures.append(e)
                    time.sleep(0.05)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    return threads


def _send_through_kills(rig: Rig, pauses: list[float]) -> tuple[list, list]:
    """Two producers send while the broker is SIGKILLed and restarted after each pause; returns
    (acknowledged bodies, failures) once they stopped, having checked every failure was retryable."""
    acked, failures, stop = [], [], threading.Event()
    threads = _senders(rig, 2, acked, failures, stop)
    for pause in pauses:
        time.sleep(pause)
        rig.broker.kill()
        rig.start_broker()
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(30)
    bad = [e for e in failures if _non_retryable(e) or "not supported" in str(e)]
    assert not bad, bad[:3]
    return acked, failures


def test_sends_through_a_broker_killed_and_restarted_on_the_same_port(tmp_path):
    """SIGKILL and restart under two sending producers: every failed send failed retryably (no
    "request code not supported"), and every acknowledged message is consumable afterwards."""
    rig = Rig(tmp_path, tmp_path / "store", {"flushDiskType": "SYNC_FLUSH"})
    try:
        acked, failures = _send_through_kills(rig, [1.0, 1.0])
        assert acked
        assert set(acked) <= set(rig.pull_all())
    finally:
        rig.close()


# --- recovery of a big segment holding little data -------------------------------------------
def _rss_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssFile", "RssAnon"):
                out[k] = int(v.split()[0])
    return out


@pytest.mark.parametrize("data_kib", [20, 4096])
def test_recovery_after_kill_touches_only_the_written_part_of_a_1gib_segment(tmp_path, data_kib):
    """A 1 GiB commit-log segment with little data, SIGKILLed: the restarted broker maps the
    segment but reads (and keeps resident) only about what was written."""
    rig = Rig(tmp_path, tmp_path / "store", {"mappedFileSizeCommitLog": 1 << 30})
    try:
        body = b"r" * 1000
        n = data_kib * 1024 // 1100
        for i in range(n):
            assert rig.raw.send(rig.addr, TOPIC, body, queue_id=i % QUEUES).code == ResponseCode.SUCCESS
        rig.broker.kill()
        t0 = time.monotonic()
        rig.start_broker()
        boot_s = time.monotonic() - t0
        rss = _rss_kib(rig.broker.proc.pid)
        print(f"\nrecovery with {data_kib} KiB on a 1 GiB segment: boot {boot_s:.2f} s, "
              f"RSS {rss['VmRSS'] / 1024:.0f} MiB (file-backed {rss.get('RssFile', 0) / 1024:.0f} MiB)")
        assert rss.get("RssFile", rss["VmRSS"]) < 256 * 1024, rss  # 1 GiB was resident before
        assert len(rig.pull_all()) == n
    finally:
        rig.close()


# --- the crash loop ---------------------------------------------------------------------------
@pytest.mark.slow
def test_crash_loop_sync_flush_loses_no_acknowledged_message(tmp_path):
    """20 SIGKILLs of a SYNC_FLUSH broker under two producers and a push consumer: 0 acknowledged
    messages lost, and the consumer ends with every one of them."""
    from rmq_core import ConsumeStatus, PushConsumer

    rig = Rig(tmp_path, tmp_path / "store", {"flushDiskType": "SYNC_FLUSH"})
    received: set[bytes] = set()
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            received.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("CG_LOOP", namesrv=rig.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(TOPIC, "*")
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        rnd = random.Random(13)
        acked, failures = _send_through_kills(rig, [rnd.uniform(0.3, 1.5) for _ in range(20)])
        stored = set(rig.pull_all())
        lost = set(acked) - stored
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
        deadline = time.time() + 120
        while time.time() < deadline:
            with lock:
                missing = set(acked) - received
            if not missing:
                break
            time.sleep(0.5)
        assert not missing, f"the consumer never got {len(missing)} acknowledged messages"
        print(f"\ncrash loop: 20 SIGKILLs, {len(acked)} acknowledged, 0 lost, {len(failures)} sends failed "
              f"retryably, consumer received {len(received)} distinct")
    finally:
        consumer.shutdown()
        rig.close()
