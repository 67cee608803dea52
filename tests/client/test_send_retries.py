"""Retry, fault-avoidance and timeout semantics of a send (RocketMQ's sendDefaultImpl over one
SendPolicy), tested once on the one send pipeline for sync, async and batch sends alike: real
brokers (two `rmq broker` processes on 127.0.0.1), their answers rewritten as they are read
(a busy broker, a refusal, a lost answer) or one broker killed."""
import pytest

from rmq_core import Message, Producer
from rmq_core.client import producer as producer_module
from rmq_core.errors import MQBrokerError, MQClientError
from rmq_core.message import MessageQueue, SendStatus
from rmq_core.remoting.codes import ResponseCode
from tests.client.conftest import FAST, wait_until
from tests.servers import NamesrvAndBroker

TOPIC = "RetryT"
MODES = ["sync", "async", "batch", "batch_async"]
RETRIES = {"retry_times_when_send_failed": 3, "retry_times_when_send_async_failed": 1}
ATTEMPTS = {"sync": 4, "async": 2, "batch": 4, "batch_async": 2}  # 1 + the mode's retry count


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    s = NamesrvAndBroker(tmp_path_factory.mktemp("retries"), brokers=2, broker_props={"registerNameServerPeriod": "1000"})
    try:
        with Producer("PG_RETRY_SEED", namesrv=s.namesrv, **FAST) as p:
            for b in ("broker-a", "broker-b"):
                p.send(Message(TOPIC, b"seed"), queue=MessageQueue(TOPIC, b, 0))
            wait_until(lambda: {q.broker_name for q in p.fetch_publish_message_queues(TOPIC)} ==
                       {"broker-a", "broker-b"}, what="the topic on both brokers")
        yield s
    finally:
        s.stop()


class Script:
    """The send answers every pipelined connection reads, rewritten in order by `codes`: a code
    replaces the answer's, None leaves it, "drop" loses it; later answers stand.  `failed` lists
    the brokers of the attempts the policy noted as failed (isolated), in order."""

    def __init__(self, monkeypatch, codes):
        self.codes = list(codes)
        self.answers = 0
        self.failed = []
        real = producer_module.read_send_response_frames

        def read(data, max_frame_length):
            items, consumed = real(data, max_frame_length)
            kept = []
            for item in items:
                if not isinstance(item, bytes):
                    self.answers += 1
                    code = self.codes.pop(0) if self.codes else None
                    if code == "drop":
                        continue
                    if code is not None:
                        item.code, item.remark = code, "injected"
                kept.append(item)
            return kept, consumed

        monkeypatch.setattr(producer_module, "read_send_response_frames", read)

    def watch(self, p):
        """Note each failed attempt's broker (a failure is noted by the policy, which benches it)."""
        failed = self.failed

        class WatchedPolicy(type(p.send_policy)):
            __slots__ = ()

            def note(self, broker_name, begin, is_failed):
                if is_failed:
                    failed.append(broker_name)
                return super().note(broker_name, begin, is_failed)

        p.send_policy.__class__ = WatchedPolicy
        return p


def _producer(servers, script, group, **kw):
    return script.watch(Producer(group, namesrv=servers.namesrv, **{**FAST, **RETRIES, **kw}).start())


def _send(p, mode, timeout=None, **kw):
    """One send of the mode: its SendResult (or its error raised)."""
    msg = Message(TOPIC, b"x")
    if mode == "sync":
        return p.send(msg, timeout=timeout, **kw)
    if mode == "async":
        return p.send_async(msg, timeout=timeout, **kw).result(30)
    if mode == "batch":
        return p.send_batch([msg, Message(TOPIC, b"y")], timeout=timeout, **kw)
    return p.send_batch_async([msg, Message(TOPIC, b"y")], timeout=timeout, **kw).result(30)


def _warm(p):
    p.send(Message(TOPIC, b"warm"))  # route cached, a connection open: the script starts after it


@pytest.mark.parametrize("mode", MODES)
def test_a_busy_broker_is_retried_on_the_other_broker_and_benched(servers, monkeypatch, mode):
    script = Script(monkeypatch, [])
    p = _producer(servers, script, f"PG_RETRY_BUSY_{mode}")
    try:
        _warm(p)
        script.codes = [ResponseCode.SYSTEM_BUSY]
        r = _send(p, mode)
        assert r.status is SendStatus.SEND_OK and script.answers == 3  # (warm, busy, retried)
        (busy,) = script.failed
        assert r.queue.broker_name != busy  # the next attempt went to another broker
        assert not p.fault_strategy.tolerance.is_available(busy)  # benched: later sends avoid it
        later = {_send(p, mode).queue.broker_name for _ in range(6)}
        assert later == {r.queue.broker_name}
    finally:
        p.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_a_refusal_is_the_answer_not_retried(servers, monkeypatch, mode):
    script = Script(monkeypatch, [])
    p = _producer(servers, script, f"PG_RETRY_REFUSED_{mode}")
    try:
        _warm(p)
        script.codes = [ResponseCode.MESSAGE_ILLEGAL]
        with pytest.raises(MQBrokerError, match="code 13 .*injected"):
            _send(p, mode)
        assert script.answers == 2 and len(script.failed) == 1
    finally:
        p.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_attempts_are_the_policys_for_the_mode(servers, monkeypatch, mode):
    script = Script(monkeypatch, [])
    p = _producer(servers, script, f"PG_RETRY_COUNT_{mode}")
    try:
        _warm(p)
        script.codes = [ResponseCode.SYSTEM_BUSY] * 10
        with pytest.raises(MQBrokerError, match="code 2 .*injected"):
            _send(p, mode)
        assert script.answers - 1 == ATTEMPTS[mode] == len(script.failed)
        assert set(script.failed) == {"broker-a", "broker-b"}  # each retry on the other broker
    finally:
        p.shutdown()


@pytest.mark.parametrize("mode", ["sync", "async", "batch"])
def test_a_given_or_selected_queue_is_not_switched(servers, monkeypatch, mode):
    script = Script(monkeypatch, [])
    p = _producer(servers, script, f"PG_RETRY_FIXED_{mode}")
    try:
        _warm(p)
        script.codes = [ResponseCode.SYSTEM_BUSY]
        queue = MessageQueue(TOPIC, "broker-b", 0)
        with pytest.raises(MQBrokerError, match="code 2 .*injected"):
            _send(p, mode, queue=queue)
        assert script.answers == 2  # one attempt
        if mode != "batch":
            script.codes = [ResponseCode.SYSTEM_BUSY]
            with pytest.raises(MQBrokerError, match="code 2 .*injected"):
                _send(p, mode, selector=lambda mqs, msg, arg: mqs[0])
            assert script.answers == 3
        assert _send(p, mode, queue=queue).queue == queue
    finally:
        p.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_the_timeout_counts_across_attempts(servers, monkeypatch, mode):
    script = Script(monkeypatch, [])
    p = _producer(servers, script, f"PG_RETRY_TIMEOUT_{mode}")
    try:
        _warm(p)
        script.codes = ["drop"] * 10
        with pytest.raises(MQClientError, match="no response .* in time"):
            _send(p, mode, timeout=0.6)
        assert script.answers == 2  # the lost answer's attempt spent the send's time: no second one
        assert len(script.failed) == 1
        script.codes = []
        assert _send(p, mode).status is SendStatus.SEND_OK  # the connection stays usable
    finally:
        p.shutdown()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_retry_another_broker_when_not_store_ok_is_for_sync_sends(servers, monkeypatch, mode):
    script = Script(monkeypatch, [])
    p = _producer(servers, script, f"PG_RETRY_STORE_{mode}", retry_another_broker_when_not_store_ok=True)
    try:
        _warm(p)
        script.codes = [ResponseCode.FLUSH_DISK_TIMEOUT]
        r = _send(p, mode)
        if mode == "sync":  # (Java: only a sync send retries a stored-but-not-OK answer)
            assert r.status is SendStatus.SEND_OK and script.answers == 3
        else:
            assert r.status is SendStatus.FLUSH_DISK_TIMEOUT and script.answers == 2
        script.codes = [ResponseCode.FLUSH_DISK_TIMEOUT] * 10
        r = _send(p, mode)  # every attempt not OK: the last answer is the result
        assert r.status is SendStatus.FLUSH_DISK_TIMEOUT
    finally:
        p.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_a_killed_broker_is_avoided(tmp_path, mode):
    servers = NamesrvAndBroker(tmp_path, brokers=2, broker_props={"registerNameServerPeriod": "1000"})
    try:
        with Producer(f"PG_RETRY_KILL_{mode}", namesrv=servers.namesrv, send_msg_timeout=5.0,
                      **{**FAST, **RETRIES}) as p:
            for b in ("broker-a", "broker-b"):
                p.send(Message(TOPIC, b"seed"), queue=MessageQueue(TOPIC, b, 0))
            wait_until(lambda: {q.broker_name for q in p.fetch_publish_message_queues(TOPIC)} ==
                       {"broker-a", "broker-b"}, what="the topic on both brokers")
            assert {_send(p, mode).queue.broker_name for _ in range(8)} == {"broker-a", "broker-b"}
            servers.brokers[1].kill()  # SIGKILL broker-b
            results = [_send(p, mode) for _ in range(12)]
            assert all(r.status is SendStatus.SEND_OK for r in results)
            assert {r.queue.broker_name for r in results} == {"broker-a"}
            assert not p.fault_strategy.tolerance.is_available("broker-b")
    finally:
        servers.stop()


def test_an_aio_send_is_retried_on_the_pipeline_too(servers, monkeypatch):
    """rmq_core.aio's send (whose Future the pipeline finishes itself) takes the same attempts."""
    import asyncio

    from rmq_core import aio

    script = Script(monkeypatch, [])

    async def main():
        async with aio.Producer("PG_RETRY_AIO", namesrv=servers.namesrv, **{**FAST, **RETRIES}) as p:
            script.watch(p.producer)
            await p.send(Message(TOPIC, b"warm"))
            script.codes = [ResponseCode.SYSTEM_BUSY]
            r = await p.send(Message(TOPIC, b"x"))
            assert r.status is SendStatus.SEND_OK and script.answers == 3
            assert r.queue.broker_name not in script.failed
            script.codes = [ResponseCode.SYSTEM_BUSY] * 10
            with pytest.raises(MQBrokerError, match="code 2 .*injected"):
                await p.send(Message(TOPIC, b"y"))
            assert script.answers - 3 == ATTEMPTS["async"]

    asyncio.run(main())
