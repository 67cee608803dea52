"""Errors that name the real cause (issue 24): an unreachable name server or broker is named with
its address and the socket error on every client surface (sync, aio, admin, Spark), config errors
name the file or setting and the key and suggest the nearest known name, and `rmq` output into a
reader that went away ends quietly."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

import rmq_core
from rmq_core import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer, aio
from rmq_core.admin import AdminClient
from rmq_core.errors import ConfigError, RMQError
from tests.servers import RmqProcess, UnreachableBroker, free_port


def _error(fn) -> str:
    with pytest.raises(RMQError) as info:
        fn()
    return str(info.value)


def _rmq(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmq_core.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def _started(consumer):
    consumer.subscribe("TopicA", "*")
    if isinstance(consumer, PushConsumer):
        consumer.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    try:
        consumer.start()
    finally:
        consumer.shutdown()


def test_an_unreachable_name_server_is_named_with_the_socket_error_everywhere():
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there

    def send():
        with Producer("ErrPG", namesrv=addr) as p:
            p.send(Message("TopicA", b"x"))

    async def aio_send():
        async with aio.Producer("ErrPG", namesrv=addr) as p:
            await p.send(Message("TopicA", b"x"))

    async def aio_pull():
        c = aio.PullConsumer("ErrCG", namesrv=addr)
        c.subscribe("TopicA", "*")
        async with c:
            pass

    def admin():
        with AdminClient(addr) as a:
            a.topic_stats("TopicA")

    import spark_plugin

    texts = {
        "Producer": _error(send),
        "PushConsumer": _error(lambda: _started(PushConsumer("ErrCG", namesrv=addr))),
        "PullConsumer": _error(lambda: _started(PullConsumer("ErrCG", namesrv=addr))),
        "aio.Producer": _error(lambda: asyncio.run(aio_send())),
        "aio.PullConsumer": _error(lambda: asyncio.run(aio_pull())),
        "AdminClient": _error(admin),
        "spark_plugin": _error(lambda: spark_plugin.offset_ranges(addr, "TopicA")),
    }
    cli = _rmq("admin", "topicStatus", "-t", "TopicA", "-n", addr)
    assert cli.returncode == 1
    texts["rmq admin"] = cli.stderr
    for surface, text in texts.items():
        assert addr in text and "Connection refused" in text, f"{surface}: {text}"
        assert "create the topic first" not in text, f"{surface}: {text}"
    assert texts["Producer"] == (f"cannot get the route of topic 'TopicA': cannot reach the name server {addr}: "
                                 f"connect to {addr} failed: Connection refused")


def test_a_broker_the_routes_name_but_no_client_reaches_is_named(tmp_path):
    with UnreachableBroker(tmp_path) as far:
        def send():
            with Producer("ErrPG", namesrv=far.namesrv) as p:
                p.send(Message("TopicA", b"x"))

        async def aio_send():
            async with aio.Producer("ErrPG", namesrv=far.namesrv) as p:
                await p.send(Message("TopicA", b"x"))

        texts = {
            "Producer": _error(send),
            "aio.Producer": _error(lambda: asyncio.run(aio_send())),
            "PushConsumer": _error(lambda: _started(PushConsumer("ErrCG", namesrv=far.namesrv))),
            "rmq admin": _rmq("admin", "brokerStatus", "-b", far.broker_addr, "-n", far.namesrv).stderr,
        }
    for surface, text in texts.items():
        assert far.broker_addr in text and "Connection refused" in text, f"{surface}: {text}"
    # the cached connect failure keeps its cause (a retry within the back-off says why, not just "moments ago")
    assert texts["Producer"].startswith("send to topic 'TopicA' failed after 3 attempt(s)")
    assert texts["PushConsumer"].startswith(f"no broker reachable: broker broker-a ({far.broker_addr}): ")


# --- config errors ------------------------------------------------------------------------------------------
def test_broker_conf_errors_name_the_file_the_key_and_the_accepted_values(tmp_path):
    conf = tmp_path / "broker.conf"
    cases = {
        "flushDiskType=SOMETIMES": f"rmq broker: error: {conf}: bad value 'SOMETIMES' for flushDiskType "
                                   f"(expected ASYNC_FLUSH | SYNC_FLUSH)",
        "brokerNam=broker-a": f"rmq broker: error: {conf}: unknown key 'brokerNam' (did you mean 'brokerName'?)",
        "mappedFileSizeCommitLog=0": f"rmq broker: error: {conf}: mappedFileSizeCommitLog must be > 0, got 0",
        "deleteWhen=4am": f"rmq broker: error: {conf}: bad value '4am' for deleteWhen (expected hours of the day "
                          f"0..23 separated by ';', e.g. 04 or 04;16)",
    }
    for line, expected in cases.items():
        conf.write_text(f"storePathRootDir={tmp_path / 'store'}\n{line}\n")
        r = _rmq("broker", "-n", "127.0.0.1:9", "-c", str(conf))
        assert (r.returncode, r.stderr.strip()) == (2, expected)
    nsconf = tmp_path / "namesrv.conf"
    nsconf.write_text("listenPrt=9876\n")
    r = _rmq("namesrv", "--listen", f"127.0.0.1:{free_port()}", "-c", str(nsconf))
    assert (r.returncode, r.stderr.strip()) == (
        2, f"rmq namesrv: error: {nsconf}: unknown key 'listenPrt' (did you mean 'listenPort'?)")


def test_settings_from_python_are_named_as_settings_with_the_nearest_known_name(tmp_path):
    with pytest.raises(ConfigError) as e:
        rmq_core.standalone(store=str(tmp_path), flush_disk_type="SOMETIMES")
    assert str(e.value) == "bad value 'SOMETIMES' for setting flush_disk_type (expected ASYNC_FLUSH | SYNC_FLUSH)"
    with pytest.raises(ConfigError, match=r"^unknown setting 'mapped_file_size' \(did you mean 'mapped_file_size_commit_log'\?\)$"):
        rmq_core.standalone(store=str(tmp_path), mapped_file_size=1)
    with pytest.raises(ConfigError) as e:
        rmq_core.standalone(str(tmp_path), {"maxMessageSise": "1"})
    assert str(e.value) == "broker config: unknown key 'maxMessageSise' (did you mean 'maxMessageSize'?)"
    with pytest.raises(ConfigError) as e:
        Producer("PG", namesrv="127.0.0.1:9876", send_timeout=3)
    assert str(e.value).startswith("Producer: unknown setting 'send_timeout' (did you mean 'send_msg_timeout'?); "
                                   "accepted here besides the Producer settings: ")
    with pytest.raises(ConfigError, match=r"unknown setting 'pull_batchsize' \(did you mean 'pull_batch_size'\?\)"):
        PushConsumer("CG", namesrv="127.0.0.1:9876", pull_batchsize=32)
    with pytest.raises(ConfigError, match=r"unknown setting 'zzz';"):  # nothing near: no guess
        Producer("PG", namesrv="127.0.0.1:9876", zzz=1)


# --- output into a reader that went away ----------------------------------------------------------------------
def test_cli_output_into_a_closed_reader_ends_quietly_with_exit_0(tmp_path):
    ns, broker = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = RmqProcess(["standalone", "--store", str(tmp_path / "store"), "--namesrv-listen", ns,
                         "--broker-listen", broker])
    try:
        server.wait_boot(60)
        for args in (["admin", "consumerProgress"], ["admin", "topicList"], ["admin", "getBrokerConfig", "-b", broker]):
            # the reader is gone before rmq writes (as `| head` once it has its lines)
            proc = subprocess.Popen([sys.executable, "-m", "rmq_core.cli", *args, "-n", ns], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            proc.stdout.close()
            err = proc.stderr.read()
            assert (proc.wait(60), err) == (0, ""), args
        r = subprocess.run(f"{sys.executable} -m rmq_core.cli admin getBrokerConfig -b {broker} -n {ns} | head -n 2",
                           shell=True, capture_output=True, text=True, executable="/bin/bash", timeout=60)
        assert r.returncode == 0 and r.stderr == "" and len(r.stdout.splitlines()) == 2
    finally:
        assert server.terminate() == 0


def test_consumer_signatures_show_the_shared_settings():
    """help() and inspect show a consumer's every setting with its own default: its own
    parameters, then those both consumers share (ConsumerBase.SHARED_SETTINGS), then the client's."""
    import inspect

    from rmq_core import PullConsumer, PushConsumer

    for cls, suspend in ((PushConsumer, 15.0), (PullConsumer, 20.0)):
        params = inspect.signature(cls).parameters
        assert params["consume_from_where"].default == "CONSUME_FROM_LAST_OFFSET"
        assert params["consume_from_where"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["broker_suspend_max_time"].default == suspend
        assert list(params)[-1] == "client_options"
    assert inspect.signature(PushConsumer).parameters["pull_batch_size"].default == 32
    assert inspect.signature(PullConsumer).parameters["pull_batch_size"].default == 10
