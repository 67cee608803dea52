"""Controller mode (automatic failover): the controller keeps each broker group's state in etcd
(docs/failover.md).  Imports nothing heavy: the etcd client comes in only when a controller starts."""
