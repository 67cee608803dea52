"""The broker's JSON config files: their crash-safe persistence (ConfigManager, and the journaled
`VersionedTable` of the topic and subscription group tables), and the subscription groups' table.
The consumer offsets are `offset_manager.py`'s, the topic configs `topic_config_manager.py`'s.

RocketMQ keeps these small tables as JSON under `<storePathRootDir>/config/` and rewrites the
whole file on every persist (ConfigManager).  We keep its file names and JSON shapes so a config
directory reads like a RocketMQ one, and make the rewrite crash-safe:

* `atomic_write` (rmq_core.common.files) writes `<file>.tmp`, fsyncs it, renames it over `<file>` and fsyncs the
  directory, so after a crash the file is either the old or the new version, never a mix.  A
  `.tmp` left behind by a crash is never read.
* Topic and subscription group tables append changes to a journal between rewrites (see
  `VersionedTable`), so a burst of changes to a large table does not rewrite it per change.
* `ConfigManager.persist` keeps the previous good version as `<file>.bak` (as RocketMQ's
  MixAll.string2File does) and `load` falls back to it when the main file is missing, empty or
  does not decode.
"""
from __future__ import annotations

import abc
import asyncio
import json
import logging
import os
import threading
from typing import Any, Iterator

import attrs

from rmq_core.common.fastjson import loads_lenient
from rmq_core.common.files import atomic_write, fsync_dir, read_file_bytes
from rmq_core.errors import IllegalArgumentError, RemotingCommandError, StoreError
from rmq_core.message import check_group
from rmq_core.remoting.body import DataVersion

log = logging.getLogger("rmq.broker")

SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
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
        self._writes = None  # the CoalescedJob of persist_soon(), made in the loop that first calls it

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
            from rmq_core.loops import CoalescedJob  # (the event-loop helpers, only where one runs)

            self._writes = CoalescedJob(self._write_batch, f"rmq-persist-{os.path.basename(self.config_file_path())}")
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
        """A coalesced batch's write: the whole file here (a journaled table appends)."""
        self.persist()
        return "whole file"

    async def flush(self) -> None:
        """Wait for the coalesced writes under way (a stopping broker calls this)."""
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




def dump_json(obj: Any, pretty: bool) -> str:
    return json.dumps(obj, indent=1 if pretty else None, separators=None if pretty else (",", ":"))


def json_table(obj: Any, name: str, path_hint: str) -> dict:
    """Return obj[name] as a dict (missing -> {}), or raise ValueError naming what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"{path_hint}: top level is {type(obj).__name__}, expected an object")
    table = obj.get(name) or {}
    if not isinstance(table, dict):
        raise ValueError(f"{path_hint}: {name} is {type(table).__name__}, expected an object")
    return table


# --- what the versioned tables share ----------------------------------------------------------
def non_negative(inst, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise IllegalArgumentError(f"{type(inst).__name__}.{attribute.name} must be an int >= 0, got {value!r}")


class JsonFields:
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


class VersionedTable(ConfigManager):
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
        table = json_table(obj, self.TABLE_KEY, self.config_file_path())
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


# --- subscription groups -----------------------------------------------------------------------
def _group_name(inst, attribute, value):
    check_group(value)


@attrs.frozen
class SubscriptionGroupConfig(JsonFields):
    """A consumer group's broker-side settings (RocketMQ SubscriptionGroupConfig)."""

    group_name: str = attrs.field(validator=_group_name)
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = attrs.field(default=1, validator=non_negative)
    retry_max_times: int = attrs.field(default=16, validator=non_negative)
    broker_id: int = attrs.field(default=0, validator=non_negative)
    which_broker_when_consume_slowly: int = attrs.field(default=1, validator=non_negative)
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


class SubscriptionGroupTable(VersionedTable):
    """`subscriptionGroup.json`: `{"dataVersion": {...}, "subscriptionGroupTable": {name: {...}}}`."""

    FILE_NAME = SUBSCRIPTION_GROUP_FILE
    TABLE_KEY = "subscriptionGroupTable"
    ITEM_TYPE = SubscriptionGroupConfig
    NAME_FIELD = "group_name"
