"""ReplicasManager: a broker's side of controller mode (RocketMQ 5's ReplicasManager).

At start the broker takes its replica id (the `brokerIdentity` file under storePathRootDir, else
one applied for at a controller), registers its address, and heartbeats every
brokerHeartbeatInterval.  Each heartbeat's answer says who the group's master is, its epoch and
the sync state set; the broker follows it:

* master (the answer names this broker): the store's role becomes SYNC_MASTER, replication
  appends ⟨epoch, log end⟩ to the epoch file and listens for slaves, the broker registers with
  the name servers as brokerId 0 carrying the epoch (stateVersion), and the delivery services
  (delays, timers, transaction checks) start;
* slave: writes stop at once, the store replicates from the master's HA address with the
  epoch handshake (cutting what the old epochs left behind), the broker registers as its own id.

Fencing: a master answers writes only until `writable_until` = (when the last successful
heartbeat was *sent*) + controllerHeartBeatTimeoutMills − a margin.  The controller renews the
lease only after that moment, etcd expires it no earlier than a full timeout after, and a new
master is elected only once it expired; so this broker stops answering SEND_OK before another can
start (docs/failover.md).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid

from rmq_core.common.files import atomic_write
from rmq_core.config import BrokerRole, parse_properties
from rmq_core.errors import ConfigError
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand

log = logging.getLogger("rmq.broker.replicas")

INVOKE_TIMEOUT = 3.0
NOT_WRITABLE = float("-inf")


def fence_margin(timeout_s: float) -> float:
    """What a master takes off its lease so that clocks running at slightly different rates
    (this process's and etcd's leader's) cannot make it outlive the lease."""
    return max(0.2, 0.1 * timeout_s)


class BrokerIdentity:
    """`{storePathRootDir}/brokerIdentity`: the replica id this store was given (RocketMQ 5's
    file: brokerName, brokerClusterName, brokerId, registerCheckCode)."""

    def __init__(self, path: str):
        self.path = path

    def load(self) -> dict | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                props = parse_properties(f.read(), self.path)
        except FileNotFoundError:
            return None
        try:
            props["brokerId"] = int(props["brokerId"])
        except (KeyError, ValueError):
            raise ConfigError(f"{self.path}: brokerId is missing or not a number") from None
        return props

    def save(self, props: dict) -> None:
        text = "".join(f"{k}={v}\n" for k, v in props.items())
        atomic_write(self.path, text.encode())


class ReplicasManager:
    def __init__(self, broker):
        self.broker = broker
        self.bc = broker.broker_config
        self.sc = broker.store_config
        self.identity = BrokerIdentity(os.path.join(self.sc.store_path_root_dir, "brokerIdentity"))
        self.broker_id: int | None = None  # this replica's controller id (>= 1)
        self.master_broker_id: int | None = None
        self.master_address: str | None = None
        self.master_ha_address: str | None = None
        self.master_epoch = 0
        self.sync_state_set: list[int] = []
        self.sync_state_set_epoch = 0
        self.role_changes = 0  # times this broker changed role (the metrics' counter)
        self.last_controller_error: str | None = None
        self._controller_index = 0
        self._task: asyncio.Task | None = None
        self._role_lock = asyncio.Lock()
        self._step_down_until = 0.0  # a planned switch-over: no writes until then (or a new epoch)
        self._altering = False
        self._wake = asyncio.Event()
        self.unclean_elections = True  # until a controller said otherwise: no failsafe
        # this process's token: a controller that sees another one under this id knows the replica
        # restarted (a master that restarts within its lease is not master again without an election)
        self.incarnation = uuid.uuid4().hex
        self.in_failsafe = False

    @property
    def controllers(self) -> list[str]:
        return self.bc.controller_addr_list

    @property
    def is_master(self) -> bool:
        return self.broker_id is not None and self.master_broker_id == self.broker_id

    # -- start / stop ----------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.controllers:
            raise ConfigError("enableControllerMode=true needs controllerAddr (the controllers, 'host:port;host:port')")
        ha = self.broker.store.ha_service
        ha.on_sync_state_set_change = self._on_sync_state_set_proposal
        try:
            await self._take_broker_id()
            await self._register()
            await self.heartbeat_once()
        except Exception as e:  # no controller yet: start as a slave that takes no writes, keep trying
            log.warning("controller mode: %s; starting as a slave and retrying", e)
        self._task = asyncio.get_running_loop().create_task(self._heartbeat_loop(), name="rmq-broker-heartbeat")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.broker.writable_until = NOT_WRITABLE

    # -- requests to the controllers -------------------------------------------------------------
    async def _invoke(self, code: int, ext: dict, body: bytes | None = None) -> RemotingCommand:
        """The request to the first controller that answers (the last one that did first)."""
        client = self.broker.namesrv_client
        errors = []
        etcd_down = 0
        n = len(self.controllers)
        for i in range(n):
            addr = self.controllers[(self._controller_index + i) % n]
            try:
                resp = await client.invoke(addr, RemotingCommand.create_request(code, ext, body), INVOKE_TIMEOUT)
            except Exception as e:
                errors.append(f"{addr}: {e}")
                continue
            if resp.code == ResponseCode.SUCCESS:
                self._controller_index = (self._controller_index + i) % n
                return resp
            if resp.remark and resp.remark.startswith("[ETCD_UNAVAILABLE]"):
                errors.append(f"{addr}: {resp.remark}")
                etcd_down += 1
                continue  # another controller may reach etcd
            raise ControllerRefused(f"controller {addr}: {resp.remark}")
        if etcd_down == n:
            raise EtcdUnavailableEverywhere("every controller says etcd is unavailable: " + "; ".join(errors))
        raise ControllerUnavailable("no controller answered: " + "; ".join(errors))

    async def _take_broker_id(self) -> None:
        held = self.identity.load()
        if held is not None:
            if held.get("brokerName") not in (None, self.bc.broker_name):
                raise ConfigError(f"{self.identity.path} belongs to broker {held.get('brokerName')!r}, not "
                                  f"{self.bc.broker_name!r}: this store is another group's")
            self.broker_id = held["brokerId"]
            return
        check_code = f"{self.broker.broker_addr};{int(time.time() * 1000)}"
        base = {"clusterName": self.bc.broker_cluster_name, "brokerName": self.bc.broker_name}
        for _ in range(16):
            resp = await self._invoke(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, base)
            bid = int(resp.ext_fields["nextBrokerId"])
            try:
                await self._invoke(RequestCode.CONTROLLER_APPLY_BROKER_ID,
                                   {**base, "appliedBrokerId": str(bid), "registerCheckCode": check_code})
            except ControllerRefused as e:
                log.info("controller mode: brokerId %d was taken meanwhile (%s): trying the next", bid, e)
                continue
            self.identity.save({"brokerName": self.bc.broker_name, "brokerClusterName": self.bc.broker_cluster_name,
                                "brokerId": bid, "registerCheckCode": check_code})
            self.broker_id = bid
            log.info("controller mode: this broker is replica %d of %s", bid, self.bc.broker_name)
            return
        raise ControllerUnavailable(f"could not apply for a brokerId of {self.bc.broker_name}")

    async def _register(self) -> None:
        await self._invoke(RequestCode.CONTROLLER_REGISTER_BROKER, {
            "clusterName": self.bc.broker_cluster_name, "brokerName": self.bc.broker_name,
            "brokerId": str(self.broker_id), "brokerAddress": self.broker.broker_addr})

    # -- heartbeats ------------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.bc.broker_heartbeat_interval / 1000)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                if self.broker_id is None:
                    await self._take_broker_id()
                    await self._register()
                await self.heartbeat_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                msg = str(e)
                if msg != self.last_controller_error:
                    log.warning("controller mode: heartbeat of %s[%s] failed: %s", self.bc.broker_name,
                                self.broker_id, msg)
                self.last_controller_error = msg

    async def heartbeat_once(self) -> None:
        store = self.broker.store
        ha = store.ha_service
        sent = time.monotonic()  # before the request: the lease is renewed after this moment
        try:
            resp = await self._heartbeat_request(store, ha)
        except EtcdUnavailableEverywhere:
            if self.failsafe_holds():
                self._extend_lease(sent)
                if not self.in_failsafe:
                    self.in_failsafe = True
                    log.warning("controller mode: etcd is unavailable to every controller; %s[%d] keeps taking "
                                "writes in failsafe: every write still waits for each member of its sync state "
                                "set %s, and no other replica can be elected", self.bc.broker_name,
                                self.broker_id, self.sync_state_set)
            raise
        if self.in_failsafe:
            self.in_failsafe = False
            log.warning("controller mode: etcd answers again; %s[%d] leaves failsafe", self.bc.broker_name,
                        self.broker_id)
        if self.last_controller_error is not None:
            log.info("controller mode: heartbeats of %s[%s] answered again", self.bc.broker_name, self.broker_id)
            self.last_controller_error = None
        self.unclean_elections = (resp.ext_fields or {}).get("enableElectUncleanMaster") == "true"
        await self.apply(resp.ext_fields or {}, resp.body, sent)

    def _ha_addr(self) -> str:
        """Where this broker takes slaves as master: known before it is master when haListenPort
        is set (its slaves then connect the moment they hear of the election)."""
        addr = self.broker.ha_server_addr()
        return "" if addr.endswith(":0") or addr.endswith(":None") else addr

    def failsafe_holds(self) -> bool:
        """Whether a master whose controllers cannot reach etcd may go on answering writes (the
        model is Patroni's failsafe mode): with etcd unavailable no election and no change of the
        sync state set can happen; with allAckInSyncStateSet every write it answers is held by
        each member of its sync state set, the only replicas a clean election may pick, and a
        member stops acknowledging this master the moment it becomes master itself - so no other
        master can answer SEND_OK while this one does, and none can lose what it acknowledged."""
        return (self.is_master and self.sc.all_ack_in_sync_state_set and not self.unclean_elections
                and time.monotonic() >= self._step_down_until)

    def _extend_lease(self, sent: float) -> None:
        timeout = self.bc.controller_heart_beat_timeout_mills / 1000
        self.broker.writable_until = sent + timeout - fence_margin(timeout)

    async def _heartbeat_request(self, store, ha):
        return await self._invoke(RequestCode.BROKER_HEARTBEAT, {
            "clusterName": self.bc.broker_cluster_name, "brokerName": self.bc.broker_name,
            "brokerId": str(self.broker_id), "brokerAddr": self.broker.broker_addr,
            "haAddr": self._ha_addr(),
            "epoch": str(ha.epoch_cache.last_epoch()), "maxOffset": str(store.get_max_phy_offset()),
            "confirmOffset": str(ha.confirm_offset() if self.is_master else store.get_max_phy_offset()),
            "heartbeatTimeoutMills": str(self.bc.controller_heart_beat_timeout_mills),
            "electionPriority": str(self.bc.broker_election_priority), "incarnation": self.incarnation})

    async def apply(self, ext: dict, body: bytes | None, sent: float | None) -> None:
        """Follow the group's state as a controller answered it (`sent`: when the heartbeat that
        brought it was sent, None for a notification)."""
        mid = ext.get("masterBrokerId")
        master_id = int(mid) if mid not in (None, "") else None
        epoch = int(ext.get("masterEpoch") or 0)
        sss = json.loads(body).get("syncStateSet", []) if body else []
        sss_epoch = int(ext.get("syncStateSetEpoch") or 0)
        async with self._role_lock:
            if epoch < self.master_epoch:
                return  # an older controller answer overtaken by a newer one
            ha = self.broker.store.ha_service
            if master_id is not None and master_id == self.broker_id:
                if not self.is_master or epoch != self.master_epoch:
                    await self._become_master(epoch, sss, sss_epoch)
                if (sss, sss_epoch) != (self.sync_state_set, self.sync_state_set_epoch):
                    self.sync_state_set, self.sync_state_set_epoch = list(sss), sss_epoch
                    ha.set_sync_state_set(set(sss), sss_epoch)
                if sent is not None and time.monotonic() >= self._step_down_until:
                    self._extend_lease(sent)
                return
            if master_id is None:
                if self.is_master:  # the controller took the mastership away with no successor yet
                    await self._become_slave(None, None, None, epoch)
                return
            master_ha = ext.get("masterHaAddress") or None
            if self.is_master or epoch != self.master_epoch or master_ha != self.master_ha_address \
                    or self.master_broker_id != master_id:
                await self._become_slave(master_id, ext.get("masterAddress") or None, master_ha, epoch)
            self.sync_state_set, self.sync_state_set_epoch = list(sss), sss_epoch

    # -- role changes ----------------------------------------------------------------------------
    async def _become_master(self, epoch: int, sss: list[int], sss_epoch: int) -> None:
        broker = self.broker
        was = "master" if self.is_master else "slave"
        broker.writable_until = NOT_WRITABLE  # until this heartbeat's answer sets the lease
        self.master_broker_id, self.master_address, self.master_epoch = self.broker_id, broker.broker_addr, epoch
        self.master_ha_address = None
        self.sync_state_set, self.sync_state_set_epoch = list(sss), sss_epoch
        self._step_down_until = 0.0
        await broker.change_role(BrokerRole.SYNC_MASTER, 0, lambda ha: ha.change_to_master(
            epoch, self.broker_id, set(sss), sss_epoch))
        broker.state_version = epoch
        self.role_changes += 1
        log.info("controller mode: %s[%d] %s -> MASTER at epoch %d (sync state set %s)", self.bc.broker_name,
                 self.broker_id, was, epoch, sss)
        self._wake.set()  # heartbeat now: the slaves learn this master's HA address from it
        await broker.register_broker_all()

    async def _become_slave(self, master_id, master_addr, master_ha, epoch: int) -> None:
        broker = self.broker
        broker.writable_until = NOT_WRITABLE  # first of all
        was_master = self.is_master
        self.master_broker_id, self.master_address, self.master_ha_address = master_id, master_addr, master_ha
        self.master_epoch = epoch
        broker.master_addr = master_addr
        # (no HA address yet: it follows nobody - never the old master - until one comes)
        await broker.change_role(BrokerRole.SLAVE, self.broker_id, lambda ha: ha.change_to_slave(
            master_ha, epoch, self.broker_id))
        broker.state_version = epoch
        if was_master:
            self.role_changes += 1
        log.info("controller mode: %s[%d] %s -> SLAVE of %s (%s) at epoch %d", self.bc.broker_name, self.broker_id,
                 "master" if was_master else "slave", master_id, master_addr, epoch)
        if master_addr:
            await broker.register_broker_all()

    # -- sync state set --------------------------------------------------------------------------
    def _on_sync_state_set_proposal(self, proposed: set[int]) -> None:
        """HAService's checker thread: the set it would have; sent to the controller once."""
        loop = self.broker.loop
        if loop is not None and not self._altering:
            self._altering = True
            loop.call_soon_threadsafe(lambda: self.broker.spawn(self._alter(sorted(proposed))))

    async def _alter(self, proposed: list[int]) -> None:
        try:
            if not self.is_master or proposed == self.sync_state_set:
                return
            resp = await self._invoke(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
                "clusterName": self.bc.broker_cluster_name, "brokerName": self.bc.broker_name,
                "masterBrokerId": str(self.broker_id), "masterEpoch": str(self.master_epoch)},
                json.dumps({"syncStateSet": proposed, "syncStateSetEpoch": self.sync_state_set_epoch}).encode())
            new = json.loads(resp.body).get("syncStateSet", proposed)
            epoch = int(resp.ext_fields["newSyncStateSetEpoch"])
            async with self._role_lock:
                if self.is_master and epoch > self.sync_state_set_epoch:
                    log.info("controller mode: %s sync state set %s -> %s (epoch %d)", self.bc.broker_name,
                             self.sync_state_set, new, epoch)
                    self.sync_state_set, self.sync_state_set_epoch = list(new), epoch
                    self.broker.store.ha_service.set_sync_state_set(set(new), epoch)
        except Exception as e:
            log.info("controller mode: changing the sync state set of %s to %s failed: %s", self.bc.broker_name,
                     proposed, e)
        finally:
            self._altering = False

    # -- planned switch-over ---------------------------------------------------------------------
    async def prepare_switch(self, epoch: int, target: int, timeout: float) -> int:
        """PREPARE_MASTER_SWITCH: stop answering writes, wait until replica `target` holds this
        log's end; returns that offset.  Writes resume at the next heartbeat after `timeout` if
        no new master was elected."""
        if not self.is_master or epoch != self.master_epoch:
            raise ControllerRefused(f"{self.bc.broker_name}[{self.broker_id}] is not the master at epoch {epoch}")
        self._step_down_until = time.monotonic() + timeout
        self.broker.writable_until = NOT_WRITABLE
        store = self.broker.store
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            end = store.get_max_phy_offset()
            acked = store.ha_service.slave_ack_offset(target)
            if acked is not None and acked >= end:
                log.info("controller mode: %s[%d] stepping down: replica %d holds the log to %d", self.bc.broker_name,
                         self.broker_id, target, end)
                return end
            await asyncio.sleep(0.01)
        self._step_down_until = 0.0
        raise ControllerRefused(f"replica {target} of {self.bc.broker_name} did not catch up within {timeout:.0f} s")

    def runtime_info(self) -> dict[str, str]:
        return {"brokerControllerId": str(self.broker_id if self.broker_id is not None else ""),
                "masterEpoch": str(self.master_epoch), "syncStateSet": json.dumps(self.sync_state_set),
                "syncStateSetEpoch": str(self.sync_state_set_epoch),
                "controllerAddr": self.bc.controller_addr or "",
                "masterBrokerId": str(self.master_broker_id if self.master_broker_id is not None else "")}


class ControllerUnavailable(Exception):
    """No controller answered (or none could reach etcd)."""


class ControllerRefused(Exception):
    """A controller (or this broker) refused the request; the message says why."""


class EtcdUnavailableEverywhere(ControllerUnavailable):
    """Every controller answered, and each said it cannot reach etcd."""
