"""Producer(auto_batch=True): async sends of a topic gathered into SEND_BATCH_MESSAGE requests while
an earlier one is in flight, each message with its own SendResult; ineligible messages go alone;
a shutdown sends what was gathered; a failed batch fails every Future of it.  Also the UNIQ_KEY
generator every send uses."""
import re
import threading
import time

import pytest

from rmq_core import Message, Producer
from rmq_core.errors import MQBrokerError
from rmq_core.message import MessageClientIDSetter, SendStatus
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.pipelined import PipelinedChannel
from rmq_plugins.transport.inproc import InprocPipelinedChannel
from tests.client.conftest import FAST, drain_topic


def _count_requests(monkeypatch, p):
    """Record (code, body length) of every send request the producer writes on its pipelined
    connections (each one through SendAttempts here: the native first attempt is turned off)."""
    real = {PipelinedChannel: PipelinedChannel.send, InprocPipelinedChannel: InprocPipelinedChannel.send}
    seen = []

    def send(self, frame, opaque, timeout, on_done, context=None):
        request = RemotingCommand.decode(memoryview(frame)[4:])
        if request.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            seen.append((request.code, len(request.body or b"")))
        return real[type(self)](self, frame, opaque, timeout, on_done, context)

    monkeypatch.setattr(PipelinedChannel, "send", send)
    monkeypatch.setattr(InprocPipelinedChannel, "send", send)
    p._native_first = False
    return seen


def test_bursts_leave_as_batches_and_every_message_gets_its_own_result(cluster, monkeypatch):
    topic = "AutoBatchT"
    with Producer("PG_AB", namesrv=cluster.tcp_namesrv, auto_batch=True, **FAST) as p:
        p.send(Message(topic, b"warm"))
        seen = _count_requests(monkeypatch, p)
        futures = []
        for burst in range(8):
            futures += [p.send_async(Message(topic, f"m{burst}-{i}".encode(), tags="TagAB", keys=f"k{burst}-{i}"))
                        for i in range(25)]
        results = [f.result(20) for f in futures]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    batches = [n for code, n in seen if code == RequestCode.SEND_BATCH_MESSAGE]
    assert batches and len(seen) < 200  # gathered: far fewer requests than messages
    assert len({r.msg_id for r in results}) == 200 and len({r.offset_msg_id for r in results}) == 200
    assert len({(r.queue.queue_id, r.queue_offset) for r in results}) == 200

    got = drain_topic(cluster.tcp_namesrv, topic, "CG_AB", 201)
    by_uniq = {m.msg_id: m for m in got}
    for i, r in enumerate(results):
        m = by_uniq[r.msg_id]  # the result's msg_id is the message's UNIQ_KEY ...
        assert m.body == f"m{i // 25}-{i % 25}".encode() and m.tags == "TagAB" and m.keys == f"k{i // 25}-{i % 25}"
        # ... and its queue, queue offset and offsetMsgId are the stored message's own
        assert (m.queue_id, m.queue_offset, m.offset_msg_id) == (r.queue.queue_id, r.queue_offset, r.offset_msg_id)


def test_batches_respect_batch_max_bytes(cluster, monkeypatch):
    topic = "AutoBatchSmallT"
    with Producer("PG_ABS", namesrv=cluster.tcp_namesrv, auto_batch=True, batch_max_bytes=1200, **FAST) as p:
        p.send(Message(topic, b"warm"))
        seen = _count_requests(monkeypatch, p)
        futures = [p.send_async(Message(topic, bytes(120))) for _ in range(60)]
        assert all(f.result(20).status is SendStatus.SEND_OK for f in futures)
    batches = [n for code, n in seen if code == RequestCode.SEND_BATCH_MESSAGE]
    assert batches and max(batches) <= 1200


def test_ineligible_messages_go_alone(cluster, monkeypatch):
    topic = "AutoBatchAloneT"
    with Producer("PG_ABA", namesrv=cluster.tcp_namesrv, auto_batch=True, batch_max_bytes=2048,
                  compress_msg_body_over_howmuch=1024, **FAST) as p:
        p.send(Message(topic, b"warm"))
        seen = _count_requests(monkeypatch, p)
        delayed = Message(topic, b"later", delay_time_level=1)
        big = Message(topic, b"b" * 3000)  # over batch_max_bytes
        packed = Message(topic, b"z" * 1500)  # compressed: a batch carries no per-message sys flag
        results = [p.send_async(m).result(20) for m in (delayed, big, packed)]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert [code for code, _ in seen] == [RequestCode.SEND_MESSAGE_V2] * 3
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_ABA", 4)
    assert sorted(m.body for m in got) == sorted([b"warm", b"later", b"b" * 3000, b"z" * 1500])


def test_shutdown_sends_what_was_gathered(cluster):
    topic = "AutoBatchShutT"
    p = Producer("PG_ABX", namesrv=cluster.tcp_namesrv, auto_batch=True, **FAST).start()
    p.send(Message(topic, b"warm"))
    futures = [p.send_async(Message(topic, f"s{i}".encode())) for i in range(150)]
    p.shutdown()
    assert all(f.result(10).status is SendStatus.SEND_OK for f in futures)
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_ABX", 151)
    assert len(got) == 151


def test_a_refused_batch_fails_each_of_its_futures(cluster):
    topic = "AutoBatchRefusedT"
    with Producer("PG_ABR", namesrv=cluster.tcp_namesrv, auto_batch=True, **FAST) as p:
        p.send(Message(topic, b"warm"))
        p._batch_accumulator.linger = 30.0  # they leave together when the first is waited for
        futures = [p.send_async(Message(topic, f"r{i}".encode())) for i in range(10)]
        # one item asks for timer delivery, which a batch cannot honour: the broker refuses it all
        futures.append(p.send_async(Message(topic, b"timed", properties={"TIMER_DELAY_SEC": "5"})))
        for f in futures:
            with pytest.raises(MQBrokerError, match="batch messages do not support timer delivery: item 10"):
                f.result(20)
        assert p.send_async(Message(topic, b"after")).result(20).status is SendStatus.SEND_OK


def test_bad_batch_max_bytes_is_refused():
    from rmq_core.errors import ConfigError

    with pytest.raises(ConfigError, match="batch_max_bytes 0"):
        Producer("PG_BAD", namesrv="127.0.0.1:9876", auto_batch=True, batch_max_bytes=0)


# --- UNIQ_KEY ---------------------------------------------------------------------------------------
def test_uniq_ids_are_distinct_across_threads_and_carry_their_parts():
    ids: list[str] = []
    lock = threading.Lock()

    def make():
        mine = [MessageClientIDSetter.create_uniq_id() for _ in range(5000)]
        with lock:
            ids.extend(mine)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 40000 and len(set(ids)) == 40000
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert len({i[:20] for i in ids}) == 1  # IP + pid + random: fixed per process
    # bytes 10..13: milliseconds since the start of this month (UTC)
    now = time.gmtime()
    month_start = time.mktime((now.tm_year, now.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.timezone
    expected = int((time.time() - month_start) * 1000)
    assert abs(int(ids[-1][20:28], 16) - expected) < 60_000


@pytest.mark.parametrize("where", ["inproc", "tcp"])
def test_first_sends_of_a_topic_and_in_proc_brokers_are_gathered_too(cluster, monkeypatch, where):
    """The one accumulator also takes a topic's sends before its route is cached, and sends to an
    in-proc broker: they leave as batches the client loop's way, each with its own SendResult."""
    topic = f"AutoBatchFirst{where}T"
    namesrv = cluster.namesrv if where == "inproc" else cluster.tcp_namesrv
    with Producer(f"PG_ABF_{where}", namesrv=namesrv, auto_batch=True, **FAST) as p:
        p._batch_accumulator.linger = 30.0  # they leave together when the first is waited for
        seen = _count_requests(monkeypatch, p)
        futures = [p.send_async(Message(topic, f"f{i}".encode())) for i in range(30)]
        results = [f.result(20) for f in futures]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert seen and all(code == RequestCode.SEND_BATCH_MESSAGE for code, _ in seen) and len(seen) < 30
    assert len({r.msg_id for r in results}) == 30
    assert len({(r.queue.queue_id, r.queue_offset) for r in results}) == 30
    got = drain_topic(cluster.tcp_namesrv, topic, f"CG_ABF_{where}", 30)
    by_uniq = {m.msg_id: m for m in got}
    assert [by_uniq[r.msg_id].body for r in results] == [f"f{i}".encode() for i in range(30)]
