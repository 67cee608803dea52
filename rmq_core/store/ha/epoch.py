"""The epoch file of controller mode (RocketMQ 5's EpochFileCache): `epochFileCheckpoint` under
storePathRootDir, one line `epoch startOffset` per master term this log holds bytes of.

A new master drops the entries that start past its log end and appends ⟨its epoch, its max
offset⟩; a slave finds, against its master's list, the offset both logs agree up to
(`find_consistent_point`), cuts its log there and takes the master's entries from there on.
The file is rewritten whole (temp file, fsync, rename, fsync of the directory) at every change:
a crash leaves the old list or the new one, never a mix.
"""
from __future__ import annotations

import threading

import attrs

from rmq_core.common.files import atomic_write
from rmq_core.errors import StoreError

EPOCH_FILE_NAME = "epochFileCheckpoint"


@attrs.frozen
class EpochEntry:
    epoch: int
    start_offset: int


class EpochFileCache:
    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = self._read()

    # -- file --------------------------------------------------------------------------------------
    def _read(self) -> list[EpochEntry]:
        try:
            with open(self.path, encoding="ascii") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as e:
            raise StoreError(f"cannot read the epoch file {self.path!r}: {e}") from None
        out: list[EpochEntry] = []
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                if len(parts) != 2:
                    raise ValueError
                entry = EpochEntry(int(parts[0]), int(parts[1]))
            except ValueError:
                raise StoreError(f"epoch file {self.path!r} line {lineno}: expected 'epoch startOffset', "
                                 f"got {line!r}") from None
            if entry.epoch <= 0 or entry.start_offset < 0 or (
                    out and (entry.epoch <= out[-1].epoch or entry.start_offset < out[-1].start_offset)):
                raise StoreError(f"epoch file {self.path!r} line {lineno}: {line!r} does not follow "
                                 f"{out[-1] if out else 'the start'} (epochs grow, start offsets never go back)")
            out.append(entry)
        return out

    def _persist(self, entries: list[EpochEntry]) -> None:
        """Write `entries` whole, atomically; then they are this cache's list."""
        atomic_write(self.path, "".join(f"{e.epoch} {e.start_offset}\n" for e in entries).encode("ascii"))
        self._entries = entries

    # -- reading -----------------------------------------------------------------------------------
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    def last_epoch(self) -> int:
        """The newest epoch this log holds bytes of (0: none)."""
        entries = self._entries
        return entries[-1].epoch if entries else 0

    def last_entry(self) -> EpochEntry | None:
        entries = self._entries
        return entries[-1] if entries else None

    # -- changes -----------------------------------------------------------------------------------
    def append(self, epoch: int, start_offset: int) -> None:
        """A new term starting at start_offset (a new master's log end)."""
        with self._lock:
            last = self._entries[-1] if self._entries else None
            if epoch <= 0 or start_offset < 0:
                raise ValueError(f"epoch {epoch} must be > 0 and start offset {start_offset} >= 0")
            if last is not None and epoch <= last.epoch:
                raise ValueError(f"epoch {epoch} does not grow past the last epoch {last.epoch} "
                                 f"(starting at {last.start_offset})")
            if last is not None and start_offset < last.start_offset:
                raise ValueError(f"epoch {epoch}'s start offset {start_offset} is before epoch {last.epoch}'s "
                                 f"start offset {last.start_offset}")
            self._persist(self._entries + [EpochEntry(epoch, start_offset)])

    def truncate_from(self, offset: int) -> None:
        """Drop the entries starting at or after `offset` (a log cut there holds none of their
        bytes; a new master drops those past its log end before it appends its own)."""
        with self._lock:
            keep = [e for e in self._entries if e.start_offset < offset]
            if len(keep) != len(self._entries):
                self._persist(keep)

    def replace_suffix(self, entries: list[EpochEntry]) -> None:
        """A slave takes its master's entries: those of `entries` it lacks replace its own from
        where they start (entries of its own from the first of them on are dropped)."""
        new = sorted(entries, key=lambda e: (e.start_offset, e.epoch))
        for a, b in zip(new, new[1:]):
            if b.epoch <= a.epoch:
                raise ValueError(f"master's epoch entries do not grow: {a} then {b}")
        with self._lock:
            if not new:
                return
            first = new[0]
            keep = [e for e in self._entries if e.epoch < first.epoch and e.start_offset <= first.start_offset]
            self._persist(keep + new)

    # -- the slave's check -------------------------------------------------------------------------
    def find_consistent_point(self, master_entries: list[EpochEntry], master_max_offset: int,
                              my_max_offset: int) -> int:
        """The offset this log and the master's agree up to: the last epoch both lists hold with
        the same start offset, ended in each log by the next entry's start (or that log's max
        offset), the smaller of the two ends.

        When no epoch is common: -1 if this list is empty (nothing to compare: a fresh store, or
        a log from before controller mode — the caller keeps its log as it is and the master
        refuses it if it runs past the master's end), else 0 (every byte of this log belongs to
        terms the master does not hold: the caller cuts it all)."""
        mine = self._entries
        if not mine:
            return -1
        by_epoch = {e.epoch: (i, e) for i, e in enumerate(master_entries)}
        for i in range(len(mine) - 1, -1, -1):
            e = mine[i]
            hit = by_epoch.get(e.epoch)
            if hit is None or hit[1].start_offset != e.start_offset:
                continue
            j = hit[0]
            my_end = mine[i + 1].start_offset if i + 1 < len(mine) else my_max_offset
            master_end = master_entries[j + 1].start_offset if j + 1 < len(master_entries) else master_max_offset
            return min(my_end, master_end)
        return 0

    def to_json(self, max_offset: int) -> list[dict]:
        """GET_BROKER_EPOCH_CACHE's epochList: each entry's end is the next one's start, the last's
        this log's max offset."""
        entries = self._entries
        out = []
        for i, e in enumerate(entries):
            end = entries[i + 1].start_offset if i + 1 < len(entries) else max_offset
            out.append({"epoch": e.epoch, "startOffset": e.start_offset, "endOffset": end})
        return out
