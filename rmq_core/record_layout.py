"""The commit-log message record's constants and field offsets for Python readers: a mirror of
rmq_core/_native/record_layout.pxd (the one definition, docs/protocol.md §5), held to it by
tests/test_record_layout.py.  Readers of a raw record use these names instead of numbers."""
from __future__ import annotations

MESSAGE_MAGIC_CODE = 0xDAA320A7
BLANK_MAGIC_CODE = 0xCBD43194

TOTAL_SIZE_AT = 0
MAGIC_CODE_AT = 4
BODY_CRC_AT = 8
QUEUE_ID_AT = 12
FLAG_AT = 16
QUEUE_OFFSET_AT = 20
PHYSICAL_OFFSET_AT = 28
SYS_FLAG_AT = 36
BORN_TIMESTAMP_AT = 40
BORN_HOST_AT = 48
HOST_V4_LEN = 8
HOST_V6_LEN = 20
RECORD_FIXED_NO_HOSTS = 72
RECORD_FIXED_V4 = 91
MIN_BLANK = 8
MAX_TOPIC = 127
MAX_PROPS = 32767
BATCH_ITEM_FIXED = 22

COMPRESSED = 0x1
MULTI_TAGS = 0x2
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_MASK = 0xC
BORNHOST_V6 = 0x10
STOREHOST_V6 = 0x20
NEED_UNWRAP = 0x40
INNER_BATCH = 0x80
COMPRESSION_LZ4 = 0x100
COMPRESSION_ZSTD = 0x200
COMPRESSION_ZLIB = 0x300
COMPRESSION_TYPE_MASK = 0x700


def born_host_len(sys_flag: int) -> int:
    return HOST_V6_LEN if sys_flag & BORNHOST_V6 else HOST_V4_LEN


def store_host_len(sys_flag: int) -> int:
    return HOST_V6_LEN if sys_flag & STOREHOST_V6 else HOST_V4_LEN


def store_timestamp_at(sys_flag: int) -> int:
    return BORN_HOST_AT + born_host_len(sys_flag)


def store_host_at(sys_flag: int) -> int:
    return store_timestamp_at(sys_flag) + 8


def reconsume_times_at(sys_flag: int) -> int:
    return store_host_at(sys_flag) + store_host_len(sys_flag)


def body_length_at(sys_flag: int) -> int:
    return reconsume_times_at(sys_flag) + 12
