"""What ACL costs a send: sends/s to a broker with aclEnable=true by a producer that signs every
request, against the same sends to a broker with ACL off by one that does not, in the same run
(each broker in its own process, with its own name server).

Groups acl-{sync,async}: 1000 sync sends one at a time / 1000 async sends in rounds of 200 in
flight (pipelined), 128 B - `baseline_acl_off` vs `acl_on`; and `interleaved`: off and on rounds
taken turn about (a load drifting between tests hits both), extra_info has both rates and
`ratio_acl` of the median rounds (targets: >= 0.9 one at a time, >= 0.8 pipelined), and
`ratio_acl_best` of the best rounds.  The client signs each request
once (HMAC-SHA1 over its ext fields and body), the broker verifies it once and checks the topic
against the account it cached for the connection."""
import itertools

import pytest

from rmq_core import Message, Producer
from tests.bench.ab import bench_rounds, interleaved
from tests.servers import NamesrvAndBroker

N = 1000
IN_FLIGHT = 200
ROUNDS = 15  # (the median of many short rounds: these machines are shared and noisy)
FAST = dict(poll_name_server_interval=5.0, heartbeat_broker_interval=5.0, persist_consumer_offset_interval=1.0)
TOPIC = "BenchAcl"
AK, SK = "bench-producer", "bench-secret-key"
PLAIN_ACL = f"""\
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [{TOPIC}=PUB]
"""
_ids = itertools.count()


@pytest.fixture(scope="module")
def off_cluster(tmp_path_factory):
    c = NamesrvAndBroker(tmp_path_factory.mktemp("rmq-bench-acl-off"), broker_props={"flushDiskType": "ASYNC_FLUSH"})
    yield c
    c.stop()


@pytest.fixture(scope="module")
def on_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rmq-bench-acl-on")
    acl = tmp / "plain_acl.yml"
    acl.write_text(PLAIN_ACL)
    c = NamesrvAndBroker(tmp, broker_props={"flushDiskType": "ASYNC_FLUSH", "aclEnable": "true",
                                            "plainAclFile": str(acl)})
    yield c
    c.stop()


def _producer(cluster, **credentials) -> Producer:
    n = next(_ids)
    p = Producer(f"PG_BENCH_ACL_{n}", namesrv=cluster.namesrv, instance_name=f"bench-acl-{n}", **credentials,
                 **FAST).start()
    p.send(Message(TOPIC, b"warm"))
    return p


@pytest.fixture(scope="module")
def acl_off(off_cluster):
    p = _producer(off_cluster)
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def acl_on(on_cluster):
    p = _producer(on_cluster, access_key=AK, secret_key=SK)
    yield p
    p.shutdown()


def _bench(benchmark, p, mode):
    bench_rounds(benchmark, f"acl-{mode}", p, mode, TOPIC, N, IN_FLIGHT, ROUNDS)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_acl_baseline_acl_off(benchmark, acl_off, mode):
    _bench(benchmark, acl_off, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_acl_on(benchmark, acl_on, mode):
    _bench(benchmark, acl_on, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_acl_interleaved(benchmark, acl_off, acl_on, mode):
    rates = interleaved(benchmark, f"acl-{mode}", {"off": acl_off, "on": acl_on}, mode, TOPIC, N, IN_FLIGHT, ROUNDS)
    info = benchmark.extra_info
    info.update(acl_off_per_s=rates["off"], acl_on_per_s=rates["on"], ratio_acl=rates["on"] / rates["off"],
                ratio_acl_best=info["on_best_per_s"] / info["off_best_per_s"])
