"""One retry / fault-avoidance policy (SendPolicy: MQFaultStrategy + sendDefaultImpl's retry rules)
for every send mode: sync, async, batch, async batch and auto-batch.

The failures are real: a second `rmq broker` process frozen with SIGSTOP (nothing answers: the
timeout rule) and then killed (connections refused: failover and fault avoidance)."""
import os
import signal
import time

import pytest

from rmq_core import Message, Producer
from rmq_core.client.fault import MQFaultStrategy, SendPolicy
from rmq_core.client.instance import MQClientInstance
from rmq_core.errors import MQBrokerError, MQClientError, RemotingConnectError, RemotingTimeoutError
from rmq_core.message import MessageQueue, SendStatus
from rmq_core.remoting.codes import ResponseCode
from tests.client.conftest import FAST, wait_until
from tests.servers import freeze

MODES = ["sync", "async", "batch", "batch_async", "auto_batch"]


def _send(p: Producer, mode: str, topic: str, body: bytes, queue: MessageQueue | None = None, timeout=None):
    """One send in `mode`, waited for: its SendResult or its error."""
    msg = Message(topic, body)
    if mode == "sync":
        return p.send(msg, queue=queue, timeout=timeout)
    if mode in ("async", "auto_batch"):
        return p.send_async(msg, queue=queue, timeout=timeout).result(30)
    if mode == "batch":
        return p.send_batch([msg, Message(topic, body + b"-2")], queue=queue, timeout=timeout)
    return p.send_batch_async([msg, Message(topic, body + b"-2")], queue=queue, timeout=timeout).result(30)


def test_attempts_per_mode_and_the_one_retry_rule():
    policy = SendPolicy(MQFaultStrategy(), retry_times_when_send_failed=2, retry_times_when_send_async_failed=5)
    assert [policy.attempts(m) for m in ("SYNC", "ASYNC", "ONEWAY")] == [3, 6, 1]
    worth = policy.worth_retrying
    assert worth(RemotingConnectError("reset")) and worth(RemotingTimeoutError("late"))
    assert worth(MQClientError("no address")) and worth(TimeoutError())
    assert worth(MQBrokerError(ResponseCode.SYSTEM_BUSY, "busy", "a"))
    assert not worth(MQBrokerError(ResponseCode.MESSAGE_ILLEGAL, "bad", "a"))
    assert not worth(ValueError("a bug"))


def test_a_failure_benches_the_broker_and_fast_answers_are_noted_once_per_ms():
    fault = MQFaultStrategy()
    policy = SendPolicy(fault)
    begin = time.monotonic()
    policy.note("broker-a", begin, False)
    assert "broker-a" in policy.noted and fault.tolerance.is_available("broker-a")
    policy.note("broker-b", begin, True)
    assert not fault.tolerance.is_available("broker-b") and "broker-b" not in policy.noted


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory):
    from tests.servers import NamesrvAndBroker

    servers = NamesrvAndBroker(tmp_path_factory.mktemp("policy"), brokers=2,
                               broker_props={"registerNameServerPeriod": "1000"})
    try:
        with Producer("PG_POLICY_SEED", namesrv=servers.namesrv, **FAST) as p:
            for b in ("broker-a", "broker-b"):
                for topic in ("PolicyT", "PolicyTimeoutT"):
                    p.send(Message(topic, b"seed"), queue=MessageQueue(topic, b, 0))
            wait_until(lambda: {q.broker_name for q in p.fetch_publish_message_queues("PolicyT")} ==
                       {"broker-a", "broker-b"}, what="the topic on both brokers")
        yield servers
    finally:
        if servers.brokers[1].proc.poll() is None:
            os.kill(servers.brokers[1].proc.pid, signal.SIGCONT)
        servers.stop()


@pytest.mark.parametrize("mode", MODES)
def test_a_send_to_a_broker_that_does_not_answer_fails_within_its_timeout(two_brokers, mode):
    stuck = MessageQueue("PolicyTimeoutT", "broker-b", 0)
    with Producer(f"PG_POLICY_TO_{mode}", namesrv=two_brokers.namesrv, auto_batch=mode == "auto_batch",
                  **FAST) as p:
        assert _send(p, mode, "PolicyTimeoutT", b"warm", queue=stuck).status is SendStatus.SEND_OK
        freeze(two_brokers.brokers[1].proc.pid)
        try:
            t0 = time.monotonic()
            with pytest.raises((MQClientError, RemotingTimeoutError), match="within|timed out|in time"):
                _send(p, mode, "PolicyTimeoutT", b"late", queue=stuck, timeout=0.5)
            assert time.monotonic() - t0 < 4  # the timeout, not the 3 s default or a hang
        finally:
            os.kill(two_brokers.brokers[1].proc.pid, signal.SIGCONT)
        # the broker answers again: the next send goes through
        assert _send(p, mode, "PolicyTimeoutT", b"again", queue=stuck).status is SendStatus.SEND_OK


def test_each_mode_gets_its_own_retry_count_and_failover_benches_the_dead_broker(two_brokers, monkeypatch):
    # producers with both brokers in their cached routes (no route refresh on a timer here: the
    # name server forgets a killed broker at once, the first failed attempt refreshes the route;
    # nor the refresh a failed master starts, test_route_suspect's subject: the attempts that pick
    # the dead broker are what this test counts)
    monkeypatch.setattr(MQClientInstance, "route_suspect", lambda *a, **k: None)
    slow_routes = {**FAST, "poll_name_server_interval": 600.0}
    producers = {}
    for mode in MODES:
        # no fault avoidance and no async retries: round robin picks broker-b, and only the sync
        # modes (2 retries) go on to broker-a
        producers["no_retry", mode] = Producer(
            f"PG_POLICY_NR_{mode}", namesrv=two_brokers.namesrv, send_latency_fault_enable=False,
            retry_times_when_send_async_failed=0, auto_batch=mode == "auto_batch", **slow_routes).start()
        # the defaults: every mode fails over to broker-a and benches broker-b
        producers["default", mode] = Producer(f"PG_POLICY_FA_{mode}", namesrv=two_brokers.namesrv,
                                              auto_batch=mode == "auto_batch", **slow_routes).start()
    try:
        for p in producers.values():
            assert {q.broker_name for q in p.fetch_publish_message_queues("PolicyT")} == {"broker-a", "broker-b"}
        two_brokers.brokers[1].kill()  # broker-b gone: its connections are refused from now on
        for (kind, mode), p in producers.items():
            outcomes = []
            for i in range(10):
                try:
                    outcomes.append(_send(p, mode, "PolicyT", f"{mode}-{i}".encode()).queue.broker_name)
                except (MQClientError, RemotingConnectError) as e:
                    outcomes.append(type(e).__name__)
            if kind == "default" or mode in ("sync", "batch"):
                assert set(outcomes) == {"broker-a"}, (kind, mode, outcomes)
            else:  # async modes without retries: the attempt that picked broker-b is the send's failure
                assert "broker-a" in outcomes and set(outcomes) - {"broker-a"}, (kind, mode, outcomes)
            if kind == "default":
                assert p.fault_strategy.tolerance.is_available("broker-b") is False
    finally:
        for p in producers.values():
            p.shutdown()
