"""ACL on: the pop codes are checked as a pull is - SUB on the topic and on the group (an ack of a
retry message names the group's pop retry topic: checked as its topic)."""
from __future__ import annotations

import json

from rmq_core.acl import signer_from
from rmq_core.remoting.client import RemotingClient
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.broker.pop.popraw import ack, pop
from tests.rawclient import RawClient
from tests.servers import acl_broker_props

ACL = """\
accounts:
  - accessKey: pop-app
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [TopicPop=PUB|SUB, TopicPubOnly=PUB]
    groupPerms: [GroupPop=SUB]
  - accessKey: pop-admin
    secretKey: admin-secret
    admin: true
"""


def _client(ak, sk):
    raw = RawClient(ak)
    signer = signer_from(ak, sk)

    async def make():
        return RemotingClient(name=f"raw-{ak}", request_steps=(signer,))

    old = raw.client
    raw.client = raw.run(make())
    raw.run(old.close())
    return raw


def test_pop_needs_sub_on_topic_and_group(make_cluster, tmp_path):
    c = make_cluster(acl_broker_props(tmp_path, ACL))
    addr = c.broker_addr
    admin, app, wrong = _client("pop-admin", "admin-secret"), _client("pop-app", "app-secret"), _client("pop-app", "bad-secret")
    try:
        from tests.broker.pop.popraw import create_topic
        create_topic(admin, addr, "TopicPop", queues=1)
        create_topic(admin, addr, "TopicPubOnly", queues=1)
        assert app.send(addr, "TopicPop", b"x").code == ResponseCode.SUCCESS
        r, ps = pop(app, addr, "GroupPop", "TopicPop")
        assert r.code == ResponseCode.SUCCESS and [p.body for p in ps] == [b"x"]
        assert ack(app, addr, "GroupPop", ps[0]).code == ResponseCode.SUCCESS
        r, _ = pop(app, addr, "GroupPop", "TopicPubOnly")
        assert r.code != ResponseCode.SUCCESS and "needs SUB on topic=TopicPubOnly" in r.remark
        r, _ = pop(app, addr, "GroupOther", "TopicPop")
        assert r.code != ResponseCode.SUCCESS and "group=GroupOther" in r.remark
        r, _ = pop(wrong, addr, "GroupPop", "TopicPop")
        assert r.code != ResponseCode.SUCCESS and "signature" in r.remark.lower()
        # a retry message's ack names %RETRY%GroupPop_TopicPop: allowed as TopicPop
        assert app.send(addr, "TopicPop", b"y").code == ResponseCode.SUCCESS
        _, first = pop(app, addr, "GroupPop", "TopicPop", invisible_ms=1000)
        again = []
        while not again:
            _, again = pop(app, addr, "GroupPop", "TopicPop", poll_ms=3000)
        assert again[0].real_topic == "%RETRY%GroupPop_TopicPop"
        assert ack(app, addr, "GroupPop", again[0]).code == ResponseCode.SUCCESS
        # BATCH_ACK_MESSAGE: each BatchAck of the body is checked
        body = {"brokerName": "broker-a", "acks": [{"c": "GroupOther", "t": "TopicPop", "r": "0", "so": 0, "q": 0,
                                                      "rq": 0, "pt": 1, "it": 1000, "b": "AQ=="}]}
        r = app.invoke(addr, RequestCode.BATCH_ACK_MESSAGE, {}, json.dumps(body).encode())
        assert r.code != ResponseCode.SUCCESS and "group=GroupOther" in r.remark
    finally:
        for r in (admin, app, wrong):
            r.close()
