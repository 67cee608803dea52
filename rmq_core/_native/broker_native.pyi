"""Type stubs for rmq_core._native.broker_native (the broker's native send lane)."""
from typing import Any, Callable

class PlainSend:
    topic: str
    body: bytes
    properties_bytes: bytes
    born_host: tuple[str, int]
    queue_id: int
    sys_flag: int
    flag: int
    reconsume_times: int
    born_timestamp: int
    @property
    def properties(self) -> None: ...
    @property
    def store_host(self) -> None: ...
    @property
    def tags_code(self) -> None: ...
    @property
    def prepared_transaction_offset(self) -> int: ...

class SendLane:
    handled: int
    declined: int
    deferred: int
    failed: int
    @property
    def waiting(self) -> int: ...
    def __init__(self, ctx: Any, store: Any, topic_manager: Any, broker_config: Any, stats: Any,
                 table: Any, send_topics: dict, cluster_prop: bytes, born_host: tuple[str, int], version: int,
                 tasks: set, max_inflight: int, json_type: Any, put_ok: Any,
                 on_deferred: Callable[[memoryview, Any, Any, str, int], None],
                 call_soon_threadsafe: Callable[..., Any] | None = None,
                 write_frames: Callable[[bytes], None] | None = None,
                 sync_outcome: Callable[[Any], tuple[int, str | None, bool]] | None = None,
                 on_error: Callable[[memoryview, Exception], None] | None = None) -> None: ...
    def deliver(self, data: bytes | bytearray, max_frame_length: int, on_frame: Callable[[memoryview], bool],
                emit: Callable[[bytes], None]) -> tuple[int, str | None]: ...
