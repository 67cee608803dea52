"""rmq: a RocketMQ-4.x-compatible message broker for Python."""
from rmq_core.errors import (  # noqa: F401
    ConfigError, IllegalArgumentError, MQBrokerError, MQClientError, RMQError,
)
from rmq_core.message import (  # noqa: F401
    ConsumeFromWhere, ConsumeStatus, LocalTransactionState, Message, MessageExt, MessageModel,
    MessageQueue,
    MessageSelector, PullResult, PullStatus, SendResult, SendStatus,
)

__version__ = "0.1.0"
