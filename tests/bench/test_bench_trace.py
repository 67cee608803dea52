"""What message trace costs a producer: sends/s with enable_msg_trace=True against the same
sends untraced, in the same run, against a broker in its own process (traceTopicEnable=true).

Groups client-trace-{sync,async}: 2000 sync sends one at a time / 2000 async sends in rounds of 50
in flight, 128 B - `baseline_untraced` vs `traced`; and `interleaved`: untraced and traced rounds
taken turn about (a load drifting between tests hits both), extra_info has both rates and
`ratio_traced` (the target: >= 0.9).  Every traced send's record is noted on the caller's path
(its Pub record written into a preallocated segment) and leaves in batches from the trace's worker
through the inner producer."""
import itertools

import pytest

from rmq_core import Message, Producer
from tests.bench.ab import bench_rounds, interleaved
from tests.servers import NamesrvAndBroker

N = 2000
BATCH = 50
ROUNDS = 9
FAST = dict(poll_name_server_interval=5.0, heartbeat_broker_interval=5.0, persist_consumer_offset_interval=1.0)
TOPIC = "BenchTrace"
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = NamesrvAndBroker(tmp_path_factory.mktemp("rmq-bench-trace"), broker_props={
        "flushDiskType": "ASYNC_FLUSH", "traceTopicEnable": "true"})
    yield c
    c.stop()


def _producer(cluster, traced: bool) -> Producer:
    n = next(_ids)
    p = Producer(f"PG_BENCH_TRACE_{n}", namesrv=cluster.namesrv, instance_name=f"bench-trace-{n}",
                 enable_msg_trace=traced, **FAST).start()
    p.send(Message(TOPIC, b"warm"))
    return p


@pytest.fixture(scope="module")
def untraced(cluster):
    p = _producer(cluster, False)
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def traced(cluster):
    p = _producer(cluster, True)
    yield p
    assert p.trace.sent > 0 and p.trace.send_failed == 0
    p.shutdown()


def _bench(benchmark, p, mode):
    bench_rounds(benchmark, f"client-trace-{mode}", p, mode, TOPIC, N, BATCH, ROUNDS)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trace_baseline_untraced(benchmark, untraced, mode):
    _bench(benchmark, untraced, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trace_traced(benchmark, traced, mode):
    _bench(benchmark, traced, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trace_interleaved(benchmark, untraced, traced, mode):
    rates = interleaved(benchmark, f"client-trace-{mode}", {"untraced": untraced, "traced": traced}, mode, TOPIC, N,
                        BATCH, ROUNDS)
    off, on = rates["untraced"], rates["traced"]
    benchmark.extra_info.update(untraced_per_s=off, traced_per_s=on, ratio_traced=on / off,
                                discarded=traced.trace.discarded)
