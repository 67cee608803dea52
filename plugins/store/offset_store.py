"""Consumer offset stores (RocketMQ's OffsetStore): where a consumer keeps "next offset to consume".

* `remote` (clustering): an in-memory table; the broker is the store of record.  Reads that miss
  memory ask the broker, persisting sends the table to the broker.  `broker_api` (given by the
  client) is bound to this consumer group and has
  `query_consumer_offset(mq) -> int` (raises MQBrokerError code 22 QUERY_NOT_FOUND when the broker
  has no offset) and `update_consumer_offset(mq, offset, oneway: bool)`.
* `local_file` (broadcasting): every consumer instance keeps its own progress in
  `<dir>/<group>/offsets.json` (default dir `~/.rmq_offsets`, or $RMQ_OFFSET_STORE_DIR).  The path
  is keyed by the group, not by RocketMQ's client id (ip@pid), which changes on every restart and
  would lose the progress.  Writes are atomic (tmp + fsync + rename + dir fsync) and keep the
  previous good file as `offsets.json.bak`; a corrupt main file falls back to the backup.
  Processes of one group on one machine share the file (an flock serialises their writes); for
  a queue they both persist, the last writer wins.

Offsets follow RocketMQ's rules: -1 = unknown, -2 = could not be read (broker unreachable); an
`increase_only` update never moves an offset backwards (a slow thread must not undo progress).

What goes to the broker never steps back either: every commit (a periodic persist, a pull's
commitOffset, a synchronous commit) passes the store's `commit_guard`, which refuses an offset
lower than one already committed for the queue.  Only an explicit set (`update_offset(...,
increase_only=False)`: a reset by time, a seek, an admin reset, the broker's own value read back)
or dropping the queue lets the next commit go lower.
"""
from __future__ import annotations

import abc
import enum
import fcntl
import json
import logging
import os
import threading
from typing import Iterable

from rmq_core.common.files import atomic_write, read_file_bytes
from rmq_core.errors import IllegalArgumentError, MQBrokerError, MQClientError
from rmq_core.message import MessageQueue, check_group

log = logging.getLogger("rmq.client.offset")

QUERY_NOT_FOUND = 22  # ResponseCode.QUERY_NOT_FOUND: the broker has no offset for the queue
OFFSET_STORE_DIR_ENV = "RMQ_OFFSET_STORE_DIR"
OFFSETS_FILE = "offsets.json"


class ReadOffsetType(str, enum.Enum):
    """Where `read_offset` looks (a str enum: the plain strings work too)."""

    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


_READ_TYPES = {t.value: t for t in ReadOffsetType}  # a str enum: its members find themselves too


def _read_type(value) -> ReadOffsetType:
    try:
        found = _READ_TYPES.get(value)  # every pull reads an offset: no Enum() call per read
        if found is not None:
            return found
        return ReadOffsetType(getattr(value, "value", value))
    except (ValueError, TypeError):
        raise IllegalArgumentError(
            f"bad read type {value!r}; expected one of {', '.join(t.value for t in ReadOffsetType)}") from None


class CommitGuard:
    """The highest offset committed per queue: `admit(mq, offset)` is False for a lower one (the
    caller then does not send it) and records it otherwise; `reset(mq)` lets the next one be lower."""

    def __init__(self, group: str):
        self.group = group
        self._lock = threading.Lock()
        self._committed: dict[MessageQueue, int] = {}

    def admit(self, mq: MessageQueue, offset: int) -> bool:
        with self._lock:
            last = self._committed.get(mq)
            if last is not None and offset < last:
                log.debug("not committing offset %d of %s (group %s): %d is committed already",
                          offset, mq, self.group, last)
                return False
            self._committed[mq] = offset
            return True

    def reset(self, mq: MessageQueue) -> None:
        with self._lock:
            self._committed.pop(mq, None)


class OffsetStore(abc.ABC):
    """Common part: the in-memory table and the RocketMQ read/update rules."""

    def __init__(self, group: str, client_id: str | None = None):
        self.group = check_group(group)
        self.client_id = client_id
        self._lock = threading.RLock()
        self._table: dict[MessageQueue, int] = {}
        self.commit_guard = CommitGuard(self.group)

    # -- in memory --
    def load(self) -> None:
        """Read persisted offsets into memory (nothing to do for the broker-backed store)."""

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        if mq is None:
            return
        with self._lock:
            old = self._table.get(mq)
            if old is None or not increase_only or offset > old:
                self._table[mq] = int(offset)
            if not increase_only:  # an explicit set (reset, seek): the next commit may go lower
                self.commit_guard.reset(mq)

    def read_offset(self, mq: MessageQueue, read_type) -> int:
        read_type = _read_type(read_type)
        if mq is None:
            return -1
        if read_type is not ReadOffsetType.READ_FROM_STORE:
            with self._lock:
                offset = self._table.get(mq)
            if offset is not None:
                return offset
            if read_type is ReadOffsetType.READ_FROM_MEMORY:
                return -1
        return self._read_from_store(mq)

    def _read_from_store(self, mq: MessageQueue) -> int:
        offset = self._stored_offset(mq)
        if offset >= 0:
            self.update_offset(mq, offset, False)
        return offset

    @abc.abstractmethod
    def _stored_offset(self, mq: MessageQueue) -> int:
        """The offset the store of record holds for `mq`: -1 when it has none, -2 when it cannot
        be read now (implemented by each subclass)."""

    def remove_offset(self, mq: MessageQueue) -> None:
        with self._lock:
            self._table.pop(mq, None)
            self.commit_guard.reset(mq)

    def clone_offset_table(self, topic: str | None = None) -> dict[MessageQueue, int]:
        """A copy of the table, only `topic`'s queues unless topic is empty."""
        with self._lock:
            return {mq: off for mq, off in self._table.items() if not topic or mq.topic == topic}

    # -- persistence --
    def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        """Persist the offsets of `mqs` (nothing when there are none)."""
        mqs = set(mqs or ())
        if mqs:
            self._persist_all(mqs)

    @abc.abstractmethod
    def _persist_all(self, mqs: set[MessageQueue]) -> None:
        """persist_all for a non-empty set: implemented by each subclass."""

    @abc.abstractmethod
    def persist(self, mq: MessageQueue) -> None:
        """Implemented by each subclass."""

    @abc.abstractmethod
    def update_consume_offset_to_broker(self, mq: MessageQueue, offset: int, oneway: bool) -> None:
        """Implemented by each subclass."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} group={self.group!r} queues={len(self._table)}>"


class RemoteBrokerOffsetStore(OffsetStore):
    """Clustering: offsets live on the broker (RocketMQ RemoteBrokerOffsetStore)."""

    def __init__(self, group: str, broker_api, client_id: str | None = None):
        super().__init__(group, client_id)
        for method in ("query_consumer_offset", "update_consumer_offset"):
            if not callable(getattr(broker_api, method, None)):
                raise IllegalArgumentError(
                    f"remote offset store for group {group!r} needs a broker_api with {method}(), got {broker_api!r}")
        self.broker_api = broker_api
        if hasattr(broker_api, "commit_guard"):  # the client's API re-checks in its event loop, right before the send
            broker_api.commit_guard = self.commit_guard

    def _stored_offset(self, mq: MessageQueue) -> int:
        try:
            return int(self.broker_api.query_consumer_offset(mq))
        except Exception as e:  # noqa: BLE001 - network trouble: RocketMQ reports -2, the caller retries later
            if isinstance(e, MQBrokerError) and e.code == QUERY_NOT_FOUND:
                return -1
            log.warning("fetchConsumeOffsetFromBroker %s for group %s failed: %s", mq, self.group, e)
            return -2

    def _persist_all(self, mqs: set[MessageQueue]) -> None:
        """Send the offsets of `mqs` to the broker (oneway); forget queues no longer in `mqs`."""
        with self._lock:
            queues = list(self._table)
        unused = []
        for mq in queues:
            if mq in mqs:
                self._send(mq, "persistAll")
            else:
                unused.append(mq)
        if unused:
            with self._lock:
                for mq in unused:
                    self._table.pop(mq, None)
                    self.commit_guard.reset(mq)
                    log.info("remove unused mq, %s, %s", mq, self.group)

    def persist(self, mq: MessageQueue) -> None:
        self._send(mq, "persist")

    def _send(self, mq: MessageQueue, what: str) -> None:
        # The offset is read now, not from a snapshot taken before the first queue was sent:
        # meanwhile pulls commit newer offsets, and an older one sent after them would step back.
        with self._lock:
            offset = self._table.get(mq)
        if offset is None:
            return
        try:
            self.update_consume_offset_to_broker(mq, offset, True)
            log.debug("[%s] Group: %s ClientId: %s updateConsumeOffsetToBroker %s %s",
                      what, self.group, self.client_id, mq, offset)
        except Exception as e:  # noqa: BLE001 - the next periodic persist retries
            log.error("updateConsumeOffsetToBroker %s (group %s) failed: %s", mq, self.group, e)

    def update_consume_offset_to_broker(self, mq: MessageQueue, offset: int, oneway: bool) -> None:
        if self.commit_guard.admit(mq, int(offset)):
            self.broker_api.update_consumer_offset(mq, int(offset), bool(oneway))


class LocalFileOffsetStore(OffsetStore):
    """Broadcasting: offsets in a local JSON file per consumer group (RocketMQ LocalFileOffsetStore).

    File shape: `{"group": "...", "offsetTable": [{"topic", "brokerName", "queueId", "offset"}, ...]}`
    (a list, because a queue is three values and broker names may contain '@').
    """

    def __init__(self, group: str, offset_dir: str | os.PathLike | None = None, client_id: str | None = None):
        super().__init__(group, client_id)
        root = os.fspath(offset_dir) if offset_dir else os.environ.get(OFFSET_STORE_DIR_ENV) or os.path.join(
            os.path.expanduser("~"), ".rmq_offsets")
        self.store_path = os.path.join(root, self.group, OFFSETS_FILE)
        self._file_lock = threading.Lock()

    def load(self) -> None:
        stored = self._read_local()
        with self._lock:
            self._table.update(stored)
        for mq, offset in stored.items():
            log.info("load consumer's offset, %s %s %s", self.group, mq, offset)

    def _stored_offset(self, mq: MessageQueue) -> int:
        try:
            return self._read_local().get(mq, -1)
        except MQClientError as e:
            log.warning("%s", e)
            return -1

    def _persist_all(self, mqs: set[MessageQueue]) -> None:
        with self._lock:
            wanted = {mq: off for mq, off in self._table.items() if mq in mqs}
        self._merge_and_write(wanted)

    def persist(self, mq: MessageQueue) -> None:
        if mq is None:
            return
        with self._lock:
            offset = self._table.get(mq)
        if offset is not None:
            self._merge_and_write({mq: offset})

    def update_consume_offset_to_broker(self, mq: MessageQueue, offset: int, oneway: bool) -> None:
        """Broadcasting offsets never go to the broker (RocketMQ does nothing here either)."""

    # -- file --
    def _merge_and_write(self, offsets: dict[MessageQueue, int]) -> None:
        # Read-merge-write (as RocketMQ does) so queues persisted earlier but not in `offsets` survive;
        # an flock on `offsets.json.lock` serialises it with other processes of the same group.
        with self._file_lock:
            try:
                os.makedirs(os.path.dirname(self.store_path), exist_ok=True)
                lock_fd = os.open(self.store_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                log.error("persist consumer offsets to %s failed: %s", self.store_path, e)
                return
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                self._merge_and_write_locked(offsets)
            finally:
                os.close(lock_fd)  # closing drops the flock

    def _merge_and_write_locked(self, offsets: dict[MessageQueue, int]) -> None:
        try:
            table = self._read_local()
        except MQClientError as e:
            log.error("not persisting offsets of group %s: %s", self.group, e)
            return
        table.update(offsets)
        data = json.dumps({
            "group": self.group,
            "offsetTable": [
                {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
                for mq, off in sorted(table.items())
            ],
        }, indent=1).encode("utf-8")
        try:
            prev = read_file_bytes(self.store_path)
            if prev is not None and _decode(prev) is not None:
                atomic_write(self.store_path + ".bak", prev)  # keep the last good version
            atomic_write(self.store_path, data)
        except OSError as e:
            log.error("persist consumer offsets to %s failed: %s", self.store_path, e)

    def _read_local(self) -> dict[MessageQueue, int]:
        """The stored table; main file first, then `.bak`.  {} when neither exists."""
        main = read_file_bytes(self.store_path)
        if main is not None and main.strip():
            table = _decode(main)
            if table is not None:
                return table
            log.warning("offset file %s is corrupt; falling back to %s.bak", self.store_path, self.store_path)
        bak = read_file_bytes(self.store_path + ".bak")
        if bak is None or not bak.strip():
            if main is not None and main.strip():
                raise MQClientError(f"offset file {self.store_path} is corrupt and has no backup; "
                                    f"move it away to start from the consume-from-where policy")
            return {}
        table = _decode(bak)
        if table is None:
            raise MQClientError(f"offset file {self.store_path} and its backup are both corrupt; "
                                f"move them away to start from the consume-from-where policy")
        return table


def _decode(raw: bytes) -> dict[MessageQueue, int] | None:
    """Parse an offsets file; None when it is not a well-formed one."""
    try:
        obj = json.loads(raw.decode("utf-8"))
        return {MessageQueue(e["topic"], e["brokerName"], int(e["queueId"])): int(e["offset"])
                for e in obj["offsetTable"]}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def remote_factory(group: str, *, broker_api=None, offset_dir=None, client_id=None) -> RemoteBrokerOffsetStore:
    if broker_api is None:
        raise IllegalArgumentError(f"the 'remote' offset store of group {group!r} needs broker_api=")
    return RemoteBrokerOffsetStore(group, broker_api, client_id)


def local_file_factory(group: str, *, broker_api=None, offset_dir=None, client_id=None) -> LocalFileOffsetStore:
    return LocalFileOffsetStore(group, offset_dir, client_id)
