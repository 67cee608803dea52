"""The admin calls of RocketMQ 5's controller (docs/failover.md): sync state, metadata, election,
epochs."""
from __future__ import annotations

import json
from typing import Mapping, Sequence

from rmq_core.admin.calls.transport import AdminTransport
from rmq_core.admin.values import AdminError
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand


class ControllerCalls(AdminTransport):
    """The controller's calls (RocketMQ 5 controller mode)."""

    # --- controller mode (RocketMQ 5's controller; docs/failover.md) ---------------------------------------
    def _controller_call(self, controllers: str, code: int, ext: Mapping | None = None, body: bytes | None = None,
                         *, what: str, timeout: float | None = None) -> tuple[str, RemotingCommand]:
        """A request to the first of `controllers` ('host:port;host:port') that answers it: every
        controller over the same etcd answers alike, and one that cannot reach etcd says so
        ([ETCD_UNAVAILABLE]), so the next is asked.  Returns (the controller's address, its answer);
        a refusal raises AdminError with the controller's reason."""
        addrs = [a.strip() for a in (controllers or "").split(";") if a.strip()]
        if not addrs:
            raise AdminError(f"{what}: no controller: pass -a HOST:PORT (the controller, or a name server "
                             f"with enableControllerInNamesrv=true)")
        errors = []
        for addr in addrs:
            try:
                response = self.invoke(addr, code, ext, body, timeout=timeout, what=what)
            except AdminError as e:
                errors.append(str(e))
                continue
            if response.code == ResponseCode.SUCCESS:
                return addr, response
            if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                errors.append(f"{addr} is not a controller (request code {code} not supported: is "
                              f"enableControllerInNamesrv=true on that name server?)")
                continue
            if (response.remark or "").startswith("[ETCD_UNAVAILABLE]"):
                errors.append(f"{addr}: {response.remark}")
                continue
            raise AdminError(f"{what} on {addr} refused: {response.remark or f'response code {response.code}'}")
        raise AdminError(f"{what}: no controller answered ({'; '.join(errors)})")

    def sync_state_data(self, controllers: str, broker_names: Sequence[str] = ()) -> dict[str, dict]:
        """CONTROLLER_GET_SYNC_STATE_DATA: per broker group its master (id, address, epoch), sync
        state set and its epoch, and replicas (id, address, alive, role, epoch, maxOffset); every
        group the controller knows when no name is given.  Groups it does not know are left out."""
        _, r = self._controller_call(controllers, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
                                     body=json.dumps(list(broker_names)).encode(), what="get sync state data")
        return json.loads(r.body) if r.body else {}

    def controller_metadata(self, controllers: str) -> tuple[str, dict, dict]:
        """CONTROLLER_GET_METADATA_INFO: (the controller asked, its answer's ext fields, its body:
        controllerAddress, etcdEndpoints, etcdHealth {endpoint: healthy}, ...)."""
        addr, r = self._controller_call(controllers, RequestCode.CONTROLLER_GET_METADATA_INFO,
                                        what="get controller metadata")
        return addr, dict(r.ext_fields or {}), json.loads(r.body) if r.body else {}

    def elect_master(self, controllers: str, cluster: str, broker_name: str, broker_id: int | None,
                     timeout: float | None = None) -> tuple[dict, list[int]]:
        """CONTROLLER_ELECT_MASTER with a designated broker id (a planned switch-over: the old
        master stops writing and the chosen replica catches up first), or any (None).  Returns the
        answer's fields (masterBrokerId, masterAddress, masterEpoch, syncStateSetEpoch) and the
        sync state set; a refusal raises AdminError with the controller's reason."""
        ext = {"clusterName": cluster, "brokerName": broker_name,
               "brokerId": "" if broker_id is None else str(broker_id),
               "designateElect": "true" if broker_id is not None else "false"}
        _, r = self._controller_call(controllers, RequestCode.CONTROLLER_ELECT_MASTER, ext, timeout=timeout,
                                     what=f"elect master of {broker_name}")
        return dict(r.ext_fields or {}), [int(b) for b in json.loads(r.body or b"{}").get("syncStateSet", [])]

    def broker_epoch_cache(self, addr: str) -> dict:
        """GET_BROKER_EPOCH_CACHE (a broker in controller mode): brokerName, brokerId, maxOffset and
        its epoch file's entries (epoch, startOffset, endOffset; the last one ends at maxOffset)."""
        r = self._call(addr, RequestCode.GET_BROKER_EPOCH_CACHE, what="get broker epoch cache")
        cache = json.loads(r.body) if r.body else {}
        entries = cache.get("epochList") or []
        if entries and cache.get("maxOffset") is not None:  # as mqadmin: the last epoch runs to maxOffset
            entries[-1]["endOffset"] = cache["maxOffset"]
        return cache
