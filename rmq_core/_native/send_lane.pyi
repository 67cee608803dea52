"""Type stubs for rmq_core._native.send_lane (the broker's native send lane)."""
from typing import Any, Callable, Final

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
    properties: Final[None]  # read-only
    store_host: Final[None]  # read-only
    tags_code: Final[None]  # read-only
    prepared_transaction_offset: Final[int]  # read-only

class LaneRequest:  # (what the lane parsed: every attribute read-only)
    code: Final[int]
    flag: Final[int]
    opaque: Final[int]
    body: Final[bytes]
    topic: Final[str]
    frame: Final[bytes]
    ext_fields: Final[Any]
    def command(self) -> Any: ...
    def is_oneway(self) -> bool: ...
    def is_response(self) -> bool: ...
    def get_str(self, name: str, default: Any = None) -> Any: ...
    def signed_send(self) -> tuple[str, str] | None: ...
    def signed_by(self, key: Any, order: Callable[[tuple], tuple]) -> bool: ...

class LaneCheck: ...

class PyLaneCheck(LaneCheck):
    def __init__(self, before: list, ctx: Any) -> None: ...

class LaneChecks(LaneCheck):
    def __init__(self, checks: Any) -> None: ...

class SignedSendCheck(LaneCheck):
    sends: dict
    rules: Any
    def __init__(self, source: Any, order: Callable[[tuple], tuple], fallback: LaneCheck,
                 refill: Callable[["SignedSendCheck"], None]) -> None: ...

class WriteFence:
    writable_until: float
    remark: str
    def __init__(self, writable_until: float = ..., remark: str | None = None) -> None: ...
    def lapsed(self) -> bool: ...

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
    check: LaneCheck | None
    decode: Callable[[bytes], Any] | None
    after: Callable[[Any, bytes], None] | None
    fence: WriteFence
    writable_until: float  # (the fence's)
    def __init__(self, topics: dict, cluster_prop: bytes, version: int, put_ok: Any,
                 on_put: Callable[[str, int, int], None],
                 outcome: Callable[[Any], tuple[int, str | None, bool]],
                 refresh: Callable[["SendLaneState"], None], fence: WriteFence | None = None) -> None: ...

class SendLane:
    handled: int
    declined: int
    deferred: int
    failed: int
    state: Final[SendLaneState]  # read-only
    waiting: Final[int]  # read-only
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
