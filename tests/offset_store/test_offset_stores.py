"""Consumer offset stores: `remote` against a recorded fake broker API, `local_file` on real files."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core.errors import IllegalArgumentError, MQBrokerError, MQClientError
from rmq_core.message import MessageQueue
from rmq_core.plugins import get_offset_store_factory
from rmq_plugins.store import LocalFileOffsetStore, ReadOffsetType

MQ0, MQ1, MQ2 = (MessageQueue("TopicA", "broker-a", i) for i in range(3))
OTHER = MessageQueue("TopicB", "hz@broker-b", 0)


class RecordingBrokerApi:
    """Stands in for the client's broker API: answers queries from `stored`, records updates."""

    def __init__(self, stored=None, fail_with=None):
        self.stored = dict(stored or {})
        self.fail_with = fail_with
        self.queries, self.updates = [], []

    def query_consumer_offset(self, mq):
        self.queries.append(mq)
        if self.fail_with is not None:
            raise self.fail_with
        if mq not in self.stored:
            raise MQBrokerError(22, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first", "127.0.0.1:10911")
        return self.stored[mq]

    def update_consumer_offset(self, mq, offset, oneway):
        self.updates.append((mq, offset, oneway))
        self.stored[mq] = offset


def remote(api=None, **kw):
    return get_offset_store_factory("remote")("GID_test", broker_api=api or RecordingBrokerApi(), **kw)


def local(tmp_path, group="GID_test", **kw):
    return get_offset_store_factory("local_file")(group, offset_dir=str(tmp_path), **kw)


# --- remote --------------------------------------------------------------------------------------
def test_remote_read_types():
    api = RecordingBrokerApi({MQ0: 40})
    store = remote(api)
    assert store.read_offset(MQ0, "READ_FROM_MEMORY") == -1 and api.queries == []
    assert store.read_offset(MQ0, "MEMORY_FIRST_THEN_STORE") == 40 and api.queries == [MQ0]
    assert store.read_offset(MQ0, ReadOffsetType.READ_FROM_MEMORY) == 40  # cached by the store read
    store.update_offset(MQ0, 45, False)
    assert store.read_offset(MQ0, "MEMORY_FIRST_THEN_STORE") == 45 and api.queries == [MQ0]
    assert store.read_offset(MQ0, "READ_FROM_STORE") == 40 and api.queries == [MQ0, MQ0]
    assert store.read_offset(MQ0, "READ_FROM_MEMORY") == 40  # the store read replaced memory


def test_remote_not_found_is_minus_one_and_other_failures_minus_two(caplog):
    assert remote(RecordingBrokerApi()).read_offset(MQ1, "READ_FROM_STORE") == -1
    assert remote(RecordingBrokerApi(fail_with=MQBrokerError(1, "system error"))).read_offset(MQ1, "READ_FROM_STORE") == -2
    assert remote(RecordingBrokerApi(fail_with=ConnectionResetError("gone"))).read_offset(MQ1, "READ_FROM_STORE") == -2
    assert "gone" in caplog.text


def test_remote_persist_all_sends_oneway_and_forgets_unassigned_queues():
    api = RecordingBrokerApi()
    store = remote(api, client_id="10.0.0.1@123")
    store.update_offset(MQ0, 10, False)
    store.update_offset(MQ1, 11, False)
    store.update_offset(OTHER, 5, False)
    store.persist_all({MQ0, MQ1})
    assert sorted(api.updates) == [(MQ0, 10, True), (MQ1, 11, True)]
    assert store.clone_offset_table("") == {MQ0: 10, MQ1: 11}  # OTHER is no longer ours
    store.persist_all(set())  # nothing to do, nothing forgotten
    assert store.clone_offset_table(None) == {MQ0: 10, MQ1: 11}
    api.updates.clear()
    store.persist(MQ1)
    store.persist(MQ2)  # unknown queue: nothing sent
    assert api.updates == [(MQ1, 11, True)]
    store.update_consume_offset_to_broker(MQ2, 7, False)
    assert api.updates[-1] == (MQ2, 7, False)


def test_remote_persist_failure_is_logged_not_raised(caplog):
    class Broken(RecordingBrokerApi):
        def update_consumer_offset(self, mq, offset, oneway):
            raise ConnectionRefusedError("broker down")
    store = remote(Broken())
    store.update_offset(MQ0, 3, False)
    store.persist_all([MQ0])
    store.persist(MQ0)
    assert caplog.text.count("broker down") == 2


def test_remote_needs_a_broker_api():
    with pytest.raises(IllegalArgumentError, match="broker_api"):
        get_offset_store_factory("remote")("GID_test")
    with pytest.raises(IllegalArgumentError, match="query_consumer_offset"):
        get_offset_store_factory("remote")("GID_test", broker_api=object())


def test_bad_read_type_and_group_name(tmp_path):
    with pytest.raises(IllegalArgumentError, match="'FROM_NOWHERE'"):
        remote().read_offset(MQ0, "FROM_NOWHERE")
    with pytest.raises(IllegalArgumentError, match="'../etc'"):
        local(tmp_path, group="../etc")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([MQ0, MQ1, OTHER]), st.integers(-1, 1000), st.booleans()), max_size=40))
def test_update_offset_increase_only_model(ops):
    store = remote()
    model = {}
    for mq, off, increase_only in ops:
        store.update_offset(mq, off, increase_only)
        if mq not in model or not increase_only or off > model[mq]:
            model[mq] = off
    assert store.clone_offset_table("") == model
    assert store.clone_offset_table("TopicB") == {k: v for k, v in model.items() if k.topic == "TopicB"}
    for mq in model:
        store.remove_offset(mq)
    assert store.clone_offset_table("") == {}


# --- local file ----------------------------------------------------------------------------------
def test_local_file_survives_restart_keyed_by_group(tmp_path):
    store = local(tmp_path, client_id="10.0.0.1@100")
    store.load()
    store.update_offset(MQ0, 7, True)
    store.update_offset(OTHER, 3, True)
    store.persist_all({MQ0, OTHER})
    path = tmp_path / "GID_test" / "offsets.json"
    assert json.loads(path.read_text()) == {"group": "GID_test", "offsetTable": [
        {"topic": "TopicA", "brokerName": "broker-a", "queueId": 0, "offset": 7},
        {"topic": "TopicB", "brokerName": "hz@broker-b", "queueId": 0, "offset": 3}]}
    # a restarted process has a new client id but the same group: it finds its progress
    again = local(tmp_path, client_id="10.0.0.1@200")
    again.load()
    assert again.read_offset(MQ0, "READ_FROM_MEMORY") == 7
    assert again.read_offset(OTHER, "READ_FROM_MEMORY") == 3
    assert local(tmp_path, group="GID_other").read_offset(MQ0, "READ_FROM_STORE") == -1


def test_local_file_persist_merges_and_keeps_bak(tmp_path):
    store = local(tmp_path)
    store.update_offset(MQ0, 1, False)
    store.persist(MQ0)
    store.update_offset(MQ1, 2, False)
    store.persist_all({MQ1})  # MQ0 stays in the file even though it is not in this set
    fresh = local(tmp_path)
    assert fresh.read_offset(MQ0, "READ_FROM_STORE") == 1
    assert fresh.read_offset(MQ1, "MEMORY_FIRST_THEN_STORE") == 2
    bak = json.loads((tmp_path / "GID_test" / "offsets.json.bak").read_text())
    assert bak["offsetTable"] == [{"topic": "TopicA", "brokerName": "broker-a", "queueId": 0, "offset": 1}]
    assert not (tmp_path / "GID_test" / "offsets.json.tmp").exists()
    store.update_consume_offset_to_broker(MQ0, 99, True)  # broadcasting: a no-op
    assert local(tmp_path).read_offset(MQ0, "READ_FROM_STORE") == 1


def test_local_file_corrupt_main_falls_back_to_bak(tmp_path, caplog):
    store = local(tmp_path)
    store.update_offset(MQ0, 10, False)
    store.persist(MQ0)
    store.update_offset(MQ0, 20, False)
    store.persist(MQ0)
    (tmp_path / "GID_test" / "offsets.json").write_bytes(b'{"group": "GID_test", "offsetTa')
    fresh = local(tmp_path)
    fresh.load()
    assert fresh.read_offset(MQ0, "READ_FROM_MEMORY") == 10
    assert "corrupt" in caplog.text
    (tmp_path / "GID_test" / "offsets.json.bak").write_bytes(b"garbage")
    with pytest.raises(MQClientError, match="offsets.json"):
        local(tmp_path).load()
    assert local(tmp_path).read_offset(MQ0, "READ_FROM_STORE") == -1


def test_local_file_default_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("RMQ_OFFSET_STORE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert LocalFileOffsetStore("g1").store_path == str(tmp_path / "home" / ".rmq_offsets" / "g1" / "offsets.json")
    monkeypatch.setenv("RMQ_OFFSET_STORE_DIR", str(tmp_path / "env"))
    assert LocalFileOffsetStore("g1").store_path == str(tmp_path / "env" / "g1" / "offsets.json")


def test_local_file_survives_kill_during_persist(tmp_path):
    """A consumer process persisting in a tight loop is SIGKILLed; the file it leaves always loads."""
    code = textwrap.dedent(f"""
        from rmq_core.message import MessageQueue
        from rmq_plugins.store import LocalFileOffsetStore
        store = LocalFileOffsetStore("GID_test", {str(tmp_path)!r})
        mqs = [MessageQueue("TopicA", "broker-a", i) for i in range(8)]
        n = 0
        while True:
            n += 1
            for mq in mqs:
                store.update_offset(mq, n, True)
            store.persist_all(mqs)
    """)
    path = tmp_path / "GID_test" / "offsets.json"
    for attempt in range(3):
        child = subprocess.Popen([sys.executable, "-c", code])
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                store = local(tmp_path)
                if path.exists() and store.read_offset(MQ0, "READ_FROM_STORE") > 20 * (attempt + 1):
                    break
                time.sleep(0.01)
            time.sleep(0.005 * attempt)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        store = local(tmp_path)
        store.load()
        offsets = store.clone_offset_table("TopicA")
        assert len(offsets) == 8 and min(offsets.values()) > 0
        # every queue was persisted together, so they differ by at most one round
        assert max(offsets.values()) - min(offsets.values()) <= 1


def test_local_file_two_processes_of_one_group_do_not_lose_each_others_queues(tmp_path):
    """Each process persists its own queues; the flocked read-merge-write keeps both sets."""
    code = textwrap.dedent(f"""
        import sys
        from rmq_core.message import MessageQueue
        from rmq_plugins.store import LocalFileOffsetStore
        qid = int(sys.argv[1])
        store = LocalFileOffsetStore("GID_test", {str(tmp_path)!r})
        mq = MessageQueue("TopicA", "broker-a", qid)
        for n in range(1, 201):
            store.update_offset(mq, n, True)
            store.persist(mq)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(qid)], stderr=subprocess.PIPE, text=True)
             for qid in (0, 1)]
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "failed" not in err  # without the lock the writers trip over each other's tmp files
    store = local(tmp_path)
    store.load()
    assert store.clone_offset_table("TopicA") == {MQ0: 200, MQ1: 200}
