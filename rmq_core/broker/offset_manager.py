"""The consumers' offsets on the broker (RocketMQ's ConsumerOffsetManager): `consumerOffset.json`,
persisted by `config_file.ConfigManager`.

RocketMQ's fastjson writes integer map keys unquoted (`{0:12,1:7}`), which is not JSON; the
offset table decoder accepts that too, so a Java broker's `consumerOffset.json` can be loaded.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from rmq_core.broker.config_file import ConfigManager, dump_json, json_table
from rmq_core.common.fastjson import loads_lenient
from rmq_core.errors import IllegalArgumentError

log = logging.getLogger("rmq.broker")

CONSUMER_OFFSET_FILE = "consumerOffset.json"
TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(ConfigManager):
    """Committed consumer offsets per `topic@group` and queue id (RocketMQ ConsumerOffsetManager).

    File `consumerOffset.json`: `{"offsetTable": {"topic@group": {"0": 12, "1": 7}}}`; a slave's
    also has `offsetTableReceivedBySlave`, the offsets consumers committed to it that its master
    has not taken yet, and both have `offsetResetTimestampTable`, when the master last reset each
    queue (a slave's: its copy of the master's), which tells a master and its slave which
    received offsets a reset overrides (rmq_core.broker.slave_sync; RocketMQ readers ignore the
    extra keys).
    """

    RECEIVED_KEY = "offsetTableReceivedBySlave"
    RESET_KEY = "offsetResetTimestampTable"

    def __init__(self, config_dir: str | os.PathLike) -> None:
        super().__init__()
        self.config_dir = os.fspath(config_dir)
        self.offset_table: dict[str, dict[int, int]] = {}
        self.received_table: dict[str, dict[int, int]] = {}  # a slave's: committed to it, not yet on its master
        # the master's last reset of each queue, in ms (unique per queue: the version of its offset)
        self.reset_table: dict[str, dict[int, int]] = {}

    def config_file_path(self) -> str:
        return os.path.join(self.config_dir, CONSUMER_OFFSET_FILE)

    @staticmethod
    def _key(topic: str, group: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    @staticmethod
    def _split(key: str) -> tuple[str, str] | None:
        parts = key.split(TOPIC_GROUP_SEPARATOR)
        return (parts[0], parts[1]) if len(parts) == 2 else None

    def commit_offset(self, client_host: str | None, group: str, topic: str, queue_id: int, offset: int,
                      client_id: str | None = None, received_by_slave: bool = False) -> None:
        """Store `offset` as the group's next offset to consume in (topic, queue_id).  A lower
        offset than the stored one is accepted (as RocketMQ) and logged naming the client.
        received_by_slave: a slave keeps it also as one its master has to take (merge_from_master)."""
        if not group or not topic:
            raise IllegalArgumentError(f"commit_offset needs a group and a topic, got group={group!r} topic={topic!r}")
        if int(queue_id) < 0:
            raise IllegalArgumentError(f"bad queue id {queue_id!r} for {topic}@{group}")
        with self._lock:
            key = self._key(topic, group)
            queues = self.offset_table.setdefault(key, {})
            prev = queues.get(int(queue_id))
            queues[int(queue_id)] = int(offset)
            if received_by_slave:
                self.received_table.setdefault(key, {})[int(queue_id)] = int(offset)
        if prev is not None and offset < prev:
            # Legal (a reset or a re-balanced consumer), but worth a trace as in RocketMQ.
            log.warning("[NOTIFYME]update consumer offset less than store. clientHost=%s, clientId=%s, key=%s, "
                        "queueId=%s, requestOffset=%s, storeOffset=%s", client_host, client_id,
                        self._key(topic, group), queue_id, offset, prev)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        with self._lock:
            queues = self.offset_table.get(self._key(topic, group))
            if queues is None:
                return -1
            return queues.get(int(queue_id), -1)

    def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self.offset_table.get(self._key(topic, group), {}))

    def snapshot(self) -> dict[tuple[str, str], dict[int, int]]:
        """A copy of every committed offset: (topic, group) -> {queue id: offset}."""
        with self._lock:
            table = {k: dict(v) for k, v in self.offset_table.items()}
        return {tg: queues for tg, queues in ((self._split(k), v) for k, v in table.items()) if tg}

    def which_topic_by_consumer(self, group: str) -> set[str]:
        with self._lock:
            keys = list(self.offset_table)
        return {tg[0] for tg in map(self._split, keys) if tg and tg[1] == group}

    def which_group_by_topic(self, topic: str) -> set[str]:
        with self._lock:
            keys = list(self.offset_table)
        return {tg[1] for tg in map(self._split, keys) if tg and tg[0] == topic}

    def clean_offset_by_topic(self, topic: str) -> None:
        """Forget every group's offsets in `topic` (the topic was deleted)."""
        self._forget(0, topic, "topic")

    def remove_offset(self, group: str) -> None:
        """Forget all offsets of `group` (the group was deleted)."""
        self._forget(1, group, "group")

    def _forget(self, part: int, name: str, what: str) -> None:
        """Drop the keys whose `part` (0 topic, 1 group) is `name`."""
        with self._lock:
            for key in [k for k in self.offset_table if (self._split(k) or ("", ""))[part] == name]:
                del self.offset_table[key]
                self.received_table.pop(key, None)
                self.reset_table.pop(key, None)
                log.warning("clean %s offset, %s", what, key)

    def reset_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Replace the given queues' offsets (resetOffsetByTime); other queues keep theirs.  Each
        reset queue is stamped with the reset's time: a greater offset a slave received before it
        knew of the reset is not taken back (take_newer), and the slave drops it (merge_from_master)."""
        for qid in offsets:
            if int(qid) < 0:
                raise IllegalArgumentError(f"bad queue id {qid!r} for {topic}@{group}")
        now = int(time.time() * 1000)
        with self._lock:
            key = self._key(topic, group)
            queues = self.offset_table.setdefault(key, {})
            stamps = self.reset_table.setdefault(key, {})
            for qid, off in offsets.items():
                queues[int(qid)] = int(off)
                # strictly greater than the last stamp: two resets in one ms (or after a clock step
                # back) are still two versions
                stamps[int(qid)] = max(now, stamps.get(int(qid), 0) + 1)

    def merge_from_master(self, master_table: dict[str, dict[int, int]],
                          master_resets: dict[str, dict[int, int]] | None = None) -> None:
        """A slave's sync: take the master's offsets, except where a consumer committed a greater
        one to this slave that the master has not reached yet (kept, for the master to take);
        a received offset the master has reached is the master's again, so later moves of the
        master's are followed.  A queue the master reset since this slave's last sync
        (`master_resets`, its reset stamps, differ from this slave's copy) takes the master's
        offset whatever this slave received before: the reset wins."""
        master_resets = master_resets or {}
        with self._lock:
            for key, queues in master_table.items():
                mine = self.offset_table.setdefault(key, {})
                received = self.received_table.get(key) or {}
                stamps, seen = master_resets.get(key) or {}, self.reset_table.get(key) or {}
                for qid, offset in queues.items():
                    kept = received.get(qid)
                    if kept is not None and kept > offset and stamps.get(qid) == seen.get(qid):
                        continue
                    received.pop(qid, None)
                    mine[qid] = offset
                if key in self.received_table and not received:
                    del self.received_table[key]
            self.reset_table = {k: dict(v) for k, v in master_resets.items()}

    def take_newer(self, received: dict[str, dict[int, int]],
                   slave_resets: dict[str, dict[int, int]] | None = None) -> int:
        """A master: take a slave's received offsets where greater than its own (the greater
        wins, per group/topic/queue), except in a queue this master reset after the slave's last
        sync (the slave's copy of the reset stamps, `slave_resets`, differs from this master's):
        what the slave received before it knew of the reset does not undo it.  Returns how many
        it took."""
        slave_resets = slave_resets or {}
        taken = 0
        with self._lock:
            for key, queues in received.items():
                mine = self.offset_table.setdefault(key, {})
                stamps, seen = self.reset_table.get(key) or {}, slave_resets.get(key) or {}
                for qid, offset in queues.items():
                    if stamps.get(qid) != seen.get(qid):
                        continue
                    if offset > mine.get(qid, -1):
                        mine[qid] = offset
                        taken += 1
        return taken

    def encode(self, pretty: bool = False) -> str:
        with self._lock:
            obj = {"offsetTable": _encode_offsets(self.offset_table)}
            if self.received_table:
                obj[self.RECEIVED_KEY] = _encode_offsets(self.received_table)
            if self.reset_table:
                obj[self.RESET_KEY] = _encode_offsets(self.reset_table)
        return dump_json(obj, pretty)

    def decode(self, text: str) -> None:
        obj = loads_lenient(text)
        parsed = decode_offset_table(obj, "offsetTable", self.config_file_path())
        received = decode_offset_table(obj, self.RECEIVED_KEY, self.config_file_path())
        resets = decode_offset_table(obj, self.RESET_KEY, self.config_file_path())
        with self._lock:
            self.offset_table = parsed
            self.received_table = received
            self.reset_table = resets


def _encode_offsets(table: dict[str, dict[int, int]]) -> dict:
    return {k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(table.items())}


def decode_offset_table(obj: Any, name: str, path_hint: str) -> dict[str, dict[int, int]]:
    """obj[name] of a consumerOffset.json (or a GET_ALL_CONSUMER_OFFSET body) as
    {"topic@group": {queue id: offset}}; ValueError naming what is malformed."""
    parsed: dict[str, dict[int, int]] = {}
    for key, queues in json_table(obj, name, path_hint).items():
        if not isinstance(queues, dict):
            raise ValueError(f"{name}[{key!r}] is {type(queues).__name__}, expected an object")
        parsed[key] = {int(q): int(o) for q, o in queues.items()}
    return parsed


__all__ = ["CONSUMER_OFFSET_FILE", "TOPIC_GROUP_SEPARATOR", "ConsumerOffsetManager", "decode_offset_table"]
