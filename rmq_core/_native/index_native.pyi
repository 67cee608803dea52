"""Type stubs for rmq_core._native.index_native (the IndexFile put/select paths)."""
import mmap

def index_key_hash(key: str) -> int:
    """abs(Java String.hashCode(key)); abs(Integer.MIN_VALUE) -> 0."""

class IndexMap:
    hash_slot_num: int
    index_num: int
    def __init__(self, mm: mmap.mmap, hash_slot_num: int, index_num: int) -> None: ...
    def release(self) -> None: ...
    def put_key(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool: ...
    def select_phy_offsets(self, out: list[int], seen: set[int], key_hash: int, max_num: int, begin: int,
                           end: int) -> None: ...
