"""The controller (RocketMQ 5's controller mode): its request processor and its election loop.

Embedded in a name server (`enableControllerInNamesrv=true`: the processor joins the name
server's remoting server) or alone (`rmq controller`: a remoting server of its own).  Any number
of controllers may serve the same etcd; each answers any request (no leader among them: etcd is
the one place decisions are made, see manager.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from rmq_core.controller.manager import ControllerError, ReplicasInfoManager
from rmq_core.controller.state import DEFAULT_ELECTION_PRIORITY, GroupMeta, ReplicaAlive
from rmq_core.errors import RemotingCommandError
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand

log = logging.getLogger("rmq.controller")

CONTROLLER_BOOT_LINE = "The controller boot success. etcd is {endpoints}"
# how long a master asked to step down (electMaster) waits for the chosen replica to catch up
SWITCH_CATCH_UP_TIMEOUT = 10.0


_required = RemotingCommand.required_str
_required_int = RemotingCommand.required_int


def meta_fields(meta: GroupMeta, alive: dict | None = None, unclean: bool = False) -> tuple[dict, bytes]:
    """The ext fields and body that tell a broker its group's master and sync state set (and
    whether unclean elections may happen: a master's failsafe depends on it): a heartbeat's,
    register's or election's answer, and NOTIFY_BROKER_ROLE_CHANGED."""
    ext = meta.answer_fields(alive=alive)
    ext["enableElectUncleanMaster"] = "true" if unclean else "false"
    return ext, json.dumps({"syncStateSet": meta.sync_state_set}).encode()


def meta_answer(request: RemotingCommand, meta: GroupMeta, alive: dict | None = None, *,
                unclean: bool = False) -> RemotingCommand:
    ext, body = meta_fields(meta, alive, unclean)
    return request.make_response(ResponseCode.SUCCESS, None, ext, body)


class ControllerService:
    """The controller: `processor_codes()` and `process_request` for a remoting server, and the
    election loop (`start`/`stop`) that elects a master for every group whose master's lease ran
    out."""

    def __init__(self, config, *, remoting_client=None):
        from rmq_core.controller.etcd import EtcdClient

        self.config = config
        self.etcd = EtcdClient(config.controller_etcd_endpoints, timeout=config.controller_etcd_timeout_mills / 1000)
        self.manager = ReplicasInfoManager(self.etcd, config.controller_etcd_root,
                                           unclean=config.enable_elect_unclean_master)
        self._client = remoting_client  # for the step-down request of a planned switch-over
        self._own_client = remoting_client is None
        self._task: asyncio.Task | None = None
        self.address: str | None = None  # where this controller answers (set by its server)
        self.elections = 0  # masters this controller elected (a changed meta)
        # etcd found unavailable by the last scan: heartbeats are answered so at once (a heartbeat
        # that waited out etcd's timeouts would come back after the lease it was to renew)
        self.etcd_unavailable: str | None = None
        self._handlers = {
            RequestCode.BROKER_HEARTBEAT: self.heartbeat,
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self.alter_sync_state_set,
            RequestCode.CONTROLLER_ELECT_MASTER: self.elect_master,
            RequestCode.CONTROLLER_REGISTER_BROKER: self.register_broker,
            RequestCode.CONTROLLER_GET_METADATA_INFO: self.get_metadata_info,
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: self.get_sync_state_data,
            RequestCode.CLEAN_BROKER_DATA: self.clean_broker_data,
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: self.get_next_broker_id,
            RequestCode.CONTROLLER_APPLY_BROKER_ID: self.apply_broker_id,
        }

    def _answer(self, request: RemotingCommand, meta: GroupMeta, alive: dict | None = None) -> RemotingCommand:
        return meta_answer(request, meta, alive, unclean=self.manager.unclean)

    @property
    def codes(self) -> list[int]:
        return list(self._handlers)

    def boot_line(self) -> str:
        return CONTROLLER_BOOT_LINE.format(endpoints=self.config.controller_etcd_endpoints)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._client is None:
            from rmq_core.remoting.client import RemotingClient
            self._client = RemotingClient(name="controller->broker")
        self._task = asyncio.get_running_loop().create_task(self._scan_loop(), name="rmq-controller-elect")
        log.info(self.boot_line())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._own_client and self._client is not None:
            await self._client.close()
            self._client = None
        await asyncio.to_thread(self.etcd.close)

    async def _scan_loop(self) -> None:
        """Every scanInactiveMasterInterval: elect where a group's master's lease ran out."""
        unavailable_since = None
        while True:
            await asyncio.sleep(self.config.scan_inactive_master_interval / 1000.0)
            try:
                changed = await asyncio.to_thread(self._scan_once)
                unavailable_since = None
                self.etcd_unavailable = None
                for meta, alive in changed:
                    self._elected(meta, alive)
            except Exception as e:  # etcd away: nothing can be decided; say so once, then now and then
                from rmq_core.controller.etcd import EtcdUnavailable
                if isinstance(e, EtcdUnavailable):
                    self.etcd_unavailable = str(e)
                now = time.monotonic()
                if unavailable_since is None or now - unavailable_since > 30:
                    log.warning("controller: cannot check the broker groups: %s", e)
                    unavailable_since = now

    def _scan_once(self) -> list[tuple[GroupMeta, dict]]:
        changed = []
        for name in self.manager.broker_names():
            meta, _rev, _rep, _rr, alive = self.manager.read_group(name)
            if self.manager.needs_election(meta, alive):
                try:
                    new, alive, did = self.manager.elect_master(meta.cluster, name)
                except ControllerError as e:
                    log.info("controller: %s", e)
                    continue
                if did:
                    changed.append((new, alive))
        return changed

    def _elected(self, meta: GroupMeta, alive: dict) -> None:
        """Tell the group's alive replicas at once (NOTIFY_BROKER_ROLE_CHANGED, oneway): they
        would learn it at their next heartbeat anyway, this saves up to an interval."""
        self.elections += 1
        if self._client is None:
            return
        ext, body = meta_fields(meta, alive, self.manager.unclean)

        async def tell(addr):
            req = RemotingCommand.create_request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext, body)
            req.mark_oneway()
            try:
                await self._client.invoke_oneway(addr, req)
            except Exception as e:
                log.debug("controller: notifying %s of the new master failed: %s", addr, e)

        for a in alive.values():
            asyncio.get_running_loop().create_task(tell(a.address))

    # -- requests --------------------------------------------------------------------------------
    async def process_request(self, ctx, request: RemotingCommand) -> RemotingCommand | None:
        handler = self._handlers.get(request.code)
        if handler is None:
            return request.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                         f"request code {request.code} not supported by the controller")
        try:
            return await handler(request)
        except RemotingCommandError as e:
            log.warning("controller: bad request code %d from %s: %s", request.code,
                        getattr(ctx, "remote_address", "?"), e)
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        except ControllerError as e:
            return request.make_response(e.code, f"[CONTROLLER] {e}")
        except Exception as e:
            from rmq_core.controller.etcd import EtcdUnavailable
            if isinstance(e, EtcdUnavailable):
                self.etcd_unavailable = str(e)
                return request.make_response(ResponseCode.SYSTEM_ERROR, f"[ETCD_UNAVAILABLE] {e}")
            raise

    async def heartbeat(self, request: RemotingCommand) -> RemotingCommand:
        name = _required(request, "brokerName")
        cluster = request.get_str("clusterName") or ""
        alive = ReplicaAlive(
            broker_id=_required_int(request, "brokerId"), address=_required(request, "brokerAddr"),
            ha_address=request.get_str("haAddr") or "", epoch=request.get_int("epoch", 0),
            max_offset=request.get_int("maxOffset", 0), confirm_offset=request.get_int("confirmOffset", 0),
            election_priority=request.get_int("electionPriority", DEFAULT_ELECTION_PRIORITY),
            heartbeat_timeout_ms=request.get_int("heartbeatTimeoutMills", 3000),
            incarnation=request.get_str("incarnation") or "")
        if alive.heartbeat_timeout_ms <= 0:
            raise RemotingCommandError(f"heartbeatTimeoutMills must be > 0, got {alive.heartbeat_timeout_ms}")
        if self.etcd_unavailable is not None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"[ETCD_UNAVAILABLE] {self.etcd_unavailable}")

        def run():
            meta, alive_now = self.manager.heartbeat(cluster, alive, name)
            did = False
            if self.manager.needs_election(meta, alive_now):  # a new group, or its master's lease ran out
                meta, alive_now, did = self.manager.elect_master(cluster, name)
            return meta, alive_now, did

        meta, alive_now, did = await asyncio.to_thread(run)
        if did:
            self._elected(meta, alive_now)
        return self._answer(request, meta, alive_now)

    async def register_broker(self, request: RemotingCommand) -> RemotingCommand:
        name = _required(request, "brokerName")
        cluster = request.get_str("clusterName") or ""
        bid = _required_int(request, "brokerId")
        addr = _required(request, "brokerAddress")
        meta = await asyncio.to_thread(self.manager.register_broker, cluster, name, bid, addr)
        return self._answer(request, meta)

    async def get_next_broker_id(self, request: RemotingCommand) -> RemotingCommand:
        name = _required(request, "brokerName")
        n = await asyncio.to_thread(self.manager.next_broker_id, request.get_str("clusterName") or "", name)
        return request.make_response(ResponseCode.SUCCESS, None, {"nextBrokerId": str(n)})

    async def apply_broker_id(self, request: RemotingCommand) -> RemotingCommand:
        name = _required(request, "brokerName")
        await asyncio.to_thread(self.manager.apply_broker_id, request.get_str("clusterName") or "", name,
                                _required_int(request, "appliedBrokerId"), _required(request, "registerCheckCode"))
        return request.make_response(ResponseCode.SUCCESS)

    async def alter_sync_state_set(self, request: RemotingCommand) -> RemotingCommand:
        name = _required(request, "brokerName")
        try:
            body = json.loads(request.body or b"{}")
            new_set = [int(b) for b in body["syncStateSet"]]
            set_epoch = int(body["syncStateSetEpoch"])
        except (ValueError, KeyError, TypeError) as e:
            raise RemotingCommandError(f"ALTER_SYNC_STATE_SET body must be {{\"syncStateSet\": [ids], "
                                       f"\"syncStateSetEpoch\": n}}: {e}") from None
        meta = await asyncio.to_thread(self.manager.alter_sync_state_set, request.get_str("clusterName") or "",
                                       name, _required_int(request, "masterBrokerId"),
                                       _required_int(request, "masterEpoch"), new_set, set_epoch)
        return request.make_response(ResponseCode.SUCCESS, None,
                                     {"newSyncStateSetEpoch": str(meta.sync_state_set_epoch)},
                                     json.dumps({"syncStateSet": meta.sync_state_set}).encode())

    async def elect_master(self, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_ELECT_MASTER.  With a brokerId (mqadmin's electMaster -b): a planned
        switch-over - the old master stops taking writes and waits for the chosen replica to hold
        everything it has, then the chosen one is elected."""
        name = _required(request, "brokerName")
        cluster = request.get_str("clusterName") or ""
        preferred = request.get_str("brokerId")
        preferred_id = int(preferred) if preferred not in (None, "", "-1") else None
        if preferred_id is None:
            meta, alive, did = await asyncio.to_thread(self.manager.elect_master, cluster, name)
            if did:
                self._elected(meta, alive)
            return self._answer(request, meta, alive)
        meta, _rev, _rep, _rr, alive = await asyncio.to_thread(self.manager.read_group, name, cluster)
        if preferred_id not in alive:
            raise ControllerError(f"cannot elect brokerId {preferred_id} of {name}: it is not alive "
                                  f"(alive: {sorted(alive)})")
        if preferred_id == meta.master_broker_id:
            return self._answer(request, meta, alive)
        planned = False
        old = meta.master_broker_id
        if old is not None and old in alive:
            await self._step_down(name, alive[old].address, meta, preferred_id)
            planned = True
        meta, alive, did = await asyncio.to_thread(self.manager.elect_master, cluster, name, preferred_id,
                                                   planned=planned)
        if did:
            self._elected(meta, alive)
        return self._answer(request, meta, alive)

    async def _step_down(self, name: str, master_addr: str, meta: GroupMeta, target: int) -> None:
        """Ask the master to stop answering writes until `target` holds all it has."""
        req = RemotingCommand.create_request(RequestCode.PREPARE_MASTER_SWITCH, {
            "brokerName": name, "masterEpoch": str(meta.master_epoch), "targetBrokerId": str(target),
            "timeoutMillis": str(int(SWITCH_CATCH_UP_TIMEOUT * 1000))})
        try:
            resp = await self._client.invoke(master_addr, req, SWITCH_CATCH_UP_TIMEOUT + 3)
        except Exception as e:
            raise ControllerError(f"the master of {name} at {master_addr} did not step down: {e}") from None
        if resp.code != ResponseCode.SUCCESS:
            raise ControllerError(f"the master of {name} at {master_addr} did not step down: {resp.remark}")

    async def get_metadata_info(self, request: RemotingCommand) -> RemotingCommand:
        def run():
            health = self.etcd.health()
            return {"controllerAddress": self.address, "etcdEndpoints": self.config.controller_etcd_endpoints,
                    "etcdRoot": self.config.controller_etcd_root, "etcdHealth": health,
                    "enableElectUncleanMaster": self.config.enable_elect_unclean_master,
                    "electionsByThisController": self.elections}
        info = await asyncio.to_thread(run)
        healthy = any(info["etcdHealth"].values())
        return request.make_response(ResponseCode.SUCCESS, None,
                                     {"controllerLeaderAddress": self.address or "", "isLeader": "true",
                                      "etcdHealthy": "true" if healthy else "false"},
                                     json.dumps(info).encode())

    async def get_sync_state_data(self, request: RemotingCommand) -> RemotingCommand:
        try:
            names = json.loads(request.body) if request.body else []
            if not isinstance(names, list):
                raise ValueError("not a list")
        except ValueError as e:
            raise RemotingCommandError(f"GET_SYNC_STATE_DATA body must be a JSON list of broker names: {e}") from None

        def run():
            wanted = [str(n) for n in names] or self.manager.broker_names()
            out = {}
            for n in wanted:
                meta, _rev, replicas, _rr, alive = self.manager.read_group(n)
                if _rev == 0 and not replicas.replicas:
                    continue
                out[n] = meta.summary(replicas, alive)
            return out

        return request.make_response(ResponseCode.SUCCESS, None, None, json.dumps(await asyncio.to_thread(run)).encode())

    async def clean_broker_data(self, request: RemotingCommand) -> RemotingCommand:
        await asyncio.to_thread(self.manager.clean_broker_data, _required(request, "brokerName"))
        return request.make_response(ResponseCode.SUCCESS)


async def run_controller(config, listen: str, *, ready: asyncio.Future | None = None):
    """`rmq controller`: a controller with a remoting server of its own, until cancelled."""
    from rmq_core.remoting.server import RemotingServer

    service = ControllerService(config)
    server = RemotingServer(listen, name="controller")
    for code in service.codes:
        server.register_processor(code, service)
    await server.start()
    service.address = server.listen_address
    await service.start()
    return service, server
