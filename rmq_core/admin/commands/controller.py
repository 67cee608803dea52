"""Controller mode's commands, with mqadmin 5's names and flags: getSyncStateSet, getBrokerEpoch,
electMaster, getControllerMetaData.  `-a` names the controller(s) ('host:port;host:port': a name
server with enableControllerInNamesrv=true, or `rmq controller`); any of them answers."""
from __future__ import annotations

import time

from rmq_core.admin.commands import UsageError, arg, command
from rmq_core.admin.output import snake
from rmq_core.admin.values import AdminError
from rmq_core.errors import RMQError

_A = arg("-a", "--controllerAddress", dest="controller", required=True,
         help="controller address(es) 'host:port;host:port' (a name server with enableControllerInNamesrv=true, "
              "or rmq controller)")


def _names(text: str | None) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def _cluster_groups(admin, cluster: str) -> list[str]:
    """The broker names of a cluster, from the name server (an unknown cluster raises naming it)."""
    return sorted({b.broker_name for b in admin.brokers(cluster)})


def _groups(admin, args) -> tuple[list[str], bool]:
    """The broker groups -b or -c names, and whether they were named one by one (-b)."""
    if args.brokerName:
        names = _names(args.brokerName)
        if not names:
            raise UsageError(f"bad -b {args.brokerName!r}: give broker names separated by ','")
        return names, True
    if args.clusterName:
        return _cluster_groups(admin, args.clusterName), False
    raise UsageError("give broker name(s) (-b NAME[,NAME]) or a cluster name (-c CLUSTER)")


SYNC_STATE_COLUMNS = ["Broker Name", "Master Broker Id", "Master Addr", "Master Epoch", "Sync State Set",
                      "Sync State Set Epoch"]
REPLICA_COLUMNS = ["Broker Name", "Broker Id", "Address", "Alive", "Role", "Epoch", "Max Offset", "In Sync State Set"]


def sync_state_rows(data: dict) -> list[list]:
    """getSyncStateSet's group rows (SYNC_STATE_COLUMNS) from CONTROLLER_GET_SYNC_STATE_DATA's body."""
    return [[name, g.get("masterBrokerId"), g.get("masterAddress"), g.get("masterEpoch"),
             list(g.get("syncStateSet") or []), g.get("syncStateSetEpoch")] for name, g in sorted(data.items())]


def replica_rows(name: str, group: dict) -> list[list]:
    return [[name, r.get("brokerId"), r.get("address"), bool(r.get("alive")), r.get("role"), r.get("epoch"),
             r.get("maxOffset"), bool(r.get("inSyncStateSet"))] for r in group.get("replicas") or []]


@command("getSyncStateSet", "Each broker group's master, master epoch, sync state set and replicas, as the controller "
         "holds them (controller mode)", _A,
         arg("-b", "--brokerName", help="broker name(s), separated by ','"),
         arg("-c", "--clusterName", help="every broker group of this cluster (names from the name server)"),
         needs_namesrv=False)
def get_sync_state_set(admin, args, out):
    names, named = _groups(admin, args)
    data = admin.sync_state_data(args.controller, names)
    missing = [n for n in names if n not in data]
    if named and missing:
        raise UsageError(f"bad -b {args.brokerName!r}: the controller at {args.controller} knows no broker group "
                         f"{', '.join(map(repr, missing))} (known groups register when their brokers start with "
                         f"enableControllerMode=true)")
    rows = sync_state_rows(data)
    if out.as_json:  # one object per group, its replicas nested
        out.table(SYNC_STATE_COLUMNS + ["Replicas"],
                  [row + [[dict(zip(map(snake, REPLICA_COLUMNS[1:]), r[1:])) for r in replica_rows(row[0], data[row[0]])]]
                   for row in rows])
        return
    out.table(SYNC_STATE_COLUMNS, rows)
    out.table(REPLICA_COLUMNS, [r for name, _ in sorted(data.items()) for r in replica_rows(name, data[name])],
              title="Replicas")
    if missing:
        out.message(f"not in controller mode (unknown to the controller): {', '.join(missing)}")


EPOCH_COLUMNS = ["Broker Name", "Broker Addr", "Broker Id", "Epoch", "Start Offset", "End Offset", "Max Offset"]


def epoch_rows(addr: str, cache: dict) -> list[list]:
    """getBrokerEpoch's rows for one replica: one per epoch of its epoch file."""
    base = [cache.get("brokerName"), addr, cache.get("brokerId")]
    entries = cache.get("epochList") or []
    if not entries:  # a replica that has not been master nor followed one yet
        return [base + [None, None, None, cache.get("maxOffset")]]
    return [base + [e.get("epoch"), e.get("startOffset"), e.get("endOffset"), cache.get("maxOffset")] for e in entries]


@command("getBrokerEpoch", "Each replica's epoch file (epoch, start offset, end offset) and max offset (controller mode)",
         arg("-b", "--brokerName", help="broker name(s), separated by ','"),
         arg("-c", "--clusterName", help="every broker group of this cluster"))
def get_broker_epoch(admin, args, out):
    names, _ = _groups(admin, args)
    table = admin.cluster_info().broker_addr_table
    unknown = [n for n in names if n not in table]
    if unknown:
        raise UsageError(f"bad -b {args.brokerName!r}: no broker named {', '.join(map(repr, unknown))} in the name server")
    rows, failed = [], []
    for name in names:
        for _bid, addr in sorted(table[name].broker_addrs.items()):
            try:
                rows += epoch_rows(addr, admin.broker_epoch_cache(addr))
            except RMQError as e:
                failed.append(str(e))
    if failed and not rows:
        raise AdminError("; ".join(failed))
    out.table(EPOCH_COLUMNS, rows, footer=failed)


@command("electMaster", "Make a replica the master of its group: a planned switch-over (the old master stops writing, "
         "the chosen replica catches up, then it is elected); controller mode", _A,
         arg("-b", "--brokerId", required=True, type=int, help="the broker id of the replica to elect (getSyncStateSet lists them)"),
         arg("-n", "--brokerName", required=True, help="its broker name"),
         arg("-c", "--clusterName", required=True, help="its cluster name"),
         needs_namesrv=False)
def elect_master(admin, args, out):
    if args.brokerId < 1:
        raise UsageError(f"bad -b {args.brokerId}: a replica's broker id in controller mode is >= 1")
    t0 = time.monotonic()
    # the switch waits for the chosen replica to catch up (up to 10 s on the controller): allow for it
    fields, sss = admin.elect_master(args.controller, args.clusterName, args.brokerName, args.brokerId,
                                     timeout=max(args.timeout, 15.0))
    took_ms = round((time.monotonic() - t0) * 1000)
    master = fields.get("masterBrokerId")
    if master != str(args.brokerId):
        raise UsageError(f"the controller did not elect broker {args.brokerId} of {args.brokerName}: "
                         f"the master is {master or 'none'} at epoch {fields.get('masterEpoch')}")
    out.message(f"elect master success: broker {master} of {args.brokerName} is the master at "
                f"{fields.get('masterAddress')}, epoch {fields.get('masterEpoch')} (the switch took {took_ms} ms)")
    out.record([("Cluster Name", args.clusterName), ("Broker Name", args.brokerName),
                ("Master Broker Id", int(master)), ("Master Addr", fields.get("masterAddress")),
                ("Master Epoch", int(fields.get("masterEpoch") or 0)), ("Sync State Set", sss),
                ("Sync State Set Epoch", int(fields.get("syncStateSetEpoch") or 0)), ("Took (ms)", took_ms)])


@command("getControllerMetaData", "The controller's address, its etcd endpoints and their health (controller mode)", _A,
         needs_namesrv=False)
def get_controller_meta_data(admin, args, out):
    asked, ext, info = admin.controller_metadata(args.controller)
    health = info.get("etcdHealth") or {}
    out.record([("Controller Address", ext.get("controllerLeaderAddress") or info.get("controllerAddress") or asked),
                ("etcd Endpoints", info.get("etcdEndpoints", "")), ("etcd Root", info.get("etcdRoot", "")),
                ("etcd Healthy", ext.get("etcdHealthy") == "true"),
                ("Unclean Election", bool(info.get("enableElectUncleanMaster"))),
                ("Elections By This Controller", info.get("electionsByThisController"))]
               + ([("etcd Health", {ep: bool(ok) for ep, ok in health.items()})] if out.as_json else []))
    if not out.as_json:
        out.table(["etcd Endpoint", "Healthy"], [(ep, bool(ok)) for ep, ok in sorted(health.items())])
