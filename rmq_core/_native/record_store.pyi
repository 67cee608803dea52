"""Type stub for rmq_core/_native/record_store.pyx (the store's record encoders, the recovery scan)."""
from rmq_core._native.mapped import NativeMap as _NativeMap

STOP_END: int
STOP_BLANK: int
STOP_CORRUPT: int

def encode_record(topic: str, body: bytes, queue_id: int = 0, flag: int = 0, queue_offset: int = 0,
                  commit_log_offset: int = 0, sys_flag: int = 0, born_timestamp: int = 0, born_host: object = None,
                  store_timestamp: int = 0, store_host: object = None, reconsume_times: int = 0,
                  prepared_transaction_offset: int = 0, properties: object = None) -> bytes: ...
def encode_batch(body: bytes, topic: bytes, queue_id: int, sys_flag: int, born_ts: int, born_host: bytes,
                 store_host: bytes, reconsume_times: int, extra_properties: bytes, max_message_size: int,
                 plan_only: bool = False) -> tuple: ...
def fit_batch(body: bytes, body_pos: int, n_items: int, topic: bytes, sys_flag: int, born_host: bytes,
              store_host: bytes, extra_properties: bytes, write_pos: int, file_size: int) -> tuple[int, int, int]: ...
def verify_records(m: _NativeMap, start: int, end: int, file_from_offset: int, check_crc: bool,
                   collect: bool = True, delay_levels_ms: list[int] | None = None) -> tuple[int, int, int, int, list]: ...
