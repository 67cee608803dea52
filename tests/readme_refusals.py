"""Real runs behind the README's refusal table (tests/test_readme.py): for each row, the texts rmq
prints for that bad input, produced against real servers.  Addresses chosen here are written back as
the README's (127.0.0.1:9875 for a closed name-server port, 127.0.0.1:10910 for a broker the routes
name but no client reaches)."""
from __future__ import annotations

import subprocess
import sys

import rmq_core
from rmq_core import ConsumeStatus, Message, MessageSelector, Producer, PushConsumer
from rmq_core.admin import AdminClient
from tests.servers import UnreachableBroker, free_port


def _error(fn) -> str:
    try:
        fn()
    except Exception as e:  # the text a user sees
        return str(e)
    raise AssertionError(f"{fn} did not fail")


def _rmq(args, cwd) -> str:
    r = subprocess.run([sys.executable, "-m", "rmq_core.cli", *args], capture_output=True, text=True, cwd=cwd,
                       timeout=120)
    assert r.returncode != 0, r
    return r.stderr.strip()


def _consumer(ns, group, **kw):
    c = PushConsumer(group, namesrv=ns, **kw)
    c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    return c


def _console_login_refusals(ns: str, tmp) -> list[str]:
    import json
    import urllib.error
    import urllib.request

    from rmq_core.dashboard import serve
    from rmq_core.dashboard.auth import add_user

    add_user(str(tmp / "console-users"), "ops", "right-password")
    console = serve(ns, "127.0.0.1", 0, users_file=str(tmp / "console-users"))
    texts = []
    try:
        for path, body in (("api/login", b'{"user": "ops", "password": "wrong"}'), ("api/topics", None)):
            try:
                urllib.request.urlopen(urllib.request.Request(console.url + path, data=body), timeout=20)
            except urllib.error.HTTPError as e:
                assert e.code == 401
                texts.append(json.loads(e.read())["error"])
    finally:
        console.stop()
    return texts


def real_texts(live: dict, tmp) -> dict[str, list[str]]:
    ns, broker = live["ns"], live["broker"]
    out: dict[str, list[str]] = {}
    closed = free_port()

    def send(msg, **kw):
        with Producer("ReadmeRefusals", namesrv=ns, **kw) as p:
            return p.send(msg)

    send(Message("TopicA", b"seed"))  # TopicA exists on the live broker (its consumers heartbeat there)

    def no_namesrv():
        with Producer("ReadmeRefusals", namesrv=f"127.0.0.1:{closed}", mq_client_api_timeout=5.0) as p:
            p.send(Message("TopicA", b"x"))
    out["Name server unreachable"] = [_error(no_namesrv).replace(f"127.0.0.1:{closed}", "127.0.0.1:9875")]
    with UnreachableBroker(tmp) as far:
        def send_far():
            with Producer("ReadmeRefusals", namesrv=far.namesrv) as p:
                p.send(Message("TopicA", b"x"))

        def consume_far():
            c = _consumer(far.namesrv, "ReadmeFar")
            c.subscribe("TopicA", "*")
            try:
                c.start()
            finally:
                c.shutdown()
        texts = [_error(send_far), _error(consume_far),
                 _rmq(["admin", "brokerStatus", "-n", far.namesrv, "-b", far.broker_addr], tmp)]
        out["A broker the routes name but this client cannot reach (e.g. its `brokerIP1`)"] = [t.replace(far.broker_addr, "127.0.0.1:10910") for t in texts]
    out["Empty body"] = [_error(lambda: send(Message("TopicA", b"")))]
    out["Oversize message"] = [_error(lambda: send(Message("TopicA", b"x" * 5000), max_message_size=4096))]
    with rmq_core.standalone(store=str(tmp / "small-max"), max_message_size=1024) as small:
        def big():
            with Producer("ReadmeRefusals", namesrv=small.namesrv) as p:
                p.send(Message("TopicA", b"x" * 2000))
        out["Oversize message"].append(_error(big))
        out["A second broker on one store"] = [_error(lambda: rmq_core.standalone(store=str(tmp / "small-max")).start())]
    out["Bad topic name"] = [_error(lambda: send(Message("bad topic!", b"x")))]
    out["Sending to a system topic"] = [_error(lambda: send(Message("SCHEDULE_TOPIC_XXXX", b"x")))]
    out["Negative delay level"] = [_error(lambda: send(Message("TopicA", b"x", delay_time_level=-1)))]
    out["Reserved property name"] = [_error(lambda: send(Message("TopicA", b"x", properties={"DELAY": "1"})))]

    def mixed():
        with Producer("ReadmeRefusals", namesrv=ns) as p:
            p.send_batch([Message("TopicA", b"x"), Message("TopicB", b"y")])
    out["Mixed topics in a batch"] = [_error(mixed)]
    out["Bad SQL92 expression"] = [_error(lambda: _consumer(ns, "ReadmeSql").subscribe("TopicA", MessageSelector.by_sql("a >> 1")))]

    def sql_on_plain_broker():
        c = _consumer(ns, "ReadmeSql")
        c.subscribe("TopicA", MessageSelector.by_sql("a > 1"))
        try:
            c.start()
        finally:
            c.shutdown()
    out["SQL92 on a broker without property filtering"] = [
        _error(sql_on_plain_broker).replace(ns, "127.0.0.1:9876").replace(broker, "127.0.0.1:10911")]

    def at_a_broker():
        with Producer("ReadmeAtBroker", namesrv=broker) as p:
            p.send(Message("TopicA", b"x"))
    out["A broker's address given as the name server"] = [_error(at_a_broker).replace(broker, "127.0.0.1:10911"),
                                                          _rmq(["admin", "topicList", "-n", broker], tmp)]
    out["Mistyped `rmq admin` command"] = [_rmq(["admin", "topicLis"], tmp)]

    def bad_plugin():
        c = _consumer(ns, "ReadmePlugin", allocate_strategy="nope")
        c.subscribe("TopicA", "*")
        try:
            c.start()
        finally:
            c.shutdown()
    out["Unknown plugin name"] = [_error(bad_plugin)]
    out["Unknown client setting"] = [_error(lambda: Producer("ReadmeRefusals", namesrv=ns, send_timeout=3))]
    (tmp / "broker.conf").write_text("brokerNam=broker-a\n")
    out["Unknown `broker.conf` key"] = [_rmq(["broker", "-n", ns, "-c", "broker.conf"], tmp)]
    (tmp / "broker.conf").write_text(f"flushDiskType=SOMETIMES\nstorePathRootDir={tmp / 'bad-value'}\n")
    out["Bad `broker.conf` value"] = [_rmq(["broker", "-n", ns, "-c", "broker.conf"], tmp)]
    out["Unknown setting from Python"] = [_error(lambda: rmq_core.standalone(store=str(tmp / "x"), mapped_file_size=1))]
    with AdminClient(ns) as admin:
        out["Unknown or bad key in `updateBrokerConfig`"] = [
            _error(lambda: admin.update_broker_config(broker, {"maxMessageSiz": "1"})),
            _error(lambda: admin.update_broker_config(broker, {"maxMessageSize": "big"})),
        ]
    out["Port in use"] = [_rmq(["namesrv", "--listen", ns], tmp).replace(ns, "127.0.0.1:9876")]
    out["The console on an address other than loopback without a login"] = [
        _rmq(["dashboard", "-n", ns, "--listen", f"0.0.0.0:{free_port()}"], tmp)]
    out["A wrong password on the console's login page"] = _console_login_refusals(ns, tmp)
    acl = tmp / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: orders-app\n    secretKey: short\n")
    (tmp / "broker.conf").write_text(f"aclEnable=true\nplainAclFile={acl}\nstorePathRootDir={tmp / 'acl-bad'}\n")
    out["A `plain_acl.yml` that does not load"] = [_rmq(["broker", "-n", ns, "-c", "broker.conf"], tmp)]
    acl.write_text("accounts:\n  - accessKey: orders-app\n    secretKey: orders-secret\n    defaultTopicPerm: DENY\n"
                   "    topicPerms: [Orders=PUB]\n")
    with rmq_core.standalone(store=str(tmp / "acl"), acl_enable=True, plain_acl_file=str(acl)) as cluster:
        def acl_send(topic, secret="orders-secret"):
            with Producer("ReadmeAcl", namesrv=cluster.namesrv, access_key="orders-app", secret_key=secret,
                          retry_times_when_send_failed=0) as p:
                p.send(Message(topic, b"x"))

        def acl_admin():
            with AdminClient(cluster.namesrv, access_key="orders-app", secret_key="orders-secret") as admin:
                admin.create_or_update_topic(cluster.broker_addr, "Orders")
        out["A request ACL refuses"] = [_error(lambda: acl_send("Orders", "wrong-secret")),
                                        _error(lambda: acl_send("Payments")), _error(acl_admin)]
    return out


