"""Crash tests: a SYNC_FLUSH writer in a child process is killed with SIGKILL at random points;
every put it had acknowledged must be found byte for byte after restart, with nothing but valid
records after them.  Then the same after the log tail is truncated or overwritten at random
positions (a torn write): records before the damage survive, the log is cut at the damage."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest

from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_message_record
from rmq_core.store import DefaultMessageStore, GetMessageStatus

from . import crash_writer as cw

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Ack:
    __slots__ = ("seq", "qid", "qoff", "phys", "size", "born", "store_ts", "kind")

    def __init__(self, line: str):
        f = line.split()
        self.seq, self.qid, self.qoff, self.phys, self.size, self.born, self.store_ts = map(int, f[:7])
        self.kind = f[7]

    def expected(self) -> bytes:
        return encode_message_record(
            topic=cw.TOPIC, body=cw.body_of(self.seq), queue_id=self.qid, queue_offset=self.qoff,
            commit_log_offset=self.phys, born_timestamp=self.born, born_host=("127.0.0.1", 0),
            store_timestamp=self.store_ts, store_host=("127.0.0.1", 10911), properties=cw.properties_of(self.seq))


def run_and_kill(store_dir: str, seed: int, start_seq: int, batch: bool, async_flush: bool = False) -> list[Ack]:
    rnd = random.Random(seed)
    kill_after = rnd.randint(50, 600)
    args = [sys.executable, "-m", "tests.store.crash_writer", store_dir, str(seed), str(start_seq)]
    if batch:
        args.append("--batch")
    if async_flush:
        args.append("--async")
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True, bufsize=1)
    acks: list[Ack] = []
    try:
        assert p.stdout.readline().strip() == "ready"
        for line in p.stdout:
            acks.append(Ack(line))
            if len(acks) >= kill_after:
                break
        os.kill(p.pid, signal.SIGKILL)
        # lines already in the pipe were acknowledged before the kill
        for line in p.stdout:
            if line.endswith("\n"):
                acks.append(Ack(line))
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        p.stdout.close()
    assert p.returncode == -signal.SIGKILL
    return acks


def open_store(store_dir: str) -> DefaultMessageStore:
    s = DefaultMessageStore(cw.config(store_dir))
    assert s.load()
    s.start()
    return s


def stored_records(store) -> dict[int, list[bytes]]:
    """Every record reachable through the consume queues, per queue, in queue order."""
    out = {}
    for q in range(cw.QUEUES):
        recs = []
        off = store.get_min_offset_in_queue(cw.TOPIC, q)
        while True:
            g = store.get_message("g", cw.TOPIC, q, off, 32)
            if g.status is not GetMessageStatus.FOUND:
                break
            pos = 0
            buf = g.buffer
            while pos < len(buf):
                size = int.from_bytes(buf[pos:pos + 4], "big")
                recs.append(buf[pos:pos + size])
                pos += size
            off = g.next_begin_offset
        out[q] = recs
    return out


def check_store(store, acks: list[Ack], cut: int | None = None) -> int:
    """All acknowledged records (ending at or before `cut`, if given) are present byte for byte;
    every other record the store serves is a well-formed message the writer wrote; nothing
    follows the log end.  Returns the next sequence number to write."""
    keep = [a for a in acks if cut is None or a.phys + a.size <= cut]
    for a in keep:
        assert store.select_one_message_by_offset(a.phys, a.size) == a.expected(), f"seq {a.seq} lost or changed"
    per_queue = stored_records(store)
    acked_by_phys = {a.phys: a for a in acks}
    max_seq = max((a.seq for a in acks), default=-1)
    for q, recs in per_queue.items():
        for i, raw in enumerate(recs):
            m = decode_messages(raw)[0]
            assert m.queue_offset == i and m.queue_id == q and m.topic == cw.TOPIC
            seq = int(m.properties["SEQ"])
            assert m.body == cw.body_of(seq), "garbage body served"
            if m.commit_log_offset in acked_by_phys and (cut is None or m.commit_log_offset + len(raw) <= cut):
                assert raw == acked_by_phys[m.commit_log_offset].expected()
            max_seq = max(max_seq, seq)
            if cut is not None:
                assert m.commit_log_offset + len(raw) <= cut, "a record at or past the damage survived"
    # the acknowledged ones are all in their queues
    for a in keep:
        assert per_queue[a.qid][a.qoff] == a.expected()
    # nothing after the end: the log ends exactly after the last record
    ends = [m_end for recs in per_queue.values() for m_end in
            (decode_messages(r)[0].commit_log_offset + len(r) for r in recs)]
    if ends:
        assert store.get_max_phy_offset() == max(ends) or store.get_max_phy_offset() % cw.SEGMENT == 0
    return max_seq + 1


def damage_tail(store_dir: str, acks: list[Ack], rnd: random.Random, mode: str) -> int:
    """Truncate or overwrite the log inside one of the last acknowledged records; returns the
    offset where that record starts (everything from there on must be gone)."""
    victim = rnd.choice(acks[-20:])
    pos = victim.phys + rnd.randrange(victim.size)
    seg_path = os.path.join(store_dir, "commitlog", f"{pos - pos % cw.SEGMENT:020d}")
    rel = pos % cw.SEGMENT
    if mode == "truncate":
        os.truncate(seg_path, rel)
    else:
        with open(seg_path, "r+b") as f:
            f.seek(rel)
            n = min(rnd.randint(16, 512), cw.SEGMENT - rel)
            f.write(rnd.randbytes(n))
    return victim.phys


@pytest.mark.parametrize("batch,async_flush", [(False, False), (True, False), (True, True)],
                         ids=["single-sync", "batch-sync", "batch-async"])
def test_sigkill_mid_stream_loses_no_acknowledged_put(tmp_path, batch, async_flush):
    store_dir = str(tmp_path / "store")
    rnd = random.Random(1234 + batch + 2 * async_flush)
    acks: list[Ack] = []
    seq = 0
    for round_no in range(3):
        acks += run_and_kill(store_dir, rnd.randrange(2**31), seq, batch, async_flush)
        assert os.path.exists(os.path.join(store_dir, "abort"))
        s = open_store(store_dir)
        try:
            seq = check_store(s, acks)
        finally:
            s.shutdown()
        assert len(os.listdir(os.path.join(store_dir, "commitlog"))) >= 1
    assert len(acks) >= 150
    assert len({a.phys // cw.SEGMENT for a in acks}) > 1  # the runs crossed segment boundaries


@pytest.mark.parametrize("mode", ["truncate", "overwrite"])
def test_torn_tail_is_cut_at_the_damaged_record(tmp_path, mode):
    store_dir = str(tmp_path / "store")
    rnd = random.Random(99 if mode == "truncate" else 7)
    acks: list[Ack] = []
    seq = 0
    for round_no in range(3):
        acks += run_and_kill(store_dir, rnd.randrange(2**31), seq, batch=round_no == 1)
        cut = damage_tail(store_dir, acks, rnd, mode)
        s = open_store(store_dir)
        try:
            seq = check_store(s, acks, cut)
            assert s.get_max_phy_offset() <= cut
            # the cut is exact: the record before the damage is the last one
            survivors = [a for a in acks if a.phys + a.size <= cut]
            assert s.get_max_phy_offset() in (max(a.phys + a.size for a in survivors), cut)
            for q in range(cw.QUEUES):
                assert s.get_max_offset_in_queue(cw.TOPIC, q) == len([a for a in survivors if a.qid == q])
        finally:
            s.shutdown()
        acks = [a for a in acks if a.phys + a.size <= cut]
