"""cleanExpiredCQ and cleanUnusedTopic on a real store (small segments on disk): a consume queue
whose messages retention deleted is destroyed, one still pointing at stored messages is kept; the
queues of a topic without a config go, the schedule topic's stay."""
import os
import time

from tests.store.conftest import msg


def test_expired_consume_queues_are_destroyed(store_factory):
    hour = time.localtime().tm_hour
    s = store_factory(file_reserved_time=1, delete_when=f"{hour:02d}")
    s.disk_usage = lambda path: 0.10
    seg = s.config.mapped_file_size_commit_log
    while s.get_max_phy_offset() + 1200 < 2 * seg:  # OldTopic's messages: the first two segments only
        assert s.put_message(msg(topic="OldTopic", body=b"o" * 1000)).is_ok()
    for _ in range(3):  # (2 KB: none fits the second segment's rest, they start the third)
        assert s.put_message(msg(topic="LiveTopic", body=b"l" * 2000)).is_ok()
    assert s.get_commit_log_offset_in_queue("LiveTopic", 0, 0) >= 2 * seg
    old = time.time() - 3 * 3600
    for mf in s.commit_log.mapped_file_queue.mapped_files[:2]:
        os.utime(mf.path, (old, old))
    assert s.clean_expired_files() == 2
    assert s.get_min_phy_offset() == 2 * seg
    removed = s.clean_expired_consumer_queue()
    assert removed == [("OldTopic", 0)]
    assert "OldTopic" not in s.get_consume_queue_table()
    assert not os.path.exists(os.path.join(s.config.consume_queue_dir, "OldTopic"))
    assert s.get_max_offset_in_queue("LiveTopic", 0) == 3
    assert s.clean_expired_consumer_queue() == []


def test_unused_topics_are_deleted(store):
    for topic in ("Kept", "Dropped", "SCHEDULE_TOPIC_XXXX"):
        assert store.put_message(msg(topic=topic)).is_ok()
    removed = store.clean_unused_topics({"Kept"})
    assert removed == ["Dropped"]
    assert set(store.get_consume_queue_table()) == {"Kept", "SCHEDULE_TOPIC_XXXX"}
    assert not os.path.exists(os.path.join(store.config.consume_queue_dir, "Dropped"))
    assert store.get_max_offset_in_queue("Kept", 0) == 1
