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
def queue_runs(msgs: list[MessageExt], without: str) -> list[tuple[str, int, int, int]]: ...
def stamp_popped(msgs: list[MessageExt], handles: list[str | None], handle_name: str, first_pop_name: str,
                 first_pop: str, topic: str) -> None: ...
def record_sizes_and_flags(buf: bytes | bytearray | memoryview) -> list[tuple[int, int, int | None]]: ...
def has_compression_type_bits(buf: bytes | bytearray | memoryview) -> bool: ...
def java_string_hash(s: str | None) -> int: ...
def string_to_properties(data: bytes | bytearray | memoryview | str | None) -> dict[str, str]: ...
def properties_to_bytes(props: Mapping[str, object] | Iterable[tuple[str, object]] | None) -> bytes: ...
def tags_code_from_properties(data: bytes | bytearray | memoryview | str | None) -> int: ...
def ip_bytes(host: str) -> bytes | None: ...

def host_bytes(value: str | tuple[str, int] | None, what: str = "host") -> bytes: ...
def offset_msg_id(host: bytes, phys: int) -> str: ...

from rmq_core.errors import IllegalArgumentError as _IllegalArgumentError

class PropertiesSizeExceededError(_IllegalArgumentError): ...
class BatchFormatError(_IllegalArgumentError): ...
