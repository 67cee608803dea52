"""Type stubs for rmq_core._native.send_lane (the broker's native send lane)."""
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

class SendLaneState:
    put: Callable[..., Any] | None
    topics: dict
    data_version: Any
    counter: int
    writable: bool
    cluster_prop: bytes
    version: int
    put_ok: Any
    on_put: Callable[[str, int, int], None]
    outcome: Callable[[Any], tuple[int, str | None, bool]]
    refresh: Callable[["SendLaneState"], None]
    before: Callable[[bytes], Any] | None
    after: Callable[[Any, bytes], None] | None
    def __init__(self, topics: dict, cluster_prop: bytes, version: int, put_ok: Any,
                 on_put: Callable[[str, int, int], None],
                 outcome: Callable[[Any], tuple[int, str | None, bool]],
                 refresh: Callable[["SendLaneState"], None]) -> None: ...

class SendLane:
    handled: int
    declined: int
    deferred: int
    failed: int
    @property
    def state(self) -> SendLaneState: ...
    @property
    def waiting(self) -> int: ...
    def __init__(self, state: SendLaneState, born_host: tuple[str, int], tasks: set, max_inflight: int,
                 on_deferred: Callable[[memoryview, Any, Any, str, int], None], *,
                 call_soon_threadsafe: Callable[..., Any] | None = None,
                 write_frames: Callable[[bytes], None] | None = None,
                 on_error: Callable[[memoryview, Exception], None] | None = None,
                 on_json_peer: Callable[[], None] | None = None) -> None: ...
    def deliver(self, data: bytes | bytearray, max_frame_length: int, on_frame: Callable[[memoryview], bool],
                emit: Callable[[bytes], None]) -> tuple[int, str | None]: ...

def checked_queues(state: SendLaneState, topic: Any, queue_id: int) -> int: ...
def plain_send_queues(state: SendLaneState, topic: Any, queue_id: int, sys_flag: int, properties: bytes) -> int: ...
def special_properties(properties: bytes) -> bool: ...
