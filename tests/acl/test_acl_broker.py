"""ACL against real `rmq namesrv` + `rmq broker` processes (aclEnable=true, plain_acl.yml): the
official C++ client (set_session_credentials), rmq's Python, asyncio and admin clients, `rmq admin`'s
ACL commands, and the file changed on disk taking effect without a restart."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import time

import pytest
import yaml

from rmq_core import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer, aio
from rmq_core.admin import AdminClient
from rmq_core.admin.client import AdminError
from rmq_core.errors import MQBrokerError, RMQError
from rmq_core.plugins import get_plugin_manager, hookimpl
from rmq_core.remoting.codes import RequestCode
from rmq_core.remoting.command import RemotingCommand
from tests.admin.test_admin_cli import admin as run_admin, wait_for
from tests.compat.test_cpp_client import Driver
from tests.servers import NamesrvAndBroker

AK, SK = "RocketMQ", "12345678"
ADMIN_AK, ADMIN_SK = "rocketmq2", "87654321"
PLAIN_ACL = f"""\
globalWhiteRemoteAddresses:
  - 127.0.0.2
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - TopicOk=PUB|SUB
      - TopicDenied=DENY
      - TopicNew=PUB
    groupPerms:
      - GroupOk=SUB
      - GroupCpp=SUB
      - GroupPy=SUB
      - GroupAio=SUB
      - GroupNoSub=PUB
  - accessKey: {ADMIN_AK}
    secretKey: {ADMIN_SK}
    admin: true
  - accessKey: loopback-app
    secretKey: loopback-secret
    whiteRemoteAddress: 127.0.0.1
  - accessKey: remote-app
    secretKey: remote-secret
    whiteRemoteAddress: 127.0.0.2,10.1.1.*
    defaultTopicPerm: PUB
"""
TEAM_ACL = """\
accounts:
  - accessKey: team-app
    secretKey: team-secret
    defaultTopicPerm: DENY
    topicPerms: [TopicOk=PUB]
"""
FAST = dict(poll_name_server_interval=2.0, heartbeat_broker_interval=2.0, persist_consumer_offset_interval=1.0)


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acl")
    acl = tmp / "conf" / "plain_acl.yml"
    acl.parent.mkdir()
    acl.write_text(PLAIN_ACL)
    (tmp / "conf" / "acl").mkdir()  # $ROCKETMQ_HOME/conf/acl: read beside plainAclFile, as RocketMQ 4.9
    team = tmp / "conf" / "acl" / "team.yml"
    team.write_text(TEAM_ACL)
    c = NamesrvAndBroker(tmp, broker_props={"aclEnable": "true", "plainAclFile": str(acl), "rocketmqHome": str(tmp),
                                            "errorReplyDelayMs": "50", "defaultTopicQueueNums": "2"})
    c.acl_file, c.team_file = acl, team
    try:
        with AdminClient(c.namesrv, access_key=ADMIN_AK, secret_key=ADMIN_SK) as a:
            a.create_or_update_topic(c.broker_addrs[0], "TopicOk", read_queue_nums=2, write_queue_nums=2)
            a.create_or_update_topic(c.broker_addrs[0], "TopicDenied", read_queue_nums=2, write_queue_nums=2)
        yield c
    finally:
        c.stop()


def cpp(tmp_path, *args, credentials=(AK, SK)):
    env_ak = {} if credentials is None else {"CPP_ACCESS_KEY": credentials[0], "CPP_SECRET_KEY": credentials[1]}
    old = {k: os.environ.get(k) for k in ("CPP_ACCESS_KEY", "CPP_SECRET_KEY")}
    os.environ.update(env_ak)
    for k in old:
        if k not in env_ak:
            os.environ.pop(k, None)
    try:
        home = tmp_path / f"home-{time.monotonic_ns()}"
        d = Driver(home, *args)
        d.home = home
        return d
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cpp_log(d) -> str:
    """What the C++ client logged (~/logs/rocketmq-cpp): where it reports a broker's remark."""
    return "".join(p.read_text(errors="replace") for p in sorted(d.home.glob("logs/**/*")) if p.is_file())


def cpp_produce(cl, tmp_path, topic, n=1, credentials=(AK, SK)):
    """(one result per message, the client's log)."""
    spec = {"group": "PID_ACL", "catch": True, "messages": [{"body": f"cpp-{i}"} for i in range(n)]}
    d = cpp(tmp_path, "produce", cl.namesrv, topic, json.dumps(spec), credentials=credentials)
    items = d.finish(120)
    assert len(items) == n, (items, d.stderr_tail())
    return items, cpp_log(d)


def max_offset(cl, topic) -> int:
    with AdminClient(cl.namesrv, access_key=ADMIN_AK, secret_key=ADMIN_SK) as a:
        return sum(q.max_offset for q in a.topic_stats(topic))


# --- the official C++ client ---------------------------------------------------------------------------------
@pytest.mark.compat
def test_cpp_right_account_sends_and_consumes(cl, tmp_path):
    sent, _ = cpp_produce(cl, tmp_path, "TopicOk", 3)
    assert all(i.get("status") == 0 for i in sent), sent
    d = cpp(tmp_path, "consume", cl.namesrv, "TopicOk", "GroupCpp", "*", "CLUSTERING", 3, 60)
    d.finish(120)
    bodies = sorted(m["body"] for m in d.messages())
    assert {"cpp-0", "cpp-1", "cpp-2"} <= set(bodies), (d.items, d.stderr_tail())


@pytest.mark.compat
@pytest.mark.parametrize("topic, credentials, remark", [
    ("TopicOk", (AK, "wrong-secret"), "Check signature failed for accessKey=RocketMQ"),
    ("TopicDenied", (AK, SK), "No default permission for topic=TopicDenied: accessKey=RocketMQ needs PUB"),
    ("TopicOk", None, "No accessKey is configured"),
    ("TopicOk", ("nobody-here", SK), "No acl config for nobody-here"),
], ids=["wrong-secret", "deny-topic", "no-credentials", "unknown-account"])
def test_cpp_refusals_carry_their_remark_and_store_nothing(cl, tmp_path, topic, credentials, remark):
    before = max_offset(cl, topic)
    [item], log = cpp_produce(cl, tmp_path, topic, 1, credentials=credentials)
    # the send fails; the C++ client logs the broker's remark (processSendResponse error remark:...)
    assert "error" in item and f"remark:AclException: {remark}" in log, (item, log[-3000:])
    if credentials is None:  # the unsigned peer is outside globalWhiteRemoteAddresses (127.0.0.2 only)
        assert "127.0.0.1 is not in globalWhiteRemoteAddresses" in log
    assert max_offset(cl, topic) == before  # nothing of the refused send was stored
    [ok], _ = cpp_produce(cl, tmp_path, "TopicOk", 1)  # and the broker keeps serving
    assert ok.get("status") == 0, ok


@pytest.mark.compat
def test_cpp_group_without_sub_is_refused(cl, tmp_path):
    d = cpp(tmp_path, "pull", cl.namesrv, "TopicOk", "GroupNoSub", "*")
    remark = "AclException: No default permission for group=GroupNoSub: accessKey=RocketMQ needs SUB"
    try:
        wait_for(lambda: remark in cpp_log(d), 60, "the pull's refusal in the C++ client's log")
    finally:
        d.proc.kill()  # (it would retry the refused pull until its own deadline)
        items = d.finish(30)
    assert not [i for i in items if "body" in i], items
    [ok], _ = cpp_produce(cl, tmp_path, "TopicOk", 1)  # the broker keeps serving
    assert ok.get("status") == 0, ok


# --- rmq's clients ---------------------------------------------------------------------------------------------
def test_python_producer_and_consumers_sign(cl):
    with Producer("PG_ACL", namesrv=cl.namesrv, access_key=AK, secret_key=SK, **FAST) as p:
        for i in range(3):
            assert p.send(Message("TopicOk", f"py-{i}".encode())).status.name == "SEND_OK"
        f = p.send_async(Message("TopicOk", b"py-async"))
        assert f.result(30).status.name == "SEND_OK"
        with pytest.raises(MQBrokerError) as e:
            p.send(Message("TopicDenied", b"x"))
        assert "No default permission for topic=TopicDenied" in str(e.value)
        assert p.send(Message("TopicOk", b"after-refusal")).status.name == "SEND_OK"  # same connection serves on

    c = PullConsumer("GroupPy", namesrv=cl.namesrv, access_key=AK, secret_key=SK,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    c.subscribe("TopicOk", "*")
    c.start()
    try:
        seen = set()
        wait_for(lambda: seen.update(m.body for m in c.poll(timeout=1.0)) or {b"py-0", b"py-async"} <= seen,
                 60, "pull consumer sees the signed sends")
        c.commit()
    finally:
        c.shutdown()

    got = set()

    def listener(msgs):
        got.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    pc = PushConsumer("GroupOk", namesrv=cl.namesrv, access_key=AK, secret_key=SK,
                      consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    pc.subscribe("TopicOk", "*")
    pc.register_message_listener(listener)
    pc.start()
    try:
        wait_for(lambda: b"after-refusal" in got, 60, "push consumer gets the messages")
    finally:
        pc.shutdown()


def test_python_consumer_of_a_group_without_sub_is_refused(cl):
    c = PullConsumer("GroupNoSub", namesrv=cl.namesrv, access_key=AK, secret_key=SK,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    c.subscribe("TopicOk", "*")
    try:
        with pytest.raises(RMQError) as e:
            c.start()
            c.poll(timeout=3.0)
        assert "No default permission for group=GroupNoSub: accessKey=RocketMQ needs SUB" in str(e.value)
    finally:
        c.shutdown()


def test_wrong_secret_and_no_credentials_refused_for_python(cl):
    with Producer("PG_ACL_BAD", namesrv=cl.namesrv, access_key=AK, secret_key="not-the-secret",
                  retry_times_when_send_failed=0, **FAST) as p:
        with pytest.raises(MQBrokerError, match="Check signature failed for accessKey=RocketMQ"):
            p.send(Message("TopicOk", b"x"))
    with Producer("PG_ACL_NONE", namesrv=cl.namesrv, retry_times_when_send_failed=0, **FAST) as p:
        with pytest.raises(MQBrokerError, match="No accessKey is configured"):
            p.send(Message("TopicOk", b"x"))


def test_an_accounts_white_address_passes_without_a_valid_signature(cl):
    # as RocketMQ: from an address in its whiteRemoteAddress an account's requests pass unchecked
    with Producer("PG_ACL_LOOPBACK", namesrv=cl.namesrv, access_key="loopback-app", secret_key="not-its-secret",
                  **FAST) as p:
        assert p.send(Message("TopicOk", b"from-loopback")).status.name == "SEND_OK"
    # from any other address the signature is checked
    with Producer("PG_ACL_REMOTE", namesrv=cl.namesrv, access_key="remote-app", secret_key="not-its-secret",
                  retry_times_when_send_failed=0, **FAST) as p:
        with pytest.raises(MQBrokerError, match="Check signature failed for accessKey=remote-app"):
            p.send(Message("TopicOk", b"x"))


def test_aio_clients_sign(cl):
    async def main():
        async with aio.Producer("PG_ACL_AIO", namesrv=cl.namesrv, access_key=AK, secret_key=SK, **FAST) as p:
            r = await p.send(Message("TopicOk", b"aio-1"))
            assert r.status.name == "SEND_OK"
            with pytest.raises(MQBrokerError, match="topic=TopicDenied"):
                await p.send(Message("TopicDenied", b"x"))
        async with aio.PullConsumer("GroupAio", namesrv=cl.namesrv, access_key=AK, secret_key=SK,
                                    consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST) as c:
            c.subscribe("TopicOk", "*")
            async for msg in c:
                if msg.body == b"aio-1":
                    break

    asyncio.run(asyncio.wait_for(main(), 120))


def test_signed_send_auto_creates_a_topic_with_pub(cl):
    with Producer("PG_ACL_NEW", namesrv=cl.namesrv, access_key=AK, secret_key=SK, **FAST) as p:
        assert p.send(Message("TopicNew", b"first")).status.name == "SEND_OK"

    def stored():  # (the new topic's route reaches the name server with the broker's next registration)
        try:
            return max_offset(cl, "TopicNew") == 1
        except AdminError:
            return False
    wait_for(stored, 30, "TopicNew created and holding the message")


# --- admin -------------------------------------------------------------------------------------------------
def test_admin_only_requests_need_an_admin_account(cl):
    broker = cl.broker_addrs[0]
    with AdminClient(cl.namesrv, access_key=AK, secret_key=SK) as a:
        with pytest.raises(AdminError, match=r"Need admin permission for request code=17, but accessKey=RocketMQ is not"):
            a.create_or_update_topic(broker, "TopicByNonAdmin", read_queue_nums=1, write_queue_nums=1)
        with pytest.raises(AdminError, match="Need admin permission for request code=54"):
            a.acl_config(broker)  # (it shows the secret keys)
        assert a.acl_config_version(broker)[0].acl_file == str(cl.acl_file)  # any account may read the version
    rc, out, err = run_admin("updateTopic", "-b", broker, "-t", "TopicByNonAdmin", "--access-key", AK,
                             "--secret-key", SK, ns=cl.namesrv)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "Need admin permission" in err and "UPDATE_AND_CREATE_TOPIC" in err
    rc, out, err = run_admin("updateTopic", "-b", broker, "-t", "TopicByNobody", ns=cl.namesrv)
    assert rc == 1 and "No accessKey is configured" in err


def test_acl_commands_change_the_file_and_take_effect(cl, monkeypatch, tmp_path):
    broker = cl.broker_addrs[0]
    monkeypatch.setenv("RMQ_ACCESS_KEY", ADMIN_AK)
    monkeypatch.setenv("RMQ_SECRET_KEY", ADMIN_SK)
    rc, out, err = run_admin("updateAclConfig", "-b", broker, "-a", "newuser1", "-s", "newsecret1",
                             "-i", "DENY", "-t", "TopicOk=PUB", ns=cl.namesrv)
    assert rc == 0, err
    assert "create or update plain access config to" in out
    assert "newuser1" in cl.acl_file.read_text()
    with Producer("PG_ACL_NEWUSER", namesrv=cl.namesrv, access_key="newuser1", secret_key="newsecret1", **FAST) as p:
        assert p.send(Message("TopicOk", b"by-newuser1")).status.name == "SEND_OK"
    [row] = [r for r in json.loads(run_admin("getAclConfig", "-b", broker, "--json", ns=cl.namesrv)[1])
             if r["access_key"] == "newuser1"]
    assert row["topic_perms"] == "TopicOk=PUB" and row["default_topic_perm"] == "DENY"
    assert row["secret_key"] == "******" and row["admin"] is False  # masked unless asked; a JSON boolean
    rc, out, err = run_admin("getAclConfig", "-b", broker, ns=cl.namesrv)
    assert rc == 0 and "newuser1" in out and "Access Key" in out and "newsecret1" not in out and "******" in out
    [row] = [r for r in json.loads(run_admin("getAclConfig", "-b", broker, "--json", "--show-secrets",
                                             ns=cl.namesrv)[1]) if r["access_key"] == "newuser1"]
    assert row["secret_key"] == "newsecret1"
    versions = json.loads(run_admin("clusterAclConfigVersion", "-c", "DefaultCluster", "--json", ns=cl.namesrv)[1])
    assert versions[0]["acl_file_path"] == str(cl.acl_file) and versions[0]["acl_config_version_num"] >= 1
    rc, out, err = run_admin("updateAclConfig", "-b", broker, "-a", "newuser2", "-s", "short", ns=cl.namesrv)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "length should longer than 6" in err
    assert run_admin("deleteAclConfig", "-b", broker, "-a", "newuser1", ns=cl.namesrv)[0] == 0
    with Producer("PG_ACL_GONE", namesrv=cl.namesrv, access_key="newuser1", secret_key="newsecret1",
                  retry_times_when_send_failed=0, **FAST) as p:
        with pytest.raises(MQBrokerError, match="No acl config for newuser1"):
            p.send(Message("TopicOk", b"x"))
    # tools.yml, when neither flags nor environment name an account
    monkeypatch.delenv("RMQ_ACCESS_KEY")
    monkeypatch.delenv("RMQ_SECRET_KEY")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "tools.yml").write_text(f"accessKey: {ADMIN_AK}\nsecretKey: {ADMIN_SK}\n")
    monkeypatch.setenv("ROCKETMQ_HOME", str(tmp_path))
    assert run_admin("clusterAclConfigVersion", "-b", broker, ns=cl.namesrv)[0] == 0


def test_an_acl_dir_file_is_read_and_its_accounts_changed_there(cl, monkeypatch):
    broker = cl.broker_addrs[0]
    monkeypatch.setenv("RMQ_ACCESS_KEY", ADMIN_AK)
    monkeypatch.setenv("RMQ_SECRET_KEY", ADMIN_SK)
    with Producer("PG_ACL_TEAM", namesrv=cl.namesrv, access_key="team-app", secret_key="team-secret", **FAST) as p:
        assert p.send(Message("TopicOk", b"by-team-app")).status.name == "SEND_OK"
    versions = json.loads(run_admin("clusterAclConfigVersion", "-b", broker, "--json", ns=cl.namesrv)[1])
    assert [v["acl_file_path"] for v in versions] == [str(cl.acl_file), str(cl.team_file)]  # plainAclFile first
    rc, out, err = run_admin("updateAclConfig", "-b", broker, "-a", "team-app", "-t", "TopicOk=PUB,TopicDenied=DENY",
                             ns=cl.namesrv)
    assert rc == 0, err
    assert "TopicDenied=DENY" in cl.team_file.read_text() and "team-app" not in cl.acl_file.read_text()
    [team] = [v for v in json.loads(run_admin("clusterAclConfigVersion", "-b", broker, "--json", ns=cl.namesrv)[1])
              if v["acl_file_path"] == str(cl.team_file)]
    assert team["acl_config_version_num"] == 1
    [row] = [r for r in json.loads(run_admin("getAclConfig", "-b", broker, "--json", ns=cl.namesrv)[1])
             if r["access_key"] == "team-app"]
    assert row["topic_perms"] == "TopicOk=PUB,TopicDenied=DENY"
    assert run_admin("updateGlobalWhiteAddr", "-b", broker, "-g", "10.77.0.*", "-p", str(cl.team_file),
                     ns=cl.namesrv)[0] == 0
    assert "10.77.0.*" in cl.team_file.read_text() and "10.77.0.*" not in cl.acl_file.read_text()
    rc, out, err = run_admin("updateGlobalWhiteAddr", "-b", broker, "-g", "10.77.0.*", "-p", "/etc/other.yml",
                             ns=cl.namesrv)
    assert rc == 1 and "the ACL file /etc/other.yml is not one this broker reads" in err


def test_file_changed_on_disk_takes_effect_without_a_restart(cl):
    original = cl.acl_file.read_text()
    try:
        with Producer("PG_ACL_WHITE", namesrv=cl.namesrv, retry_times_when_send_failed=0, **FAST) as p:
            with pytest.raises(MQBrokerError, match="No accessKey is configured"):
                p.send(Message("TopicOk", b"x"))
            # 127.0.0.1 into the global white list: the unsigned producer passes
            data = yaml.safe_load(original)
            data["globalWhiteRemoteAddresses"].append("127.0.0.1")
            cl.acl_file.write_text(yaml.safe_dump(data))

            def unsigned_passes():
                try:
                    return p.send(Message("TopicOk", b"white-listed")).status.name == "SEND_OK"
                except MQBrokerError:
                    return False
            wait_for(unsigned_passes, 30, "the white-listed address passes unsigned")
            # a malformed file keeps the last good rules
            cl.acl_file.write_text(original + "  - accessKey: x\n")
            cl.brokers[0].wait_for("keeping the last good rules", 30)
            bad_line = len(original.splitlines()) + 1
            assert f"{cl.acl_file}:{bad_line}:" in cl.brokers[0].wait_for("keeping the last good rules")
            assert unsigned_passes()
        # replaced by rename: back to the original rules, the unsigned producer refused again
        tmp = cl.acl_file.with_suffix(".new")
        tmp.write_text(original)
        os.replace(tmp, cl.acl_file)
        with Producer("PG_ACL_WHITE2", namesrv=cl.namesrv, retry_times_when_send_failed=0, **FAST) as p:
            def refused():
                try:
                    p.send(Message("TopicOk", b"x"))
                    return False
                except MQBrokerError as e:
                    return "No accessKey is configured" in str(e)
            wait_for(refused, 30, "the original rules back")
    finally:
        cl.acl_file.write_text(original)


class _AddsAField:
    """A global client hook that adds an ext field to every request (before the signer signs a send)."""

    sends = 0

    @hookimpl
    def rmq_client_before_request(self, remote_addr, request):
        if request.code == RequestCode.SEND_MESSAGE_V2:
            self.sends += 1
        request.ext_fields["OnsChannel"] = "HOOKED"


def test_sends_are_signed_as_written_and_a_hooks_change_is_signed_too(cl, monkeypatch):
    from rmq_core.remoting.steps import FrameStep

    passed = collections.Counter()  # (FrameStep method, request code) of each request it was handed
    real_before, real_request = FrameStep.before, FrameStep.before_request

    def before(self, frame):
        passed["before", RemotingCommand.decode(bytes(frame)[4:]).code] += 1
        return real_before(self, frame)

    def before_request(self, request):
        passed["before_request", request.code] += 1
        return real_request(self, request)

    monkeypatch.setattr(FrameStep, "before", before)
    monkeypatch.setattr(FrameStep, "before_request", before_request)
    with Producer("PG_ACL_BUILT", namesrv=cl.namesrv, access_key=AK, secret_key=SK, instance_name="acl-built",
                  **FAST) as p:
        results = [p.send(Message("TopicOk", b"built-%d" % i)) for i in range(3)]
        results += [f.result(30) for f in [p.send_async(Message("TopicOk", b"built-a%d" % i)) for i in range(5)]]
    assert all(r.status.name == "SEND_OK" for r in results)
    # every send was signed as it was written, no frame decoded: the signer is the only step, so
    # the native first attempt's SendHeader applies it (no step call: RequestSteps.header_signer);
    # the general path's sends (a queue's first) reach it before they are written
    assert passed["before", RequestCode.SEND_MESSAGE_V2] == 0
    assert passed["before_request", RequestCode.SEND_MESSAGE_V2] < 8

    # auto_batch: a batch of gathered sends reaches the signer before it is written, likewise
    batches = collections.Counter()
    real_write_batch = Producer._write_batch

    def counted_batch(self, *args, **kwargs):
        batches["written"] += 1
        return real_write_batch(self, *args, **kwargs)

    monkeypatch.setattr(Producer, "_write_batch", counted_batch)
    with Producer("PG_ACL_BATCHED", namesrv=cl.namesrv, access_key=AK, secret_key=SK, instance_name="acl-batched",
                  auto_batch=True, **FAST) as p:
        p.send(Message("TopicOk", b"route"))
        results = [f.result(30) for f in [p.send_async(Message("TopicOk", b"batched-%d" % i)) for i in range(400)]]
    assert all(r.status.name == "SEND_OK" for r in results)
    assert batches["written"] >= 1
    assert passed["before", RequestCode.SEND_BATCH_MESSAGE] == 0
    assert passed["before_request", RequestCode.SEND_BATCH_MESSAGE] >= batches["written"]

    hook = _AddsAField()
    get_plugin_manager().register(hook, name="test-acl-adds-a-field")
    try:
        with Producer("PG_ACL_HOOKED", namesrv=cl.namesrv, access_key=AK, secret_key=SK,
                      instance_name="acl-hooked", **FAST) as p:
            results = [p.send(Message("TopicOk", b"hooked-%d" % i)) for i in range(3)]
            results += [f.result(30) for f in [p.send_async(Message("TopicOk", b"hooked-a%d" % i)) for i in range(5)]]
    finally:
        get_plugin_manager().unregister(hook)
    # the hook's field is signed with the others, and the broker verified that
    assert all(r.status.name == "SEND_OK" for r in results)
    assert passed["before", RequestCode.SEND_MESSAGE_V2] == 0
    # (with a hook beside the signer, every send reaches the steps before it is written: the native
    # first attempt runs them itself - they have no after() - the general path through before_request)
    assert hook.sends >= 8
