"""Type stub for the native message codec (rmq_core/_native/record.pyx)."""
from typing import Any, Final, Iterable, Mapping

class MessageExt:
    topic: str
    flag: int
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    body_crc: int
    sys_flag: int
    born_timestamp: int
    store_timestamp: int
    reconsume_times: int
    prepared_transaction_offset: int
    broker_name: str | None
    body: bytes | None
    born_host: str
    store_host: str
    properties: dict[str, str]
    tags: str | None
    keys: str | None
    delay_time_level: int
    msg_id: str
    receipt_handle: str | None  # the POP_CK property (a message received by a SimpleConsumer)
    delivery_attempt: Final[int]  # reconsume_times + 1
    offset_msg_id: Final[str]  # read-only
    raw_properties: Final[bytes]  # read-only
    def __init__(
        self,
        *,
        topic: str = "",
        body: bytes | bytearray | memoryview | str | None = b"",
        flag: int = 0,
        queue_id: int = 0,
        queue_offset: int = 0,
        commit_log_offset: int = 0,
        store_size: int = 0,
        body_crc: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: str | tuple[str, int] | None = None,
        store_timestamp: int = 0,
        store_host: str | tuple[str, int] | None = None,
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        broker_name: str | None = None,
        properties: Mapping[str, str] | str | bytes | None = None,
        msg_id: str | None = None,
    ) -> None: ...
    def get_property(self, name: str, default: Any = None) -> str | Any: ...
    def get_user_property(self, name: str, default: Any = None) -> str | Any: ...
    def put_property(self, name: str, value: object) -> None: ...
    def put_user_property(self, name: str, value: object) -> None: ...
    def clear_property(self, name: str) -> None: ...
    def to_dict(self) -> dict[str, Any]: ...

def decode_messages(
    buf: bytes | bytearray | memoryview,
    *,
    decompress: bool = True,
    read_body: bool = True,
    broker_name: str | None = None,
) -> list[MessageExt]: ...
def decode_message(
    buf: bytes | bytearray | memoryview,
    offset: int = 0,
    *,
    decompress: bool = True,
    read_body: bool = True,
    broker_name: str | None = None,
) -> MessageExt: ...
def decode_batch_body(buf: bytes | bytearray | memoryview) -> list[tuple[int, bytes, bytes]]: ...
def record_sizes_and_flags(buf: bytes | bytearray | memoryview) -> list[tuple[int, int, int | None]]: ...
def has_compression_type_bits(buf: bytes | bytearray | memoryview) -> bool: ...
def java_string_hash(s: str | None) -> int: ...
def string_to_properties(data: bytes | bytearray | memoryview | str | None) -> dict[str, str]: ...
def properties_to_bytes(props: Mapping[str, object] | Iterable[tuple[str, object]] | None) -> bytes: ...
def tags_code_from_properties(data: bytes | bytearray | memoryview | str | None) -> int: ...
def ip_bytes(host: str) -> bytes | None: ...

COL_TOPIC: int
COL_BROKER_NAME: int
COL_QUEUE_ID: int
COL_QUEUE_OFFSET: int
COL_MSG_ID: int
COL_TAGS: int
COL_KEYS: int
COL_BODY: int
COL_PROPERTIES: int
COL_BORN_TIMESTAMP: int
COL_STORE_TIMESTAMP: int
COL_RECONSUME_TIMES: int

def decode_columns(buf: bytes | bytearray | memoryview, broker_name: str, until_offset: int = -1,
                   skip_properties: tuple[str, ...] = (), columns: int = -1) -> dict[str, Any]: ...

# --- the commit-log record: encoders and the recovery scan ---
from rmq_core._native.mapped import NativeMap as _NativeMap
from rmq_core.errors import IllegalArgumentError as _IllegalArgumentError

STOP_END: int
STOP_BLANK: int
STOP_CORRUPT: int

class PropertiesSizeExceededError(_IllegalArgumentError): ...
class BatchFormatError(_IllegalArgumentError): ...

def encode_batch(body: bytes, topic: bytes, queue_id: int, sys_flag: int, born_ts: int, born_host: bytes,
                 store_host: bytes, reconsume_times: int, extra_properties: bytes, max_message_size: int,
                 plan_only: bool = False) -> tuple: ...
def fit_batch(body: bytes, body_pos: int, n_items: int, topic: bytes, sys_flag: int, born_host: bytes,
              store_host: bytes, extra_properties: bytes, write_pos: int, file_size: int) -> tuple[int, int, int]: ...
def verify_records(m: _NativeMap, start: int, end: int, file_from_offset: int, check_crc: bool,
                   collect: bool = True, delay_levels_ms: list[int] | None = None) -> tuple[int, int, int, int, list]: ...

class UniqIds:
    def __init__(self, prefix: Any, month_bounds: Any, sequence: Any) -> None: ...
    def __call__(self) -> str: ...

def encode_send_batch(msgs: list[Any], max_message_size: int, message_cls: type, reserved: frozenset[str],
                      check_topic: Any, uniq_ids: UniqIds) -> tuple[str, str, bytes, bool]: ...
def encode_batch_item(message: Any, max_message_size: int, message_cls: type, reserved: frozenset[str],
                      check_topic: Any, uniq_ids: UniqIds) -> tuple[str, str, bytes, bool]: ...
