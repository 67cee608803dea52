"""Pure-Python reference of the index file's put and select kernels (rmq_core._native.index),
written from the layout in rmq_core/store/index.py: the property test builds the same files with
both and compares them byte for byte, and the same queries through both."""
from __future__ import annotations

from rmq_core.store.index import _ENTRY, _HEADER, _SLOT, INDEX_SIZE, INVALID_INDEX, IndexFile

_I32_MAX = 0x7FFFFFFF


def put_records_py(f: IndexFile, records, run, i: int, indexed: int) -> tuple[int, int]:
    """The reference takes no run: every record goes through the service's loop and put_key_py."""
    return i, indexed


def put_key_py(f: IndexFile, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
    begin_ts, _end_ts, begin_phy, _end_phy, slot_count, count = _HEADER.unpack_from(f._mm, 0)
    count = max(count, 1)
    if count >= f.index_num:
        return False
    slot_pos = f._slot_pos(key_hash)
    prev = f._slot_head(slot_pos, count)
    if count <= 1:
        # The first entry starts the file's time and offset range (diff 0).
        begin_ts, begin_phy = store_timestamp, phy_offset
    diff = (store_timestamp - begin_ts) // 1000 if begin_ts > 0 else 0
    diff = min(max(diff, 0), _I32_MAX)
    # Entry, then slot, then header: the order crash repair relies on.
    _ENTRY.pack_into(f._mm, f._entry_pos(count), key_hash, phy_offset, diff, prev)
    _SLOT.pack_into(f._mm, slot_pos, count)
    _HEADER.pack_into(f._mm, 0, begin_ts, store_timestamp, begin_phy, phy_offset, slot_count + 1, count + 1)
    f._dirty = True
    return True


def select_phy_offsets_py(f: IndexFile, out: list, seen: set, key_hash: int, max_num: int, begin: int,
                          end: int) -> None:
    count = f.index_count
    if count <= 1:
        return
    index = f._slot_head(f._slot_pos(key_hash), count)
    begin_ts = f.begin_timestamp
    while index > INVALID_INDEX and len(out) < max_num:
        h, off, diff, prev = _ENTRY.unpack_from(f._mm, f._entries_at + index * INDEX_SIZE)
        if diff < 0:
            break
        time_read = begin_ts + diff * 1000
        if h == key_hash and begin <= time_read <= end and off not in seen:
            seen.add(off)
            out.append(off)
        if prev <= INVALID_INDEX or prev >= index or time_read < begin:
            break
        index = prev
