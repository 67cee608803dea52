"""What an operator meets first on the command line and in a client's errors, against real `rmq`
processes: `rmq --version`, help pages, "did you mean", `rmq broker` reading NAMESRV_ADDR, the boot
warning of servers reachable from other hosts, a client given a broker's port as its name server,
a broker group without a master, one wording of a refused connection."""
from __future__ import annotations

import contextlib
import gc
import io
import logging
import zlib

import pytest

from rmq_core import Message, Producer
from rmq_core.cli import main
from rmq_core.errors import IllegalArgumentError, MQClientError
from rmq_core.message import TopicValidator
from rmq_core.remoting.body import DataVersion, RegisterBrokerBody
from rmq_core.remoting.codes import RequestCode
from tests.servers import RmqProcess, free_port, write_conf


def run(*argv):
    """`rmq ...` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as e:  # argparse: --version, -h, usage errors
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def test_version_help_pages_and_did_you_mean():
    from rmq_core import __version__

    assert run("--version") == (0, f"rmq {__version__}\n", "")
    for command, words in (("namesrv", "brokers register"), ("broker", "NAMESRV_ADDR"),
                           ("standalone", "A name server and a broker in one process")):
        rc, out, _ = run(command, "-h")
        assert rc == 0 and words in " ".join(out.split())
    rc, _, err = run("admin", "topicLis")
    assert rc == 2 and "invalid choice: 'topicLis' (did you mean 'topicList'?)" in err
    assert "updateBrokerConfig" not in err  # not the list of every command
    rc, _, err = run("namesrvv")
    assert rc == 2 and "(did you mean 'namesrv'?)" in err


def test_topic_name_error_says_ascii_letters():
    with pytest.raises(IllegalArgumentError) as ei:
        TopicValidator.check_topic("café")
    assert str(ei.value) == ("bad topic name 'café': only ASCII letters (a-z, A-Z), digits, '%', '|', '_' and '-' "
                             "are allowed")


@pytest.fixture(scope="module")
def exposed(tmp_path_factory):
    """`rmq namesrv` and `rmq broker` bound to 0.0.0.0 (reached here only through 127.0.0.1), the
    broker given its name server only by NAMESRV_ADDR."""
    tmp = tmp_path_factory.mktemp("exposed")
    ns_port, port = free_port(), free_port()
    ns = RmqProcess(["-v", "namesrv", "--listen", f"0.0.0.0:{ns_port}"], ("The Name Server boot success",),
                    env={"HOME": str(tmp)})
    broker = None
    try:
        ns.wait_boot()
        conf = write_conf(tmp / "broker.conf", {
            "brokerIP1": "127.0.0.1", "listenPort": port, "haListenPort": free_port(),
            "storePathRootDir": tmp / "store", "mappedFileSizeCommitLog": 4 * 1024 * 1024,
            "maxHashSlotNum": 1000, "maxIndexNum": 4000})
        broker = RmqProcess(["broker", "-c", conf, "--listen-host", "0.0.0.0"],
                            env={"NAMESRV_ADDR": f"127.0.0.1:{ns_port}"})
        broker.wait_boot()
        yield ns, broker, f"127.0.0.1:{ns_port}", f"127.0.0.1:{port}"
    finally:
        if broker is not None:
            broker.terminate()
        ns.terminate()


def test_servers_reachable_from_other_hosts_warn_and_the_broker_reads_namesrv_addr(exposed):
    ns, broker, namesrv, broker_addr = exposed
    assert any("WARNING rmq.namesrv - the name server listens on 0.0.0.0:" in l and "checks no ACL" in l
               for l in ns.lines)
    assert any("WARNING rmq.broker - ACL is off (aclEnable=false) and the broker listens on 0.0.0.0:" in l
               for l in broker.lines)
    assert broker.wait_for("boot success").endswith(f"name server is {namesrv}")  # (NAMESRV_ADDR)
    # rmq's own server process keeps the collector off its tables
    assert "garbage collector:" in ns.wait_for("long-lived objects frozen")
    rc, out, err = run("admin", "clusterList", "-n", namesrv, "--json")
    assert rc == 0 and broker_addr in out, err


def test_a_client_given_a_broker_as_its_name_server_is_told_so(exposed, caplog):
    _, _, _, broker_addr = exposed
    with Producer("PG_AT_BROKER", namesrv=broker_addr, mq_client_api_timeout=5.0) as p:
        with caplog.at_level(logging.WARNING, logger="rmq"):
            with pytest.raises(MQClientError) as ei:
                p.send(Message("TopicAnywhere", b"x"))
    assert str(ei.value) == (
        f"cannot get the route of topic 'TopicAnywhere': the name server {broker_addr} answered: request code "
        "GET_ROUTEINFO_BY_TOPIC(105) is a name server's: this address is a broker, not a name server (a name "
        "server listens on port 9876 by default)")
    assert [r for r in caplog.records if r.name.startswith("rmq")] == []  # one report: the exception
    rc, _, err = run("admin", "topicList", "-n", broker_addr)
    assert rc == 1 and "this address is a broker, not a name server" in err


def test_a_refused_connection_is_worded_one_way(exposed, caplog):
    far = f"127.0.0.1:{free_port()}"
    with Producer("PG_REFUSED", namesrv=far) as p:
        with caplog.at_level(logging.WARNING, logger="rmq"):
            with pytest.raises(MQClientError) as ei:
                p.send(Message("TopicAnywhere", b"x"))
    assert str(ei.value) == (f"cannot get the route of topic 'TopicAnywhere': cannot reach the name server {far}: "
                             f"connect to {far} failed: Connection refused")
    assert [r for r in caplog.records if r.name.startswith("rmq")] == []
    rc, _, err = run("admin", "topicList", "-n", far)
    assert rc == 1 and f"connect to {far} failed: Connection refused" in err and "Errno" not in err


def test_a_reset_connection_is_worded_without_its_errno():
    """A peer that accepts and resets the connection (SO_LINGER 0): the socket error's text only."""
    import socket
    import struct
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    addr = f"127.0.0.1:{srv.getsockname()[1]}"

    def reset_each():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(1)
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()

    threading.Thread(target=reset_each, daemon=True).start()
    try:
        rc, _, err = run("admin", "topicList", "-n", addr)
    finally:
        srv.close()
    assert rc == 1 and f"to {addr} failed: Connection reset by peer" in err and "Errno" not in err


def _register(admin, ns, broker_id, addr, state_version=0, topics=("TopicOnSlave",)):
    table = {t: {"topicName": t, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicFilterType": "SINGLE_TAG",
                 "topicSysFlag": 0, "order": False} for t in topics}
    body = RegisterBrokerBody(table, DataVersion(state_version=state_version)).encode()
    r = admin.invoke(ns, RequestCode.REGISTER_BROKER, {
        "clusterName": "DefaultCluster", "brokerName": "broker-nm", "brokerAddr": addr, "brokerId": broker_id,
        "haServerAddr": addr, "compressed": "false", "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF}, body)
    assert r.code == 0, r.remark


@pytest.mark.parametrize("controller_mode", [False, True], ids=["manual", "controller"])
def test_a_group_without_a_master_is_named(tmp_path, controller_mode):
    """The master of the only group holding a topic is gone, its slave still registered: the
    producer names the group and says there is no master (and, in controller mode, that one is
    being elected) - not "no route info ... create the topic first"."""
    from rmq_core.admin import AdminClient

    namesrv = f"127.0.0.1:{free_port()}"
    ns = RmqProcess(["namesrv", "--listen", namesrv], ("The Name Server boot success",), env={"HOME": str(tmp_path)})
    try:
        ns.wait_boot()
        master, slave = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        with AdminClient(namesrv) as admin:
            _register(admin, namesrv, 0, master, state_version=3 if controller_mode else 0)
            _register(admin, namesrv, 1, slave, state_version=3 if controller_mode else 0)
            r = admin.invoke(namesrv, RequestCode.UNREGISTER_BROKER, {
                "clusterName": "DefaultCluster", "brokerName": "broker-nm", "brokerAddr": master, "brokerId": 0})
            assert r.code == 0
            # (while this connection, the slave's registration, stays open)
            with Producer("PG_NO_MASTER", namesrv=namesrv) as p:
                with pytest.raises(MQClientError) as ei:
                    p.send(Message("TopicOnSlave", b"x"))
        why = ("a new master is being elected (controller mode): retry in a few seconds" if controller_mode
               else "start the master again (a slave is read-only)")
        assert str(ei.value) == (f"cannot send to topic 'TopicOnSlave': broker group broker-nm has no master "
                                 f"(only slaves registered: {slave}); {why}")
    finally:
        ns.terminate()


def test_an_embedded_name_server_and_broker_leave_the_collector_alone(tmp_path):
    from rmq_core.embedded import Cluster

    before = gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()
    c = Cluster(str(tmp_path / "store"), {"mappedFileSizeCommitLog": str(4 * 1024 * 1024),
                                          "maxHashSlotNum": "1000", "maxIndexNum": "4000"})
    c.start()
    try:
        with Producer("PG_EMBEDDED_GC", namesrv=c.tcp_namesrv) as p:
            p.send(Message("TopicEmbeddedGc", b"x"))
        assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before
    finally:
        c.stop()


CONSUMER_OF_A_MISSING_TOPIC = """
import sys, time
from rmq_core import ConsumeStatus, PushConsumer
from rmq_core.embedded import Cluster
c = Cluster(sys.argv[1], {"mappedFileSizeCommitLog": str(4 * 1024 * 1024), "maxHashSlotNum": "1000",
                          "maxIndexNum": "4000"})
c.start()
pc = PushConsumer("CG_MISSING", namesrv=c.tcp_namesrv)
pc.subscribe("TopicMissing", "*")
pc.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
pc.start()
print("started", flush=True)
time.sleep(60)
"""


def test_a_program_without_logging_sees_rmq_warnings_with_their_logger_names(tmp_path):
    """A user's program that configured no logging: the consumer's warning reaches stderr once,
    named (Python's last-resort handler would print the bare message)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", CONSUMER_OF_A_MISSING_TOPIC, str(tmp_path / "store")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import threading

    guard = threading.Timer(60, proc.kill)  # (a program that never logs ends the wait, and the test fails)
    guard.start()
    try:
        line = proc.stderr.readline()  # the first line: the rebalance's warning
    finally:
        guard.cancel()
        proc.kill()
        proc.wait()
    assert line == "rmq.client.rebalance WARNING: doRebalance, CG_MISSING, but the topic[TopicMissing] does not exist\n"
