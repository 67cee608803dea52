"""Thousands of malformed frames against a broker process while a well-behaved client keeps
sending and pulling; the broker keeps serving and its memory stays bounded."""
import threading
import time

import psutil
import pytest

from rmq_core.codec import decode_messages
from tests.fuzz_frames import KNOWN_CODES, fuzz
from tests.rawclient import RawClient
from tests.servers import RmqProcess, free_port

# PULL_MESSAGE is left out of the well-framed nonsense: a pull with a random suspend flag and
# timeout is legitimately held (long polling) past the fuzzer's answer deadline.  Malformed pulls
# are covered by test_broker_send_pull.
FUZZ_CODES = [c for c in KNOWN_CODES if c != 11]


@pytest.fixture
def broker_process(tmp_path):
    ns_port, b_port = free_port(), free_port()
    conf = tmp_path / "broker.conf"
    conf.write_text("mappedFileSizeCommitLog=16777216\nmaxHashSlotNum=1000\nmaxIndexNum=4000\n"
                    "errorReplyDelayMs=10\n")
    p = RmqProcess(["standalone", "--store", str(tmp_path / "store"), "-c", str(conf),
                    "--namesrv-listen", f"127.0.0.1:{ns_port}", "--broker-listen", f"127.0.0.1:{b_port}"],
                   ("The Name Server boot success", "boot success. serializeType=JSON and"))
    p.wait_boot()
    yield p, f"127.0.0.1:{b_port}", f"127.0.0.1:{ns_port}"
    p.kill()


def _good_client(addr, stop, stats):
    raw = RawClient("good")
    try:
        i = 0
        while not stop.is_set():
            r = raw.send(addr, "FuzzGood", f"good-{i}".encode(), queue_id=0)
            if r.code == 0:
                resp = raw.pull(addr, "FuzzGood", 0, int(r.ext_fields["queueOffset"]))
                ok = resp.code == 0 and decode_messages(resp.body)[0].body == f"good-{i}".encode()
                stats["ok" if ok else "bad"] += 1
            else:
                stats["bad"] += 1
                stats.setdefault("errors", []).append((r.code, r.remark))
            i += 1
            time.sleep(0.005)
    finally:
        raw.close()


def test_fuzzed_broker_keeps_serving_and_memory_stays_bounded(broker_process):
    proc, addr, namesrv = broker_process
    stop, stats = threading.Event(), {"ok": 0, "bad": 0}
    good = threading.Thread(target=_good_client, args=(addr, stop, stats))
    good.start()
    deadline = time.time() + 10
    while stats["ok"] == 0 and time.time() < deadline:  # the good client is up before the fuzzing starts
        time.sleep(0.02)
    rss = [psutil.Process(proc.proc.pid).memory_info().rss]
    reports = []
    try:
        for seed in (11, 12, 13):
            before = stats["ok"]
            reports.append(fuzz(addr, 1500, seed, codes=FUZZ_CODES))
            rss.append(psutil.Process(proc.proc.pid).memory_info().rss)
            time.sleep(0.1)
            assert stats["ok"] > before, f"the well-behaved client made no progress during a fuzz round: {stats}"
        # the name server of the same process is fuzzed too
        reports.append(fuzz(namesrv, 1500, 14))
    finally:
        stop.set()
        good.join(30)
    assert proc.proc.poll() is None, "the broker died:\n" + "\n".join(proc.lines[-30:])
    for r in reports:
        assert r.answered_all and r.reconnects == 0, r
        assert r.killer_connections_left_open == 0
    assert stats["bad"] == 0 and stats["ok"] > 20, stats.get("errors", [])[:5]
    growth = rss[-1] - rss[1]
    assert growth < 48 * 1024 * 1024, f"broker RSS grew {growth / 2**20:.1f} MiB: {rss}"
