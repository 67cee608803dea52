"""What a client-side request step (RocketMQ's RPCHook) may do on the send pipeline, for sync, async and batch sends
over tcp and in-proc: add ext fields that reach the broker (as ACL signing will), read the answer's
fields, and fail a request by raising - that request only."""
import pytest

from rmq_core import Message, Producer
from rmq_core.plugins import get_plugin_manager, hookimpl
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.client.conftest import FAST

SEND_CODES = {RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
TRANSPORTS = ["tcp", "inproc"]


def _namesrv(cluster, transport):
    return cluster.tcp_namesrv if transport == "tcp" else cluster.namesrv


class _Registered:
    """Plugins registered for the test's duration (in order), unregistered after it."""

    def __init__(self, *plugins):
        self.plugins = plugins

    def __enter__(self):
        for i, plugin in enumerate(self.plugins):
            get_plugin_manager().register(plugin, name=f"test-rpc-hook-{id(self)}-{i}")
        return self

    def __exit__(self, *exc):
        for plugin in self.plugins:
            get_plugin_manager().unregister(plugin)


def _sends(p, topic, bodies_sync, bodies_async, batch_bodies):
    """Sync sends, then async ones, then one batch: (results, futures, batch result)."""
    results = [p.send(Message(topic, b)) for b in bodies_sync]
    futures = [p.send_async(Message(topic, b)) for b in bodies_async]
    queue = p.fetch_publish_message_queues(topic)[0]
    batch = p.send_batch([Message(topic, b) for b in batch_bodies], queue=queue)
    return results, [f.result(10) for f in futures], batch


class _Signer:
    """Signs every send request as ACL signing will: ext fields added on the client's side."""

    @hookimpl
    def rmq_client_before_request(self, remote_addr, request):
        if request.code in SEND_CODES and "AccessKey" not in request.ext_fields:
            request.ext_fields["AccessKey"] = "rmq-test"
            request.ext_fields["Signature"] = f"sig-{request.opaque}"


class _Arrivals:
    """The broker's side: it sees each send request as it arrived (signed by the client's step)."""

    def __init__(self):
        self.signed = []

    @hookimpl
    def rmq_broker_before_request(self, remote_addr, request):
        if request.code in SEND_CODES and "AccessKey" in request.ext_fields:
            self.signed.append((request.code, request.ext_fields["AccessKey"],
                                request.ext_fields.get("Signature") == f"sig-{request.opaque}"))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fields_a_hook_adds_reach_the_broker(make_cluster, transport):
    arrivals = _Arrivals()
    with _Registered(_Signer(), arrivals):
        cluster = make_cluster()  # (its server calls the hooks too: they were registered first)
        with Producer(f"PG_RPC_SIGN_{transport}", namesrv=_namesrv(cluster, transport),
                      instance_name=f"rpc-sign-{transport}", **FAST) as p:
            topic = f"RpcSignT_{transport}"
            p.send(Message(topic, b"warm"))
            del arrivals.signed[:]
            results, answers, batch = _sends(p, topic, [b"s0", b"s1", b"s2"], [b"a%d" % i for i in range(10)],
                                             [b"b0", b"b1"])
    assert all(r.status.name == "SEND_OK" for r in results + answers + [batch])
    v2, batch_code = RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE
    assert sorted(arrivals.signed) == sorted([(v2, "rmq-test", True)] * 13 + [(batch_code, "rmq-test", True)])


class _AnswerReader:
    """Notes what each send's answer says, read through the command the hook is handed."""

    def __init__(self):
        self.answers = []

    @hookimpl
    def rmq_client_after_response(self, remote_addr, request, response):
        if request.code in SEND_CODES:
            self.answers.append({
                "request_code": request.code, "code": response.code, "same_opaque": response.opaque == request.opaque,
                "is_response": response.is_response, "msg_id": response.get_str("msgId"),
                "queue_id": response.get_int("queueId"), "queue_offset": response.get_int("queueOffset"),
                "region": response.ext_fields.get("MSG_REGION")})


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_hook_reads_the_answer_of_each_send(cluster, transport):
    reader = _AnswerReader()
    with _Registered(reader):  # (after the broker started: only the client calls it)
        with Producer(f"PG_RPC_READ_{transport}", namesrv=_namesrv(cluster, transport),
                      instance_name=f"rpc-read-{transport}", **FAST) as p:
            topic = f"RpcReadT_{transport}"
            p.send(Message(topic, b"warm"))
            del reader.answers[:]
            results, answers, batch = _sends(p, topic, [b"s0", b"s1"], [b"a%d" % i for i in range(8)], [b"b0", b"b1"])
    singles = results + answers
    assert len(reader.answers) == len(singles) + 1
    by_id = {a["msg_id"]: a for a in reader.answers}
    for r in singles:  # (the answer's msgId is the broker's offset message id)
        assert by_id[r.offset_msg_id] == {
            "request_code": RequestCode.SEND_MESSAGE_V2, "code": ResponseCode.SUCCESS, "same_opaque": True,
            "is_response": True, "msg_id": r.offset_msg_id, "queue_id": r.queue.queue_id,
            "queue_offset": r.queue_offset, "region": "DefaultRegion"}
    (batch_answer,) = [a for a in reader.answers if a["request_code"] == RequestCode.SEND_BATCH_MESSAGE]
    assert batch_answer["code"] == ResponseCode.SUCCESS and batch_answer["same_opaque"]
    assert batch_answer["queue_id"] == batch.queue.queue_id
    assert batch_answer["queue_offset"] == batch.queue_offset


class _Refuser:
    """Fails the requests of messages that ask for it: before the request leaves, or when its
    answer comes."""

    @hookimpl
    def rmq_client_before_request(self, remote_addr, request):
        if request.code in SEND_CODES and b"refuse-request" in (request.body or b""):
            raise ValueError("request refused by the hook")

    @hookimpl
    def rmq_client_after_response(self, remote_addr, request, response):
        if request.code in SEND_CODES and b"refuse-answer" in (request.body or b""):
            raise ValueError("answer refused by the hook")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_hook_that_raises_fails_only_that_request(cluster, transport):
    with _Registered(_Refuser()):
        with Producer(f"PG_RPC_FAIL_{transport}", namesrv=_namesrv(cluster, transport),
                      instance_name=f"rpc-fail-{transport}", **FAST) as p:
            topic = f"RpcFailT_{transport}"
            assert p.send(Message(topic, b"warm")).status.name == "SEND_OK"
            queue = p.fetch_publish_message_queues(topic)[0]
            for refused, what in ((b"refuse-request", "request refused"), (b"refuse-answer", "answer refused")):
                # sync
                with pytest.raises(ValueError, match=what):
                    p.send(Message(topic, refused))
                assert p.send(Message(topic, b"fine")).status.name == "SEND_OK"
                # async: only the refused one of a burst fails
                futures = [p.send_async(Message(topic, refused if i == 3 else b"fine-%d" % i)) for i in range(8)]
                for i, f in enumerate(futures):
                    if i == 3:
                        with pytest.raises(ValueError, match=what):
                            f.result(10)
                    else:
                        assert f.result(10).status.name == "SEND_OK"
                # batch
                with pytest.raises(ValueError, match=what):
                    p.send_batch([Message(topic, b"b0"), Message(topic, refused)], queue=queue)
                assert p.send_batch([Message(topic, b"b0"), Message(topic, b"b1")], queue=queue).status.name == "SEND_OK"
