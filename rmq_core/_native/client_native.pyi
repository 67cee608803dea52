"""Type stubs for rmq_core._native.client_native (the client's native SEND request / response codec)."""
from typing import Any

from rmq_core.message import Message, MessageQueue, SendResult
from rmq_core.remoting.command import RemotingCommand

def now_ms() -> int: ...

class SendHeader:
    code: int
    topic: str
    queue_id: int
    broker_name: str
    def __init__(self, group: str, topic: str, queue_id: int, broker_name: str, create_topic_key: str = "TBW102",
                 default_topic_queue_nums: int = 4, code: int = 310, batch: bool = False, language: str = "PYTHON",
                 version: int = 0) -> None: ...
    def build_frame(self, sys_flag: int, flag: int, properties: dict[str, str | None], opaque: int,
                    body: bytes | bytearray | memoryview, born_timestamp: int | None = None, reconsume_times: int = 0,
                    max_reconsume_times: int | None = None) -> bytes | None: ...
    def build_message_frame(self, message: Message, uniq: str, opaque: int) -> bytes | None: ...

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
    def from_command(cmd: RemotingCommand) -> SendResponse: ...

def read_send_response(frame: bytes | bytearray | memoryview) -> SendResponse | None: ...
def read_send_responses(data: bytes | bytearray | memoryview, max_frame_length: int) -> tuple[list[SendResponse | bytes], int]: ...

class SendResultMaker:
    def __init__(self, send_result_cls: type[SendResult], field_names: tuple[str, ...], message_queue_cls: type[MessageQueue],
                 status_by_code: dict[Any, Any], default_region: str = "DefaultRegion") -> None: ...
    def make(self, response: SendResponse, mq: MessageQueue, msg_id: str) -> SendResult | None: ...

class PipelinedCompletion:
    def __init__(self, maker: SendResultMaker, fault_strategy: Any, noted: dict[str, int], fallback: Any) -> None: ...
    def __call__(self, context: tuple, response: SendResponse | None, error: BaseException | None) -> None: ...

def init_future_states(pending: str, running: str, finished: str) -> None: ...
def finish_unwatched(future: Any, result: Any, exception: BaseException | None) -> bool: ...

class PipelinedSender:
    def __init__(self, producer: Any, instance: Any, future_cls: type, message_cls: type[Message], check_message: Any,
                 uniq_ids: Any, completion: PipelinedCompletion, read_frames: Any, from_command: Any,
                 opaque_counter: Any, remoting_error: type[BaseException], master_id: int = 0) -> None: ...
    def send(self, message: Message, timeout: float) -> Any: ...

def deliver_responses(items: list[Any], pending: dict[int, tuple[float, Any, Any]],
                      failed: Any) -> tuple[int, list[Any]]: ...

class UniqIds:
    def __init__(self, setter_cls: type) -> None: ...
    def __call__(self) -> str: ...

def encode_batch(msgs: list[Message], max_message_size: int, message_cls: type[Message], reserved: frozenset[str],
                 check_topic: Any, id_setter: type) -> tuple[str, str, bytes, bool]: ...
