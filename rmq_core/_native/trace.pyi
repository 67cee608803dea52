"""Type stub for the native message trace records (rmq_core/_native/trace.pyx)."""
from collections import deque
from typing import Any, Callable

class TraceBuffer:
    pubs: deque
    notes: deque
    capacity: int
    discarded: int
    def __init__(self, capacity: int, wake: Callable[[], Any]) -> None: ...
    def __len__(self) -> int: ...
    def offer_pub(self, context: tuple, result: Any) -> bool: ...
    def offer(self, note: tuple) -> bool: ...

def pub_record(timestamp: int, region: str, group: str, topic: str, msg_id: str, tags: str | None,
               keys: str | None, store_host: str, body_length: int, cost: int, msg_type: int, offset_msg_id: str,
               success: bool) -> str: ...
def write_pubs(pubs: deque, group: str, epoch_offset: float, trace_topic: str, body: bytearray,
               keys: dict[str, None], size: int, key_bytes: int, max_size: int, max_key_bytes: int, ok_status: Any,
               message_type_of: Callable[[Any], int]) -> tuple[int, int]: ...
