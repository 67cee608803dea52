"""MessagingService of a `rmq broker` with grpcServerPort, called with a raw grpcio stub: route,
settings, each message type, receive / ack, message-type refusal, bad input, the client tables."""
from __future__ import annotations

import hashlib
import socket
import threading
import time
import zlib

import grpc
import pytest

from rmq_core import Message, Producer
from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2 as spb
from tests.admin.test_admin_cli import admin, ok, rows, wait_for
from tests.proxy.conftest import Stub, make_topic, ms
from tests.proxy.test_h2 import GOAWAY, frames


def test_route_lists_the_topics_queues_with_the_grpc_endpoint_and_never_creates_a_topic(cl, stub):
    make_topic(cl, "PxRoute", queues=3)
    r = stub.route("PxRoute")
    assert r.status.code == pb.OK, r.status
    assert [q.id for q in r.message_queues] == [0, 1, 2]
    q = r.message_queues[0]
    assert q.permission == pb.READ_WRITE and q.broker.name == "broker-a"
    assert [(a.host, a.port) for a in q.broker.endpoints.addresses] == [("127.0.0.1", int(cl.endpoint.split(":")[1]))]
    assert set(q.accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}  # a 4.x topic: every type
    r = stub.route("PxNoSuchTopic")
    assert r.status.code == pb.TOPIC_NOT_FOUND and "PxNoSuchTopic" in r.status.message
    assert admin("topicRoute", "-t", "PxNoSuchTopic", ns=cl.namesrv)[0] != 0  # not created by the query


def _telemetry(stub, settings, *, keep=0.5):
    """The server's answer to `settings` on a Telemetry stream."""
    def commands():
        yield spb.TelemetryCommand(settings=settings)
        time.sleep(keep)

    for command in stub.stub.Telemetry(commands(), metadata=stub.md(), timeout=10):
        return command


def test_settings_are_answered_as_the_proxy_does(cl, stub):
    make_topic(cl, "PxSettings")
    answer = _telemetry(stub, pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name="PxSettings")])))
    assert answer.status.code == pb.OK
    s = answer.settings
    assert s.publishing.max_body_size == 4 * 1024 * 1024 and s.publishing.validate_message_type
    assert s.backoff_policy.max_attempts == 3 and s.backoff_policy.HasField("exponential_backoff")
    ok("updateSubGroup", "-b", cl.broker_addrs[0], "-g", "PxFifoGroup", "-r", "5", "-o", "true", ns=cl.namesrv)
    answer = _telemetry(stub, pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name="PxFifoGroup"), subscriptions=[pb.SubscriptionEntry(
            topic=pb.Resource(name="PxSettings"), expression=pb.FilterExpression(type=pb.TAG, expression="*"))])))
    s = answer.settings
    assert s.subscription.fifo is True and s.backoff_policy.max_attempts == 6
    assert s.subscription.receive_batch_size == 32 and s.subscription.long_polling_timeout.seconds == 20
    assert s.backoff_policy.customized_backoff.next[0].seconds == 1


def test_normal_send_receive_ack_carry_what_the_clients_check(cl, stub):
    make_topic(cl, "PxNormal")
    body = "héllo".encode()
    # the first send checks the topic (the general path), the next ones take the send lane's put:
    # both store the same message; one to any queue (-1) too
    sent = [stub.send("PxNormal", body, tag="TagA", keys=["k1", "k2"], props={"userProp": "ü value", "n": "1"},
                      queue_id=q) for q in (0, 0, -1)]
    for i, r in enumerate(sent):
        assert r.status.code == pb.OK, r.status
        e = r.entries[0]
        assert e.message_id and not e.transaction_id and (e.offset == i or i == 2)
    status, msgs = stub.receive("GPxNormal", "PxNormal")
    while len(msgs) < 3 and status.code == pb.OK:
        status, more = stub.receive("GPxNormal", "PxNormal")
        msgs += more
    assert len(msgs) == 3
    assert sorted(m.system_properties.message_id for m in msgs) == sorted(r.entries[0].message_id for r in sent)
    for m in msgs:
        sp = m.system_properties
        assert m.body == body and dict(m.user_properties) == {"userProp": "ü value", "n": "1"}
        assert sp.tag == "TagA" and list(sp.keys) == ["k1", "k2"]
        assert sp.body_digest.type == pb.MD5 and sp.body_digest.checksum == hashlib.md5(body).hexdigest().upper()
        assert sp.body_encoding == pb.IDENTITY and sp.delivery_attempt == 1 and sp.receipt_handle
        assert sp.message_type == pb.NORMAL and sp.born_host == "127.0.0.1" and sp.store_timestamp.seconds > 0
    a = stub.ack("GPxNormal", "PxNormal", *msgs)
    assert a.status.code == pb.OK and all(e.status.code == pb.OK for e in a.entries)
    status, msgs = stub.receive("GPxNormal", "PxNormal", poll=0.5)
    assert status.code == pb.MESSAGE_NOT_FOUND and msgs == []


def test_a_4x_compressed_message_reaches_a_5x_receive_decompressed(cl, stub):
    make_topic(cl, "PxCross")
    body = b"x" * 20_000  # compressed by the 4.x producer (over 4 KiB)
    with Producer("PxCrossPG", namesrv=cl.namesrv) as p:
        p.send(Message("PxCross", body, tags="T4", keys="k4", properties={"p": "v"}))
    status, msgs = stub.receive("GPxCross", "PxCross")
    assert status.code == pb.OK
    m = msgs[0]
    assert m.body == body and m.system_properties.body_encoding == pb.IDENTITY
    assert dict(m.user_properties) == {"p": "v"} and m.system_properties.tag == "T4"
    assert m.system_properties.body_digest.checksum == hashlib.md5(body).hexdigest().upper()
    stub.ack("GPxCross", "PxCross", m)


def test_a_gzip_body_is_stored_compressed_and_received_plain(cl, stub):
    make_topic(cl, "PxGzip")
    body = b"gz" * 5000
    sp = pb.SystemProperties(message_id="GZ1", message_type=pb.NORMAL, body_encoding=pb.GZIP)
    r = stub.SendMessage(spb.SendMessageRequest(messages=[pb.Message(
        topic=pb.Resource(name="PxGzip"), system_properties=sp, body=zlib.compress(body))]))
    assert r.status.code == pb.OK, r.status
    _, msgs = stub.receive("GPxGzip", "PxGzip")
    assert msgs[0].body == body


def test_fifo_messages_of_a_group_share_a_queue_and_keep_their_group(cl, stub):
    make_topic(cl, "PxFifo", queues=4, message_type="FIFO")
    assert list(stub.route("PxFifo").message_queues[0].accept_message_types) == [pb.FIFO]
    for i in range(3):
        r = stub.send("PxFifo", f"f{i}".encode(), group="order-1", kind=pb.FIFO, queue_id=-1)
        assert r.status.code == pb.OK, r.status
    _, msgs = stub.receive("GPxFifo", "PxFifo")
    assert [m.body for m in msgs] == [b"f0", b"f1", b"f2"]
    assert {m.system_properties.message_group for m in msgs} == {"order-1"}
    assert len({m.system_properties.queue_id for m in msgs}) == 1
    assert {m.system_properties.message_type for m in msgs} == {pb.FIFO}


def test_a_restricted_topic_refuses_other_types_over_grpc_and_remoting(cl, stub):
    make_topic(cl, "PxOnlyFifo", message_type="FIFO")
    r = stub.send("PxOnlyFifo", b"n", kind=pb.NORMAL)
    assert r.status.code == pb.BAD_REQUEST
    assert "NORMAL" in r.status.message and "FIFO" in r.status.message and "PxOnlyFifo" in r.status.message
    with Producer("PxOnlyFifoPG", namesrv=cl.namesrv, retry_times_when_send_failed=0) as p:
        with pytest.raises(Exception, match="message type"):
            p.send(Message("PxOnlyFifo", b"4x"))
    ok("updateTopic", "-b", cl.broker_addrs[0], "-t", "PxOnlyFifo", "-r", "2", "-w", "2", "-a", "+message.type=MIXED",
       ns=cl.namesrv)
    assert stub.send("PxOnlyFifo", b"n", kind=pb.NORMAL).status.code == pb.OK
    code, out, err = admin("updateTopic", "-b", cl.broker_addrs[0], "-t", "PxOnlyFifo", "-a", "+message.type=BOGUS",
                           ns=cl.namesrv)
    assert code != 0 and "BOGUS" in err


@pytest.mark.slow  # (the 5.x client's delay case in tests/rmq5 runs by default)
def test_delay_message_arrives_at_its_delivery_timestamp(cl, stub):
    make_topic(cl, "PxDelay", message_type="DELAY")
    due = int(time.time() * 1000) + 2500
    assert stub.send("PxDelay", b"later", deliver_ms=due, kind=pb.DELAY).status.code == pb.OK
    status, msgs = stub.receive("GPxDelay", "PxDelay", poll=0.5)
    assert status.code == pb.MESSAGE_NOT_FOUND
    deadline = time.time() + 20
    while not msgs and time.time() < deadline:
        _, msgs = stub.receive("GPxDelay", "PxDelay", poll=2)
    assert [m.body for m in msgs] == [b"later"] and time.time() * 1000 >= due
    assert msgs[0].system_properties.message_type == pb.DELAY


def test_transactions_commit_rollback_and_check_back_through_telemetry(cl, stub):
    make_topic(cl, "PxTx", message_type="TRANSACTION")
    commit = stub.send("PxTx", b"commit", kind=pb.TRANSACTION)
    rollback = stub.send("PxTx", b"rollback", kind=pb.TRANSACTION)
    assert commit.entries[0].transaction_id and rollback.entries[0].transaction_id
    for r, resolution in ((commit, pb.COMMIT), (rollback, pb.ROLLBACK)):
        e = stub.EndTransaction(spb.EndTransactionRequest(
            topic=pb.Resource(name="PxTx"), message_id=r.entries[0].message_id,
            transaction_id=r.entries[0].transaction_id, resolution=resolution, source=pb.SOURCE_CLIENT))
        assert e.status.code == pb.OK, e.status
    bad = stub.EndTransaction(spb.EndTransactionRequest(topic=pb.Resource(name="PxTx"), transaction_id="nope",
                                                        resolution=pb.COMMIT))
    assert bad.status.code == pb.INVALID_TRANSACTION_ID and "nope" in bad.status.message
    # an unknown one: the broker checks back through the producer's Telemetry stream
    checks, stop = [], threading.Event()

    def commands():
        yield spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
            topics=[pb.Resource(name="PxTx")])))
        stop.wait(30)

    stream = stub.stub.Telemetry(commands(), metadata=stub.md(), timeout=40)

    def read():
        for command in stream:
            if command.WhichOneof("command") == "recover_orphaned_transaction_command":
                checks.append(command.recover_orphaned_transaction_command)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    unknown = stub.send("PxTx", b"unknown", kind=pb.TRANSACTION)
    wait_for(lambda: checks, timeout=30, what="a RecoverOrphanedTransactionCommand")
    check = checks[0]
    # (the id of the half as the check pass re-appended it: EndTransaction resolves the original by it)
    assert check.message.system_properties.message_id == unknown.entries[0].message_id
    assert check.message.body == b"unknown" and check.transaction_id
    e = stub.EndTransaction(spb.EndTransactionRequest(
        topic=pb.Resource(name="PxTx"), message_id=check.message.system_properties.message_id,
        transaction_id=check.transaction_id, resolution=pb.COMMIT, source=pb.SOURCE_SERVER_CHECK))
    assert e.status.code == pb.OK
    stop.set()
    stream.cancel()
    got = []
    deadline = time.time() + 10
    while len(got) < 2 and time.time() < deadline:
        got += [m.body for m in stub.receive("GPxTx", "PxTx", poll=1)[1]]
    assert sorted(got) == [b"commit", b"unknown"]


def test_bad_input_gets_a_clear_status_and_the_broker_keeps_serving(cl, stub):
    make_topic(cl, "PxBad")
    r = stub.send("PxNoTopic", b"x")
    assert r.status.code == pb.TOPIC_NOT_FOUND and "PxNoTopic" in r.status.message
    r = stub.send("PxBad", b"x" * (4 * 1024 * 1024 + 1))
    assert r.status.code == pb.MESSAGE_BODY_TOO_LARGE and "4194305" in r.status.message
    r = stub.send("PxBad", b"x", props={"TAGS": "sneaky"})
    assert r.status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY and "TAGS" in r.status.message
    for props in ({"bad\x02name": "v"}, {"name": "bad\x02value"}):  # (would not read back)
        r = stub.send("PxBad", b"x", props=props)
        assert r.status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY and repr(next(iter(props))) in r.status.message, r.status
    r = stub.send("PxBad", b"x", kind=pb.FIFO)
    assert r.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    status, _ = stub.receive("GPxBad", "PxBad", invisible=1)
    assert status.code == pb.ILLEGAL_INVISIBLE_TIME and "1000" in status.message
    a = stub.AckMessage(spb.AckMessageRequest(group=pb.Resource(name="GPxBad"), topic=pb.Resource(name="PxBad"),
                                              entries=[spb.AckMessageEntry(message_id="m", receipt_handle="garbage")]))
    assert a.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE and "garbage" in a.entries[0].status.message
    c = stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name="GPxBad"), topic=pb.Resource(name="PxBad"), receipt_handle="garbage",
        invisible_duration=ms(-5)))
    assert c.status.code == pb.ILLEGAL_INVISIBLE_TIME
    with pytest.raises(grpc.RpcError) as e:
        list(stub.stub.PullMessage(spb.PullMessageRequest(), metadata=stub.md(), timeout=5))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "PullMessage" in e.value.details()
    assert Stub(cl.endpoint, client_id="").route("PxBad").status.code == pb.OK  # (route needs no client id)
    assert stub.send("PxBad", b"still serving").status.code == pb.OK


def test_change_invisible_duration_and_forward_to_dead_letter(cl, stub):
    make_topic(cl, "PxChange")
    stub.send("PxChange", b"c")
    _, msgs = stub.receive("GPxChange", "PxChange", invisible=10)
    r = stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name="GPxChange"), topic=pb.Resource(name="PxChange"),
        receipt_handle=msgs[0].system_properties.receipt_handle, invisible_duration=ms(30)))
    assert r.status.code == pb.OK and r.receipt_handle != msgs[0].system_properties.receipt_handle
    f = stub.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name="GPxChange"), topic=pb.Resource(name="PxChange"), receipt_handle=r.receipt_handle,
        message_id=msgs[0].system_properties.message_id, delivery_attempt=1, max_delivery_attempts=1))
    assert f.status.code == pb.OK, f.status
    wait_for(lambda: admin("topicRoute", "-t", "%DLQ%GPxChange", ns=cl.namesrv)[0] == 0, what="the DLQ's route")


def test_5x_clients_are_listed_with_language_and_version_until_they_terminate(cl, stub):
    make_topic(cl, "PxConn")
    ok("updateSubGroup", "-b", cl.broker_addrs[0], "-g", "GPxConn", ns=cl.namesrv)
    _telemetry(stub, pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name="GPxConn"), subscriptions=[pb.SubscriptionEntry(
            topic=pb.Resource(name="PxConn"), expression=pb.FilterExpression(type=pb.TAG, expression="*"))])))
    producer = Stub(cl.endpoint)
    _telemetry(producer, pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name="PxConn")])))
    conns = rows("consumerConnection", "-g", "GPxConn", ns=cl.namesrv)
    assert [(c["client_id"], c["language"], c["version"]) for c in conns] == [(stub.client_id, "PYTHON", "V5_1_2")]
    conns = rows("producerConnection", "-g", "PxConn", "-t", "PxConn", ns=cl.namesrv)
    assert [(c["client_id"], c["language"], c["version"]) for c in conns] == [(producer.client_id, "PYTHON", "V5_1_2")]
    assert stub.Heartbeat(spb.HeartbeatRequest(group=pb.Resource(name="GPxConn"),
                                               client_type=pb.SIMPLE_CONSUMER)).status.code == pb.OK
    for s in (stub, producer):
        assert s.NotifyClientTermination(spb.NotifyClientTerminationRequest()).status.code == pb.OK
    assert admin("consumerConnection", "-g", "GPxConn", ns=cl.namesrv)[0] != 0 or \
        rows("consumerConnection", "-g", "GPxConn", ns=cl.namesrv) == []
    producer.close()


def test_standalone_serves_grpc_on_grpc_listen_and_a_taken_port_is_named(tmp_path):
    import socket

    from tests.servers import RmqProcess, free_port

    port = free_port()
    p = RmqProcess(["standalone", "--store", str(tmp_path / "store"), "--namesrv-listen", f"127.0.0.1:{free_port()}",
                    "--broker-listen", f"127.0.0.1:{free_port()}", "--grpc-listen", f"127.0.0.1:{port}"],
                   ("boot success. serializeType=JSON and", "serves RocketMQ 5 clients (gRPC)"))
    try:
        lines = p.wait_boot()
        assert f"127.0.0.1:{port}" in lines[1]
        s = Stub(f"127.0.0.1:{port}")
        assert s.route("PxStandaloneNoTopic").status.code == pb.TOPIC_NOT_FOUND
        s.close()
    finally:
        p.terminate()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = taken.getsockname()[1]
    try:
        p = RmqProcess(["standalone", "--store", str(tmp_path / "store2"), "--namesrv-listen",
                        f"127.0.0.1:{free_port()}", "--broker-listen", f"127.0.0.1:{free_port()}",
                        "--grpc-listen", f"127.0.0.1:{busy}"], ("boot success. serializeType=JSON and",))
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{busy}"):
            p.wait_boot()
    finally:
        taken.close()


def test_route_and_assignment_span_every_broker_holding_the_topic(tmp_path):
    from tests.proxy.conftest import BROKER_PROPS, grpc_cluster
    from tests.servers import free_port

    two = grpc_cluster(tmp_path)
    try:
        port_b = free_port()
        two.add_broker("broker-b", {**BROKER_PROPS, "grpcServerPort": port_b})
        for i in (0, 1):
            make_topic(two, "PxWide", queues=2, broker=i)
        wait_for(lambda: len(rows("topicRoute", "-t", "PxWide", ns=two.namesrv)) == 2, what="route over both")
        s = Stub(two.endpoint)
        r = s.route("PxWide")
        assert r.status.code == pb.OK
        got = sorted((q.broker.name, q.id, q.broker.endpoints.addresses[0].port) for q in r.message_queues)
        port_a = int(two.endpoint.split(":")[1])
        assert got == [("broker-a", 0, port_a), ("broker-a", 1, port_a), ("broker-b", 0, port_b), ("broker-b", 1, port_b)]
        a = s.QueryAssignment(spb.QueryAssignmentRequest(topic=pb.Resource(name="PxWide"),
                                                         group=pb.Resource(name="GPxWide")))
        assert a.status.code == pb.OK
        assert sorted((x.message_queue.broker.name, x.message_queue.id) for x in a.assignments) == \
            [("broker-a", -1), ("broker-b", -1)]
        # a message sent to broker-b's endpoint is stored there and received from there
        b = Stub(f"127.0.0.1:{port_b}")
        assert b.send("PxWide", b"to-b").status.code == pb.OK
        assert [m.body for m in b.receive("GPxWide", "PxWide")[1]] == [b"to-b"]
        s.close()
        b.close()
    finally:
        two.stop()


def test_an_empty_long_poll_ends_before_the_clients_deadline_with_message_not_found(cl, stub):
    make_topic(cl, "PxPoll")
    req = spb.ReceiveMessageRequest(group=pb.Resource(name="GPxPoll"),
                                    message_queue=pb.MessageQueue(topic=pb.Resource(name="PxPoll"), id=-1),
                                    batch_size=4, invisible_duration=ms(15))  # no long_polling_timeout: 20 s
    answers = list(stub.stub.ReceiveMessage(req, metadata=stub.md(), timeout=2.5))  # bounded by the deadline
    assert answers[0].status.code == pb.MESSAGE_NOT_FOUND
    assert answers[-1].WhichOneof("content") == "delivery_timestamp"


def test_consumer_settings_register_as_a_heartbeat_does_and_a_bad_sql92_is_refused(tmp_path):
    """A 5.x consumer's settings go through the 4.x heartbeat's registration: its group gets its
    %RETRY% topic (so `rmq admin` lists it), and a malformed SQL92 subscription is answered with
    ILLEGAL_FILTER_EXPRESSION naming the expression's fault, not registered."""
    from tests.proxy.conftest import grpc_cluster

    c = grpc_cluster(tmp_path, enablePropertyFilter="true")
    stub = Stub(c.endpoint)
    try:
        make_topic(c, "PxSql")

        def settings(expression):
            return pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
                group=pb.Resource(name="GPxSql"), subscriptions=[pb.SubscriptionEntry(
                    topic=pb.Resource(name="PxSql"), expression=pb.FilterExpression(type=pb.SQL, expression=expression))]))

        bad = _telemetry(stub, settings("a > AND"))
        assert bad.status.code == pb.ILLEGAL_FILTER_EXPRESSION and "a > AND" in bad.status.message, bad.status
        assert admin("consumerConnection", "-g", "GPxSql", ns=c.namesrv)[0] != 0  # not registered
        good = _telemetry(stub, settings("a > 5"))
        assert good.status.code == pb.OK, good.status
        assert [r["client_id"] for r in rows("consumerConnection", "-g", "GPxSql", ns=c.namesrv)] == [stub.client_id]
        wait_for(lambda: admin("topicRoute", "-t", "%RETRY%GPxSql", ns=c.namesrv)[0] == 0, what="the group's retry topic")
    finally:
        stub.close()
        c.stop()


def test_large_messages_both_ways_and_a_malformed_connection_leaves_others_working(cl, stub):
    """rmq's own HTTP/2 server (rmq_core/_native/h2) with grpcio's C-core client: messages past the
    initial windows both ways; a peer not speaking HTTP/2 gets a GOAWAY naming why."""
    make_topic(cl, "PxH2Large", queues=1)
    body = bytes(range(256)) * 6144  # 1.5 MiB: past every initial window, WINDOW_UPDATEs both ways
    assert stub.send("PxH2Large", body, keys=["big"]).status.code == pb.OK
    status, messages = stub.receive("GPxH2Large", "PxH2Large", batch=1)
    assert status.code == pb.OK and messages[0].body == body
    host, port = cl.endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n")
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break  # (the server closed the connection)
            got += chunk
    goaway = [f for f in frames(got) if f[0] == GOAWAY]
    assert goaway and b"bad connection preface" in goaway[0][3][8:]
    assert stub.ack("GPxH2Large", "PxH2Large", messages[0]).status.code == pb.OK
    assert stub.send("PxH2Large", b"after").status.code == pb.OK


def test_a_send_of_several_messages_answers_each_and_a_malformed_request_is_refused(cl, stub):
    make_topic(cl, "PxMany")
    ok = pb.Message(topic=pb.Resource(name="PxMany"), body=b"one", system_properties=pb.SystemProperties(
        message_id="M-OK", message_type=pb.NORMAL, tag="T"))
    bad = pb.Message(topic=pb.Resource(name="PxMany"), body=b"two", system_properties=pb.SystemProperties(
        message_id="M-BAD", message_type=pb.NORMAL, tag="a|b"))
    r = stub.SendMessage(spb.SendMessageRequest(messages=[ok, bad]))
    assert r.status.code == pb.MULTIPLE_RESULTS, r.status
    assert [(e.status.code, e.message_id) for e in r.entries] == [(pb.OK, "M-OK"), (pb.ILLEGAL_MESSAGE_TAG, "M-BAD")]
    assert "'a|b'" in r.entries[1].status.message
    r = stub.SendMessage(spb.SendMessageRequest(messages=[ok, ok]))
    assert r.status.code == pb.OK and [e.offset for e in r.entries][1] == r.entries[0].offset + 1
    # bytes that are no SendMessageRequest (a length past the end): the call's own status names it
    raw = stub.channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\x0a\x10\x22", metadata=stub.md(), timeout=5)
    assert e.value.code() == grpc.StatusCode.INTERNAL and "runs past the end" in e.value.details()
    assert stub.send("PxMany", b"still serving").status.code == pb.OK
