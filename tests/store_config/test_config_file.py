"""JSON config files on real files: atomic writes, crash between write and rename, .bak fallback, shapes."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core.errors import IllegalArgumentError
from rmq_core.broker.config_file import SubscriptionGroupConfig, SubscriptionGroupTable
from rmq_core.broker.offset_manager import ConsumerOffsetManager
from rmq_core.broker.topic_config_manager import TopicConfig, TopicConfigTable
from rmq_core.common.fastjson import loads_lenient
from rmq_core.common.files import atomic_write


def test_atomic_write_replaces_and_leaves_no_tmp(tmp_path):
    p = tmp_path / "sub" / "f.json"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two"
    assert sorted(os.listdir(p.parent)) == ["f.json"]


def test_atomic_write_rejects_text(tmp_path):
    with pytest.raises(IllegalArgumentError, match="str"):
        atomic_write(tmp_path / "x", "text")


def _crash_during_persist(config_dir, victim: str):
    """Run persist() in a child whose os.replace SIGKILLs the process when it would rename onto `victim`."""
    code = textwrap.dedent(f"""
        import os, signal
        from rmq_core.broker.offset_manager import ConsumerOffsetManager
        real_replace = os.replace
        def dying_replace(src, dst):
            if os.path.basename(dst) == {victim!r}:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_replace(src, dst)
        os.replace = dying_replace
        m = ConsumerOffsetManager({str(config_dir)!r})
        assert m.load()
        m.commit_offset("127.0.0.1", "g", "T", 0, 999)
        m.persist()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()


def test_crash_between_write_and_rename_keeps_old_version(tmp_path):
    m = ConsumerOffsetManager(tmp_path)
    m.commit_offset("127.0.0.1", "g", "T", 0, 5)
    m.persist()
    _crash_during_persist(tmp_path, "consumerOffset.json")
    # the child wrote the new version into the tmp file and died before the rename
    assert (tmp_path / "consumerOffset.json.tmp").exists()
    assert b"999" in (tmp_path / "consumerOffset.json.tmp").read_bytes()
    fresh = ConsumerOffsetManager(tmp_path)
    assert fresh.load()
    assert fresh.query_offset("g", "T", 0) == 5
    # the next persist overwrites the stale tmp and goes through
    fresh.commit_offset(None, "g", "T", 0, 6)
    fresh.persist()
    assert not (tmp_path / "consumerOffset.json.tmp").exists()
    again = ConsumerOffsetManager(tmp_path)
    assert again.load() and again.query_offset("g", "T", 0) == 6


def test_corrupt_main_file_falls_back_to_bak(tmp_path, caplog):
    m = ConsumerOffsetManager(tmp_path)
    m.commit_offset(None, "g", "T", 0, 10)
    m.persist()
    m.commit_offset(None, "g", "T", 0, 20)
    m.persist()  # .bak now holds offset 10
    assert json.loads((tmp_path / "consumerOffset.json.bak").read_text())["offsetTable"]["T@g"]["0"] == 10
    (tmp_path / "consumerOffset.json").write_bytes(b'{"offsetTable": {"T@g": {"0": 2')  # torn
    fresh = ConsumerOffsetManager(tmp_path)
    with caplog.at_level("WARNING"):
        assert fresh.load()
    assert fresh.query_offset("g", "T", 0) == 10
    assert "corrupt" in caplog.text
    # persisting now must not copy the corrupt main file over the good backup
    fresh.persist()
    assert json.loads((tmp_path / "consumerOffset.json.bak").read_text())["offsetTable"]["T@g"]["0"] == 10


def test_both_corrupt_load_returns_false(tmp_path):
    (tmp_path / "consumerOffset.json").write_text("{nope")
    (tmp_path / "consumerOffset.json.bak").write_text("[also nope")
    assert ConsumerOffsetManager(tmp_path).load() is False


def test_missing_files_is_a_fresh_start(tmp_path):
    m = ConsumerOffsetManager(tmp_path / "new")
    assert m.load()
    assert m.query_offset("g", "T", 0) == -1


def test_consumer_offset_json_shape_and_queries(tmp_path):
    m = ConsumerOffsetManager(tmp_path)
    m.commit_offset("1.2.3.4:5", "g1", "T", 0, 12)
    m.commit_offset("1.2.3.4:5", "g1", "T", 1, 7)
    m.commit_offset("1.2.3.4:5", "g2", "T", 0, 3)
    m.commit_offset("1.2.3.4:5", "g1", "U", 0, 1)
    m.persist()
    obj = json.loads((tmp_path / "consumerOffset.json").read_text())
    assert obj == {"offsetTable": {"T@g1": {"0": 12, "1": 7}, "T@g2": {"0": 3}, "U@g1": {"0": 1}}}
    assert m.query_offsets("g1", "T") == {0: 12, 1: 7}
    assert m.query_offset("g1", "T", 5) == -1
    assert m.which_topic_by_consumer("g1") == {"T", "U"}
    assert m.which_group_by_topic("T") == {"g1", "g2"}
    m.reset_offsets("g1", "T", {1: 0, 2: 4})
    assert m.query_offsets("g1", "T") == {0: 12, 1: 0, 2: 4}
    m.clean_offset_by_topic("U")
    assert m.which_topic_by_consumer("g1") == {"T"}
    m.remove_offset("g1")
    assert m.which_group_by_topic("T") == {"g2"}
    with pytest.raises(IllegalArgumentError, match="-1"):
        m.commit_offset(None, "g", "T", -1, 0)


def test_reads_java_fastjson_offsets(tmp_path):
    # what a RocketMQ 4.9 broker writes: integer keys without quotes
    (tmp_path / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"%RETRY%g@g":{0:0\n\t\t},\n\t\t"TopicTest@g":{0:250,1:251,2:252,3:253\n\t\t}\n\t}\n}')
    m = ConsumerOffsetManager(tmp_path)
    assert m.load()
    assert m.query_offsets("g", "TopicTest") == {0: 250, 1: 251, 2: 252, 3: 253}
    assert m.query_offset("g", "%RETRY%g", 0) == 0


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(
    st.tuples(st.sampled_from(["T", "U", "%RETRY%g"]), st.sampled_from(["g", "h"]), st.integers(0, 31)),
    st.integers(0, 2**62), max_size=30))
def test_offset_table_round_trips(tmp_path_factory, entries):
    d = tmp_path_factory.mktemp("offsets")
    m = ConsumerOffsetManager(d)
    for (topic, group, qid), off in entries.items():
        m.commit_offset(None, group, topic, qid, off)
    m.persist()
    back = ConsumerOffsetManager(d)
    assert back.load()
    assert back.offset_table == m.offset_table
    assert loads_lenient(m.encode(pretty=False)) == loads_lenient(m.encode(pretty=True))


def test_topic_config_json_names_and_table(tmp_path):
    t = TopicConfigTable(tmp_path)
    v0 = t.data_version.counter
    assert t.put(TopicConfig("TopicA", read_queue_nums=4, write_queue_nums=4)) is None
    assert t.put(TopicConfig("TopicB", 8, 8, perm=4, order=True)) is None
    assert t.data_version.counter == v0 + 2
    t.persist()
    obj = json.loads((tmp_path / "topics.json").read_text())
    assert set(obj) == {"dataVersion", "topicConfigTable"}
    assert set(obj["dataVersion"]) == {"timestamp", "counter"}
    assert obj["topicConfigTable"]["TopicB"] == {
        "topicName": "TopicB", "readQueueNums": 8, "writeQueueNums": 8, "perm": 4,
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": True}
    back = TopicConfigTable(tmp_path)
    assert back.load()
    assert back.get("TopicA") == TopicConfig("TopicA", 4, 4)
    assert back.data_version == t.data_version
    assert sorted(back) == ["TopicA", "TopicB"] and len(back) == 2 and "TopicB" in back
    assert back.delete("TopicA").topic_name == "TopicA"
    assert back.delete("TopicA") is None
    assert back.data_version.counter == t.data_version.counter + 1
    assert [name for name, _ in back.items()] == ["TopicB"]


def test_topic_config_ignores_unknown_java_fields():
    tc = TopicConfig.from_json({"topicName": "T", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
                                "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False,
                                "attributes": {}})
    assert tc == TopicConfig("T", 2, 2)


@pytest.mark.parametrize("kwargs, needle", [
    ({"topic_name": "bad topic"}, "'bad topic'"),
    ({"topic_name": "T", "perm": 99}, "99"),
    ({"topic_name": "T", "read_queue_nums": -1}, "-1"),
    ({"topic_name": "T", "topic_filter_type": "ANY"}, "'ANY'"),
])
def test_topic_config_validation_names_bad_value(kwargs, needle):
    with pytest.raises(IllegalArgumentError) as e:
        TopicConfig(**kwargs)
    assert needle in str(e.value)


def test_subscription_group_table(tmp_path):
    t = SubscriptionGroupTable(tmp_path)
    t.put(SubscriptionGroupConfig("gA"))
    t.put(SubscriptionGroupConfig("gB", consume_broadcast_enable=False, retry_max_times=3))
    t.persist()
    obj = json.loads((tmp_path / "subscriptionGroup.json").read_text())
    assert obj["subscriptionGroupTable"]["gA"] == {
        "groupName": "gA", "consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
        "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True, "consumeMessageOrderly": False}
    back = SubscriptionGroupTable(tmp_path)
    assert back.load()
    assert back.get("gB") == SubscriptionGroupConfig("gB", consume_broadcast_enable=False, retry_max_times=3)
    fifo = SubscriptionGroupConfig.from_json({"groupName": "gF", "consumeMessageOrderly": True})
    assert fifo.consume_message_orderly and fifo.to_json()["consumeMessageOrderly"] is True
    with pytest.raises(IllegalArgumentError, match="consumeMessageOrderly.*'yes please'"):
        SubscriptionGroupConfig.from_json({"groupName": "gF", "consumeMessageOrderly": "yes please"})
    with pytest.raises(IllegalArgumentError, match="'a b'"):
        SubscriptionGroupConfig("a b")


def test_topics_bak_fallback(tmp_path):
    t = TopicConfigTable(tmp_path)
    t.put(TopicConfig("A", 1, 1))
    t.persist()
    t.put(TopicConfig("B", 1, 1))
    t.persist()
    (tmp_path / "topics.json").write_text("")  # emptied by a crashed editor
    back = TopicConfigTable(tmp_path)
    assert back.load()
    assert sorted(back) == ["A"]


# --- the journal of coalesced writes --------------------------------------------------------------
def _journal_lines(tmp_path) -> list[dict]:
    raw = (tmp_path / "topics.json.log").read_bytes() if (tmp_path / "topics.json.log").exists() else b""
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def test_batches_append_to_the_journal_and_load_replays_it(tmp_path):
    t = TopicConfigTable(tmp_path)
    t.put(TopicConfig("A", 1, 1))
    t.persist()
    whole = (tmp_path / "topics.json").read_bytes()
    t.put(TopicConfig("B", 2, 2))
    t.put(TopicConfig("A", 4, 4))
    t.delete("B")
    assert "appended" in t._write_changes()
    assert (tmp_path / "topics.json").read_bytes() == whole  # a batch does not rewrite the file
    assert [sorted(e) for e in _journal_lines(tmp_path)] == [["put", "ts", "v"], ["put", "ts", "v"], ["delete", "ts", "v"]]
    back = TopicConfigTable(tmp_path)
    assert back.load()
    assert dict(back.items()) == {"A": TopicConfig("A", 4, 4)} and back.data_version == t.data_version
    # a rewrite empties the journal; entries older than the file are never replayed over it
    t.put(TopicConfig("C", 1, 1))
    t.persist()
    assert _journal_lines(tmp_path) == []
    again = TopicConfigTable(tmp_path)
    assert again.load() and sorted(again) == ["A", "C"]


def test_a_torn_journal_line_ends_the_replay(tmp_path):
    t = TopicConfigTable(tmp_path)
    t.put(TopicConfig("A", 1, 1))
    t._write_changes()
    with open(tmp_path / "topics.json.log", "ab") as f:
        f.write(b'{"v":99,"ts":1,"put":{"topicName":"Torn"')  # a crash in the middle of an append
    back = TopicConfigTable(tmp_path)
    assert back.load() and sorted(back) == ["A"]


def test_the_journal_is_compacted_into_the_file(tmp_path, monkeypatch):
    import rmq_core.broker.config_file as cf

    monkeypatch.setattr(cf, "JOURNAL_MIN_ENTRIES", 4)
    t = TopicConfigTable(tmp_path)
    for i in range(3):
        t.put(TopicConfig(f"T{i}", 1, 1))
    assert "appended" in t._write_changes()
    t.put(TopicConfig("T0", 2, 2))
    t.put(TopicConfig("T0", 3, 3))
    assert "whole file" in t._write_changes()  # 5 entries > max(4, 3 topics): the journal is bounded by the table
    assert _journal_lines(tmp_path) == []
    assert json.loads((tmp_path / "topics.json").read_text())["topicConfigTable"]["T0"]["readQueueNums"] == 3


def test_persist_soon_group_commits_a_burst(tmp_path):
    import asyncio

    asyncio.run(_burst(tmp_path))


async def _burst(tmp_path):
    import asyncio

    t = TopicConfigTable(tmp_path)
    writes = []
    real = t._write_changes
    t._write_changes = lambda: writes.append(real()) or writes[-1]
    waits = []
    for i in range(50):
        t.put(TopicConfig(f"T{i}", 1, 1))
        waits.append(t.persist_soon())
    await asyncio.gather(*waits)
    assert 1 <= len(writes) <= 2  # the first change's write, then one for the other 49
    back = TopicConfigTable(tmp_path)
    assert back.load() and len(back) == 50
    await t.flush()  # a clean stop: the whole file, nothing left in the journal
    assert _journal_lines(tmp_path) == [] and len(json.loads((tmp_path / "topics.json").read_text())["topicConfigTable"]) == 50
