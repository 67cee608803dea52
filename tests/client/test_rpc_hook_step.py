"""RPC hooks (RocketMQ's RPCHook) are a step of the send connections, not a switch to another route:
with a hook registered, sync, async, batch and auto-batch sends to a tcp broker still travel on the
direct and pipelined connections, and every request and answer passes the hook - which may change
the request, as ACL signing will (the broker stores what the hook wrote)."""
import pytest

from rmq_core import Message, Producer
from rmq_core.plugins import get_plugin_manager, hookimpl
from rmq_core.remoting.codes import RequestCode, ResponseCode
from tests.client.conftest import FAST, drain_topic

SEND_CODES = {RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}


class _Signer:
    """Adds a user property to every send request's properties (header field "i" of V2 /
    "properties"), as a signing hook adds its fields, and records the answers it saw."""

    def __init__(self):
        self.requests = []
        self.answers = []

    @hookimpl
    def rmq_client_before_request(self, remote_addr, request):
        if request.code == RequestCode.SEND_MESSAGE_V2:
            request.ext_fields["i"] = request.ext_fields.get("i", "") + "signed\x01yes\x02"
        if request.code in SEND_CODES:
            self.requests.append(request.opaque)

    @hookimpl
    def rmq_client_after_response(self, remote_addr, request, response):
        if request.code in SEND_CODES:
            assert response.opaque == request.opaque
            self.answers.append(response.code)


@pytest.mark.parametrize("auto_batch", [False, True])
def test_hooked_sends_stay_on_the_send_connections(cluster, monkeypatch, auto_batch):
    signer = _Signer()
    pm = get_plugin_manager()
    pm.register(signer, name="test-rpc-signer")
    try:
        with Producer(f"PG_RPC_STEP_{auto_batch}", namesrv=cluster.tcp_namesrv, instance_name=f"rpc-step-{auto_batch}",
                      auto_batch=auto_batch, **FAST) as p:
            topic = f"RpcStepT{int(auto_batch)}"
            p.send(Message(topic, b"warm"))
            inst = p.instance
            real_invoke = inst.invoke
            loop_sends = []

            async def invoke(addr, request, timeout):  # the client loop's remoting route
                if request.code in SEND_CODES:
                    loop_sends.append(request.code)
                return await real_invoke(addr, request, timeout)

            monkeypatch.setattr(inst, "invoke", invoke)
            results = [p.send(Message(topic, f"s{i}".encode())) for i in range(5)]
            results += [f.result(10) for f in [p.send_async(Message(topic, f"a{i}".encode())) for i in range(20)]]
            queue = p.fetch_publish_message_queues(topic)[0]
            results.append(p.send_batch([Message(topic, b"b0"), Message(topic, b"b1")], queue=queue))
            assert loop_sends == []  # nothing took the loop's route
            assert any(not c.closed for cs in inst._send_channels.values() for c in cs)
    finally:
        pm.unregister(signer)
    assert all(r.status.name == "SEND_OK" for r in results)
    assert len(signer.requests) == len(signer.answers) >= 8
    assert set(signer.answers) == {ResponseCode.SUCCESS}
    got = drain_topic(cluster.tcp_namesrv, topic, f"CG_RPC_STEP_{auto_batch}", 28, timeout=10)
    # what the hook wrote into each single message's request is what the broker stored (auto-batch
    # sends its async messages as batches, whose messages carry their properties in the body)
    singles = [m for m in got if m.body[:1] == b"s" or m.body == b"warm" or (m.body[:1] == b"a" and not auto_batch)]
    assert len(singles) == (6 if auto_batch else 26)
    assert singles and all(m.properties.get("signed") == "yes" for m in singles)
