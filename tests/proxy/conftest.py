"""The gRPC front end (rmq_core/proxy) against real `rmq namesrv` + `rmq broker` processes serving
grpcServerPort, called through a raw grpcio stub built from the checked-in generated modules."""
from __future__ import annotations

import hashlib
import hmac
import time
import uuid

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2 as spb
from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2_grpc as spb_grpc
from tests.admin.test_admin_cli import admin, ok, wait_for
from tests.servers import NamesrvAndBroker, free_port

# small stores; registrations and transaction checks every second
BROKER_PROPS = {"mappedFileSizeCommitLog": 16 * 1024 * 1024, "registerNameServerPeriod": 1000,
                "transactionTimeOut": 1000, "transactionCheckInterval": 1000, "errorReplyDelayMs": 50}


def grpc_cluster(tmp_path, **props) -> NamesrvAndBroker:
    """`rmq namesrv` + `rmq broker` (broker-a) serving gRPC; `.endpoint`: its gRPC address."""
    port = free_port()
    cl = NamesrvAndBroker(tmp_path, broker_props={**BROKER_PROPS, "grpcServerPort": port, **props})
    cl.endpoint = f"127.0.0.1:{port}"
    return cl


def make_topic(cl, topic: str, queues: int = 2, message_type: str | None = None, broker: int = 0) -> None:
    extra = ["-a", f"+message.type={message_type}"] if message_type else []
    ok("updateTopic", "-b", cl.broker_addrs[broker], "-t", topic, "-r", str(queues), "-w", str(queues), *extra,
       ns=cl.namesrv)
    wait_for(lambda: admin("topicRoute", "-t", topic, ns=cl.namesrv)[0] == 0, what=f"route of {topic}")


def ms(seconds: float) -> Duration:
    return Duration(seconds=int(seconds), nanos=int((seconds % 1) * 1e9))


class Stub:
    """A raw MessagingService stub with a 5.x client's metadata (and, given an account, its
    MQv2-HMAC-SHA1 authorization)."""

    def __init__(self, endpoint: str, client_id: str | None = None, access_key=None, secret_key=None):
        self.channel = grpc.insecure_channel(endpoint)
        self.stub = spb_grpc.MessagingServiceStub(self.channel)
        self.client_id = client_id or f"test-{uuid.uuid4().hex[:12]}"
        self.access_key, self.secret_key = access_key, secret_key

    def md(self):
        now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        md = [("x-mq-client-id", self.client_id), ("x-mq-language", "PYTHON"), ("x-mq-client-version", "5.1.2"),
              ("x-mq-protocol", "GRPC_V2"), ("x-mq-date-time", now)]
        if self.access_key:
            sig = hmac.new(self.secret_key.encode(), now.encode(), hashlib.sha1).hexdigest()
            md.append(("authorization", f"MQv2-HMAC-SHA1 Credential={self.access_key}, "
                                        f"SignedHeaders=x-mq-date-time, Signature={sig}"))
        return md

    def __getattr__(self, name):
        method = getattr(self.stub, name)
        return lambda request, **kw: method(request, metadata=self.md(), timeout=kw.pop("timeout", 10), **kw)

    def route(self, topic: str):
        return self.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)))

    def send(self, topic: str, body: bytes = b"body", *, tag=None, keys=(), props=None, group=None,
             deliver_ms=None, kind=pb.NORMAL, queue_id=0):
        sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper(), keys=list(keys), message_type=kind,
                                 body_encoding=pb.IDENTITY, queue_id=queue_id)
        if tag is not None:
            sp.tag = tag
        if group is not None:
            sp.message_group = group
        if deliver_ms is not None:
            sp.delivery_timestamp.CopyFrom(Timestamp(seconds=deliver_ms // 1000, nanos=deliver_ms % 1000 * 1_000_000))
        m = pb.Message(topic=pb.Resource(name=topic), user_properties=props or {}, system_properties=sp, body=body)
        return self.SendMessage(spb.SendMessageRequest(messages=[m]))

    def receive(self, group: str, topic: str, *, batch=32, invisible=15.0, poll=1.0, timeout=None):
        """(status, [messages]) of one ReceiveMessage."""
        req = spb.ReceiveMessageRequest(group=pb.Resource(name=group),
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
                                        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                                        batch_size=batch, invisible_duration=ms(invisible),
                                        long_polling_timeout=ms(poll))
        status, messages = None, []
        for r in self.stub.ReceiveMessage(req, metadata=self.md(), timeout=timeout or poll + 5):
            which = r.WhichOneof("content")
            if which == "status":
                status = r.status
            elif which == "message":
                messages.append(r.message)
        return status, messages

    def ack(self, group: str, topic: str, *messages):
        return self.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic),
            entries=[spb.AckMessageEntry(message_id=m.system_properties.message_id,
                                         receipt_handle=m.system_properties.receipt_handle) for m in messages]))

    def close(self):
        self.channel.close()


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    c = grpc_cluster(tmp_path_factory.mktemp("proxy"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def stub(cl):
    s = Stub(cl.endpoint)
    try:
        yield s
    finally:
        s.close()
