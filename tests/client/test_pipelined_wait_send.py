"""send_async's Future read by its waiter (LeanFuture.result -> PipelinedChannel.wait): many threads
sending and waiting on one producer's connection at once, callbacks that send and wait themselves,
against a real broker on 127.0.0.1."""
import random
import threading

from rmq_core import Message, Producer
from rmq_core.message import SendStatus
from tests.client.conftest import FAST, drain_topic, wait_until


def test_threads_waiting_on_their_sends_and_callbacks_that_wait_all_land_once(cluster):
    topic = "PipeWaitT"
    results, cb_results, errors = [], [], []
    lock = threading.Lock()
    with Producer("PG_PIPE_WAIT", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message(topic, b"warm-up"))  # route cached: the async sends take the pipelined path

        def callback(result, error):
            # on the client's blocking executor: may send and wait, on the same connection
            try:
                inner = p.send_async(Message(topic, b"cb-async-" + result.msg_id.encode()))
                sync = p.send(Message(topic, b"cb-sync-" + result.msg_id.encode()))
                with lock:
                    cb_results.extend([inner.result(10), sync])
            except Exception as e:  # noqa: BLE001 - asserted below
                errors.append(e)

        def worker(n, rnd):
            try:
                for r in range(6):
                    futs = [p.send_async(Message(topic, f"{n}-{r}-{i}".encode()),
                                         callback if i == 0 and r % 2 == 0 else None)
                            for i in range(rnd.randrange(1, 25))]
                    if rnd.random() < 0.5:
                        rnd.shuffle(futs)
                    got = [f.result(10) for f in futs]
                    with lock:
                        results.extend(got)
            except Exception as e:  # noqa: BLE001 - asserted below
                errors.append(e)

        rnd = random.Random(7)
        threads = [threading.Thread(target=worker, args=(n, random.Random(rnd.random()))) for n in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        callbacks = 5 * 3
        wait_until(lambda: len(cb_results) == 2 * callbacks or errors, what="every callback's sends")
        assert not errors
    assert all(r.status is SendStatus.SEND_OK for r in results + cb_results)
    ids = [r.msg_id for r in results + cb_results]
    assert len(set(ids)) == len(ids)  # no result handed to two futures
    got = drain_topic(cluster.tcp_namesrv, topic, "CG_PIPE_WAIT", 1 + len(ids))
    bodies = sorted(m.body for m in got)
    assert len(bodies) == len(set(bodies)) == 1 + len(ids)  # each message stored once
