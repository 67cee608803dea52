"""The official C++ client (rocketmq==0.4.4) resolves routes from our name server and sends through
our remoting layer: a RemotingServer standing in for the broker records what arrives."""
import asyncio
import json
import os
import sys

import pytest

from rmq_core.config import NamesrvConfig
from rmq_core.message import create_offset_msg_id
from rmq_core.namesrv import NamesrvController
from rmq_core.remoting import RemotingClient, RemotingCommand, RemotingServer
from rmq_core.remoting.body import DataVersion, RegisterBrokerBody
from rmq_core.remoting.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.compat

PRODUCE = r"""
import json, sys
from rocketmq.client import Message, Producer
namesrv, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = Producer("PID_NS_COMPAT")
p.set_namesrv_addr(namesrv)
p.start()
try:
    for i in range(n):
        m = Message(topic)
        m.set_body("body-%d" % i)
        m.set_tags("TagA")
        r = p.send_sync(m)
        print(json.dumps({"status": int(r.status), "offset": r.offset, "msg_id": r.msg_id}), flush=True)
finally:
    p.shutdown()
"""


class FakeBroker:
    """Answers SEND_MESSAGE like a broker would (string ext fields), records every request."""

    def __init__(self):
        self.requests: list[RemotingCommand] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.assigned: list[int] = []
        self.addr = ""

    async def process_request(self, ctx, request):
        self.requests.append(request)
        if request.code != RequestCode.SEND_MESSAGE:
            return request.make_response(ResponseCode.SUCCESS)
        key = (request.get_str("topic"), request.get_int("queueId"))
        offset = self.offsets.get(key, 0)
        self.offsets[key] = offset + 1
        self.assigned.append(offset)
        host, port = self.addr.rsplit(":", 1)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={
            "msgId": create_offset_msg_id(host, int(port), 1000 + len(self.requests)),
            "queueId": key[1], "queueOffset": offset})


async def _produce(tmp_path, namesrv: str, topic: str, n: int) -> list[dict]:
    env = dict(os.environ, HOME=str(tmp_path))  # the C++ client writes its logs under $HOME
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRODUCE, namesrv, topic, str(n), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 40)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


async def test_cpp_producer_routes_via_tbw102_and_known_topic(tmp_path):
    try:
        import rocketmq.client  # noqa: F401
    except Exception as e:  # pragma: no cover - the dev extra installs it
        pytest.skip(f"C++ client unavailable: {e}")
    ns = NamesrvController(NamesrvConfig(kv_config_path=""), "127.0.0.1:0")
    await ns.start()
    fake = FakeBroker()
    broker = RemotingServer("127.0.0.1:0", name="fake-broker")
    broker.register_default_processor(fake)
    await broker.start()
    fake.addr = broker.listen_address
    registrar = RemotingClient()
    try:
        body = RegisterBrokerBody.build({"TBW102": {"readQueueNums": 8, "writeQueueNums": 8, "perm": 7},
                                         "KnownTopic": {"readQueueNums": 2, "writeQueueNums": 2, "perm": 6}},
                                        DataVersion()).encode()
        resp = await registrar.invoke(ns.listen_address, RemotingCommand.create_request(RequestCode.REGISTER_BROKER, {
            "clusterName": "DefaultCluster", "brokerName": "broker-a", "brokerAddr": broker.listen_address,
            "brokerId": 0, "haServerAddr": ""}, body), 3)
        assert resp.code == ResponseCode.SUCCESS

        # unknown topic: TOPIC_NOT_EXIST from us, the client falls back to TBW102's route
        results = await _produce(tmp_path, ns.listen_address, "NewTopicNotInNS", 3)
        assert [r["status"] for r in results] == [0, 0, 0]
        sends = [r for r in fake.requests if r.code == RequestCode.SEND_MESSAGE]
        assert {s.get_str("topic") for s in sends} == {"NewTopicNotInNS"}
        assert {s.get_str("defaultTopic") for s in sends} == {"TBW102"}
        assert all(0 <= s.get_int("queueId") < 4 for s in sends)  # min(4, TBW102's queues)
        # the string queueOffsets we answered came back to the application
        assert sorted(r["offset"] for r in results) == sorted(fake.assigned)
        assert all(r["msg_id"] for r in results)

        # a topic the broker registered: its own 2 queues are used
        fake.requests.clear()
        fake.assigned.clear()
        results = await _produce(tmp_path, ns.listen_address, "KnownTopic", 4)
        assert [r["status"] for r in results] == [0] * 4
        sends = [r for r in fake.requests if r.code == RequestCode.SEND_MESSAGE]
        assert {s.get_int("queueId") for s in sends} == {0, 1}
        assert sorted(r["offset"] for r in results) == [0, 0, 1, 1]
    finally:
        await registrar.close()
        await broker.stop()
        await ns.stop()
