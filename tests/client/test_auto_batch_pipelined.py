"""Producer(auto_batch=True) to a tcp broker: messages gathered in the senders' threads leave as
SEND_BATCH_MESSAGE frames on the pipelined connection - when a caller waits, when the batch is full,
when the linger passes (callbacks only), when the request in flight is answered - each with its own
SendResult; a bad message fails its own Future."""
import threading

import pytest

from rmq_core import Message, Producer
from rmq_core.client.accumulator import GatheredFuture
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import SendStatus
from tests.client.conftest import FAST, drain_topic


def _record_writes(monkeypatch, p):
    """The body length of every batch the producer writes on a pipelined connection."""
    real = p._write_batch
    sizes = []

    def write_batch(topic, wait, body, *rest):
        sizes.append(len(body))
        return real(topic, wait, body, *rest)

    monkeypatch.setattr(p, "_write_batch", write_batch)
    return sizes


def test_a_burst_waited_for_leaves_in_one_request(cluster, monkeypatch):
    topic = "ABPipeBurstT"
    with Producer("PG_ABP1", namesrv=cluster.tcp_namesrv, auto_batch=True, **FAST) as p:
        p.send(Message(topic, b"warm"))
        p._batch_accumulator.linger = 30.0  # only the wait sends them
        writes = _record_writes(monkeypatch, p)
        futures = [p.send_async(Message(topic, f"b{i}".encode(), keys=f"k{i}")) for i in range(30)]
        assert all(isinstance(f, GatheredFuture) for f in futures) and not writes
        results = [f.result(20) for f in futures]
    assert len(writes) == 1
    assert all(r.status is SendStatus.SEND_OK for r in results)
    # one batch: one queue, consecutive offsets in sending order, each its own UNIQ_KEY
    assert len({r.queue for r in results}) == 1
    assert [r.queue_offset for r in results] == list(range(results[0].queue_offset, results[0].queue_offset + 30))
    got = {m.msg_id: m for m in drain_topic(cluster.tcp_namesrv, topic, "CG_ABP1", 31)}
    for i, r in enumerate(results):
        m = got[r.msg_id]
        assert (m.body, m.keys, m.queue_offset, m.offset_msg_id) == (f"b{i}".encode(), f"k{i}", r.queue_offset,
                                                                     r.offset_msg_id)


def test_callbacks_only_leave_after_the_linger(cluster, monkeypatch):
    topic = "ABPipeLingerT"
    with Producer("PG_ABP2", namesrv=cluster.tcp_namesrv, auto_batch=True, **FAST) as p:
        p.send(Message(topic, b"warm"))
        writes = _record_writes(monkeypatch, p)
        done = threading.Event()
        got = []

        def callback(result, error):
            got.append((result, error))
            if len(got) == 20:
                done.set()

        for i in range(20):  # nobody waits on a Future: the flusher thread sends them
            p.send_async(Message(topic, f"c{i}".encode()), callback=callback)
        assert done.wait(20)
    assert all(e is None and r.status is SendStatus.SEND_OK for r, e in got)
    assert len({r.msg_id for r, _ in got}) == 20 and 1 <= len(writes) < 20


def test_full_batches_leave_without_a_wait(cluster, monkeypatch):
    topic = "ABPipeFullT"
    with Producer("PG_ABP3", namesrv=cluster.tcp_namesrv, auto_batch=True, batch_max_bytes=2000, **FAST) as p:
        p.send(Message(topic, b"warm"))
        p._batch_accumulator.linger = 30.0
        writes = _record_writes(monkeypatch, p)
        futures = [p.send_async(Message(topic, bytes(150))) for _ in range(40)]
        assert writes and max(writes) <= 2000  # written as they filled up, before anyone waited
        assert all(f.result(20).status is SendStatus.SEND_OK for f in futures)
    assert len(writes) >= 4 and max(writes) <= 2000  # 40 items of ~220 bytes: 9 a request at most


@pytest.mark.parametrize("msg, error", [
    (Message("ABPipeBadT", b""), "empty body"),
    (Message("ABPipeBadT", b"x", flag=1 << 40), "flag 1099511627776 is out of range"),
    (Message("ABPipeBadT", b"x", properties={"k": "v\x02"}), "separator"),
])
def test_a_bad_message_fails_its_own_future(cluster, msg, error):
    with Producer("PG_ABP5", namesrv=cluster.tcp_namesrv, auto_batch=True, **FAST) as p:
        p.send(Message("ABPipeBadT", b"warm"))
        good = p.send_async(Message("ABPipeBadT", b"fine"))
        bad = p.send_async(msg)
        with pytest.raises(IllegalArgumentError, match=error):
            bad.result(20)
        assert good.result(20).status is SendStatus.SEND_OK


def test_shutdown_sends_what_lingers(cluster):
    topic = "ABPipeShutT"
    p = Producer("PG_ABP6", namesrv=cluster.tcp_namesrv, auto_batch=True, **FAST).start()
    p.send(Message(topic, b"warm"))
    p._batch_accumulator.linger = 30.0
    futures = [p.send_async(Message(topic, f"s{i}".encode())) for i in range(25)]
    assert p._batch_accumulator.pending() == 25
    p.shutdown()
    assert all(f.done() and f.result(0).status is SendStatus.SEND_OK for f in futures)
    assert len(drain_topic(cluster.tcp_namesrv, topic, "CG_ABP6", 26)) == 26
