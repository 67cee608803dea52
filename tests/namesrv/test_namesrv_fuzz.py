"""Fuzz a name server running in its own process with malformed frames while a good client keeps working."""
import asyncio
import os
import subprocess
import sys
import time

import psutil
import pytest

from rmq_core.remoting import RemotingClient, RemotingCommand
from rmq_core.remoting.body import DataVersion, RegisterBrokerBody
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.fuzz_frames import fuzz

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SERVE = """
import asyncio, sys
from rmq_core.config import NamesrvConfig
from rmq_core.namesrv import NamesrvController

async def main():
    ns = NamesrvController(NamesrvConfig(kv_config_path=sys.argv[1]), "127.0.0.1:0")
    await ns.start()
    print(ns.listen_address, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture
def namesrv_process(tmp_path):
    log = open(tmp_path / "namesrv.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(tmp_path / "kv.json")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        addr = proc.stdout.readline().strip()
        assert addr, f"name server did not start: {(tmp_path / 'namesrv.log').read_text()}"
        yield proc, addr
    finally:
        proc.kill()  # a real kill of the process we started
        proc.wait(10)
        log.close()


async def _good_client_loop(addr: str, stop: asyncio.Event, stats: dict) -> None:
    client = RemotingClient(name="good-client")
    try:
        while not stop.is_set():
            req = RemotingCommand.create_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "FuzzTopic"})
            resp = await client.invoke(addr, req, 3)
            stats["ok" if resp.code == ResponseCode.SUCCESS else "bad"] += 1
            await asyncio.sleep(0.005)
    finally:
        await client.close()


async def _run(addr: str, rounds: list[tuple[int, int]], proc) -> tuple[list, list, dict]:
    broker = RemotingClient(name="broker")
    body = RegisterBrokerBody.build({"FuzzTopic": {"readQueueNums": 4, "writeQueueNums": 4, "perm": 6}},
                                    DataVersion()).encode()
    resp = await broker.invoke(addr, RemotingCommand.create_request(RequestCode.REGISTER_BROKER, {
        "clusterName": "C", "brokerName": "b", "brokerAddr": "127.0.0.1:10911", "brokerId": 0}, body), 3)
    assert resp.code == ResponseCode.SUCCESS
    stop, stats = asyncio.Event(), {"ok": 0, "bad": 0}
    good = asyncio.ensure_future(_good_client_loop(addr, stop, stats))
    reports, rss = [], [psutil.Process(proc.pid).memory_info().rss]
    try:
        for n, seed in rounds:
            before = stats["ok"]
            reports.append(await asyncio.to_thread(fuzz, addr, n, seed))
            rss.append(psutil.Process(proc.pid).memory_info().rss)
            await asyncio.sleep(0.05)
            assert stats["ok"] > before, "the well-behaved client made no progress during a fuzz round"
    finally:
        stop.set()
        await good
        await broker.close()
    return reports, rss, stats


async def test_fuzzed_namesrv_keeps_serving_and_memory_stays_bounded(namesrv_process):
    proc, addr = namesrv_process
    started = time.monotonic()
    reports, rss, stats = await _run(addr, [(2000, 1), (2000, 2), (2000, 3)], proc)
    assert proc.poll() is None, "the name server died"
    total = sum(r.frames for r in reports)
    assert total == 6000
    for r in reports:
        assert r.answered_all and r.reconnects == 0
        assert r.responses == r.wellformed_requests
        assert r.killer_frames > 300
        # every frame the server must refuse closed its connection (none hung or were answered)
        must_close = sum(v for k, v in r.kinds.items() if k not in ("random-bytes", "truncated", "wellformed"))
        assert r.killer_connections_closed_by_server == must_close and r.killer_connections_left_open == 0
    assert stats["bad"] == 0 and stats["ok"] > 10
    # after the warm-up round, further rounds do not keep growing the server's memory
    growth = rss[-1] - rss[1]
    assert growth < 24 * 1024 * 1024, f"name server RSS grew {growth / 2**20:.1f} MiB: {rss}"
    assert time.monotonic() - started < 60


@pytest.mark.slow
async def test_fuzz_soak(namesrv_process):
    proc, addr = namesrv_process
    reports, rss, stats = await _run(addr, [(5000, s) for s in range(10, 20)], proc)
    assert proc.poll() is None
    assert all(r.answered_all for r in reports)
    assert rss[-1] - rss[2] < 16 * 1024 * 1024, rss
