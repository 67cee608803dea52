"""A broker process SIGKILLed with popped-but-unacked messages: after its restart every unacked one
is delivered again once its invisible time is over (not before), none whose ack was answered OK
comes again, nothing is lost, and nothing handed out before the kill is handed out again from a
pop offset the kill left stale (consumerOffset.json is written on a timer: here never)."""
from __future__ import annotations

import time

import pytest

from rmq_core.common.pop_extra_info import ExtraInfo
from rmq_core.remoting.codes import ResponseCode
from tests.broker.pop.popraw import ack, create_topic, pop
from tests.rawclient import RawClient
from tests.servers import NamesrvAndBroker, RmqProcess

G = "CG_POP_CRASH"
T = "TP_POP_CRASH"


def _restart(cluster: NamesrvAndBroker) -> None:
    old = cluster.brokers[0]
    old.kill()  # SIGKILL: no shutdown hook, no offsets persisted
    proc = RmqProcess(old.args[3:], ("boot success",))  # (args after `python -m rmq_core.cli`)
    cluster.brokers[0] = proc
    proc.wait_boot()


# consumer offsets (pop offsets, revive progress) never persisted before the kill, or every 200 ms
# (never persisted is the harder case: every pop offset and the revive progress come from the log)
@pytest.mark.parametrize("persist_ms", [3_600_000, pytest.param(200, marks=pytest.mark.slow)])
def test_sigkill_with_unacked_messages(tmp_path, persist_ms):
    _sigkill_case(tmp_path, persist_ms, total=80, popped_n=60)


@pytest.mark.slow
def test_sigkill_with_500_unacked_messages(tmp_path):
    _sigkill_case(tmp_path, 200, total=2000, popped_n=1000)


def _sigkill_case(tmp_path, persist_ms, total, popped_n):
    cluster = NamesrvAndBroker(tmp_path, broker_props={"flushConsumerOffsetInterval": persist_ms})
    raw = RawClient()
    try:
        addr = cluster.broker_addrs[0]
        create_topic(raw, addr, T, queues=4)
        for i in range(total):
            assert raw.send(addr, T, f"m{i}".encode(), queue_id=i % 4, keys=f"k{i}").code == ResponseCode.SUCCESS
        popped = []
        while len(popped) < popped_n:
            _, ps = pop(raw, addr, G, T, max_nums=16, invisible_ms=4000 if total < 500 else 8000)
            assert ps
            popped += ps
        if persist_ms < 1000:
            time.sleep(0.5)  # (a persist of the offsets after the pops and acks)
        acked = {p.body for p in popped[::2]}
        for p in popped[::2]:
            assert ack(raw, addr, G, p).code == ResponseCode.SUCCESS
        unacked = {p.body: p for p in popped[1::2]}
        # a few more, invisible for long: acked only after the restart, with their old handles
        _, late = pop(raw, addr, G, T, max_nums=5, invisible_ms=120_000)
        assert len(late) == 5
        handed_out = {p.body for p in popped + late}
        never_popped = {f"m{i}".encode() for i in range(total)} - handed_out
        back_after = {p.body: ExtraInfo.parse(p.handle).visible_at for p in popped[1::2]}

        _restart(cluster)

        for p in late:
            assert ack(raw, addr, G, p).code == ResponseCode.SUCCESS, p.handle
        got = {}
        deadline = time.time() + 60
        while time.time() < deadline and len(got) < len(unacked) + len(never_popped):
            _, ps = pop(raw, addr, G, T, max_nums=32, invisible_ms=60_000, poll_ms=2000)
            now = int(time.time() * 1000)
            for p in ps:
                assert p.body not in got, f"{p.body} delivered twice after the restart"
                if p.body in back_after:
                    assert now >= back_after[p.body], f"{p.body} came back before its invisible time was over"
                got[p.body] = p
                assert ack(raw, addr, G, p).code == ResponseCode.SUCCESS
        assert not set(got) & acked, "a message whose ack was answered OK was delivered again"
        assert not set(got) & {p.body for p in late}
        assert set(got) == set(unacked) | never_popped  # nothing lost, nothing handed out twice
        assert all(got[b].attempt == 2 for b in unacked)
        _, none = pop(raw, addr, G, T, poll_ms=1000)
        assert none == []
    finally:
        raw.close()
        cluster.stop()


def test_sigkill_with_a_fifo_queue_in_flight(tmp_path):
    """A FIFO group's in-flight message survives the kill: its queue stays blocked until the
    invisible time is over, then the same message comes again (attempt 2), then the next."""
    from tests.broker.pop.popraw import change, create_group
    cluster = NamesrvAndBroker(tmp_path, broker_props={"flushConsumerOffsetInterval": 3_600_000})
    raw = RawClient()
    try:
        addr = cluster.broker_addrs[0]
        create_topic(raw, addr, "TP_FIFO_CRASH", queues=1)
        create_group(raw, addr, "CG_FIFO_CRASH", consumeMessageOrderly=True)
        for i in range(3):
            assert raw.send(addr, "TP_FIFO_CRASH", f"f{i}".encode(), queue_id=0).code == ResponseCode.SUCCESS
        _, first = pop(raw, addr, "CG_FIFO_CRASH", "TP_FIFO_CRASH", max_nums=2, invisible_ms=2000)
        assert [p.body for p in first] == [b"f0", b"f1"]
        assert ack(raw, addr, "CG_FIFO_CRASH", first[1]).code == ResponseCode.SUCCESS
        r = change(raw, addr, "CG_FIFO_CRASH", first[0], 4000)  # a second FIFO checkpoint takes f0 over
        assert r.code == ResponseCode.SUCCESS, r.remark
        visible_at = int(r.ext_fields["popTime"]) + 4000

        _restart(cluster)

        got = []
        deadline = time.time() + 30
        while time.time() < deadline and len(got) < 2:
            _, ps = pop(raw, addr, "CG_FIFO_CRASH", "TP_FIFO_CRASH", max_nums=1, invisible_ms=30_000, poll_ms=1000)
            for p in ps:
                assert int(time.time() * 1000) >= visible_at, "the FIFO queue opened before f0's invisible time"
                got.append(p)
                assert ack(raw, addr, "CG_FIFO_CRASH", p).code == ResponseCode.SUCCESS
        assert [(p.body, p.attempt) for p in got] == [(b"f0", 2), (b"f2", 1)]  # f1 was acked: not again
    finally:
        raw.close()
        cluster.stop()
