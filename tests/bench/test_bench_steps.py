"""What request steps cost when a client and a broker share one process (the embedded mode): sends/s
with a client-side and a broker-side hook both registered - each reading the request's ext fields,
as a signer and a checker would - against the same sends with none, measured in the same run.

Two embedded clusters (name server + broker, TCP between client and broker: the pipelined send
connection and the broker's native send lane), one started while the hooks were registered (steps
are resolved when a client or server starts); rounds alternate between them so a load drifting
during the run hits both.  Groups `steps-{sync,async}`: `baseline_none` and `both_sides`, each the
median sends/s of its rounds; `interleaved` carries the ratio (both_sides / none) in extra_info.
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

ROUNDS = 7
FAST = dict(poll_name_server_interval=5.0, heartbeat_broker_interval=5.0, persist_consumer_offset_interval=1.0)
TOPIC = "BenchSteps"
_ids = itertools.count()


class _ReadingHooks:
    """A client-side and a broker-side hook, each reading the request's ext fields."""

    def __init__(self):
        self.client = self.broker = 0

    @hookimpl
    def rmq_client_before_request(self, remote_addr, request):
        if request.ext_fields:
            self.client += 1

    @hookimpl
    def rmq_broker_before_request(self, remote_addr, request, connection):
        if request.ext_fields:
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


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("steps")
    plain = _start(tmp, "plain")
    hooks = _ReadingHooks()
    pm = get_plugin_manager()
    pm.register(hooks, name="bench-reading-steps")
    try:
        hooked = _start(tmp, "hooked")  # (its broker and client resolved the hooks as they started)
    finally:
        pm.unregister(hooks)
    yield {"none": plain[1], "both_sides": hooked[1], "hooks": hooks}
    for cluster, p in (plain, hooked):
        p.shutdown()
        cluster.stop()


def _round(p, mode):
    """Sends/s of one round of N 128-byte sends (sync, or async BATCH in flight: the trace bench's round)."""
    t0 = time.perf_counter()
    send_round(p, mode, TOPIC, N, BATCH)
    return N / (time.perf_counter() - t0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_steps_interleaved(benchmark, pairs, mode):
    benchmark.group = f"steps-{mode}"
    rates = {"none": [], "both_sides": []}
    hooks = pairs["hooks"]
    seen = (hooks.client, hooks.broker)

    def run():
        for which in ("none", "both_sides"):
            rates[which].append(_round(pairs[which], mode))

    _round(pairs["none"], mode), _round(pairs["both_sides"], mode)  # warm-up
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    none, both = statistics.median(rates["none"]), statistics.median(rates["both_sides"])
    benchmark.extra_info.update(none_msgs_per_s=none, both_sides_msgs_per_s=both, ratio=both / none)
    print(f"\nsteps-{mode}: none {none:.0f}/s, both sides {both:.0f}/s, ratio {both / none:.3f}")
    # every hooked send passed both hooks (the warm-up's too)
    assert hooks.client - seen[0] >= (ROUNDS + 1) * N and hooks.broker - seen[1] >= (ROUNDS + 1) * N
