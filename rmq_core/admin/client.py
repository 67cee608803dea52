"""AdminClient: the calls of RocketMQ's MQAdminExt over the 4.x remoting protocol.

Every call is a plain blocking request/response on the caller's thread (BlockingChannelPool: one
socket per concurrent caller and address, no event loop), with the standard request codes and
body formats, so the same calls work against rmq and against an Apache RocketMQ 4.x cluster
wherever the codes match.  Failures raise AdminError with one line naming what was wrong (the
topic, group, broker or id) - never a bare response code.

    >>> with AdminClient("127.0.0.1:9876") as admin:
    ...     for row in admin.topic_stats("TopicA"):
    ...         print(row.broker_name, row.queue_id, row.min_offset, row.max_offset)

Values come back as small frozen attrs objects (QueueStats, ConsumeStats, Connection, ...) or
dicts where RocketMQ's own structure is a free-form table (runtime info, broker config).
"""
from __future__ import annotations

from rmq_core.admin.calls.acl import AclCalls
from rmq_core.admin.calls.controller import ControllerCalls
from rmq_core.admin.calls.dlq import DlqCalls
# the values the calls return, importable from here as before (public API)
from rmq_core.admin.values import (  # noqa: F401
    AclVersion, AdminError, BrokerInfo, ConsumeStats, Connection, ConsumerConnection, OffsetReset, QueueProgress,
    QueueStats, SendOutcome,
)


class AdminClient(DlqCalls, AclCalls, ControllerCalls):
    """The admin calls against one cluster, addressed by its name server(s).

    namesrv: 'host:port' or 'host:port;host:port' (else NAMESRV_ADDR from the environment), or an
    embedded cluster's `inproc://` address.  Safe to share between threads (each call borrows its
    own connection).  Close it (or use `with`) to drop the connections.
    """


__all__ = ["AdminClient", "AdminError", "AclVersion", "BrokerInfo", "ConsumeStats", "Connection", "ConsumerConnection",
           "OffsetReset", "QueueProgress", "QueueStats", "SendOutcome"]
