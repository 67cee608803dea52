"""More end-to-end behaviour: failover between two brokers, orderly local retry then DLQ,
expired in-flight messages sent back, interception hooks, broker-driven offset reset."""
import threading
import time


from rmq_core import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from rmq_core.message import MessageQueue, SendStatus
from rmq_core.plugins import get_plugin_manager, hookimpl
from tests.client.conftest import FAST, FAST_CONSUMER, wait_until


def make_consumer(namesrv, group, topic, listener, **kw):
    opts = dict(FAST_CONSUMER, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    opts.update(kw)
    orderly = opts.pop("orderly", False)
    c = PushConsumer(group, namesrv=namesrv, **opts)
    c.subscribe(topic, "*")
    c.register_message_listener(listener, orderly=orderly)
    return c


def test_send_fails_over_to_the_other_broker_when_one_dies(tmp_path):
    from tests.servers import NamesrvAndBroker

    servers = NamesrvAndBroker(tmp_path, brokers=2, broker_props={"registerNameServerPeriod": "1000"})
    try:
        with Producer("PG_FAILOVER", namesrv=servers.namesrv, send_msg_timeout=5.0, **FAST) as p:
            # the topic on both brokers: one send through each (the queue picks the broker)
            for b in ("broker-a", "broker-b"):
                p.send(Message("Failover", b"seed"), queue=MessageQueue("Failover", b, 0))
            wait_until(lambda: {q.broker_name for q in p.fetch_publish_message_queues("Failover")} ==
                       {"broker-a", "broker-b"}, what="the topic on both brokers")
            servers.brokers[1].kill()  # SIGKILL broker-b
            results = [p.send(Message("Failover", f"m{i}".encode())) for i in range(40)]
            assert all(r.status is SendStatus.SEND_OK for r in results)
            assert {r.queue.broker_name for r in results} == {"broker-a"}
            # the dead broker is out of the sends' way: benched by the latency fault strategy when a
            # send tried it, or gone from the topic's route when the name server saw its connection
            # close first (then no send tries it, and nothing is benched)
            queues = {q.broker_name for q in p.topic_publish_info["Failover"].queues}
            assert p.fault_strategy.tolerance.is_available("broker-b") is False or queues == {"broker-a"}, queues
    finally:
        servers.stop()


def test_orderly_suspend_retries_locally_then_dead_letters(cluster):
    topic = "OrderlyRetry"
    with Producer("PG_OR", namesrv=cluster.namesrv, **FAST) as p:
        q = p.fetch_publish_message_queues(topic)[0]
        for i in range(3):
            p.send(Message(topic, f"o{i}".encode()), queue=q)
    seen = []

    def listener(msgs):
        for m in msgs:
            seen.append((m.body, m.reconsume_times))
        if any(m.body == b"o1" for m in msgs):
            return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeStatus.SUCCESS

    c = make_consumer(cluster.namesrv, "CG_OR", topic, listener, orderly=True, max_reconsume_times=2,
                      suspend_current_queue_time=0.1)
    with c:
        wait_until(lambda: (b"o2", 0) in seen, what="the queue moves on past the poisoned message")
    # o1 tried 1 + 2 times, locally and in order (o2 only after o1 gave up), then sent to the DLQ
    assert seen[:5] == [(b"o0", 0), (b"o1", 0), (b"o1", 1), (b"o1", 2), (b"o2", 0)]
    pc = PullConsumer("CG_OR_DLQ", namesrv=cluster.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                      **FAST_CONSUMER)
    pc.assign([MessageQueue("%DLQ%CG_OR", "broker-a", 0)])
    with pc:
        got = []
        deadline = time.time() + 10
        while not got and time.time() < deadline:
            got = pc.poll(0.5)
    assert [m.body for m in got] == [b"o1"]


def test_expired_in_flight_message_is_sent_back(cluster):
    topic = "Stuck"
    with Producer("PG_STUCK", namesrv=cluster.namesrv, **FAST) as p:
        p.send(Message(topic, b"slow"))
    deliveries = []
    release = threading.Event()

    def listener(msgs):
        deliveries.append(msgs[0].reconsume_times)
        if len(deliveries) == 1:
            release.wait(10)  # stuck far longer than consume_timeout
        return ConsumeStatus.CONSUME_SUCCESS

    c = make_consumer(cluster.namesrv, "CG_STUCK", topic, listener, consume_timeout=0.5, consume_thread_max=2,
                      consume_thread_min=1)
    try:
        c.start()
        wait_until(lambda: len(deliveries) >= 2, timeout=15, what="the stuck message redelivered")
    finally:
        release.set()
        c.shutdown()
    assert deliveries[:2] == [0, 1]


class _Recorder:
    def __init__(self):
        self.events = []

    @hookimpl
    def rmq_before_send(self, context):
        self.events.append(("before_send", context.message.topic))

    @hookimpl
    def rmq_after_send(self, context):
        self.events.append(("after_send", context.send_result.status.value if context.send_result else "error"))

    @hookimpl
    def rmq_before_consume(self, context):
        self.events.append(("before_consume", len(context.messages)))

    @hookimpl
    def rmq_after_consume(self, context):
        self.events.append(("after_consume", context.success))

    @hookimpl
    def rmq_filter_message(self, context):
        # a FilterMessageHook may drop messages on the client side
        context.messages = [m for m in context.messages if m.body != b"drop-me"]
        self.events.append(("filter", len(context.messages)))


def test_send_and_consume_hooks(cluster):
    rec = _Recorder()
    pm = get_plugin_manager()
    pm.register(rec, name="test-recorder")
    try:
        with Producer("PG_HOOK", namesrv=cluster.namesrv, **FAST) as p:
            q = p.fetch_publish_message_queues("Hooked")[0]
            p.send(Message("Hooked", b"drop-me"), queue=q)
            p.send(Message("Hooked", b"h"), queue=q)
        got = []
        with make_consumer(cluster.namesrv, "CG_HOOK", "Hooked",
                           lambda msgs: (got.extend(msgs), ConsumeStatus.CONSUME_SUCCESS)[1]):
            wait_until(lambda: got, what="the hooked message")
            wait_until(lambda: ("after_consume", True) in rec.events, what="after_consume")
    finally:
        pm.unregister(rec)
    assert ("before_send", "Hooked") in rec.events and ("after_send", "SEND_OK") in rec.events
    assert ("before_consume", 1) in rec.events
    assert [m.body for m in got] == [b"h"]


def test_broker_reset_offset_rewinds_a_running_consumer(cluster):
    topic = "Rewind"
    with Producer("PG_RW", namesrv=cluster.namesrv, **FAST) as p:
        q = p.fetch_publish_message_queues(topic)[0]
        for i in range(5):
            p.send(Message(topic, f"r{i}".encode()), queue=q)
    got = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    with make_consumer(cluster.namesrv, "CG_RW", topic, listener):
        wait_until(lambda: len(got) >= 5, what="first pass")
        cluster.call(cluster.broker.notify_reset_offset("CG_RW", topic, 0, {q.queue_id: 2}))
        wait_until(lambda: len(got) >= 8, what="messages from offset 2 again")
    assert got[:5] == [f"r{i}".encode() for i in range(5)]
    assert got[5:8] == [b"r2", b"r3", b"r4"]


class _RefuseSendBack:
    async def process_request(self, ctx, request):
        from rmq_core.remoting.codes import ResponseCode
        return request.make_response(ResponseCode.SYSTEM_ERROR, "send back refused by the test")


def test_refused_send_back_falls_back_to_resending_into_the_retry_topic(cluster):
    from rmq_core.remoting.codes import RequestCode

    for server in cluster.broker.servers:
        server.register_processor(RequestCode.CONSUMER_SEND_MSG_BACK, _RefuseSendBack())
    with Producer("PG_FB", namesrv=cluster.namesrv, **FAST) as p:
        r = p.send(Message("FallBack", b"again", tags="T1", properties={"u": "1"}))
    seen = []

    def listener(msgs):
        seen.extend((m.topic, m.reconsume_times, m.tags, m.get_property("u"), m.get_property("ORIGIN_MESSAGE_ID"))
                    for m in msgs)
        return ConsumeStatus.RECONSUME_LATER if len(seen) == 1 else ConsumeStatus.CONSUME_SUCCESS

    with make_consumer(cluster.namesrv, "CG_FB", "FallBack", listener) as c:
        wait_until(lambda: len(seen) >= 2, timeout=20, what="the message back through the retry topic")
        inst = c.instance
        # re-sent by the client instance's own producer, on the send pipeline
        inner = inst.producers.get("CLIENT_INNER_PRODUCER")
        assert inner is not None and inner.instance is inst and "%RETRY%CG_FB" in inner.topic_publish_info
    assert seen[0][:4] == ("FallBack", 0, "T1", "1")
    assert seen[1] == ("FallBack", 1, "T1", "1", r.msg_id)
    # the inner producer does not keep the client running: it shut down with the consumer
    assert not inst.running and "CLIENT_INNER_PRODUCER" not in inst.producers


def test_send_message_v1_header_and_flow_control(cluster):
    """SEND_MESSAGE (code 10, long header names) works too; a tiny pull threshold throttles the
    pull loop (flow control) without losing anything."""
    topic = "FlowControl"
    with Producer("PG_V1", namesrv=cluster.namesrv, use_send_message_v2=False, **FAST) as p:
        q = p.fetch_publish_message_queues(topic)[0]
        for i in range(10):
            if i % 2:
                p.send_batch([Message(topic, f"f{i}-{j}".encode()) for j in range(20)], queue=q)
            else:
                for j in range(20):
                    p.send(Message(topic, f"f{i}-{j}".encode(), tags="v1"), queue=q)
    got = []
    gate = threading.Event()

    def listener(msgs):
        gate.wait(5)
        got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = make_consumer(cluster.namesrv, "CG_FLOW", topic, listener, pull_threshold_for_queue=10, pull_batch_size=8,
                      consume_thread_max=2, consume_thread_min=1)
    with c:
        wait_until(lambda: c.flow_control_times > 0, what="flow control kicks in")
        # while the listener is blocked the buffer stays near the threshold
        pq = next(pq for mq, pq in c.process_queue_table.items() if mq == q)
        assert pq.msg_count <= 10 + 8
        gate.set()
        wait_until(lambda: len(got) >= 200, what="everything after the gate opens")
    assert sorted(got) == sorted(f"f{i}-{j}".encode() for i in range(10) for j in range(20))


def test_orderly_shutdown_releases_locks_at_once(cluster):
    """A clean shutdown unlocks the queues: the next member takes them well within the 3 s lease."""
    topic = "OrderlyHandover"
    with Producer("PG_HO", namesrv=cluster.namesrv, **FAST) as p:
        for i in range(8):
            p.send(Message(topic, f"h{i}".encode()))
    a = make_consumer(cluster.namesrv, "CG_HO", topic, lambda msgs: ConsumeStatus.SUCCESS, orderly=True,
                      lock_interval=0.5).start()
    try:
        wait_until(lambda: len([q for q, pq in a.process_queue_table.items()
                                if pq.locked and q.topic == topic]) == 4, what="a locks the 4 queues")
        locked = [q for q in a.process_queue_table if q.topic == topic]
    finally:
        a.shutdown()
    # unlocked by the shutdown itself, not left to their lease
    assert [cluster.broker.lock_manager.owner("CG_HO", q) for q in locked] == [None] * 4
    b = make_consumer(cluster.namesrv, "CG_HO", topic, lambda msgs: ConsumeStatus.SUCCESS, orderly=True,
                      lock_interval=0.5)
    with b:
        wait_until(lambda: len([q for q, pq in b.process_queue_table.items()
                                if pq.locked and q.topic == topic]) == 4, what="b locks the 4 queues")


def test_allocate_strategy_by_name_and_lite_auto_commit(cluster):
    topic = "ByCircle"
    with Producer("PG_BYC", namesrv=cluster.namesrv, **FAST) as p:
        for i in range(8):
            p.send(Message(topic, f"c{i}".encode()))
    c1 = PullConsumer("CG_BYC", namesrv=cluster.namesrv, allocate_strategy="by_circle", auto_commit=True,
                      auto_commit_interval=0.2, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
    c2 = PullConsumer("CG_BYC", namesrv=cluster.namesrv, allocate_strategy="by_circle",
                      consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CONSUMER)
    c1.subscribe(topic, "*")
    c2.subscribe(topic, "*")
    with c1, c2:
        def mine(c):
            return sorted(q.queue_id for q in c.assignment() if q.topic == topic)
        wait_until(lambda: len(mine(c1)) == 2 and len(mine(c2)) == 2, what="queues split by circle")
        ids = sorted([c1.client_id, c2.client_id])
        first = c1 if c1.client_id == ids[0] else c2
        assert mine(first) == [0, 2]  # by circle: queue i goes to consumer i % 2
        got = []
        deadline = time.time() + 15
        while len(got) < 8 and time.time() < deadline:
            got += c1.poll(0.2) + c2.poll(0.2)
        time.sleep(0.3)
        c1.poll(0.1)  # the auto-commit happens inside poll
        for q in c1.assignment():
            if q.topic == topic:
                assert c1.committed(q) == 2
    assert sorted(m.body for m in got) == sorted(f"c{i}".encode() for i in range(8))


def test_consumer_running_info_answer(cluster):
    import json
    from rmq_core.client.broker_requests import BrokerRequestProcessor
    from rmq_core.remoting.codes import RequestCode
    from rmq_core.remoting.command import RemotingCommand

    with Producer("PG_RI", namesrv=cluster.namesrv, **FAST) as p:
        p.send(Message("RunInfo", b"x"))
    with make_consumer(cluster.namesrv, "CG_RI", "RunInfo", lambda m: ConsumeStatus.CONSUME_SUCCESS) as c:
        wait_until(lambda: c.process_queue_table, what="queues")
        proc = BrokerRequestProcessor(c.instance)
        req = RemotingCommand.create_request(RequestCode.GET_CONSUMER_RUNNING_INFO,
                                             {"consumerGroup": "CG_RI", "clientId": c.client_id})
        resp = c.instance.run(proc.process_request(None, req))
        info = json.loads(resp.body)
        assert resp.code == 0 and info["properties"]["consumeType"] == "CONSUME_PASSIVELY"
        assert {s["topic"] for s in info["subscriptionSet"]} == {"RunInfo", "%RETRY%CG_RI"}
        assert len(info["mqTable"]) >= 4
        unknown = RemotingCommand.create_request(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "nope"})
        assert c.instance.run(proc.process_request(None, unknown)).code != 0


def test_clean_shutdown_commits_what_was_consumed(cluster):
    """After shutdown() nothing consumed is delivered again to the next member of the group."""
    topic = "CleanStop"
    with Producer("PG_CS", namesrv=cluster.namesrv, **FAST) as p:
        for i in range(100):
            p.send(Message(topic, f"c{i}".encode()))
    first, second = [], []
    lock = threading.Lock()

    def one(store):
        def fn(msgs):
            time.sleep(0.002)
            with lock:
                store.extend(m.body for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS
        return fn

    a = make_consumer(cluster.namesrv, "CG_CS", topic, one(first), consume_thread_max=2, consume_thread_min=1,
                      persist_consumer_offset_interval=60.0)
    a.start()
    wait_until(lambda: len(first) >= 30, what="a consumes some")
    a.shutdown()
    with make_consumer(cluster.namesrv, "CG_CS", topic, one(second)):
        wait_until(lambda: len(set(first) | set(second)) == 100, what="b consumes the rest")
        time.sleep(0.3)
    assert set(first) | set(second) == {f"c{i}".encode() for i in range(100)}
    assert not set(first) & set(second), "messages consumed before a clean shutdown came back"


def test_inproc_namesrv_means_inproc_broker_connections(cluster):
    """With namesrv=inproc://..., broker traffic stays in-proc too (no TCP connection to the broker)."""
    with Producer("PG_INPROC", namesrv=cluster.namesrv, **FAST) as p:
        p.send(Message("InprocOnly", b"x"))
        addrs = p.instance.run(_connected(p.instance))
    assert addrs and all(a.startswith("inproc://") for a in addrs), addrs
    with Producer("PG_TCP", namesrv=cluster.tcp_namesrv, **FAST) as p:
        p.send(Message("InprocOnly", b"y"))
        # (the send leaves on a pipelined channel; the command connection comes with the next
        # heartbeat, every second here)
        wait_until(lambda: cluster.broker_addr in p.instance.run(_connected(p.instance)),
                   what="a TCP connection to the broker")


async def _connected(instance):
    return instance.remoting.connected_addresses()


def test_subscribe_and_unsubscribe_while_running(cluster):
    with Producer("PG_SUB", namesrv=cluster.namesrv, **FAST) as p:
        p.send(Message("SubA", b"a1"))
        p.send(Message("SubB", b"b1"))
        got = []
        lock = threading.Lock()

        def listener(msgs):
            with lock:
                got.extend(m.body for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        with make_consumer(cluster.namesrv, "CG_SUB", "SubA", listener) as c:
            wait_until(lambda: b"a1" in got, what="SubA")
            c.subscribe("SubB", "*")
            wait_until(lambda: b"b1" in got, what="SubB after subscribing at run time")
            c.unsubscribe("SubA")
            wait_until(lambda: not [q for q in c.process_queue_table if q.topic == "SubA"],
                       what="SubA queues released")
            p.send(Message("SubA", b"a2"))
            p.send(Message("SubB", b"b2"))
            wait_until(lambda: b"b2" in got, what="b2")
            time.sleep(0.5)
    assert b"a2" not in got
