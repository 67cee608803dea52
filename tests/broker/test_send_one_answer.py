"""One validation, one answer: a send is refused with the same code and remark whichever route of
the send processor reads it — the native lane (a plain SEND_MESSAGE_V2), process_send (the same
request the lane declines, or any request on a broker without the lane), or send_message (the
long-named SEND_MESSAGE header).  Every refusal here is made once, by the same checks; the lane
only recognises what those checks already passed (send_lane.checked_queues / plain_send_queues,
which process_send calls too)."""
import pytest

from rmq_core.broker.processors import send as send_module
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from tests.broker.test_send_lane import BORN, V2, RawSocket, _warm, frame, lane_of, v2_fields

V1 = int(RequestCode.SEND_MESSAGE)
_LONG = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
         "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
         "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}


def as_v1(ext: dict) -> dict:
    return {_LONG[k]: v for k, v in ext.items() if k in _LONG}


def with_remark(code, ext, body, opaque):
    """The same request with a remark in its header: the lane declines it (RocketMQ never sends
    one), the general path ignores it."""
    cmd = RemotingCommand.create_request(code, ext, body)
    cmd.opaque = opaque
    cmd.remark = "declined by the lane"
    return cmd.encode()


# (name, V2 fields, whether the long-named SEND_MESSAGE form must answer alike: a bad integer's
# remark names the field as the client spelled it)
REFUSED = [
    ("bad topic name", v2_fields("bad topic!", 0), True),
    ("system topic", v2_fields("SCHEDULE_TOPIC_XXXX", 0), True),
    ("queue id out of range", v2_fields("OneAnswer", 9), True),
    ("bad queue id", v2_fields("OneAnswer", 0, e="1x"), False),
    ("bad flag", v2_fields("OneAnswer", 0, h="2x"), False),
    ("too long a topic", v2_fields("T" * 128, 0), True),
]


def answer_of(s: RawSocket, data: bytes):
    s.send(data)
    a = RemotingCommand.decode(s.recv_frame())
    return a.code, a.remark


def refusals(cluster, ext, long_form_too):
    """(code, remark) of the refused request sent as a plain SEND_MESSAGE_V2, as the same request
    with a header the lane declines, and (when comparable) as SEND_MESSAGE."""
    s = RawSocket(cluster.broker_addr)
    try:
        _warm(s, "OneAnswer")
        lane = lane_of(cluster, s)
        handled = lane.handled if lane is not None else 0
        got = [answer_of(s, frame(V2, ext, b"x", opaque=10)),
               answer_of(s, with_remark(V2, ext, b"x", opaque=11))]
        if long_form_too:
            got.append(answer_of(s, frame(V1, as_v1(ext), b"x", opaque=12)))
        if lane is not None:
            assert lane.handled == handled  # refused: never answered by the lane itself
        return got
    finally:
        s.close()


@pytest.fixture
def brokers(make_cluster, tmp_path, monkeypatch):
    with_lane = make_cluster(store=tmp_path / "lane")
    monkeypatch.setattr(send_module, "NATIVE_SEND", False)
    without = make_cluster(store=tmp_path / "ref")
    monkeypatch.setattr(send_module, "NATIVE_SEND", True)
    return with_lane, without


@pytest.mark.parametrize("name,ext,long_form_too", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_send_gets_one_answer_on_every_route(brokers, name, ext, long_form_too):
    answers = [refusals(b, ext, long_form_too) for b in brokers]
    for got in answers:
        assert len(set(got)) == 1, got  # lane-shaped, lane-declined, long-named: one answer
        code, remark = got[0]
        assert code != ResponseCode.SUCCESS and remark
    assert answers[0] == answers[1]  # with and without the lane


def test_a_read_only_broker_refuses_alike_on_every_route(brokers):
    got = []
    for cluster in brokers:
        s = RawSocket(cluster.broker_addr)
        try:
            _warm(s, "OneAnswer")
            cluster.broker.broker_config.broker_permission = 4  # read only
            try:
                ext = v2_fields("OneAnswer", 1)
                got.append([answer_of(s, frame(V2, ext, b"x", opaque=20)),
                            answer_of(s, with_remark(V2, ext, b"x", opaque=21)),
                            answer_of(s, frame(V1, as_v1(ext), b"x", opaque=22))])
            finally:
                cluster.broker.broker_config.broker_permission = 6
        finally:
            s.close()
    assert got[0] == got[1]
    assert len(set(got[0])) == 1 and got[0][0][0] == ResponseCode.NO_PERMISSION


def test_the_lane_and_process_send_recognise_the_same_plain_sends(brokers):
    """The kernel check both routes call: a plain send to a checked topic is put at once by
    either (the lane's handled count grows; the route without the lane answers alike)."""
    ok = []
    for cluster in brokers:
        s = RawSocket(cluster.broker_addr)
        try:
            _warm(s, "OneAnswer")
            lane = lane_of(cluster, s)
            before = lane.handled if lane is not None else None
            code, remark = answer_of(s, frame(V2, v2_fields("OneAnswer", 0, g=str(BORN)), b"plain", opaque=30))
            ok.append((code, remark))
            if lane is not None:
                assert lane.handled == before + 1
        finally:
            s.close()
    assert ok == [(ResponseCode.SUCCESS, None)] * 2


def test_kernel_checks_directly():
    from rmq_core._native.send_lane import SendLaneState, checked_queues, plain_send_queues, special_properties

    class Version:
        counter = 3

    dv = Version()

    def refresh(state):
        state.data_version, state.counter, state.writable = dv, dv.counter, True

    st = SendLaneState({"T": (dv, 3, 4, 8)}, b"CLUSTER\x01c\x02", 0, object(), None, None, refresh)
    refresh(st)
    assert checked_queues(st, "T", 7) == 4 and checked_queues(st, "T", -1) == 4
    assert checked_queues(st, "T", 8) == 0 and checked_queues(st, "U", 0) == 0 and checked_queues(st, None, 0) == 0
    assert plain_send_queues(st, "T", 0, 0, b"KEYS\x01k\x02") == 4
    assert plain_send_queues(st, "T", 0, 4, b"") == 0  # transaction prepared
    for props in (b"DELAY\x013\x02", b"A\x01b\x02TIMER_DELAY_SEC\x0110\x02", b"TRAN_MSG\x01true\x02",
                  b"DELIVER_TIME_MS\x011\x02"):
        assert special_properties(props) and plain_send_queues(st, "T", 0, 0, props) == 0
    assert not special_properties(b"DELAYED\x011\x02XDELAY\x011\x02")
    st.writable = False
    assert checked_queues(st, "T", 0) == 0
    st.writable, st.counter = True, 4  # the topic table changed since the check
    assert checked_queues(st, "T", 0) == 0
