"""rmq clients: Producer, PushConsumer, PullConsumer (RocketMQ 4.x semantics, Pythonic API), and
SimpleConsumer (RocketMQ 5's pop consumption over the remoting protocol).

    from rmq_core import Producer, PushConsumer, PullConsumer, SimpleConsumer, Message, ConsumeStatus

Both transports work: namesrv="127.0.0.1:9876" (TCP) or the inproc:// address of an embedded
name server (`rmq_core.standalone(...).namesrv`).
"""
from rmq_core.client.config import ClientConfig
from rmq_core.client.instance import MQClientInstance, MQClientManager
from rmq_core.client.producer import Producer
from rmq_core.client.pull_consumer import PullConsumer
from rmq_core.client.push_consumer import PushConsumer
from rmq_core.client.simple_consumer import SimpleConsumer
from rmq_core.client.transaction import TransactionProducer, TransactionSendResult
from rmq_core.client.selector import (
    MessageQueueSelector, SelectMessageQueueByHash, SelectMessageQueueByRandom,
)

__all__ = [
    "ClientConfig", "MQClientInstance", "MQClientManager", "Producer", "PushConsumer", "PullConsumer",
    "SimpleConsumer", "TransactionProducer", "TransactionSendResult",
    "MessageQueueSelector", "SelectMessageQueueByHash", "SelectMessageQueueByRandom",
]
