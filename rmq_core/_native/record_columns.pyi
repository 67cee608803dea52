"""Type stub for rmq_core/_native/record_columns.pyx (a pull body as Arrow columns)."""
from typing import Any

def decode_columns(buf: bytes | bytearray | memoryview, broker_name: str, until_offset: int = -1,
                   skip_properties: tuple[str, ...] = ()) -> dict[str, Any]: ...
