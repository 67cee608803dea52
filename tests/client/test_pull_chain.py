"""A queue's pulls in flight (PullChain), against a real broker: while the broker reports a backlog
several pulls of one queue are on the wire, each after the first at a guessed offset.  A guess
goes wrong where the stride changes - a consume-queue file ends (1000 entries here), a large
message hits the broker's transfer-bytes limit, a tag filter skips messages - and its answer must
be dropped: every message arrives exactly once, in queue order, for the lite and the push consumer.
"""
import threading

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until

N = 2600
BIG = 120 * 1024  # two of them fill the broker's 256 KiB per pull: the stride drops to 2


def _tag(i: int) -> str:
    return "TagA" if i % 5 in (0, 1, 3) else "TagB"


def _send(namesrv, topic) -> None:
    with Producer(f"PG_{topic}", namesrv=namesrv, **FAST) as p:
        queue = p.fetch_publish_message_queues(topic)[0]
        batch = []
        for i in range(N):
            body = f"{i}".encode()
            if i % 400 == 399:  # a few large ones between runs of small ones
                body = body.ljust(BIG, b"-")
            batch.append(Message(topic, body, tags=_tag(i)))
            if len(batch) == 50 or i == N - 1 or i % 400 >= 397:
                p.send_batch(batch, queue=queue) if len(batch) > 1 else p.send(batch[0], queue=queue)
                batch = []


def _expected(expression: str) -> list[int]:
    return [i for i in range(N) if expression == "*" or _tag(i) == expression]


def _index(m) -> int:
    return int(m.body.split(b"-", 1)[0])


def _check(got: list, expression: str) -> None:
    """Exactly once and in queue order: the offsets rise and the bodies are the expected ones."""
    offsets = [m.queue_offset for m in got]
    assert offsets == sorted(set(offsets)), "a message came twice or out of queue order"
    assert [_index(m) for m in got] == _expected(expression)


@pytest.mark.parametrize("expression", ["*", "TagA"])
def test_lite_pull_consumer_gets_every_message_once_in_order(cluster, expression):
    topic = f"ChainLite{expression.strip('*')}"
    _send(cluster.namesrv, topic)
    want = len(_expected(expression))
    got = []
    c = PullConsumer(f"CG_CHAIN_LITE{expression.strip('*')}", namesrv=cluster.namesrv, pull_batch_size=32,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
    c.subscribe(topic, expression)
    with c:
        wait_until(lambda: got.extend(c.poll(0.2)) or len(got) >= want, timeout=60, what="every message")
    _check([m for m in got if m.queue_id == 0], expression)
    assert len(got) == want


@pytest.mark.parametrize("expression", ["*", "TagA"])
def test_orderly_push_consumer_gets_every_message_once_in_order(cluster, expression):
    topic = f"ChainPush{expression.strip('*')}"
    _send(cluster.namesrv, topic)
    want = len(_expected(expression))
    got = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            got.extend(msgs)
        return ConsumeStatus.SUCCESS

    c = PushConsumer(f"CG_CHAIN_PUSH{expression.strip('*')}", namesrv=cluster.namesrv,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
    c.subscribe(topic, expression)
    c.register_message_listener(listener, orderly=True)
    with c:
        wait_until(lambda: len(got) >= want, timeout=60, what="every message")
    with lock:
        _check(list(got), expression)


@pytest.mark.parametrize("by", ["count", "size"])
def test_flow_control_counts_the_pulls_in_flight(cluster, by):
    """A blocked listener and a deep backlog: however many pulls are on the wire, the buffer never
    holds more than the threshold plus one pull (as with one pull at a time), and everything comes
    once the listener runs."""
    topic = f"ChainFlow{by}"
    if by == "count":
        n, body, options, bound = 2000, 100, dict(pull_threshold_for_queue=300), lambda pq: pq.msg_count <= 300 + 32
    else:  # 64 KiB bodies: four to a pull (the broker's 256 KiB), 1 MiB at most buffered
        n, body, options = 60, 64 * 1024, dict(pull_threshold_size_for_queue=1)
        bound = lambda pq: pq.msg_size <= 1024 * 1024 + 256 * 1024  # noqa: E731
    with Producer(f"PG_{topic}", namesrv=cluster.namesrv, **FAST) as p:
        queue = p.fetch_publish_message_queues(topic)[0]
        for i in range(0, n, 10):
            p.send_batch([Message(topic, f"{i + j}".encode().ljust(body, b"-")) for j in range(10)], queue=queue)
    gate = threading.Event()
    got = []
    lock = threading.Lock()

    def listener(msgs):
        gate.wait(30)
        with lock:
            got.extend(_index(m) for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(f"CG_CHAIN_FLOW_{by}", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     consume_thread_min=1, consume_thread_max=1, **options, **FAST_CONSUMER)
    c.subscribe(topic, "*")
    c.register_message_listener(listener)
    with c:
        wait_until(lambda: c.flow_control_times >= 3, what="flow control holding the pulls back")
        pq = next(pq for mq, pq in c.process_queue_table.items() if mq.topic == topic and mq.queue_id == 0)
        for _ in range(20):  # the buffer, looked at while pulls could still be arriving
            assert bound(pq), pq
            threading.Event().wait(0.01)
        gate.set()
        wait_until(lambda: len(got) >= n, timeout=60, what="everything once the listener runs")
    assert sorted(got) == list(range(n))
