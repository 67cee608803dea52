"""A broker group's controller state as etcd holds it, and the election policy.

Plain values and pure functions: the manager (manager.py) reads them from etcd, decides with them
and writes them back in one compare-and-put transaction.
"""
from __future__ import annotations

import json
from typing import Iterable, Mapping

import attrs

# RocketMQ's default brokerElectionPriority: the lowest priority (a lower number is preferred)
DEFAULT_ELECTION_PRIORITY = 2**31 - 1


def _ids(values: Iterable) -> list[int]:
    return sorted({int(v) for v in values})


@attrs.define
class GroupMeta:
    """`{root}/{cluster}/{brokerName}/meta`: who the master is, its epoch, the sync state set."""
    cluster: str
    broker_name: str
    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int = 0
    sync_state_set: list[int] = attrs.field(factory=list, converter=_ids)
    sync_state_set_epoch: int = 0

    def to_json(self) -> bytes:
        return json.dumps({"clusterName": self.cluster, "brokerName": self.broker_name,
                           "masterBrokerId": self.master_broker_id, "masterAddress": self.master_address,
                           "masterEpoch": self.master_epoch, "syncStateSet": self.sync_state_set,
                           "syncStateSetEpoch": self.sync_state_set_epoch}).encode()

    @classmethod
    def from_json(cls, raw: bytes | None, cluster: str, broker_name: str) -> "GroupMeta":
        if not raw:
            return cls(cluster, broker_name)
        d = json.loads(raw)
        mid = d.get("masterBrokerId")
        return cls(cluster, broker_name, None if mid is None else int(mid), d.get("masterAddress"),
                   int(d.get("masterEpoch", 0)), d.get("syncStateSet") or [], int(d.get("syncStateSetEpoch", 0)))

    def answer_fields(self, alive: Mapping[int, "ReplicaAlive"] | None = None) -> dict:
        """The ext fields of a heartbeat / register / elect answer."""
        ha = ""
        if alive is not None and self.master_broker_id is not None:
            a = alive.get(self.master_broker_id)
            ha = a.ha_address if a is not None else ""
        return {"masterBrokerId": "" if self.master_broker_id is None else str(self.master_broker_id),
                "masterAddress": self.master_address or "", "masterHaAddress": ha or "",
                "masterEpoch": str(self.master_epoch), "syncStateSetEpoch": str(self.sync_state_set_epoch)}

    def summary(self, replicas: "Replicas | None" = None, alive: Mapping[int, "ReplicaAlive"] | None = None) -> dict:
        """One group's row of getSyncStateSet (CONTROLLER_GET_SYNC_STATE_DATA)."""
        alive = alive or {}
        rows = []
        for bid, info in sorted((replicas.replicas if replicas else {}).items()):
            a = alive.get(bid)
            rows.append({"brokerId": bid, "address": info.get("address"), "alive": a is not None,
                         "epoch": a.epoch if a else None, "maxOffset": a.max_offset if a else None,
                         "inSyncStateSet": bid in self.sync_state_set,
                         "role": "MASTER" if bid == self.master_broker_id else "SLAVE"})
        return {"clusterName": self.cluster, "brokerName": self.broker_name,
                "masterBrokerId": self.master_broker_id, "masterAddress": self.master_address,
                "masterEpoch": self.master_epoch, "syncStateSet": list(self.sync_state_set),
                "syncStateSetEpoch": self.sync_state_set_epoch, "replicas": rows}


@attrs.define
class Replicas:
    """`{root}/{cluster}/{brokerName}/replicas`: the ids handed out and each id's address."""
    next_broker_id: int = 1
    replicas: dict[int, dict] = attrs.field(factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({"nextBrokerId": self.next_broker_id,
                           "replicas": {str(k): v for k, v in sorted(self.replicas.items())}}).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> "Replicas":
        if not raw:
            return cls()
        d = json.loads(raw)
        return cls(int(d.get("nextBrokerId", 1)), {int(k): dict(v) for k, v in (d.get("replicas") or {}).items()})


@attrs.frozen
class ReplicaAlive:
    """`{root}/{cluster}/{brokerName}/alive/{id}`, under the replica's lease: what its last
    heartbeat said."""
    broker_id: int
    address: str
    ha_address: str = ""
    epoch: int = 0
    max_offset: int = 0
    confirm_offset: int = 0
    election_priority: int = DEFAULT_ELECTION_PRIORITY
    heartbeat_timeout_ms: int = 3000
    lease_id: int = 0
    incarnation: str = ""  # one per broker process: a new one is a restart

    def to_json(self) -> bytes:
        return json.dumps({"brokerId": self.broker_id, "address": self.address, "haAddress": self.ha_address,
                           "epoch": self.epoch, "maxOffset": self.max_offset, "confirmOffset": self.confirm_offset,
                           "electionPriority": self.election_priority,
                           "heartbeatTimeoutMillis": self.heartbeat_timeout_ms, "leaseId": self.lease_id,
                           "incarnation": self.incarnation}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "ReplicaAlive":
        d = json.loads(raw)
        return cls(int(d["brokerId"]), d.get("address", ""), d.get("haAddress", ""), int(d.get("epoch", 0)),
                   int(d.get("maxOffset", 0)), int(d.get("confirmOffset", 0)),
                   int(d.get("electionPriority", DEFAULT_ELECTION_PRIORITY)),
                   int(d.get("heartbeatTimeoutMillis", 3000)), int(d.get("leaseId", 0)), d.get("incarnation", ""))


def candidates(meta: GroupMeta, alive: Mapping[int, ReplicaAlive], *, unclean: bool) -> list[ReplicaAlive]:
    """Who may become master: the alive members of the sync state set; any alive replica when
    unclean election is on, or when the group never had a sync state set (its first master)."""
    if unclean or not meta.sync_state_set:
        return list(alive.values())
    return [a for bid, a in alive.items() if bid in meta.sync_state_set]


def elect(meta: GroupMeta, alive: Mapping[int, ReplicaAlive], *, unclean: bool = False,
          preferred: int | None = None) -> int | None:
    """The replica to make master (RocketMQ 5's DefaultElectPolicy), or None when none may be.

    The current master stays while alive (unless another is preferred); a preferred replica wins
    when it is a candidate; otherwise the highest epoch, then the highest max offset, then the
    lowest brokerElectionPriority, then the lowest id."""
    pool = candidates(meta, alive, unclean=unclean)
    ids = {a.broker_id for a in pool}
    if preferred is not None:
        return preferred if preferred in ids else None
    if meta.master_broker_id is not None and meta.master_broker_id in alive:
        return meta.master_broker_id
    if not pool:
        return None
    best = min(pool, key=lambda a: (-a.epoch, -a.max_offset, a.election_priority, a.broker_id))
    return best.broker_id


def elected(meta: GroupMeta, winner: int, address: str) -> GroupMeta:
    """The group's state once `winner` is master: a new epoch, and a sync state set of the new
    master alone (the others rejoin as they catch up with it, through ALTER_SYNC_STATE_SET)."""
    return attrs.evolve(meta, master_broker_id=winner, master_address=address, master_epoch=meta.master_epoch + 1,
                        sync_state_set=[winner], sync_state_set_epoch=meta.sync_state_set_epoch + 1)
