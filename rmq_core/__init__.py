"""rmq: a RocketMQ-4.x-compatible message broker for Python."""
import logging as _logging

from rmq_core.errors import (  # noqa: F401
    ConfigError, IllegalArgumentError, MQBrokerError, MQClientError, RMQError,
)
from rmq_core.message import (  # noqa: F401
    ConsumeFromWhere, ConsumeStatus, LocalTransactionState, Message, MessageExt, MessageModel,
    MessageQueue,
    MessageSelector, PullResult, PullStatus, SendResult, SendStatus,
)

__version__ = "0.1.0"



class _NamedLastResort(_logging.Handler):
    """Python's last-resort handler for rmq's loggers, naming the logger: every line rmq logs goes
    through a named logger under "rmq", and a program that configured no logging of its own still
    sees warnings and errors (a consumer's topic that does not exist) with the name that lets it
    configure them.  Once the program configures logging (a root handler), this one stays silent."""

    def __init__(self):
        super().__init__(_logging.WARNING)
        self.setFormatter(_logging.Formatter("%(name)s %(levelname)s: %(message)s"))

    def emit(self, record):
        if _logging.getLogger().handlers:
            return
        import sys
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


_logging.getLogger("rmq").addHandler(_NamedLastResort())

# Clients (and the embedded cluster) are imported on first use so `import rmq_core` (the broker,
# the store) stays light.
_LAZY_EXPORTS = {
    "standalone": "rmq_core.embedded",
    "Cluster": "rmq_core.embedded",
    "Producer": "rmq_core.client.producer",
    "PushConsumer": "rmq_core.client.push_consumer",
    "PullConsumer": "rmq_core.client.pull_consumer",
    "SimpleConsumer": "rmq_core.client.simple_consumer",
    "TransactionProducer": "rmq_core.client.transaction",
    "TransactionSendResult": "rmq_core.client.transaction",
    "SelectMessageQueueByHash": "rmq_core.client.selector",
    "SelectMessageQueueByRandom": "rmq_core.client.selector",
}


def __getattr__(name):
    if name == "aio":  # the asyncio API (a module of its own)
        import importlib

        return importlib.import_module("rmq_core.aio")
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rmq_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_EXPORTS) | {"aio"})
