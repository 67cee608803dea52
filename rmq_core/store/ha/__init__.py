"""Master-slave replication of the commit log, as RocketMQ 4.9's store/ha.

* `HAService` (master and slave): on a master it accepts slaves (`AcceptSocketService`) and keeps
  one `HAConnection` per slave, which transfers commit-log bytes and reads the slave's
  acknowledgements; `GroupTransferService` answers SYNC_MASTER puts once a slave acknowledged
  them.  On a slave, `HAClient` connects to the master, reports its max offset and appends what
  the master sends (`DefaultMessageStore.append_to_commit_log`).
* Wire protocol (RocketMQ's, unchanged): slave -> master an 8-byte big-endian commit-log offset
  (its max offset: on connect, after appending, and at least every haSendHeartbeatInterval);
  master -> slave frames of an 8-byte physical offset, a 4-byte size and that many raw
  commit-log bytes (at most haTransferBatchSize), an empty frame as a heartbeat when idle.
"""
from rmq_core.store.ha.ha_client import HAClient
from rmq_core.store.ha.ha_connection import HAConnection
from rmq_core.store.ha.ha_service import GroupTransferService, HAService

__all__ = ["GroupTransferService", "HAClient", "HAConnection", "HAService"]
