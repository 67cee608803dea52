"""Type stubs for rmq_core._native.frame (frame splitting, the JSON header codec, the send request
header writer and the send response reader)."""
from typing import Any

HeaderValues = tuple[int, str, int, int, int, str | None, dict[str, str], bytes | None]
HEADER_FIELDS: tuple[str, ...]

def split_frames(data: bytes | bytearray | memoryview, max_frame_length: int) -> tuple[list[memoryview], int]: ...
def decode_frames(data: bytes | bytearray | memoryview, max_frame_length: int) -> tuple[list[HeaderValues | memoryview], int]: ...
def decode_frame(frame: bytes | bytearray | memoryview) -> HeaderValues | None: ...
def encode_json_frame_header(cmd: Any, body_length: int) -> bytes | None: ...
def copy_if_plain(ext: Any) -> dict[str, str] | None: ...
def header_ints(ext: dict[str, Any], keys: tuple[str, ...], defaults: tuple[Any, ...]) -> tuple[Any, ...] | None: ...

def now_ms() -> int: ...

class SendHeader:
    code: int
    topic: str
    queue_id: int
    broker_name: str
    def __init__(self, group: str, topic: str, queue_id: int, broker_name: str, create_topic_key: str = "TBW102",
                 default_topic_queue_nums: int = 4, code: int = 310, batch: bool = False, language: str = "PYTHON",
                 version: int = 0, v2: bool = True) -> None: ...
    def build_frame(self, sys_flag: int, flag: int, properties: dict[str, str | None], opaque: int,
                    body: bytes | bytearray | memoryview, born_timestamp: int | None = None, reconsume_times: int = 0,
                    max_reconsume_times: int | None = None, oneway: bool = False) -> bytes | None: ...
    def build_message_frame(self, message: Any, uniq: str, opaque: int) -> bytes | None: ...

class SendResponse:
    code: int
    flag: int
    opaque: int
    remark: str | None
    msg_id: str | None
    queue_id: int | None
    queue_offset: int | None
    transaction_id: str | None
    region_id: str | None
    def __init__(self, code: int, flag: int = 1, opaque: int = 0, remark: str | None = None, msg_id: str | None = None,
                 queue_id: int | None = None, queue_offset: int | None = None, transaction_id: str | None = None,
                 region_id: str | None = None) -> None: ...
    @staticmethod
    def from_command(cmd: Any) -> SendResponse: ...

def read_send_response(frame: bytes | bytearray | memoryview) -> SendResponse | None: ...
def read_send_responses(data: bytes | bytearray | memoryview, max_frame_length: int) -> tuple[list[SendResponse | bytes], int]: ...
