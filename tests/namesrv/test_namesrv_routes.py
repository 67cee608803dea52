"""Name server: registration, routes, liveness, KV config — a real NamesrvController on 127.0.0.1."""
import asyncio
import glob
import json
import logging
import os
import time
import zlib

import pytest

from rmq_core.config import NamesrvConfig
from rmq_core.namesrv import BOOT_SUCCESS_LINE, NamesrvController, run_namesrv
from rmq_core.remoting import RemotingClient, RemotingCommand
from rmq_core.remoting.body import (
    REGISTER_ALL, ClusterInfo, DataVersion, RegisterBrokerBody, TopicRouteData, kv_table_decode, loads_lenient, topic_list_decode,
)
from rmq_core.remoting.codes import RequestCode, ResponseCode

from tests.paths import CAPTURES as _CAPTURES_DIR  # noqa: E402

CAPTURES = str(_CAPTURES_DIR)


def _config(tmp_path, **kw) -> NamesrvConfig:
    kw.setdefault("kv_config_path", str(tmp_path / "kvConfig.json"))
    return NamesrvConfig(**kw)


@pytest.fixture(params=["tcp", "inproc"])
def listen(request):
    return "127.0.0.1:0" if request.param == "tcp" else f"inproc://ns-{os.getpid()}-{time.monotonic_ns()}"


async def register(client, ns, *, cluster="DefaultCluster", name="broker-a", addr="127.0.0.1:10911", broker_id=0,
                   topics=None, version=None, ha="127.0.0.1:10912", crc=True, compressed=False, register_all=None):
    topics = {"TopicA": 4} if topics is None else topics
    table = {t: {"topicName": t, "readQueueNums": n, "writeQueueNums": n, "perm": 6, "topicFilterType": "SINGLE_TAG",
                 "topicSysFlag": 0, "order": False} for t, n in topics.items()}
    body = RegisterBrokerBody(table, version or DataVersion()).encode(compress=compressed)
    ext = {"clusterName": cluster, "brokerName": name, "brokerAddr": addr, "brokerId": broker_id,
           "haServerAddr": ha, "compressed": compressed,
           "bodyCrc32": (zlib.crc32(body) & 0x7FFFFFFF) if crc else 0}
    if register_all is not None:
        ext[REGISTER_ALL] = register_all
    return await client.invoke(ns.listen_address, RemotingCommand.create_request(RequestCode.REGISTER_BROKER, ext, body), 3)


async def route(client, ns, topic):
    resp = await client.invoke(ns.listen_address,
                               RemotingCommand.create_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 3)
    return resp


async def call(client, ns, code, ext=None, body=None):
    return await client.invoke(ns.listen_address, RemotingCommand.create_request(code, ext, body), 3)


async def eventually(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_route_appears_on_register_and_disappears_on_unregister(tmp_path, listen):
    async with NamesrvController(_config(tmp_path), listen) as ns:
        broker = RemotingClient(name="broker")
        try:
            resp = await route(broker, ns, "TopicA")
            assert resp.code == ResponseCode.TOPIC_NOT_EXIST and resp.body is None
            assert resp.remark == "No topic route info in name server for the topic: TopicA"
            resp = await register(broker, ns, topics={"TopicA": 4, "TBW102": 8})
            assert resp.code == ResponseCode.SUCCESS
            resp = await route(broker, ns, "TopicA")
            assert resp.code == ResponseCode.SUCCESS
            data = TopicRouteData.decode(resp.body)
            assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in data.queue_datas] == [
                ("broker-a", 4, 4, 6)]
            assert [(b.cluster, b.broker_name, b.broker_addrs) for b in data.broker_datas] == [
                ("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"})]
            tbw = TopicRouteData.decode((await route(broker, ns, "TBW102")).body)
            assert tbw.queue_datas[0].write_queue_nums == 8
            resp = await call(broker, ns, RequestCode.UNREGISTER_BROKER, {
                "clusterName": "DefaultCluster", "brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911",
                "brokerId": 0})
            assert resp.code == ResponseCode.SUCCESS
            assert (await route(broker, ns, "TopicA")).code == ResponseCode.TOPIC_NOT_EXIST
            assert (await route(broker, ns, "TBW102")).code == ResponseCode.TOPIC_NOT_EXIST
            info = ClusterInfo.decode((await call(broker, ns, RequestCode.GET_BROKER_CLUSTER_INFO)).body)
            assert info.broker_addr_table == {} and info.cluster_addr_table == {}
        finally:
            await broker.close()


async def test_route_json_matches_what_the_cpp_client_accepted(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        broker = RemotingClient()
        try:
            await register(broker, ns, topics={"CapTopic": 4})
            ours = json.loads((await route(broker, ns, "CapTopic")).body)  # standard JSON: Python parses it
        finally:
            await broker.close()
    accepted = None
    with open(os.path.join(CAPTURES, "producer_variants.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("dir") == "server->client" and rec.get("code") == 0 and '"brokerDatas"' in (rec.get("body_text") or ""):
                accepted = json.loads(rec["body_text"])  # the quoted-keys variant the client took
                break
    assert accepted is not None
    assert ours == accepted
    assert list(ours["brokerDatas"][0]["brokerAddrs"]) == ["0"]  # quoted key
    for key in ("perm", "readQueueNums", "writeQueueNums", "topicSysFlag"):
        assert type(ours["queueDatas"][0][key]) is int


def test_fastjson_unquoted_route_from_captures_parses():
    with open(os.path.join(CAPTURES, "producer.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    body = next(r["body_text"] for r in records if '{0:"' in (r.get("body_text") or ""))
    with pytest.raises(ValueError):
        json.loads(body)  # what Python's own parser makes of fastjson's bare keys
    data = TopicRouteData.decode(body.encode())
    assert data.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
    assert data.broker_datas[0].select_broker_addr() == "127.0.0.1:10911"
    assert loads_lenient('{"a":"{0:x}", -1 :"b", "c":[{7:1}]}') == {"a": "{0:x}", "-1": "b", "c": [{"7": 1}]}


async def test_two_brokers_of_one_cluster_both_in_route(tmp_path, listen):
    async with NamesrvController(_config(tmp_path), listen) as ns:
        a, b = RemotingClient(name="a"), RemotingClient(name="b")
        try:
            await register(a, ns, name="broker-a", addr="127.0.0.1:10911", topics={"T": 4, "OnlyA": 2})
            await register(b, ns, name="broker-b", addr="127.0.0.1:10921", topics={"T": 8})
            data = TopicRouteData.decode((await route(a, ns, "T")).body)
            assert {q.broker_name: q.write_queue_nums for q in data.queue_datas} == {"broker-a": 4, "broker-b": 8}
            assert {bd.broker_name: bd.broker_addrs[0] for bd in data.broker_datas} == {
                "broker-a": "127.0.0.1:10911", "broker-b": "127.0.0.1:10921"}
            info = ClusterInfo.decode((await call(a, ns, RequestCode.GET_BROKER_CLUSTER_INFO)).body)
            assert info.cluster_addr_table == {"DefaultCluster": {"broker-a", "broker-b"}}
            topics = topic_list_decode((await call(a, ns, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"})).body)
            assert topics == ["OnlyA", "T"]
            # broker-b goes away (connection closed): T keeps broker-a only
            await b.close()
            assert await eventually(lambda: _route_brokers(a, ns, "T", {"broker-a"}))
        finally:
            await a.close()
            await b.close()


async def _route_brokers(client, ns, topic, expected):
    resp = await route(client, ns, topic)
    if resp.code != ResponseCode.SUCCESS:
        return expected == set()
    return {bd.broker_name for bd in TopicRouteData.decode(resp.body).broker_datas} == expected


async def test_route_disappears_when_broker_connection_closes(tmp_path, listen):
    async with NamesrvController(_config(tmp_path), listen) as ns:
        broker, reader = RemotingClient(), RemotingClient()
        try:
            await register(broker, ns)
            assert (await route(reader, ns, "TopicA")).code == ResponseCode.SUCCESS
            await broker.close()
            assert await eventually(lambda: _route_brokers(reader, ns, "TopicA", set()))
        finally:
            await broker.close()
            await reader.close()


async def test_route_expires_when_broker_stops_registering(tmp_path, listen):
    config = _config(tmp_path, broker_channel_expired_time=800, scan_not_active_broker_interval=50)
    async with NamesrvController(config, listen) as ns:
        alive, silent, reader = RemotingClient(), RemotingClient(), RemotingClient()
        silent_closed = asyncio.Event()
        silent.on_channel_close.append(lambda ctx: silent_closed.set())
        try:
            await register(alive, ns, name="alive", addr="127.0.0.1:1001", topics={"Live": 1})
            await register(silent, ns, name="silent", addr="127.0.0.1:1002", topics={"Quiet": 1})
            # "alive" keeps re-registering; "silent" does not, though its connection stays open.
            for _ in range(18):
                await asyncio.sleep(0.1)
                await register(alive, ns, name="alive", addr="127.0.0.1:1001", topics={"Live": 1})
            assert (await route(reader, ns, "Quiet")).code == ResponseCode.TOPIC_NOT_EXIST
            assert (await route(reader, ns, "Live")).code == ResponseCode.SUCCESS
            # the name server closed the expired broker's connection, as Java does
            await asyncio.wait_for(silent_closed.wait(), 3)
        finally:
            for c in (alive, silent, reader):
                await c.close()


async def test_reregistration_applies_topic_changes(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        broker = RemotingClient()
        try:
            version = DataVersion()
            await register(broker, ns, topics={"Keep": 4, "Drop": 4}, version=version)
            # an incremental registration (RocketMQ's registerIncrementBrokerData, and every Java
            # 4.9 registration): it adds and updates what it carries, and leaves the rest alone
            version.next_version()
            await register(broker, ns, topics={"Keep": 8}, version=version)
            assert (await route(broker, ns, "Drop")).code == ResponseCode.SUCCESS
            keep = TopicRouteData.decode((await route(broker, ns, "Keep")).body)
            assert keep.queue_datas[0].write_queue_nums == 8
            # the full table (registerAll): what it lacks is gone
            await register(broker, ns, topics={"Keep": 8}, version=version, register_all=True)
            assert (await route(broker, ns, "Drop")).code == ResponseCode.TOPIC_NOT_EXIST
            # same data version but a new topic: still picked up
            await register(broker, ns, topics={"Keep": 8, "New": 2}, version=version, register_all=True)
            assert (await route(broker, ns, "New")).code == ResponseCode.SUCCESS
            all_topics = topic_list_decode((await call(broker, ns, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).body)
            assert all_topics == ["Keep", "New"]
            assert ns.route_info_manager.broker_topics == {"broker-a": {"Keep", "New"}}
        finally:
            await broker.close()


async def test_slave_registration_learns_master_and_ha_address(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        master, slave = RemotingClient(), RemotingClient()
        try:
            resp = await register(master, ns, addr="127.0.0.1:10911", ha="127.0.0.1:10912")
            assert resp.get_str("masterAddr") is None
            resp = await register(slave, ns, addr="127.0.0.1:10921", broker_id=1, ha="127.0.0.1:10922", topics={})
            assert resp.get_str("masterAddr") == "127.0.0.1:10911"
            assert resp.get_str("haServerAddr") == "127.0.0.1:10912"
            data = TopicRouteData.decode((await route(master, ns, "TopicA")).body)
            assert data.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911", 1: "127.0.0.1:10921"}
            # the master dies: the slave still serves reads of the topic
            await master.close()
            assert await eventually(lambda: _slave_only(slave, ns))
        finally:
            await master.close()
            await slave.close()


async def _slave_only(client, ns):
    resp = await route(client, ns, "TopicA")
    return resp.code == 0 and TopicRouteData.decode(resp.body).broker_datas[0].broker_addrs == {1: "127.0.0.1:10921"}


async def test_wipe_write_perm_and_delete_topic(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        broker = RemotingClient()
        try:
            version = DataVersion()
            await register(broker, ns, topics={"A": 4, "B": 4}, version=version)
            resp = await call(broker, ns, RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
            assert resp.code == 0 and resp.get_str("wipeTopicCount") == "2"
            assert TopicRouteData.decode((await route(broker, ns, "A")).body).queue_datas[0].perm == 4
            # a periodic re-registration with an unchanged snapshot keeps the wipe in force (as Java)
            await register(broker, ns, topics={"A": 4, "B": 4}, version=version)
            assert TopicRouteData.decode((await route(broker, ns, "A")).body).queue_datas[0].perm == 4
            resp = await call(broker, ns, RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
            assert resp.get_str("addTopicCount") == "2"
            assert TopicRouteData.decode((await route(broker, ns, "A")).body).queue_datas[0].perm == 6
            assert (await call(broker, ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "A"})).code == 0
            assert (await route(broker, ns, "A")).code == ResponseCode.TOPIC_NOT_EXIST
            assert (await route(broker, ns, "B")).code == ResponseCode.SUCCESS
        finally:
            await broker.close()


async def test_kv_config_and_order_topic_conf(tmp_path):
    config = _config(tmp_path, order_message_enable=True)
    async with NamesrvController(config, "127.0.0.1:0") as ns:
        c = RemotingClient()
        try:
            await register(c, ns, topics={"Ordered": 8})
            put = await call(c, ns, RequestCode.PUT_KV_CONFIG,
                             {"namespace": "ORDER_TOPIC_CONFIG", "key": "Ordered", "value": "broker-a:8"})
            assert put.code == 0
            got = await call(c, ns, RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "Ordered"})
            assert got.get_str("value") == "broker-a:8"
            data = TopicRouteData.decode((await route(c, ns, "Ordered")).body)
            assert data.order_topic_conf == "broker-a:8"
            # REGISTER_BROKER answers with the ORDER_TOPIC_CONFIG table
            resp = await register(c, ns, topics={"Ordered": 8})
            assert kv_table_decode(resp.body) == {"Ordered": "broker-a:8"}
            table = await call(c, ns, RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"})
            assert kv_table_decode(table.body) == {"Ordered": "broker-a:8"}
        finally:
            await c.close()
    # persisted, and reloaded by the next name server
    with open(tmp_path / "kvConfig.json", encoding="utf-8") as f:
        assert json.load(f) == {"configTable": {"ORDER_TOPIC_CONFIG": {"Ordered": "broker-a:8"}}}
    async with NamesrvController(config, "127.0.0.1:0") as ns:
        c = RemotingClient()
        try:
            got = await call(c, ns, RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "Ordered"})
            assert got.get_str("value") == "broker-a:8"
            assert (await call(c, ns, RequestCode.DELETE_KV_CONFIG,
                               {"namespace": "ORDER_TOPIC_CONFIG", "key": "Ordered"})).code == 0
            missing = await call(c, ns, RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "Ordered"})
            assert missing.code == ResponseCode.QUERY_NOT_FOUND and "Ordered" in missing.remark
        finally:
            await c.close()


async def test_order_topic_conf_needs_order_message_enable(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        c = RemotingClient()
        try:
            await register(c, ns, topics={"Ordered": 8})
            await call(c, ns, RequestCode.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "Ordered", "value": "x:1"})
            assert TopicRouteData.decode((await route(c, ns, "Ordered")).body).order_topic_conf is None
        finally:
            await c.close()


async def test_register_crc_compressed_and_java_bodies(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        c = RemotingClient()
        try:
            body = RegisterBrokerBody({}, DataVersion()).encode()
            bad = RemotingCommand.create_request(RequestCode.REGISTER_BROKER, {
                "clusterName": "C", "brokerName": "b", "brokerAddr": "127.0.0.1:1", "brokerId": 0,
                "bodyCrc32": (zlib.crc32(body) & 0x7FFFFFFF) ^ 1}, body)
            resp = await c.invoke(ns.listen_address, bad, 3)
            assert resp.code == ResponseCode.SYSTEM_ERROR and "crc32" in resp.remark
            # the unsigned and the signed int32 form of the CRC are accepted too
            for crc in (zlib.crc32(body), zlib.crc32(body) - (1 << 32)):
                ok = RemotingCommand.create_request(RequestCode.REGISTER_BROKER, {
                    "clusterName": "C", "brokerName": "b", "brokerAddr": "127.0.0.1:1", "brokerId": 0,
                    "bodyCrc32": crc}, body)
                assert (await c.invoke(ns.listen_address, ok, 3)).code == 0
            assert (await register(c, ns, topics={"Zipped": 2}, compressed=True)).code == 0
            assert TopicRouteData.decode((await route(c, ns, "Zipped")).body).queue_datas[0].read_queue_nums == 2
            # a Java 4.9 broker's fastjson body, as sent on the wire
            java = ('{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":3,'
                    '"stateVersion":0,"timestamp":1700000000000},"topicConfigTable":{"JavaTopic":{"order":false,'
                    '"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"JavaTopic",'
                    '"topicSysFlag":0,"writeQueueNums":4}}}}').encode()
            req = RemotingCommand.create_request(RequestCode.REGISTER_BROKER, {
                "clusterName": "DefaultCluster", "brokerName": "java-b", "brokerAddr": "127.0.0.1:10931",
                "brokerId": "0", "haServerAddr": "127.0.0.1:10932", "compressed": "false",
                "bodyCrc32": str(zlib.crc32(java) & 0x7FFFFFFF)}, java)
            assert (await c.invoke(ns.listen_address, req, 3)).code == 0
            data = TopicRouteData.decode((await route(c, ns, "JavaTopic")).body)
            assert data.broker_datas[0].broker_addrs == {0: "127.0.0.1:10931"}
            # QUERY_DATA_VERSION: unchanged version -> changed=false
            version = json.dumps({"counter": 3, "timestamp": 1700000000000}).encode()
            q = await call(c, ns, RequestCode.QUERY_DATA_VERSION, {
                "brokerAddr": "127.0.0.1:10931", "brokerName": "java-b", "clusterName": "DefaultCluster",
                "brokerId": 0}, version)
            assert q.get_bool("changed") is False and json.loads(q.body)["counter"] == 3
        finally:
            await c.close()


@pytest.mark.parametrize("code,ext,field", [
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {}, "topic"),
    (RequestCode.REGISTER_BROKER, {"clusterName": "C", "brokerName": "b", "brokerAddr": "h:1"}, "brokerId"),
    (RequestCode.REGISTER_BROKER, {"clusterName": "C", "brokerName": "b", "brokerAddr": "h:1", "brokerId": "zero"}, "zero"),
    (RequestCode.REGISTER_BROKER, {"clusterName": "C", "brokerName": "b", "brokerAddr": "nocolon", "brokerId": 0}, "nocolon"),
    (RequestCode.PUT_KV_CONFIG, {"namespace": "N"}, "key"),
    (RequestCode.WIPE_WRITE_PERM_OF_BROKER, {}, "brokerName"),
])
async def test_bad_requests_get_clear_errors(tmp_path, code, ext, field):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        c = RemotingClient()
        try:
            resp = await call(c, ns, code, ext)
            assert resp.code == ResponseCode.SYSTEM_ERROR and field in resp.remark
            assert (await call(c, ns, RequestCode.GET_BROKER_CLUSTER_INFO)).code == 0  # still serving
        finally:
            await c.close()


async def test_register_with_garbage_body_is_refused(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        c = RemotingClient()
        try:
            for body in (b"\x00\xff", b"[1,2]", b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":"x"}}}}'):
                req = RemotingCommand.create_request(RequestCode.REGISTER_BROKER, {
                    "clusterName": "C", "brokerName": "b", "brokerAddr": "127.0.0.1:1", "brokerId": 0}, body)
                resp = await c.invoke(ns.listen_address, req, 3)
                assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark
        finally:
            await c.close()


async def test_system_topic_list(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        c = RemotingClient()
        try:
            await register(c, ns, cluster="C1", name="b1", addr="127.0.0.1:1")
            body = json.loads((await call(c, ns, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)).body)
            assert body == {"topicList": ["C1", "b1"], "brokerAddr": "127.0.0.1:1"}
        finally:
            await c.close()


async def test_boot_line_logged(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="rmq.namesrv"):
        ns = NamesrvController(_config(tmp_path), "127.0.0.1:0")
        line = await ns.start()
        await ns.stop()
    assert line == BOOT_SUCCESS_LINE == "The Name Server boot success. serializeType=JSON"
    assert any(r.name == "rmq.namesrv" and r.getMessage() == BOOT_SUCCESS_LINE for r in caplog.records)


async def test_run_namesrv_prints_boot_line_and_serves(tmp_path, capsys):
    ready = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(run_namesrv(_config(tmp_path), "127.0.0.1:0", ready=ready))
    controller = await asyncio.wait_for(ready, 5)
    c = RemotingClient()
    try:
        assert (await call(c, controller, RequestCode.GET_BROKER_CLUSTER_INFO)).code == 0
    finally:
        await c.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert BOOT_SUCCESS_LINE in capsys.readouterr().out


def test_captures_route_requests_are_answerable():
    # every GET_ROUTEINFO_BY_TOPIC the C++ client sent decodes to a topic we can look up
    topics = set()
    for path in glob.glob(os.path.join(CAPTURES, "*.jsonl")):
        if ".client." in path:
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("dir") == "client->server" and rec.get("code") == 105:
                    cmd = RemotingCommand.decode(bytes.fromhex(rec["frame_hex"])[4:])
                    topics.add(cmd.get_str("topic"))
    assert {"CapTopic", "TBW102", "%RETRY%CID_CAP"} <= topics


async def test_namesrv_on_tcp_and_inproc_shares_routes(tmp_path):
    inproc = f"inproc://ns-dual-{os.getpid()}-{time.monotonic_ns()}"
    async with NamesrvController(_config(tmp_path), ["127.0.0.1:0", inproc]) as ns:
        tcp_addr, inproc_addr = ns.listen_addresses
        assert inproc_addr == inproc
        broker, reader = RemotingClient(), RemotingClient()
        try:
            await broker.invoke(tcp_addr, RemotingCommand.create_request(RequestCode.REGISTER_BROKER, {
                "clusterName": "C", "brokerName": "b", "brokerAddr": "127.0.0.1:10911", "brokerId": 0},
                RegisterBrokerBody.build({"Shared": {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}},
                                         DataVersion()).encode()), 3)
            resp = await reader.invoke(inproc_addr, RemotingCommand.create_request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Shared"}), 3)
            assert resp.code == ResponseCode.SUCCESS
        finally:
            await broker.close()
            await reader.close()


async def test_get_and_update_namesrv_config(tmp_path):
    async with NamesrvController(_config(tmp_path), "127.0.0.1:0") as ns:
        c = RemotingClient()
        try:
            text = (await call(c, ns, RequestCode.GET_NAMESRV_CONFIG)).body.decode()
            props = dict(line.split("=", 1) for line in text.splitlines())
            assert props["brokerChannelExpiredTime"] == "120000" and props["orderMessageEnable"] == "false"
            ok = await call(c, ns, RequestCode.UPDATE_NAMESRV_CONFIG, None,
                            b"orderMessageEnable=true\nbrokerChannelExpiredTime=30000\n")
            assert ok.code == 0
            assert ns.config.order_message_enable is True and ns.config.broker_channel_expired_time == 30000
            bad = await call(c, ns, RequestCode.UPDATE_NAMESRV_CONFIG, None, b"brokerChannelExpiredTime=soon")
            assert bad.code == ResponseCode.SYSTEM_ERROR and "soon" in bad.remark
            denied = await call(c, ns, RequestCode.UPDATE_NAMESRV_CONFIG, None, b"listenPort=1")
            assert denied.code == ResponseCode.NO_PERMISSION and "listenPort" in denied.remark
            assert ns.config.broker_channel_expired_time == 30000
        finally:
            await c.close()


def test_compressed_body_is_javas_deflate_layout():
    """RegisterBrokerBody.encode(true) of RocketMQ 4.9: a zlib stream (Deflater BEST_COMPRESSION)
    of int32 big-endian length-prefixed parts: DataVersion JSON, the topic count, one
    TopicConfig.encode() line per topic ("name read write perm filterType"), the filter servers."""
    import struct

    version = DataVersion(1700000000000, 7)
    raw_z = RegisterBrokerBody.encode_compressed(version, [("A", 4, 2, 6, "SINGLE_TAG"), ("B", 1, 1, 4, "MULTI_TAG")],
                                                 ["127.0.0.1:1"])
    assert raw_z[:2] == b"\x78\xda"  # zlib header of level 9, as java.util.zip.Deflater(9) writes
    raw = zlib.decompress(raw_z)
    pos = 0

    def take() -> bytes:
        nonlocal pos
        (n,) = struct.unpack_from(">i", raw, pos)
        pos += 4 + n
        return raw[pos - n:pos]

    assert json.loads(take()) == {"counter": 7, "timestamp": 1700000000000}
    (count,) = struct.unpack_from(">i", raw, pos)
    pos += 4
    assert count == 2 and [take() for _ in range(count)] == [b"A 4 2 6 SINGLE_TAG", b"B 1 1 4 MULTI_TAG"]
    assert json.loads(take()) == ["127.0.0.1:1"] and pos == len(raw)
    back = RegisterBrokerBody.decode(raw_z, compressed=True)
    assert back.data_version == version and back.topic_config_table["A"]["writeQueueNums"] == 2
