"""Replication benchmarks (real `rmq namesrv` + `rmq broker` processes on loopback).

* ha-send-{16,128}: sends/s and p99 latency of rmq's Producer.send_async with 16 / 128 sends in
  flight (a sliding window) to a master alone (baseline), an ASYNC_MASTER with its slave, and a
  SYNC_MASTER with its slave (each send answered once the slave acknowledged it).  Targets:
  SYNC_MASTER >= 0.5x ASYNC_MASTER at 128 in flight (RocketMQ's own reports put it near 0.1x), and
  ASYNC_MASTER + slave >= 0.9x the master alone.  `sync_vs_async` in the SYNC entry's extra info
  is that ratio, measured in the same run.
* ha-catch-up: bytes/s a slave catches up after a backlog (RMQ_BENCH_HA_BACKLOG_MIB, 1024 by
  default: the master's log grows by that much before the slave starts) against the loopback TCP
  bulk rate of a plain socket pair sending the same bytes, measured in the same run (baseline);
  `vs_loopback` in the slave entry's extra info is that ratio (target >= 0.6).
"""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from rmq_core import Message, Producer
from tests.codec_oracle import encode_batch_items
from tests.broker.ha_group import HAGroup
from tests.rawclient import RawClient
from tests.servers import RmqProcess

N_SENDS = 6000  # messages per round
ROUNDS = 5
BODY = b"x" * 256
FAST = dict(poll_name_server_interval=5.0, heartbeat_broker_interval=5.0, send_msg_timeout=30)
BACKLOG_MIB = int(os.environ.get("RMQ_BENCH_HA_BACKLOG_MIB", "1024"))
MODES = {"baseline_master_alone": None, "async_master_slave": "ASYNC_MASTER", "sync_master_slave": "SYNC_MASTER"}
_rates: dict[tuple[str, int], float] = {}


class _Setups:
    """The three broker groups, started on first use and kept until the module ends: the modes'
    rounds run close together in time (this machine's load drifts; ratios of runs minutes apart
    drift with it), and an idle group costs next to nothing."""

    def __init__(self, tmp_path_factory):
        self.tmp = tmp_path_factory
        self.started: dict[str, tuple] = {}

    def get(self, mode):
        if mode not in self.started:
            role = MODES[mode] or "ASYNC_MASTER"
            g = HAGroup(self.tmp.mktemp(mode), role=role, master_props={"flushDiskType": "ASYNC_FLUSH"})
            self.started[mode] = (g, None)
            g.start_master()
            if MODES[mode] is not None:
                g.start_slave()
            producer = Producer(f"PG_HA_{mode}", namesrv=g.namesrv, **FAST).start()
            self.started[mode] = (g, producer)
            deadline = time.monotonic() + 60
            while True:  # the topic exists and, for SYNC_MASTER, the slave acknowledges
                r = producer.send(Message("BenchHA", BODY))
                if r.status.name == "SEND_OK":
                    break
                assert time.monotonic() < deadline, f"{mode}: sends never answered SEND_OK ({r.status})"
                time.sleep(0.2)
        return self.started[mode]

    def close(self):
        for g, producer in self.started.values():
            if producer is not None:
                producer.shutdown()
            g.stop()
        self.started.clear()


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    s = _Setups(tmp_path_factory)
    yield s
    s.close()


def _window(producer, n, in_flight):
    """n send_async calls with at most in_flight unanswered; returns (seconds, latencies, statuses)."""
    sem = threading.Semaphore(in_flight)
    lat = [0.0] * n
    statuses = {}
    done = threading.Event()
    left = [n]
    lock = threading.Lock()

    def finish(i, t0, fut):
        lat[i] = time.perf_counter() - t0
        try:
            st = fut.result().status.name
        except Exception as e:  # noqa: BLE001 - counted, the bench asserts none
            st = type(e).__name__
        with lock:
            statuses[st] = statuses.get(st, 0) + 1
            left[0] -= 1
            if not left[0]:
                done.set()
        sem.release()

    start = time.perf_counter()
    for i in range(n):
        sem.acquire()
        t0 = time.perf_counter()
        fut = producer.send_async(Message("BenchHA", BODY))
        fut.add_done_callback(lambda f, i=i, t0=t0: finish(i, t0, f))
    assert done.wait(120)
    return time.perf_counter() - start, lat, statuses


def _pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p / 100))] * 1000.0


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("in_flight", [16, 128])
def test_ha_send(benchmark, setups, mode, in_flight):
    benchmark.group = f"ha-send-{in_flight}"
    benchmark.name = f"test_ha_send_{mode}[{in_flight}]"
    _, producer = setups.get(mode)
    lats = []
    seen = {}

    def run():
        secs, lat, statuses = _window(producer, N_SENDS, in_flight)
        lats.extend(lat)
        for k, v in statuses.items():
            seen[k] = seen.get(k, 0) + v
        return secs

    _window(producer, N_SENDS // 4, in_flight)  # warm-up
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    assert seen == {"SEND_OK": N_SENDS * ROUNDS}, seen
    rate = N_SENDS / benchmark.stats.stats.median
    _rates[(mode, in_flight)] = rate
    info = {"records_per_s": rate, "p99_ms": _pct(lats, 99), "p50_ms": _pct(lats, 50)}
    if mode == "sync_master_slave" and ("async_master_slave", in_flight) in _rates:
        info["sync_vs_async"] = rate / _rates[("async_master_slave", in_flight)]
    benchmark.extra_info.update(info)


# --- catch-up after a backlog --------------------------------------------------------------------
def _loopback_rate(total: int, chunk: int = 1 << 20) -> float:
    """Bytes/s of a plain loopback TCP socket pair moving `total` bytes (the baseline)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    got = [0]

    def sink():
        c, _ = srv.accept()
        buf = bytearray(chunk)
        while (n := c.recv_into(buf)) > 0:
            got[0] += n
        c.close()

    t = threading.Thread(target=sink)
    t.start()
    data = memoryview(os.urandom(chunk))
    s = socket.create_connection(("127.0.0.1", port))
    start = time.perf_counter()
    sent = 0
    while sent < total:
        s.sendall(data)
        sent += chunk
    s.close()
    t.join()
    secs = time.perf_counter() - start
    srv.close()
    return got[0] / secs


def _data_end(path) -> int:
    """Where the data of a segment file filled from its start ends (its last non-zero byte + 1):
    a binary search over 4 KiB pages (the backlog's records hold no zero page), then that page."""
    page = 4096
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)

        def nonzero(i):
            f.seek(i * page)
            return f.read(page).strip(b"\0") != b""

        lo, hi = 0, size // page  # pages [0, lo) hold data; pages [hi, ...) none
        while lo < hi:
            mid = (lo + hi) // 2
            if nonzero(mid):
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return 0
        f.seek((lo - 1) * page)
        return (lo - 1) * page + len(f.read(page).rstrip(b"\0"))


def _segment(store):
    return os.path.join(store, "commitlog", "0" * 20)


@pytest.fixture(scope="module")
def backlog_group(tmp_path_factory, setups):
    """A master whose log holds RMQ_BENCH_HA_BACKLOG_MIB MiB in its first segment (an empty slave
    starts at the master's last segment: one segment makes the whole backlog its to catch up)."""
    setups.close()
    size = (BACKLOG_MIB + 64) * 1024 * 1024
    g = HAGroup(tmp_path_factory.mktemp("backlog"), master_props={"mappedFileSizeCommitLog": size,
                                                                  "flushDiskType": "ASYNC_FLUSH"},
                slave_props={"mappedFileSizeCommitLog": size})
    g.start_master()
    raw = RawClient("backlog")
    try:
        items = [(0, b"b" * 4000, {}) for _ in range(200)]  # 200 records of 4 KiB per batch request
        body = encode_batch_items(items)
        target = BACKLOG_MIB * 1024 * 1024
        sent = 0
        while sent < target:
            r = raw.invoke(g.master_addr, 320, _batch_header(), body)
            assert r.code == 0, r.remark
            sent += 200 * 4000
    finally:
        raw.close()
    g.backlog = _data_end(_segment(g.master_store))
    yield g
    g.stop()


def _batch_header():
    return {"producerGroup": "PG_BACKLOG", "topic": "BenchBacklog", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
            "bornTimestamp": str(int(time.time() * 1000)), "flag": "0", "properties": "", "reconsumeTimes": "0",
            "unitMode": "false", "batch": "true"}


def test_ha_catch_up_baseline_loopback_tcp(benchmark, backlog_group):
    benchmark.group = "ha-catch-up"
    total = backlog_group.backlog
    rate = benchmark.pedantic(lambda: _loopback_rate(total), rounds=1, iterations=1)
    _rates[("loopback", 0)] = rate
    benchmark.extra_info.update({"records_per_s": rate, "MiB_per_s": rate / 2**20, "bytes": total})


def test_ha_catch_up_slave(benchmark, backlog_group):
    """From the slave's start to its log holding the master's last byte (the slave appends in
    order: its data end reaching the master's is the whole backlog replicated)."""
    benchmark.group = "ha-catch-up"
    g = backlog_group
    total = g.backlog

    def run():
        # timed from the slave's first appended bytes (its segment file appears), not its boot
        g.slave = RmqProcess(["broker", "-n", g.namesrv, "-c", g.slave_conf, "--listen-host", "127.0.0.1"])
        seg = _segment(g.slave_store)
        while not os.path.exists(seg):
            time.sleep(0.001)
        t0 = time.perf_counter()
        while _data_end(seg) < total:
            time.sleep(0.01)
        return time.perf_counter() - t0

    secs = benchmark.pedantic(run, rounds=1, iterations=1)
    with open(_segment(g.slave_store), "rb") as a, open(_segment(g.master_store), "rb") as b:
        a.seek(total - 4096)
        b.seek(total - 4096)
        assert a.read(4096) == b.read(4096)
    info = {"records_per_s": total / secs, "MiB_per_s": total / secs / 2**20, "bytes": total}
    if ("loopback", 0) in _rates:
        info["vs_loopback"] = total / secs / _rates[("loopback", 0)]
    benchmark.extra_info.update(info)
