"""A signed plain send takes the broker's native send lane with ACL on: the access validator runs
as the lane's request step (checking a signed send from the values the lane parsed), answers come
from the lane, and a refusal is answered in the lane's place with its remark, nothing stored."""
import contextlib

from rmq_core.acl import SigningKey
from rmq_core.embedded import Cluster
from rmq_core.remoting.codes import ResponseCode
from rmq_core.remoting.command import RemotingCommand
from tests.broker.conftest import SMALL
from tests.broker.test_send_lane import V2, RawSocket, frame, lane_of, v2_fields

KEY = SigningKey("12345678")


def signed(topic, body, opaque, secret=KEY, **extra):
    ext = {**v2_fields(topic), "AccessKey": "RocketMQ", **extra}
    ext["Signature"] = secret.sign(ext, body)
    return frame(V2, ext, body, opaque=opaque)


@contextlib.contextmanager
def acl_lane(tmp_path):
    """A broker with ACL on (account RocketMQ: PUB on TopicLane, TopicDenied denied) and a raw
    connection whose two first signed sends to TopicLane passed: (cluster, socket, its lane)."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: RocketMQ\n    secretKey: '12345678'\n"
                   "    defaultTopicPerm: DENY\n    topicPerms: [TopicLane=PUB, TopicDenied=DENY]\n")
    c = Cluster(str(tmp_path / "store"), SMALL, acl_enable=True, plain_acl_file=str(acl))
    c.start()
    s = RawSocket(c.broker_addr)
    try:
        s.send(signed("TopicLane", b"first", 1))  # (auto-creates the topic: the general path)
        assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SUCCESS
        s.send(signed("TopicLane", b"second", 2))
        assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SUCCESS
        yield c, s, lane_of(c, s)
    finally:
        s.close()
        c.stop()


def test_signed_sends_take_the_lane_and_refusals_are_answered(tmp_path):
    with acl_lane(tmp_path) as (c, s, lane):
        before = lane.handled
        s.send(b"".join(signed("TopicLane", f"m{i}".encode(), 10 + i, OnsChannel="") for i in range(20)))
        answers = s.answers(20)
        assert all(RemotingCommand.decode(a).code == ResponseCode.SUCCESS for a in answers.values())
        assert lane.handled - before == 20  # all answered by the lane

        refusals = [
            (frame(V2, v2_fields("TopicLane"), b"unsigned", opaque=40), "No accessKey is configured"),
            (signed("TopicLane", b"forged", 41, secret=SigningKey("not-the-secret")),
             "Check signature failed for accessKey=RocketMQ"),
            (signed("TopicDenied", b"denied", 42), "No default permission for topic=TopicDenied"),
        ]
        s.send(b"".join(f for f, _ in refusals))
        answers = {k: RemotingCommand.decode(v) for k, v in s.answers(3).items()}
        for opaque, (_, remark) in zip((40, 41, 42), refusals):
            assert answers[opaque].code == ResponseCode.SYSTEM_ERROR and remark in answers[opaque].remark
        s.send(signed("TopicLane", b"after", 50))  # the connection serves on
        assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SUCCESS
        store = c.broker.store
        assert sum(store.get_max_offset_in_queue("TopicLane", q) for q in range(8)) == 23  # no refused one


def test_a_signed_send_is_checked_from_the_values_the_lane_parsed(tmp_path, monkeypatch):
    """A send with AccessKey and Signature only is checked from the lane's parsed values (no request
    decoded): by check_signed_send the first time its account and topic come on the connection,
    natively after that (send_lane.SignedSendCheck, over what check_signed_send cached); one with
    another ACL field (OnsChannel) by before().  All refuse a forged signature and a denied topic
    with the same remarks."""
    from rmq_plugins.acl.plain import PlainAccessValidator

    calls = {"before": 0, "check_signed_send": 0}
    for name in calls:
        real = getattr(PlainAccessValidator, name)

        def counted(self, *args, _real=real, _name=name):
            calls[_name] += 1
            return _real(self, *args)

        monkeypatch.setattr(PlainAccessValidator, name, counted)
    with acl_lane(tmp_path) as (c, s, lane):
        handled, checked = lane.handled, calls["check_signed_send"]
        s.send(b"".join(signed("TopicLane", f"m{i}".encode(), 10 + i) for i in range(10)))
        assert all(RemotingCommand.decode(a).code == ResponseCode.SUCCESS for a in s.answers(10).values())
        assert lane.handled - handled == 10 and calls["check_signed_send"] - checked <= 1
        checked, before = calls["check_signed_send"], calls["before"]
        s.send(b"".join(signed("TopicLane", f"n{i}".encode(), 20 + i) for i in range(5)))
        assert all(RemotingCommand.decode(a).code == ResponseCode.SUCCESS for a in s.answers(5).values())
        assert lane.handled - handled == 15  # checked natively: no Python call of the validator
        assert calls["check_signed_send"] == checked and calls["before"] == before
        before = calls["before"]
        s.send(signed("TopicLane", b"with OnsChannel", 30, OnsChannel="ALIYUN"))
        assert RemotingCommand.decode(s.recv_frame()).code == ResponseCode.SUCCESS
        assert calls["before"] - before == 1

        for extra in ({}, {"OnsChannel": "ALIYUN"}):
            s.send(signed("TopicLane", b"forged", 41, secret=SigningKey("not-the-secret"), **extra)
                   + signed("TopicDenied", b"denied", 42, **extra))
            answers = {k: RemotingCommand.decode(v) for k, v in s.answers(2).items()}
            assert answers[41].code == ResponseCode.SYSTEM_ERROR
            assert "Check signature failed for accessKey=RocketMQ" in answers[41].remark
            assert answers[42].code == ResponseCode.SYSTEM_ERROR
            assert "No default permission for topic=TopicDenied" in answers[42].remark
        store = c.broker.store
        assert sum(store.get_max_offset_in_queue("TopicLane", q) for q in range(8)) == 18  # no refused one


def test_the_lanes_native_check_follows_a_rules_change(tmp_path):
    """Sends checked natively from the connection's cache are checked anew once the rules change:
    a topic the new rules deny is refused on the same connection, with the validator's remark."""
    with acl_lane(tmp_path) as (c, s, lane):
        s.send(b"".join(signed("TopicLane", f"m{i}".encode(), 10 + i) for i in range(5)))
        assert all(RemotingCommand.decode(a).code == ResponseCode.SUCCESS for a in s.answers(5).values())
        validator = c.broker.access_validator
        (tmp_path / "plain_acl.yml").write_text(
            "accounts:\n  - accessKey: RocketMQ\n    secretKey: '12345678'\n"
            "    defaultTopicPerm: DENY\n    topicPerms: [TopicLane=DENY]\n")
        assert validator.reload()
        s.send(signed("TopicLane", b"now denied", 30))
        answer = RemotingCommand.decode(s.recv_frame())
        assert answer.code == ResponseCode.SYSTEM_ERROR and "TopicLane" in answer.remark
