"""What the native sender (client_native.PipelinedSender) works from, owned by the Python layer.

The Producer and its client instance keep these tables and settings current; the native code only
reads them (and advances a route's round-robin cursor, TopicPublishInfo.index, as
MQFaultStrategy does), so it never reaches into a Producer or an MQClientInstance."""
from __future__ import annotations

from typing import Any


class SendState:
    __slots__ = (
        # tables (the same dicts the Python layer keeps current)
        "publish_info",  # topic -> TopicPublishInfo (the producer's route cache)
        "headers",  # (topic, broker, queue id, batch) -> client_native.SendHeader (the producer's cache)
        "broker_addrs",  # broker name -> {broker id: address} (the instance's broker_addr_table)
        "master_id",  # the broker id of a master (MixAll.MASTER_ID)
        "fault",  # the MQFaultStrategy: .enabled, .select_one_message_queue(info, last_broker)
        "benched",  # broker name -> FaultItem (its LatencyFaultTolerance.items)
        "clock",  # that table's clock (ms)
        "checked_topics",  # topic names check_message passed
        # settings (the producer's, written through when changed)
        "max_message_size",
        "compress_over",  # compress_msg_body_over_howmuch
        "one_channel_per_broker",  # pipelined_send_connections == 1: a broker's open connection is cached
        "loop_thread_ident",  # the client loop's thread (it must never block on a socket)
        # what the native code calls
        "pipelined_possible",  # () -> bool: not shutting down
        "channel_for",  # (address) -> the broker's pipelined connection (tcp or in-proc)
        "send_general",  # (message, timeout, queue, address, mode): SendAttempts once a queue is picked
        "failed",  # (context, response, error): an attempt's failure, judged (and retried) by SendAttempts
        "completion",  # client_native.PipelinedCompletion: a send's usual answer
        "check_message",  # (message, max_message_size): raises for a bad message
        "uniq",  # () -> a new UNIQ_KEY
        "opaques",  # an iterator of request opaques
        "future_cls",  # LeanFuture
        "message_cls",  # Message (a user's subclass goes the Python way)
        "remoting_error",  # what channel_for raises when it cannot connect
    )

    def __init__(self, **fields: Any):
        for name in self.__slots__:
            setattr(self, name, fields.get(name))

    def __repr__(self) -> str:
        return f"SendState(max_message_size={self.max_message_size}, compress_over={self.compress_over})"


