"""Type stub for rmq_core/_native/record_columns.pyx (a pull body as Arrow columns)."""
from typing import Any

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
