"""Refusals the 5.x client reports.  ACL on (aclEnable, plain_acl.yml): Apache's 5.x client signs
its gRPC requests (`authorization: MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
Signature=<hex>`); the broker checks them against the same accounts and permissions as 4.x
requests.  And the proxy's default bounds of an invisible duration (minInvisibleTimeMillsForRecv)."""
from __future__ import annotations

import pytest

from rmq_core.admin import AdminClient
from tests.admin.test_admin_cli import admin, wait_for
from tests.rmq5.conftest import grpc_cluster
from tests.servers import acl_broker_props

AK, SK = "rmq5-app", "rmq5-secret"
ADMIN_AK, ADMIN_SK = "rmq5-admin", "rmq5-admin-secret"
TOPIC, GROUP = "Rmq5Acl", "GID_RMQ5_ACL"
PLAIN_ACL = f"""\
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - {TOPIC}=PUB|SUB
    groupPerms:
      - {GROUP}=SUB
  - accessKey: {ADMIN_AK}
    secretKey: {ADMIN_SK}
    admin: true
"""


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rmq5acl")
    c = grpc_cluster(tmp, **acl_broker_props(tmp, PLAIN_ACL), minInvisibleTimeMillsForRecv=10_000)  # the proxy's default
    try:
        with AdminClient(c.namesrv, access_key=ADMIN_AK, secret_key=ADMIN_SK) as a:
            a.create_or_update_topic(c.broker_addrs[0], TOPIC, read_queue_nums=2, write_queue_nums=2)
        wait_for(lambda: admin("topicRoute", "-t", TOPIC, ns=c.namesrv)[0] == 0, what=f"route of {TOPIC}")
        yield c
    finally:
        c.stop()


def test_right_key_sends_and_receives(cl, rmq5_client):
    c = rmq5_client(cl.endpoint, access_key=AK, secret_key=SK)
    c.call("simple_consumer", group=GROUP, subscriptions={TOPIC: "*"}, **{"await": 2})
    assert c.call("receive", max=1, invisible=10)["messages"] == []
    p = rmq5_client(cl.endpoint, access_key=AK, secret_key=SK)
    p.call("producer", topics=[TOPIC])
    receipts = p.call("send", messages=[{"topic": TOPIC, "body": f"signed-{i}"} for i in range(3)])["receipts"]
    assert all("message_id" in r for r in receipts), receipts
    got = c.call("drain", count=3, seconds=30, invisible=10)["messages"]
    assert sorted(m["body"] for m in got) == ["signed-0", "signed-1", "signed-2"]


def stored(cl) -> int:
    with AdminClient(cl.namesrv, access_key=ADMIN_AK, secret_key=ADMIN_SK) as a:
        return sum(q.max_offset for q in a.topic_stats(TOPIC))


def test_wrong_secret_is_refused_with_a_clear_error(cl, rmq5_client):
    before = stored(cl)
    p = rmq5_client(cl.endpoint, access_key=AK, secret_key="not-the-secret")
    p.call("producer", topics=[TOPIC])
    [r] = p.call("send", messages=[{"topic": TOPIC, "body": "forged"}])["receipts"]
    # The client's send fails on the refused QueryRoute; it names the server's answer only in its
    # log (~/logs/rocketmq_python): code 40100 (UNAUTHORIZED) and the broker's text.
    assert r["error"] == f"Exception: failed to fetch topic:{TOPIC} route.", r
    refused = [line for line in p.log().splitlines() if "40100" in line]
    assert refused and f"Check signature failed for accessKey={AK}" in refused[0], p.log()[-2000:]
    assert stored(cl) == before, "a refused client's message was stored"


def test_unknown_access_key_is_refused(cl, rmq5_client):
    c = rmq5_client(cl.endpoint, access_key="nobody", secret_key="x")
    c.call("simple_consumer", group=GROUP, subscriptions={TOPIC: "*"}, **{"await": 2})
    answer = c.call("receive", max=1, invisible=10, check=False)
    assert not answer["ok"] and f"failed to fetch topic:{TOPIC} route." in answer["error"]
    assert any("40100" in line for line in c.log().splitlines()), c.log()[-2000:]


def test_invisible_duration_below_the_minimum_is_refused(cl, rmq5_client):
    c = rmq5_client(cl.endpoint, access_key=AK, secret_key=SK)
    c.call("simple_consumer", group=GROUP, subscriptions={TOPIC: "*"}, **{"await": 2})
    answer = c.call("receive", max=1, invisible=5, check=False)
    assert answer["error"] == "BadRequestException: 40011, invisible duration 5000 ms is out of [10000, 43200000] ms"
