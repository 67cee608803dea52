"""What request steps cost when a client and a broker share one process (the embedded mode): sends/s
with a client-side and a broker-side hook both registered - hooks that do nothing, and hooks that
read the request's fields (the topic, as a signer or a checker would) - against the same sends with
none, measured in the same run.

Three embedded clusters (name server + broker, TCP between client and broker: the pipelined send
connection and the broker's native send lane), two of them started while their hooks were
registered (steps are resolved when a client or server starts); rounds alternate between them so a
load drifting during the run hits all.  Groups `steps-{sync,async}`: the median sends/s of each
one's rounds - by the clock and per CPU second of the process (client and broker together: what the
steps cost, less what other processes take) - and the ratios (no_op / none, reading / none) in
extra_info.
"""
import itertools
import statistics
import time

import pytest

from rmq_core import Message, Producer
from rmq_core.embedded import Cluster
from rmq_core.plugins import get_plugin_manager, hookimpl
from tests.bench.ab import send_round
from tests.bench.test_bench_trace import BATCH, N  # (the client benches' round)

ROUNDS = 9
FAST = dict(poll_name_server_interval=5.0, heartbeat_broker_interval=5.0, persist_consumer_offset_interval=1.0)
TOPIC = "BenchSteps"
_ids = itertools.count()


class _NoOpHooks:
    """A client-side and a broker-side hook that do nothing."""

    @hookimpl
    def rmq_client_before_request(self, remote_addr, request):
        return None

    @hookimpl
    def rmq_broker_before_request(self, remote_addr, request, connection):
        return None


class _ReadingHooks:
    """A client-side and a broker-side hook, each reading the request's topic from its ext fields
    (SEND_MESSAGE_V2's "b")."""

    def __init__(self):
        self.client = self.broker = 0

    @hookimpl
    def rmq_client_before_request(self, remote_addr, request):
        if request.ext_fields.get("b") == TOPIC:
            self.client += 1

    @hookimpl
    def rmq_broker_before_request(self, remote_addr, request, connection):
        if request.ext_fields.get("b") == TOPIC:
            self.broker += 1


def _start(tmp_path, name):
    cluster = Cluster(str(tmp_path / name), {"flushDiskType": "ASYNC_FLUSH"})
    cluster.start()
    p = Producer(f"PG_STEPS_{next(_ids)}", namesrv=cluster.tcp_namesrv, instance_name=f"bench-steps-{next(_ids)}",
                 **FAST).start()
    deadline = time.monotonic() + 30
    while True:  # the broker registers with the name server on a timer
        try:
            p.send(Message(TOPIC, b"warm"))
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return cluster, p


def _start_hooked(tmp, name, hooks):
    pm = get_plugin_manager()
    pm.register(hooks, name=f"bench-{name}-steps")
    try:
        return _start(tmp, name)  # (its broker and client resolved the hooks as they started)
    finally:
        pm.unregister(hooks)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("steps")
    hooks = _ReadingHooks()
    started = {"none": _start(tmp, "plain"), "no_op": _start_hooked(tmp, "noop", _NoOpHooks()),
               "reading": _start_hooked(tmp, "reading", hooks)}
    yield {**{name: pair[1] for name, pair in started.items()}, "hooks": hooks}
    for cluster, p in started.values():
        p.shutdown()
        cluster.stop()


def _round(p, mode):
    """(sends/s, sends per CPU second of the process - client and broker together) of one round of
    N 128-byte sends (sync, or async BATCH in flight: the trace bench's round)."""
    t0, c0 = time.perf_counter(), time.process_time()
    send_round(p, mode, TOPIC, N, BATCH)
    return N / (time.perf_counter() - t0), N / (time.process_time() - c0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_steps_interleaved(benchmark, pairs, mode):
    benchmark.group = f"steps-{mode}"
    rates = {"none": [], "no_op": [], "reading": []}
    hooks = pairs["hooks"]
    seen = (hooks.client, hooks.broker)

    order = list(rates)

    def run():  # (the order turns each round: no one follows the same one's background work every time)
        for which in order:
            rates[which].append(_round(pairs[which], mode))
        order.append(order.pop(0))

    for which in rates:  # warm-up
        _round(pairs[which], mode)
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    wall = {which: statistics.median(r[0] for r in rs) for which, rs in rates.items()}
    cpu = {which: statistics.median(r[1] for r in rs) for which, rs in rates.items()}
    for name, m in (("wall", wall), ("cpu", cpu)):
        benchmark.extra_info.update({f"{which}_{name}_msgs_per_s": v for which, v in m.items()})
        benchmark.extra_info.update({f"{which}_{name}_ratio": m[which] / m["none"] for which in ("no_op", "reading")})
        print(f"\nsteps-{mode} ({name}): none {m['none']:.0f}/s, no-op {m['no_op']:.0f}/s "
              f"({m['no_op'] / m['none']:.3f}), reading {m['reading']:.0f}/s ({m['reading'] / m['none']:.3f})")
    # every send of the reading pair passed both hooks, and they read its topic (the warm-up's too)
    assert hooks.client - seen[0] >= (ROUNDS + 1) * N and hooks.broker - seen[1] >= (ROUNDS + 1) * N
