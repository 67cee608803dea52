"""The broker's JSON config files: consumer offsets, topic configs, subscription groups.

RocketMQ keeps these small tables as JSON under `<storePathRootDir>/config/` and rewrites the
whole file on every persist (ConfigManager).  We keep its file names and JSON shapes so a config
directory reads like a RocketMQ one, and make the rewrite crash-safe:

* `atomic_write` (rmq_core.common.files) writes `<file>.tmp`, fsyncs it, renames it over `<file>` and fsyncs the
  directory, so after a crash the file is either the old or the new version, never a mix.  A
  `.tmp` left behind by a crash is never read.
* Topic and subscription group tables append changes to a journal between rewrites (see
  `_VersionedTable`), so a burst of changes to a large table does not rewrite it per change.
* `ConfigManager.persist` keeps the previous good version as `<file>.bak` (as RocketMQ's
  MixAll.string2File does) and `load` falls back to it when the main file is missing, empty or
  does not decode.

RocketMQ's fastjson writes integer map keys unquoted (`{0:12,1:7}`), which is not JSON; the
offset table decoder accepts that too, so a Java broker's `consumerOffset.json` can be loaded.
"""
from __future__ import annotations

import abc
import asyncio
import json
import logging
import os
import threading
import time
from typing import Any, Iterator

import attrs

from rmq_core.common.fastjson import loads_lenient
from rmq_core.common.files import atomic_write, fsync_dir, read_file_bytes
from rmq_core.errors import IllegalArgumentError, RemotingCommandError, StoreError
from rmq_core.message import PermName, TopicValidator, check_group
from rmq_core.remoting.body import DataVersion

log = logging.getLogger("rmq.broker")

CONSUMER_OFFSET_FILE = "consumerOffset.json"
TOPICS_FILE = "topics.json"
SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
TOPIC_GROUP_SEPARATOR = "@"
JOURNAL_SUFFIX = ".log"
JOURNAL_MIN_ENTRIES = 1024  # the journal grows to max(this, table size) entries before a rewrite


# --- ConfigManager -----------------------------------------------------------------------------
class ConfigManager(abc.ABC):
    """RocketMQ's ConfigManager: one JSON file, `load()` with `.bak` fallback, `persist()`.

    Subclasses implement `config_file_path()`, `encode(pretty)` and `decode(text)`; `decode`
    raises on malformed input (any exception means "this version is unusable").
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._written: tuple | None = None  # (inode, size, mtime) of the file this manager last wrote
        self._writes = None  # the GroupCommit of persist_soon(), made in the loop that first calls it

    @abc.abstractmethod
    def config_file_path(self) -> str:
        """Implemented by each subclass."""

    @abc.abstractmethod
    def encode(self, pretty: bool = False) -> str:
        """Implemented by each subclass."""

    @abc.abstractmethod
    def decode(self, text: str) -> None:
        """Implemented by each subclass."""

    def load(self) -> bool:
        """Load the main file, else `.bak`.  A missing file is a fresh start (True); False only
        when a file exists but neither it nor its backup decodes."""
        path = self.config_file_path()
        with self._lock:
            main = read_file_bytes(path)
            if main and main.strip():
                try:
                    self.decode(main.decode("utf-8"))
                    self._after_load()
                    log.info("load %s OK", path)
                    return True
                except Exception as e:  # noqa: BLE001 - any decode failure means "use the backup"
                    log.warning("config file %s is corrupt (%s); trying %s.bak", path, e, path)
            return self._load_bak(path, main_existed=main is not None)

    def _load_bak(self, path: str, main_existed: bool) -> bool:
        bak = read_file_bytes(path + ".bak")
        if bak is None or not bak.strip():
            if main_existed:
                log.error("config file %s is unusable and has no backup", path)
                return False
            self._after_load()  # (a journal alone: changes made since a fresh start)
            return True  # nothing stored yet
        try:
            self.decode(bak.decode("utf-8"))
        except Exception as e:  # noqa: BLE001
            log.error("config file %s and its backup are both corrupt: %s", path, e)
            return False
        self._after_load()
        log.warning("loaded %s from its backup %s.bak", path, path)
        return True

    def persist(self) -> None:
        """Write the table; the previous version (if it decodes as JSON) becomes `<file>.bak`."""
        path = self.config_file_path()
        with self._lock:
            data = self.encode(pretty=True).encode("utf-8")
            try:
                self._keep_backup(path)
                atomic_write(path, data)
                self._written = _file_id(path)
            except OSError as e:
                raise StoreError(f"cannot persist {path}: {e.strerror or e}") from e

    def persist_soon(self):
        """Group-committed persist(): in an event loop, a future of the write that will hold the
        table as it is now (changes made while a write runs share the next one); outside a loop,
        written at once (None)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.persist()
            return None
        if self._writes is None:
            from rmq_core.loops import GroupCommit  # (the event-loop helpers, only where one runs)

            self._writes = GroupCommit(self._write_batch, f"rmq-persist-{os.path.basename(self.config_file_path())}")
        return self._writes.request()

    async def _write_batch(self) -> None:
        try:
            what = await asyncio.to_thread(self._write_changes)
        except Exception as e:
            log.error("%s", e)
            raise
        log.info("%s written (%s)", os.path.basename(self.config_file_path()), what)

    def _after_load(self) -> None:
        """Called once a file was loaded (a journaled table replays its journal)."""

    def _write_changes(self) -> str:
        """A group-committed batch's write: the whole file here (a journaled table appends)."""
        self.persist()
        return "whole file"

    async def flush(self) -> None:
        """Wait for the group-committed writes under way (a stopping broker calls this)."""
        if self._writes is not None:
            await self._writes.close()

    def _keep_backup(self, path: str) -> None:
        """The current file becomes `<file>.bak`.  When it is the very file this manager last wrote
        (same inode, size and mtime) it is known good: a hard link renamed over the backup costs
        O(1), where re-reading and re-checking a large table would cost O(table) per persist."""
        if self._written is not None and _file_id(path) == self._written:
            tmp = path + ".bak.tmp"
            try:
                os.remove(tmp)
            except FileNotFoundError:
                pass
            try:
                os.link(path, tmp)
            except OSError:  # (a file system without hard links) fall back to the copy below
                pass
            else:
                os.replace(tmp, path + ".bak")
                return
        prev = read_file_bytes(path)
        if prev and _is_json_like(prev):
            atomic_write(path + ".bak", prev)


def _file_id(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _is_json_like(raw: bytes) -> bool:
    """True when `raw` decodes as (RocketMQ-flavoured) JSON, so a corrupt file never replaces a good .bak."""
    try:
        loads_lenient(raw.decode("utf-8"))
        return True
    except (RemotingCommandError, UnicodeDecodeError):
        return False




def _dumps(obj: Any, pretty: bool) -> str:
    return json.dumps(obj, indent=1 if pretty else None, separators=None if pretty else (",", ":"))


def _table(obj: Any, name: str, path_hint: str) -> dict:
    """Return obj[name] as a dict (missing -> {}), or raise ValueError naming what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"{path_hint}: top level is {type(obj).__name__}, expected an object")
    table = obj.get(name) or {}
    if not isinstance(table, dict):
        raise ValueError(f"{path_hint}: {name} is {type(table).__name__}, expected an object")
    return table


# --- consumer offsets --------------------------------------------------------------------------
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
        return _dumps(obj, pretty)

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
    for key, queues in _table(obj, name, path_hint).items():
        if not isinstance(queues, dict):
            raise ValueError(f"{name}[{key!r}] is {type(queues).__name__}, expected an object")
        parsed[key] = {int(q): int(o) for q, o in queues.items()}
    return parsed


# --- topic configs -----------------------------------------------------------------------------
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


def _non_negative(inst, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise IllegalArgumentError(f"{type(inst).__name__}.{attribute.name} must be an int >= 0, got {value!r}")


def _perm(inst, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 15:
        raise IllegalArgumentError(f"{type(inst).__name__}.perm must be within 0..15 (R=4, W=2, X=1), got {value!r}")


def _filter_type(inst, attribute, value):
    if value not in TOPIC_FILTER_TYPES:
        raise IllegalArgumentError(f"bad topicFilterType {value!r}; expected one of {', '.join(TOPIC_FILTER_TYPES)}")


def _attributes(inst, attribute, value):
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise IllegalArgumentError(f"bad topic attribute {k!r}={v!r}: names and values are strings")
    from rmq_core.broker.message_type import check_topic_attributes  # (names a bad message.type)

    check_topic_attributes(value)


def _topic_name(inst, attribute, value):
    TopicValidator.check_topic(value)


class _JsonFields:
    """A config written with RocketMQ's field names: `_JSON` pairs (attribute, JSON name)."""

    _JSON: tuple = ()
    _WHAT = "config"

    def to_json(self) -> dict:
        return {j: getattr(self, a) for a, j in self._JSON}

    @classmethod
    def _json_kwargs(cls, obj: dict) -> dict:
        """The attributes of a JSON object; unknown fields (a newer broker's) are ignored."""
        if not isinstance(obj, dict):
            raise IllegalArgumentError(f"{cls._WHAT} must be an object, got {obj!r}")
        return {a: obj[j] for a, j in cls._JSON if j in obj}

    @classmethod
    def from_json(cls, obj: dict):
        return cls(**cls._json_kwargs(obj))


@attrs.frozen
class TopicConfig(_JsonFields):
    """One topic's queue counts and permissions (RocketMQ TopicConfig)."""

    topic_name: str = attrs.field(validator=_topic_name)
    read_queue_nums: int = attrs.field(default=16, validator=_non_negative)
    write_queue_nums: int = attrs.field(default=16, validator=_non_negative)
    perm: int = attrs.field(default=PermName.PERM_READ | PermName.PERM_WRITE, validator=_perm)
    topic_filter_type: str = attrs.field(default="SINGLE_TAG", validator=_filter_type)
    topic_sys_flag: int = attrs.field(default=0, validator=_non_negative)
    order: bool = False
    # RocketMQ 5's topic attributes, e.g. {"message.type": "FIFO"} (rmq_core.broker.message_type);
    # written to JSON only when there are some, so a 4.x topic's JSON stays as 4.x writes it
    attributes: dict = attrs.field(factory=dict, converter=lambda v: dict(v or {}), validator=_attributes,
                                   hash=False)

    _JSON = (("topic_name", "topicName"), ("read_queue_nums", "readQueueNums"),
             ("write_queue_nums", "writeQueueNums"), ("perm", "perm"),
             ("topic_filter_type", "topicFilterType"), ("topic_sys_flag", "topicSysFlag"), ("order", "order"),
             ("attributes", "attributes"))
    _WHAT = "topic config"

    def to_json(self) -> dict:
        out = super().to_json()
        if not self.attributes:
            del out["attributes"]
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "TopicConfig":
        kwargs = cls._json_kwargs(obj)
        if "order" in kwargs:
            kwargs["order"] = bool(kwargs["order"])
        return cls(**kwargs)


class _VersionedTable(ConfigManager):
    """A name -> config table with a DataVersion bumped on every change.

    Group-committed writes (`persist_soon`) append the batch's changes to `<file>.log`, one JSON
    line each (`{"v": counter, "ts": ..., "put": {...}}` or `"delete": name`), and fdatasync it:
    a batch costs what it changed, not the table's size.  Once the journal holds more entries than
    max(JOURNAL_MIN_ENTRIES, table size), the batch rewrites the whole file instead (crash-safe, as
    `persist`) and empties the journal.  `load` replays the entries whose data version counter is
    newer than the file's (an entry already in the file is skipped, so a crash between a rewrite and
    the emptying is harmless).  A clean stop (`flush`) rewrites the file and empties the journal,
    so a stopped broker's config directory is what a RocketMQ broker reads."""

    FILE_NAME = ""
    TABLE_KEY = ""
    ITEM_TYPE: Any = None

    def __init__(self, config_dir: str | os.PathLike) -> None:
        super().__init__()
        self.config_dir = os.fspath(config_dir)
        self.data_version = DataVersion()
        self._table: dict[str, Any] = {}
        # name -> its `"name":{...}` JSON, kept between writes: a write of a large table joins
        # strings instead of encoding every entry again, and the broker's full registration
        # carries the same text.
        self._fragments: dict[str, str] = {}
        # Changes not in the file yet, in order: (data version after the change, name, config or
        # None for a deletion).  A batch appends them to the journal (see the class docstring).
        self._unwritten: list[tuple[DataVersion, str, Any]] = []
        self._journal_entries = 0  # entries in the journal now (a rewrite of the file empties it)
        self._io_lock = threading.Lock()

    def config_file_path(self) -> str:
        return os.path.join(self.config_dir, self.FILE_NAME)

    def journal_path(self) -> str:
        return self.config_file_path() + JOURNAL_SUFFIX

    def _write_changes(self) -> str:
        with self._lock:
            changes, self._unwritten = self._unwritten, []
            if not changes:
                return "nothing new"
            if self._journal_entries + len(changes) > max(JOURNAL_MIN_ENTRIES, len(self._table)):
                self.persist()  # compaction: amortised O(1) per change
                return "whole file, journal emptied"
            lines = "".join(
                json.dumps({"v": v.counter, "ts": v.timestamp, **({"put": item.to_json()} if item is not None
                                                                   else {"delete": name})},
                           separators=(",", ":")) + "\n" for v, name, item in changes).encode("utf-8")
            self._journal_entries += len(changes)
        path = self.journal_path()
        with self._io_lock:
            try:
                created = not os.path.exists(path)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    view = memoryview(lines)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                if created:
                    fsync_dir(os.path.dirname(path))
            except OSError as e:
                raise StoreError(f"cannot append to {path}: {e.strerror or e}") from e
        return f"{len(changes)} changes appended to {os.path.basename(path)}"

    def persist(self) -> None:
        """The whole file (crash-safe), then an empty journal: what it held is in the file now."""
        with self._lock:
            super().persist()
            self._unwritten = []
            self._journal_entries = 0
            with self._io_lock:
                try:
                    fd = os.open(self.journal_path(), os.O_WRONLY)
                except FileNotFoundError:
                    return
                try:
                    os.ftruncate(fd, 0)
                    os.fsync(fd)
                except OSError as e:
                    raise StoreError(f"cannot empty {self.journal_path()}: {e.strerror or e}") from e
                finally:
                    os.close(fd)

    def _after_load(self) -> None:
        """Replay the journal's changes newer than the file (by data version counter).  A torn
        last line (a crash in the middle of an append that was never acknowledged) ends it."""
        raw = read_file_bytes(self.journal_path())
        if not raw:
            return
        applied = entries = 0
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                counter, ts = int(entry["v"]), int(entry["ts"])
                item = self.ITEM_TYPE.from_json(entry["put"]) if "put" in entry else None
                name = self._name_of(item) if item is not None else str(entry["delete"])
            except (ValueError, KeyError, TypeError, IllegalArgumentError) as e:
                log.warning("%s: ignoring its end from entry %d on (%s)", self.journal_path(), entries + 1, e)
                break
            entries += 1
            if counter <= self.data_version.counter:
                continue  # in the file already
            if item is None:
                self._table.pop(name, None)
            else:
                self._table[name] = item
            self._fragments.pop(name, None)
            self.data_version = DataVersion(ts, counter)
            applied += 1
        self._journal_entries = entries
        if applied:
            log.info("%s: %d changes replayed", self.journal_path(), applied)

    async def flush(self) -> None:
        await super().flush()
        if self._journal_entries or self._unwritten:
            await asyncio.to_thread(self.persist)

    NAME_FIELD: str  # the item's field that is its table key (a topic's or a group's name)

    def _name_of(self, item) -> str:
        return getattr(item, self.NAME_FIELD)

    def get(self, name: str):
        with self._lock:
            return self._table.get(name)

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._table

    def __len__(self) -> int:
        with self._lock:
            return len(self._table)

    def items(self) -> list[tuple[str, Any]]:
        with self._lock:
            return list(self._table.items())

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, _ in self.items()])

    def put(self, item) -> Any:
        """Add or replace a config (an ITEM_TYPE); returns the previous one.  Bumps the data version."""
        if not isinstance(item, self.ITEM_TYPE):
            raise IllegalArgumentError(f"put needs a {self.ITEM_TYPE.__name__}, not {type(item).__name__}")
        name = self._name_of(item)
        with self._lock:
            old = self._table.get(name)
            self._table[name] = item
            self._fragments.pop(name, None)
            self.data_version.next_version()
            self._unwritten.append((attrs.evolve(self.data_version), name, item))
            return old

    def delete(self, name: str):
        """Remove `name`; returns the removed config or None.  Bumps the data version when removed."""
        with self._lock:
            old = self._table.pop(name, None)
            if old is not None:
                self._fragments.pop(name, None)
                self.data_version.next_version()
                self._unwritten.append((attrs.evolve(self.data_version), name, None))
            return old

    def table_json(self, separator: str = ",") -> str:
        """The table's entries as JSON object members (`"name":{...}`), without the braces."""
        with self._lock:
            fragments = self._fragments
            out = []
            for name, item in self._table.items():
                text = fragments.get(name)
                if text is None:
                    text = fragments[name] = json.dumps(name) + ":" + json.dumps(item.to_json(), separators=(",", ":"))
                out.append(text)
        return separator.join(out)

    def snapshot_json(self) -> tuple[DataVersion, str]:
        """(a copy of the data version, table_json()) taken together."""
        with self._lock:
            return attrs.evolve(self.data_version), self.table_json()

    def snapshot(self) -> tuple[DataVersion, list]:
        """(a copy of the data version, the configs) taken together."""
        with self._lock:
            return attrs.evolve(self.data_version), list(self._table.values())

    def encode(self, pretty: bool = False) -> str:
        """One entry per line when `pretty` (readable, and cheap to write for a large table)."""
        with self._lock:
            version = json.dumps(self.data_version.to_json(), separators=(",", ":"))
            table = self.table_json(",\n" if pretty else ",")
        nl = "\n" if pretty else ""
        return f'{{"dataVersion":{version},{nl}"{self.TABLE_KEY}":{{{nl}{table}}}}}{nl}'

    def decode(self, text: str) -> None:
        obj = loads_lenient(text)
        table = _table(obj, self.TABLE_KEY, self.config_file_path())
        parsed = {name: self.ITEM_TYPE.from_json(item) for name, item in table.items()}
        raw_version = obj.get("dataVersion")
        if raw_version and not isinstance(raw_version, dict):
            raise ValueError(f"dataVersion is {type(raw_version).__name__}, expected an object")
        version = DataVersion.from_json(raw_version) if raw_version else DataVersion()
        with self._lock:
            self._table = parsed
            self._fragments = {}
            self._unwritten = []
            self.data_version = version


class TopicConfigTable(_VersionedTable):
    """`topics.json`: `{"dataVersion": {...}, "topicConfigTable": {name: TopicConfig JSON}}`.

    Storage only: policy (auto-create, system topics, permissions) lives in the broker."""

    FILE_NAME = TOPICS_FILE
    TABLE_KEY = "topicConfigTable"
    ITEM_TYPE = TopicConfig
    NAME_FIELD = "topic_name"


# --- subscription groups -----------------------------------------------------------------------
def _group_name(inst, attribute, value):
    check_group(value)


@attrs.frozen
class SubscriptionGroupConfig(_JsonFields):
    """A consumer group's broker-side settings (RocketMQ SubscriptionGroupConfig)."""

    group_name: str = attrs.field(validator=_group_name)
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = attrs.field(default=1, validator=_non_negative)
    retry_max_times: int = attrs.field(default=16, validator=_non_negative)
    broker_id: int = attrs.field(default=0, validator=_non_negative)
    which_broker_when_consume_slowly: int = attrs.field(default=1, validator=_non_negative)
    notify_consumer_ids_changed_enable: bool = True
    # RocketMQ 5: a FIFO group (pop consumption hands a queue's next message out only after the
    # ones before it are acked)
    consume_message_orderly: bool = attrs.field(default=False, converter=lambda v: _json_bool(v, "consumeMessageOrderly"))

    _JSON = (("group_name", "groupName"), ("consume_enable", "consumeEnable"),
             ("consume_from_min_enable", "consumeFromMinEnable"),
             ("consume_broadcast_enable", "consumeBroadcastEnable"), ("retry_queue_nums", "retryQueueNums"),
             ("retry_max_times", "retryMaxTimes"), ("broker_id", "brokerId"),
             ("which_broker_when_consume_slowly", "whichBrokerWhenConsumeSlowly"),
             ("notify_consumer_ids_changed_enable", "notifyConsumerIdsChangedEnable"),
             ("consume_message_orderly", "consumeMessageOrderly"))
    _WHAT = "subscription group config"


def _json_bool(value, name: str) -> bool:
    """A JSON boolean (or fastjson's "true"/"false" string); anything else raises naming the field."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise IllegalArgumentError(f"subscription group config {name} must be true or false, got {value!r}")


class SubscriptionGroupTable(_VersionedTable):
    """`subscriptionGroup.json`: `{"dataVersion": {...}, "subscriptionGroupTable": {name: {...}}}`."""

    FILE_NAME = SUBSCRIPTION_GROUP_FILE
    TABLE_KEY = "subscriptionGroupTable"
    ITEM_TYPE = SubscriptionGroupConfig
    NAME_FIELD = "group_name"
