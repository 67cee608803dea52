"""Type stubs for rmq_core._native.proto_send (RocketMQ 5's SendMessageRequest / SendMessageResponse wire codec)."""
from typing import Final

SEND_FIELDS: Final[tuple[str, ...]]

def decode_send_request(data: bytes) -> list[tuple]: ...
def encode_send_response(code: int, message: str, entries: list[tuple[int, str, str, str, int]]) -> bytes: ...
