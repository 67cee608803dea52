"""ACL over gRPC: a 5.x client's MQv2-HMAC-SHA1 authorization checked against the same
plain_acl.yml accounts and permissions as a 4.x request's."""
from __future__ import annotations

import pytest

from rmq_core import Message, Producer
from rmq_core.admin import AdminClient
from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
from tests.proxy.conftest import Stub, grpc_cluster
from tests.servers import acl_broker_props

AK, SK = "app5key", "app5-secret"
PLAIN_ACL = f"""\
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - PxAclOk=PUB|SUB
      - PxAclSubOnly=SUB
    groupPerms:
      - GPxAcl=SUB
  - accessKey: admin5key
    secretKey: admin5-secret
    admin: true
"""


@pytest.fixture(scope="module")
def acl_cl(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy-acl")
    c = grpc_cluster(tmp, **acl_broker_props(tmp, PLAIN_ACL))
    try:
        with AdminClient(c.namesrv, access_key="admin5key", secret_key="admin5-secret") as a:
            for t in ("PxAclOk", "PxAclSubOnly"):
                a.create_or_update_topic(c.broker_addrs[0], t, read_queue_nums=2, write_queue_nums=2)
        yield c
    finally:
        c.stop()


def test_the_right_key_sends_and_receives_across_protocols(acl_cl):
    s = Stub(acl_cl.endpoint, access_key=AK, secret_key=SK)
    assert s.route("PxAclOk").status.code == pb.OK
    assert s.send("PxAclOk", b"five").status.code == pb.OK
    with Producer("PG_acl", namesrv=acl_cl.namesrv, access_key=AK, secret_key=SK) as p:
        p.send(Message("PxAclOk", b"four"))
    status, msgs = s.receive("GPxAcl", "PxAclOk")
    assert status.code == pb.OK and sorted(m.body for m in msgs) == [b"five", b"four"]
    assert s.ack("GPxAcl", "PxAclOk", *msgs).status.code == pb.OK


def test_a_wrong_secret_an_unknown_key_and_no_credentials_are_unauthorized(acl_cl):
    r = Stub(acl_cl.endpoint, access_key=AK, secret_key="wrong").send("PxAclOk", b"x")
    assert r.status.code == pb.UNAUTHORIZED and f"accessKey={AK}" in r.status.message
    assert "Signature" in r.status.message
    r = Stub(acl_cl.endpoint, access_key="nobody1", secret_key="xxxxxxx").route("PxAclOk")
    assert r.status.code == pb.UNAUTHORIZED and "nobody1" in r.status.message
    status, _ = Stub(acl_cl.endpoint).receive("GPxAcl", "PxAclOk")
    assert status.code == pb.UNAUTHORIZED and "No accessKey" in status.message


def test_a_missing_permission_is_forbidden_naming_the_resource(acl_cl):
    s = Stub(acl_cl.endpoint, access_key=AK, secret_key=SK)
    r = s.send("PxAclSubOnly", b"x")
    assert r.status.code == pb.FORBIDDEN and "PxAclSubOnly" in r.status.message and AK in r.status.message
    status, _ = s.receive("GPxOther", "PxAclOk")
    assert status.code == pb.FORBIDDEN and "GPxOther" in status.message
