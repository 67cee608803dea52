"""Message codec: the native record routines (rmq_core._native.record) under the names the broker
and the clients import: v1 records (PULL bodies, the commit log), batch bodies and properties
strings.  The layout is docs/protocol.md §5 (its constants: rmq_core/_native/record_layout.pxd);
the pure-Python reference twins are test oracles only (tests/codec_oracle.py).
"""
from __future__ import annotations

from rmq_core._native.record import (  # noqa: F401 - re-exported
    MessageExt,
    decode_message,
    decode_messages,
    has_compression_type_bits,
    java_string_hash,
    properties_to_bytes,
    queue_runs,
    record_sizes_and_flags,
    stamp_popped,
    string_to_properties,
    tags_code_from_properties,
)
from rmq_core._native.record_batch import decode_batch_body  # noqa: F401 - re-exported
from rmq_core.errors import MessageDecodeError  # noqa: F401 - re-exported

__all__ = [
    "MessageDecodeError", "MessageExt", "decode_messages", "decode_message", "decode_batch_body",
    "java_string_hash", "string_to_properties", "properties_to_bytes", "tags_code_from_properties",
    "has_compression_type_bits", "record_sizes_and_flags", "queue_runs", "stamp_popped",
]
