"""ReplicasInfoManager: every controller decision as an etcd transaction.

A controller keeps nothing that matters in memory: it reads a group's keys, decides (state.py),
and writes in one transaction that compares what it read (the meta key's mod revision; the old
master's alive key still absent), so of two controllers racing, one wins and the other re-reads.
Blocking calls (the etcd client is synchronous): the controller runs them in worker threads.
"""
from __future__ import annotations

import logging
import math

import attrs

from rmq_core.controller.etcd import EtcdClient, EtcdUnavailable
from rmq_core.controller.state import GroupMeta, ReplicaAlive, Replicas, elect, elected

log = logging.getLogger("rmq.controller")

CAS_RETRIES = 16


class ControllerError(Exception):
    """A request the controller refuses; `code` is the remoting response code to answer with."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class ReplicasInfoManager:
    def __init__(self, etcd: EtcdClient, root: str = "/rmq/controller", *, unclean: bool = False):
        self.etcd = etcd
        self.root = root.rstrip("/")
        self.unclean = unclean

    # -- keys ------------------------------------------------------------------------------------
    def _group(self, broker_name: str) -> str:
        if not broker_name or "/" in broker_name:
            raise ControllerError(f"bad brokerName {broker_name!r}")
        return f"{self.root}/{broker_name}"

    def _meta_key(self, name: str) -> str:
        return self._group(name) + "/meta"

    def _replicas_key(self, name: str) -> str:
        return self._group(name) + "/replicas"

    def _alive_prefix(self, name: str) -> str:
        return self._group(name) + "/alive/"

    # -- reads -----------------------------------------------------------------------------------
    def read_group(self, broker_name: str, cluster: str = ""):
        """(meta, meta revision, replicas, replicas revision, {id: ReplicaAlive})."""
        keys = self.etcd.get_prefix(self._group(broker_name) + "/")
        raw_meta, meta_rev = keys.get(self._meta_key(broker_name), (None, 0))
        raw_rep, rep_rev = keys.get(self._replicas_key(broker_name), (None, 0))
        meta = GroupMeta.from_json(raw_meta, cluster, broker_name)
        if cluster and not meta.cluster:
            meta.cluster = cluster
        alive = {}
        prefix = self._alive_prefix(broker_name)
        for key, (value, _rev) in keys.items():
            if key.startswith(prefix):
                a = ReplicaAlive.from_json(value)
                alive[a.broker_id] = a
        return meta, meta_rev, Replicas.from_json(raw_rep), rep_rev, alive

    def broker_names(self) -> list[str]:
        names = set()
        for key in self.etcd.get_prefix(self.root + "/"):
            rest = key[len(self.root) + 1:]
            if "/" in rest:
                names.add(rest.split("/", 1)[0])
        return sorted(names)

    # -- broker ids ------------------------------------------------------------------------------
    def next_broker_id(self, cluster: str, broker_name: str) -> int:
        _m, _mr, replicas, _rr, _a = self.read_group(broker_name, cluster)
        return replicas.next_broker_id

    def apply_broker_id(self, cluster: str, broker_name: str, broker_id: int, check_code: str) -> None:
        """Give `broker_id` to the replica that says `check_code` (RocketMQ's registerCheckCode,
        its address and start time): the id must be the next free one, or already its own."""
        if broker_id <= 0:
            raise ControllerError(f"brokerId {broker_id} is not a replica id (ids start at 1)")
        for _ in range(CAS_RETRIES):
            _m, _mr, replicas, rev, _a = self.read_group(broker_name, cluster)
            held = replicas.replicas.get(broker_id)
            if held is not None:
                if held.get("registerCheckCode") == check_code:
                    return
                raise ControllerError(f"brokerId {broker_id} of {broker_name} is taken by "
                                      f"{held.get('address') or held.get('registerCheckCode')}")
            if broker_id != replicas.next_broker_id:
                raise ControllerError(f"brokerId {broker_id} of {broker_name} is not the next free id "
                                      f"({replicas.next_broker_id})")
            address = check_code.split(";", 1)[0]
            replicas.replicas[broker_id] = {"address": address, "registerCheckCode": check_code}
            replicas.next_broker_id = broker_id + 1
            ok, _ = self.etcd.txn([("mod", self._replicas_key(broker_name), "=", rev)],
                                  [("put", self._replicas_key(broker_name), replicas.to_json(), 0)])
            if ok:
                log.info("controller: brokerId %d of %s applied by %s", broker_id, broker_name, check_code)
                return
        raise ControllerError(f"could not apply brokerId {broker_id} of {broker_name}: too much contention")

    def register_broker(self, cluster: str, broker_name: str, broker_id: int, address: str) -> GroupMeta:
        """A replica says where it serves now (a restart may change the port)."""
        for _ in range(CAS_RETRIES):
            meta, _mr, replicas, rev, _a = self.read_group(broker_name, cluster)
            held = replicas.replicas.get(broker_id)
            if held is None:
                raise ControllerError(f"brokerId {broker_id} of {broker_name} was never applied for "
                                      f"(CONTROLLER_APPLY_BROKER_ID first)")
            if held.get("address") == address:
                return meta
            held["address"] = address
            ok, _ = self.etcd.txn([("mod", self._replicas_key(broker_name), "=", rev)],
                                  [("put", self._replicas_key(broker_name), replicas.to_json(), 0)])
            if ok:
                return meta
        raise ControllerError(f"could not register brokerId {broker_id} of {broker_name}: too much contention")

    # -- liveness --------------------------------------------------------------------------------
    def heartbeat(self, cluster: str, alive: ReplicaAlive, broker_name: str) -> tuple[GroupMeta, dict]:
        """Renew the replica's lease and record what it reported; returns the group's meta and
        alive replicas as they are after the renewal.

        One lease per replica, kept in its alive key, renewed by whichever controller gets the
        heartbeat; a new one is granted only when the key is gone (the lease ran out), with a
        create-if-absent transaction.  So every successful heartbeat leaves the key under a lease
        renewed after the heartbeat was sent: the broker's own deadline stays behind etcd's."""
        key = self._alive_prefix(broker_name) + str(alive.broker_id)
        ttl = max(1, math.ceil(alive.heartbeat_timeout_ms / 1000))
        for _ in range(CAS_RETRIES):
            raw, _rev = self.etcd.get(key)
            if raw is not None:
                held = ReplicaAlive.from_json(raw)
                lease = held.lease_id
                if held.incarnation and alive.incarnation and held.incarnation != alive.incarnation:
                    self._restarted(cluster, broker_name, held)
                    continue
                if lease and self.etcd.keepalive(lease) > 0:
                    self.etcd.put(key, attrs.evolve(alive, lease_id=lease).to_json(), lease=lease)
                    break
                continue  # ran out between the get and the keep-alive: the key goes with it
            lease, _granted = self.etcd.grant(ttl)
            ok, _ = self.etcd.txn([("version", key, "=", 0)],
                                  [("put", key, attrs.evolve(alive, lease_id=lease).to_json(), lease)])
            if ok:
                log.info("controller: %s[%d] %s is alive (lease %x, %d s)", broker_name, alive.broker_id,
                         alive.address, lease, ttl)
                break
            self.etcd.revoke(lease)  # another controller created it first: use that one
        else:
            raise ControllerError(f"could not record the heartbeat of {broker_name}[{alive.broker_id}]")
        meta, _mr, _rep, _rr, alive_now = self.read_group(broker_name, cluster)
        return meta, alive_now

    def _restarted(self, cluster: str, broker_name: str, held: ReplicaAlive) -> None:
        """A replica restarted within its old lease: the old lease goes (with its alive key), and
        if it was the master, the group loses its master, so that the next election weighs every
        member's log again (a restarted master may have lost its unflushed tail) at a new epoch."""
        log.info("controller: %s[%d] restarted (incarnation %s -> new)", broker_name, held.broker_id,
                 held.incarnation)
        self.etcd.revoke(held.lease_id)
        for _ in range(CAS_RETRIES):
            meta, rev, _rep, _rr, _alive = self.read_group(broker_name, cluster)
            if meta.master_broker_id != held.broker_id:
                return
            ok, _ = self.etcd.txn([("mod", self._meta_key(broker_name), "=", rev)], [
                ("put", self._meta_key(broker_name), attrs.evolve(meta, master_broker_id=None,
                                                                  master_address=None).to_json(), 0)])
            if ok:
                return

    # -- election --------------------------------------------------------------------------------
    def needs_election(self, meta: GroupMeta, alive: dict) -> bool:
        return meta.master_broker_id is None or meta.master_broker_id not in alive

    def elect_master(self, cluster: str, broker_name: str, preferred: int | None = None,
                     *, planned: bool = False) -> tuple[GroupMeta, dict, bool]:
        """Elect (or keep) the group's master.  Returns (meta, alive, changed).  `planned`: the
        old master has stepped down (electMaster), so it need not be dead for the switch."""
        for _ in range(CAS_RETRIES):
            meta, rev, replicas, _rr, alive = self.read_group(broker_name, cluster)
            if preferred is None and not self.needs_election(meta, alive):
                return meta, alive, False
            if preferred is not None and preferred == meta.master_broker_id and preferred in alive:
                return meta, alive, False
            winner = elect(meta, alive, unclean=self.unclean, preferred=preferred)
            if winner is None:
                if preferred is not None:
                    why = ("not alive" if preferred not in alive else
                           f"not in the sync state set {meta.sync_state_set}")
                    raise ControllerError(f"cannot elect brokerId {preferred} of {broker_name}: it is {why}")
                return meta, alive, False
            new = elected(meta, winner, alive[winner].address)
            compare = [("mod", self._meta_key(broker_name), "=", rev)]
            old = meta.master_broker_id
            if old is not None and old != winner and not planned:
                compare.append(("version", self._alive_prefix(broker_name) + str(old), "=", 0))
            ok, _ = self.etcd.txn(compare, [("put", self._meta_key(broker_name), new.to_json(), 0)])
            if ok:
                log.info("controller: %s elected brokerId %d (%s) master at epoch %d (was %s; candidates %s)",
                         broker_name, winner, new.master_address, new.master_epoch, old,
                         {b: (a.epoch, a.max_offset) for b, a in alive.items()})
                return new, alive, True
        raise ControllerError(f"could not elect a master of {broker_name}: too much contention")

    def alter_sync_state_set(self, cluster: str, broker_name: str, master_id: int, master_epoch: int,
                             new_set: list[int], set_epoch: int) -> GroupMeta:
        """The master's proposal of a new sync state set (RocketMQ's ALTER_SYNC_STATE_SET): only
        the current master at the current epochs may change it; it keeps the master; every new
        member is an alive replica."""
        for _ in range(CAS_RETRIES):
            meta, rev, _rep, _rr, alive = self.read_group(broker_name, cluster)
            if meta.master_broker_id != master_id or meta.master_epoch != master_epoch:
                raise ControllerError(f"brokerId {master_id} at epoch {master_epoch} is not the master of "
                                      f"{broker_name} (master {meta.master_broker_id}, epoch {meta.master_epoch})")
            if meta.sync_state_set_epoch != set_epoch:
                raise ControllerError(f"sync state set epoch {set_epoch} of {broker_name} is stale "
                                      f"(now {meta.sync_state_set_epoch})")
            wanted = sorted(set(new_set))
            if master_id not in wanted:
                raise ControllerError(f"a sync state set of {broker_name} must hold its master {master_id}: {wanted}")
            joining = [b for b in wanted if b not in meta.sync_state_set and b not in alive]
            if joining:
                raise ControllerError(f"brokerIds {joining} of {broker_name} are not alive: they cannot join "
                                      f"the sync state set")
            if wanted == meta.sync_state_set:
                return meta
            new = attrs.evolve(meta, sync_state_set=wanted, sync_state_set_epoch=set_epoch + 1)
            ok, _ = self.etcd.txn([("mod", self._meta_key(broker_name), "=", rev)],
                                  [("put", self._meta_key(broker_name), new.to_json(), 0)])
            if ok:
                log.info("controller: %s sync state set %s -> %s (epoch %d)", broker_name, meta.sync_state_set,
                         wanted, new.sync_state_set_epoch)
                return new
        raise ControllerError(f"could not change the sync state set of {broker_name}: too much contention")

    def clean_broker_data(self, broker_name: str) -> None:
        """CLEAN_BROKER_DATA: forget a group (its brokers are gone for good)."""
        _meta, rev, _rep, _rr, alive = self.read_group(broker_name)
        if alive:
            raise ControllerError(f"{broker_name} still has alive replicas {sorted(alive)}: stop them first")
        for key in self.etcd.get_prefix(self._group(broker_name) + "/"):
            self.etcd.delete(key)


__all__ = ["ControllerError", "EtcdUnavailable", "ReplicasInfoManager"]
