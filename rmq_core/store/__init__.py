"""The message store: commit log, consume queues, index, checkpoint, flush and retention.

`DefaultMessageStore` is the facade the broker codes against; see its module for the API.
"""
from rmq_core.store.message_store import DefaultMessageStore, disk_usage_ratio
from rmq_core.store.types import (AppendMessageResult, DispatchRequest, GetMessageResult, GetMessageStatus,
                                  MessageExtBatch, MessageExtBrokerInner, PutMessageResult, PutMessageStatus,
                                  QueryMessageResult)
from rmq_core.errors import BatchFormatError, PropertiesSizeExceededError

__all__ = [
    "AppendMessageResult", "BatchFormatError", "DefaultMessageStore", "DispatchRequest", "GetMessageResult",
    "GetMessageStatus", "MessageExtBatch", "MessageExtBrokerInner", "PropertiesSizeExceededError",
    "PutMessageResult", "PutMessageStatus", "QueryMessageResult", "disk_usage_ratio",
]
