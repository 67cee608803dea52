"""Soak (make test-slow): consumers join and leave at random while messages keep flowing."""
import random
import threading
import time

import pytest

from rmq_core import ConsumeStatus, Message, Producer, PushConsumer
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until


@pytest.mark.slow
def test_random_membership_churn_loses_nothing(cluster):
    topic = "Soak"
    rnd = random.Random(7)
    lock = threading.Lock()
    counts: dict[bytes, int] = {}

    def listener(msgs):
        with lock:
            for m in msgs:
                counts[m.body] = counts.get(m.body, 0) + 1
        return ConsumeStatus.CONSUME_SUCCESS

    def consumer():
        c = PushConsumer("CG_SOAK", namesrv=cluster.tcp_namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                         **FAST_CONSUMER)
        c.subscribe(topic, "*")
        c.register_message_listener(listener)
        return c.start()

    sent = []
    stop = threading.Event()
    with Producer("PG_SOAK", namesrv=cluster.namesrv, **FAST) as p:
        p.send(Message(topic, b"seed"))
        sent.append(b"seed")

        def produce():
            i = 0
            while not stop.is_set():
                batch = [Message(topic, f"s{i + j}".encode()) for j in range(20)]
                p.send_batch(batch)
                sent.extend(m.body for m in batch)
                i += 20
                time.sleep(0.01)

        members = [consumer()]
        t = threading.Thread(target=produce)
        t.start()
        try:
            for _ in range(12):
                time.sleep(rnd.uniform(0.3, 1.2))
                if len(members) < 4 and (len(members) == 1 or rnd.random() < 0.6):
                    members.append(consumer())
                else:
                    members.pop(rnd.randrange(len(members))).shutdown()
        finally:
            stop.set()
            t.join()
        try:
            wait_until(lambda: len(counts) == len(sent), timeout=60, what="every message consumed")
        finally:
            for c in members:
                c.shutdown()
    assert set(counts) == set(sent)
    dups = sum(v - 1 for v in counts.values())
    print(f"soak: {len(sent)} messages, {dups} duplicate deliveries over 12 membership changes")
