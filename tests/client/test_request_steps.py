"""Request steps have a side (rmq_core.remoting.steps): in one embedded process a client-side and
a broker-side step each run exactly once per request - sync, async, batch sends and pulls, over
tcp and in-proc - and a broker step refuses a request with RequestRefused: the answer carries its
code and remark, nothing is stored, the connection keeps serving.  Per-instance steps (a
producer's and a broker's `request_steps`, an admin client's) run on the same routes."""
import collections

import pytest

from rmq_core import Message, Producer
from rmq_core.admin.client import AdminClient
from rmq_core.errors import MQBrokerError
from rmq_core.plugins import get_plugin_manager, hookimpl
from rmq_core.remoting import RequestRefused, RequestStep
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.client.conftest import FAST, drain_topic

SEND_CODES = {RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
WATCHED = SEND_CODES | {RequestCode.PULL_MESSAGE}


class _BothSides:
    """Global hooks of both sides noting every watched request by (side, when, code, opaque); the
    broker's refuses a send whose body asks for it, and reads its ext fields as a check would."""

    def __init__(self):
        self.seen = collections.Counter()

    def _note(self, side, when, request):
        if request.code in WATCHED:
            self.seen[side, when, request.code, request.opaque] += 1

    @hookimpl
    def rmq_client_before_request(self, remote_addr, request):
        self._note("client", "before", request)

    @hookimpl
    def rmq_client_after_response(self, remote_addr, request, response):
        self._note("client", "after", request)

    @hookimpl
    def rmq_broker_before_request(self, remote_addr, request, connection):
        self._note("broker", "before", request)
        if request.code in SEND_CODES and request.body == b"refuse-me":
            assert connection.remote_address and isinstance(connection.attributes, dict)
            raise RequestRefused(f"refused {request.ext_fields.get('b') or request.ext_fields.get('topic')}",
                                 code=ResponseCode.NO_PERMISSION)

    @hookimpl
    def rmq_broker_after_response(self, remote_addr, request, response, connection):
        self._note("broker", "after", request)

    def opaques(self, side, when, codes):
        return {k[3] for k in self.seen if k[0] == side and k[1] == when and k[2] in codes}


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_each_side_runs_once_per_request_and_a_refusal_is_answered(make_cluster, transport):
    hooks = _BothSides()
    pm = get_plugin_manager()
    pm.register(hooks, name="test-both-sides")
    try:
        cluster = make_cluster()
        namesrv = cluster.tcp_namesrv if transport == "tcp" else cluster.namesrv
        topic = f"StepsT_{transport}"
        with Producer(f"PG_STEPS_{transport}", namesrv=namesrv, instance_name=f"steps-{transport}", **FAST) as p:
            p.send(Message(topic, b"warm"))
            results = [p.send(Message(topic, b"s%d" % i)) for i in range(5)]
            results += [f.result(10) for f in [p.send_async(Message(topic, b"a%d" % i)) for i in range(20)]]
            queue = p.fetch_publish_message_queues(topic)[0]
            results.append(p.send_batch([Message(topic, b"b0"), Message(topic, b"b1")], queue=queue))
            with pytest.raises(MQBrokerError) as refused:
                p.send(Message(topic, b"refuse-me"))
            assert refused.value.code == ResponseCode.NO_PERMISSION
            assert f"refused {topic}" in str(refused.value)
            results.append(p.send(Message(topic, b"after")))  # the connections serve on
        assert all(r.status.name == "SEND_OK" for r in results)
        stored = [b"warm", b"after", b"b0", b"b1"] + [b"s%d" % i for i in range(5)] + [b"a%d" % i for i in range(20)]
        got = drain_topic(namesrv, topic, f"CG_STEPS_{transport}", len(stored))
    finally:
        pm.unregister(hooks)
    assert sorted(m.body for m in got) == sorted(stored)  # nothing refused stored
    assert set(hooks.seen.values()) == {1}  # no step ran twice for one request, on either side
    sent = hooks.opaques("client", "before", SEND_CODES)
    assert len(sent) >= 29
    assert hooks.opaques("broker", "before", SEND_CODES) == sent
    refused_ones = {k[3] for k in hooks.seen if k[1] == "before" and k[0] == "broker"} - \
        {k[3] for k in hooks.seen if k[1] == "after" and k[0] == "broker"}
    answered = sent - refused_ones
    assert len(answered) >= 28 and refused_ones
    assert hooks.opaques("broker", "after", SEND_CODES) == answered
    assert hooks.opaques("client", "after", SEND_CODES) == sent  # (a refusal is an answer too)
    pulls = hooks.opaques("client", "before", {RequestCode.PULL_MESSAGE})
    assert pulls and hooks.opaques("broker", "before", {RequestCode.PULL_MESSAGE}) == pulls


class _Signer(RequestStep):
    def __init__(self, key):
        self.key = key

    def before(self, remote_addr, request, connection=None):
        if request.code in SEND_CODES or request.code == RequestCode.GET_BROKER_RUNTIME_INFO:
            request.ext_fields["AccessKey"] = self.key


class _Checker(RequestStep):
    """A broker's own step: sends and runtime-info requests must carry the right AccessKey."""

    def __init__(self):
        self.accounts = []

    def before(self, remote_addr, request, connection=None):
        if request.code in SEND_CODES or request.code == RequestCode.GET_BROKER_RUNTIME_INFO:
            key = request.ext_fields.get("AccessKey")
            if key != "rmq-good":
                raise RequestRefused(f"AccessKey {key!r} not allowed", code=ResponseCode.NO_PERMISSION)
            connection.attributes["account"] = key
            self.accounts.append(key)


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_per_instance_steps_of_a_client_and_a_broker(make_cluster, transport):
    checker = _Checker()
    cluster = make_cluster(request_steps=[checker])
    namesrv = cluster.tcp_namesrv if transport == "tcp" else cluster.namesrv
    topic = f"OwnStepsT_{transport}"
    with Producer(f"PG_OWN_{transport}", namesrv=namesrv, instance_name=f"own-good-{transport}",
                  request_steps=[_Signer("rmq-good")], **FAST) as good:
        assert good.send(Message(topic, b"one")).status.name == "SEND_OK"
        assert good.send_async(Message(topic, b"two")).result(10).status.name == "SEND_OK"
    with Producer(f"PG_OWN_BAD_{transport}", namesrv=namesrv, instance_name=f"own-bad-{transport}",
                  request_steps=[_Signer("rmq-bad")], **FAST) as bad:
        with pytest.raises(MQBrokerError, match="AccessKey 'rmq-bad' not allowed"):
            bad.send(Message(topic, b"three"))
    assert checker.accounts and set(checker.accounts) == {"rmq-good"}
    # the admin client's blocking route passes its steps too
    with AdminClient(cluster.tcp_namesrv, request_steps=[_Signer("rmq-good")]) as admin:
        assert admin.invoke(cluster.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO).code == ResponseCode.SUCCESS
    with AdminClient(cluster.tcp_namesrv) as admin:
        answer = admin.invoke(cluster.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        assert (answer.code, answer.remark) == (ResponseCode.NO_PERMISSION, "AccessKey None not allowed")


class _Reads(RequestStep):
    """Notes what a step is handed for each send: its kind and every ext field; adds and changes
    fields as `change` says."""

    def __init__(self, change=None):
        self.seen, self.change = [], change or {}

    def before(self, remote_addr, request, connection=None):
        if request.code in SEND_CODES:
            for key, value in self.change.items():
                request.ext_fields[key] = value
            self.seen.append((type(request).__name__, request.opaque, dict(request.ext_fields), request.body))


def test_steps_read_and_change_the_values_a_send_is_written_and_parsed_from(make_cluster):
    """A producer's step gets a send as its header writer has it, a broker's as its send lane parsed
    it (no header decoded twice on either side); a field a client step adds or changes is what the
    broker's step and the store see."""
    broker_step = _Reads()
    cluster = make_cluster(request_steps=[broker_step])
    topic = "StepViewsT"
    added = _Reads({"TraceId": "t-\u00e9\u0001"})  # (a non-ASCII, escaped value: the lane leaves it to the general path)
    with Producer("PG_VIEWS", namesrv=cluster.tcp_namesrv, instance_name="views-add", request_steps=[added],
                  **FAST) as p:
        results = [p.send(Message(topic, b"sync", tags="TagA"))]
        results.append(p.send_async(Message(topic, b"async", keys="k1")).result(10))
    reads = _Reads()
    with Producer("PG_VIEWS", namesrv=cluster.tcp_namesrv, instance_name="views-plain", request_steps=[reads],
                  **FAST) as p:
        results += [p.send(Message(topic, b"plain-%d" % i)) for i in range(3)]
    changed = _Reads({"a": "PG_RENAMED"})  # a field the header writes itself: the frame is written anew
    with Producer("PG_VIEWS", namesrv=cluster.tcp_namesrv, instance_name="views-change", request_steps=[changed],
                  **FAST) as p:
        results.append(p.send(Message(topic, b"changed")))
    assert all(r.status.name == "SEND_OK" for r in results)
    sent = added.seen + reads.seen + changed.seen
    assert {kind for kind, *_ in sent} == {"SendRequest"}
    at_broker = {opaque: (kind, fields, body) for kind, opaque, fields, body in broker_step.seen}
    for _, opaque, fields, body in sent:
        kind, broker_fields, broker_body = at_broker[opaque]
        assert (broker_fields, broker_body) == (fields, body)
    assert [f["a"] for _, _, f, _ in changed.seen] == ["PG_RENAMED"]
    # plain sends stay on the broker's send lane with its step: handed over as parsed there
    assert {at_broker[opaque][0] for _, opaque, _, _ in reads.seen} == {"LaneRequest"}
    assert all(f["TraceId"] == "t-\u00e9\u0001" for _, _, f, _ in added.seen)
    stored = drain_topic(cluster.namesrv, topic, "CG_VIEWS", 6)
    assert sorted(m.body for m in stored) == sorted(body for *_, body in sent)


class _Refuses(RequestStep):
    """A client's own step (no after()) that fails the sends whose body asks for it."""

    def before(self, remote_addr, request, connection=None):
        if request.code in SEND_CODES and request.body == b"refuse me":
            raise ValueError("refused by the client's step")


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_a_client_step_that_raises_fails_that_send_only(make_cluster, transport):
    """Steps with no after() run in the native first attempt (send_pipeline: run_send_steps): one
    that raises fails that send with its error, sync and async; the next sends go on."""
    cluster = make_cluster()
    namesrv = cluster.tcp_namesrv if transport == "tcp" else cluster.namesrv
    topic = f"RefusingStepT_{transport}"
    with Producer(f"PG_REFUSING_{transport}", namesrv=namesrv, instance_name=f"refusing-{transport}",
                  request_steps=[_Refuses()], retry_times_when_send_failed=0,
                  retry_times_when_send_async_failed=0, **FAST) as p:
        assert p.send(Message(topic, b"first")).status.name == "SEND_OK"
        for _ in range(4):  # (each queue's first send took the general path: now the native one)
            assert p.send(Message(topic, b"warm")).status.name == "SEND_OK"
        with pytest.raises(Exception, match="refused by the client's step"):
            p.send(Message(topic, b"refuse me"))
        with pytest.raises(Exception, match="refused by the client's step"):
            p.send_async(Message(topic, b"refuse me")).result(10)
        assert p.send(Message(topic, b"after")).status.name == "SEND_OK"
        assert p.send_async(Message(topic, b"after")).result(10).status.name == "SEND_OK"
    got = drain_topic(namesrv, topic, f"CG_REFUSING_{transport}", 7)
    assert sorted(m.body for m in got) == [b"after"] * 2 + [b"first"] + [b"warm"] * 4


class _Keeper(RequestStep):
    """A broker's own step that keeps every send it is handed, and the ext_fields of some."""

    def __init__(self):
        self.kept, self.views = [], []

    def before(self, remote_addr, request, connection=None):
        if request.code == RequestCode.SEND_MESSAGE_V2:
            if (len(self.kept) + len(self.views)) % 2:
                self.views.append(request.ext_fields)
            else:
                self.kept.append(request)


def test_a_send_a_broker_step_keeps_stays_whole(make_cluster):
    """The lane hands steps a send over its read chunk; one a step keeps (or whose ext_fields it
    keeps) is copied out of it first: read later, after many other reads, it is the send it was."""
    keeper = _Keeper()
    cluster = make_cluster(request_steps=[keeper])
    with Producer("PG_KEEPER", namesrv=cluster.tcp_namesrv, instance_name="keeper", **FAST) as p:
        futures = [p.send_async(Message("KeptT", b"kept-%d" % i)) for i in range(200)]
        assert all(f.result(10).status.name == "SEND_OK" for f in futures)
    assert len(keeper.kept) + len(keeper.views) >= 200
    assert {r.ext_fields["b"] for r in keeper.kept} == {"KeptT"} and {v["b"] for v in keeper.views} == {"KeptT"}
    lane = [r for r in keeper.kept if type(r).__name__ == "LaneRequest"]  # (a queue's first send: dispatch's)
    assert len(lane) >= 50 and len({r.body for r in lane}) == len(lane)
    assert all(r.frame.endswith(r.body) and r.body.startswith(b"kept-") for r in lane)
