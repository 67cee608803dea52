"""Type stubs for rmq_core._native.send_pipeline (the send pipeline's kernel)."""
from typing import Any

from rmq_core._native.trace import TraceBuffer
from rmq_core._native.frame import SendResponse
from rmq_core._native.send_route import MQFaultStrategy, TopicPublishInfo
from rmq_core.message import Message, MessageQueue, SendResult

class SendResultMaker:
    def __init__(self, send_result_cls: type[SendResult], field_names: tuple[str, ...], message_queue_cls: type[MessageQueue],
                 status_by_code: dict[Any, Any], default_region: str = "DefaultRegion") -> None: ...
    def make(self, response: SendResponse, mq: MessageQueue, msg_id: str) -> SendResult | None: ...

class PipelinedCompletion:
    def __init__(self, *, maker: SendResultMaker, fault: MQFaultStrategy, noted: dict[str, int], fallback: Any,
                 traced: TraceBuffer | None = None) -> None: ...
    def __call__(self, context: tuple, response: SendResponse | None, error: BaseException | None) -> None: ...


class PipelinedSender:
    def __init__(self, *, routes: dict[str, TopicPublishInfo], fault: MQFaultStrategy, headers: dict[tuple, Any],
                 broker_addrs: dict[str, dict[int, str]], master_id: int, checked_topics: set[str],
                 check_message: Any, new_uniq: Any, opaques: Any, future_cls: type, message_cls: type[Message],
                 channel_for: Any, remoting_error: type[BaseException], completion: PipelinedCompletion,
                 send_general: Any, failed: Any, one_channel_per_broker: bool, steps_on: bool = False,
                 header_signer: Any = None, before_steps: list | None = None, encode_send: Any = None,
                 max_message_size: int, compress_over: int) -> None: ...
    def configure(self, *, max_message_size: int | None = None, compress_over: int | None = None,
                  open: bool | None = None) -> None: ...
    def send(self, message: Message, timeout: float, mode: str = "ASYNC", future: Any = None) -> Any: ...

def deliver_responses(items: list[Any], pending: dict[int, tuple[float, Any, Any]],
                      failed: Any) -> tuple[int, list[Any]]: ...

def finish_batch(maker: SendResultMaker, batch: list[tuple], status: Any, queue: MessageQueue, base: int,
                 offset_ids: str | None, region: str | None) -> None: ...
