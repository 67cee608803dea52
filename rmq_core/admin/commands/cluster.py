"""Cluster, broker and name server commands: clusterList, brokerStatus, getBrokerConfig,
updateBrokerConfig, getNamesrvConfig, updateKvConfig, deleteKvConfig, clusterRT, statsAll,
wipeWritePerm, addWritePerm."""
from __future__ import annotations

import time

from rmq_core.admin.commands import UsageError, arg, broker_targets, command
from rmq_core.admin.output import Shown, typed
from rmq_core.admin.values import replica_state
from rmq_core.errors import RMQError
from rmq_core.message import MixAll, TopicValidator

_B = arg("-b", "--brokerAddr", help="broker address host:port")
_C = arg("-c", "--clusterName", help="cluster name")


def _first_float(text: str | None) -> float:
    """putTps is "a b c" (10 s / 1 min / 10 min) on Java brokers, one value on rmq: the first."""
    try:
        return float((text or "0").split()[0])
    except (ValueError, IndexError):
        return 0.0


@command("clusterList", "The brokers of each cluster with their role, version, rates and disk use",
         arg("-c", "--clusterName", help="only this cluster"),
         arg("-m", "--moreStats", action="store_true", help="also today's and yesterday's message totals"))
def cluster_list(admin, args, out):
    rows = []
    for b in admin.brokers(args.clusterName):
        info = admin.broker_runtime_info(b.addr)
        earliest = admin.earliest_message_time(b.addr, info)
        if earliest > 0:
            h = (time.time() * 1000 - earliest) / 3_600_000
            hours = Shown(round(h, 2), f"{h:.2f}")
        else:
            hours = Shown(None, "N/A")
        row = [b.cluster, b.broker_name, b.broker_id, b.addr, *replica_state(info)[:2], info.get("brokerVersionDesc", ""),
               _first_float(info.get("putTps")), _first_float(info.get("getTransferedTps")),
               int(info.get("pageCacheLockTimeMills") or 0), hours, typed(info.get("commitLogDiskRatio", ""))]
        if args.moreStats:
            row += [int(info.get("msgPutTotalTodayNow") or 0), int(info.get("msgGetTotalTodayNow") or 0)]
        rows.append(row)
    cols = ["Cluster Name", "Broker Name", "BID", "Addr", "Role", "Epoch", "Version", "InTPS", "OutTPS", "PCWait(ms)", "Hour", "SPACE"]
    if args.moreStats:
        cols += ["InTotalToday", "OutTotalToday"]
    out.table(cols, rows)


def _key_values(admin, args, out, fetch) -> None:
    """A table of `fetch(addr)`'s keys and values for each broker the arguments name."""
    out.table(["Broker Addr", "Key", "Value"],
              [(addr, k, typed(v)) for addr in broker_targets(admin, args) for k, v in sorted(fetch(addr).items())])


@command("brokerStatus", "A broker's runtime info (key / value)", _B, _C)
def broker_status(admin, args, out):
    _key_values(admin, args, out, admin.broker_runtime_info)


@command("getBrokerConfig", "A broker's configuration, and where each value came from", _B, _C)
def get_broker_config(admin, args, out):
    rows = []
    for addr in broker_targets(admin, args):
        props, origins = admin.broker_config_origins(addr)
        # Origin: the -c file, updateBrokerConfig's file (over the file's or default value), a
        # flag, or the default; "" from a broker that does not say (RocketMQ's)
        rows += [(addr, k, v, "" if origins is None else origins.get(k, "default")) for k, v in sorted(props.items())]
    out.table(["Broker Addr", "Key", "Value", "Origin"], rows)


@command("updateBrokerConfig", "Change one setting of a running broker (-b) or of a cluster's masters (-c); "
         "--reset drops a value it persisted", _B, _C,
         arg("-k", "--key", required=True, help="config key, e.g. brokerPermission"),
         arg("-v", "--value", help="new value (persisted in the store's config/broker.properties, read over "
                                   "broker.conf at every start)"),
         arg("--reset", action="store_true", help="drop the key's persisted value: broker.conf's (or the default) "
                                                  "holds again"))
def update_broker_config(admin, args, out):
    if args.value is not None and args.reset:
        raise UsageError(f"-v {args.value} sets a value, --reset drops the persisted one: give one of them")
    if args.value is None and not args.reset:
        raise UsageError("give -v VALUE (a new value) or --reset (back to broker.conf's or the default)")
    rows = []
    for addr in broker_targets(admin, args):
        if args.reset:
            note = admin.reset_broker_config(addr, [args.key])
            out.message(f"reset broker config success, {addr}: {note}")
            rows.append((addr, args.key, "", "now" if "in effect now" in note else "after a restart"))
            continue
        later = admin.update_broker_config(addr, {args.key: args.value})
        out.message(f"update broker config success, {addr}" + (f"; {later}" if later else ", in effect now"))
        rows.append((addr, args.key, typed(args.value), "after a restart" if later else "now"))
    out.table(["Broker Addr", "Key", "Value", "Takes Effect"], rows)


@command("getNamesrvConfig", "Each name server's configuration")
def get_namesrv_config(admin, args, out):
    rows = [(ns, k, typed(v)) for ns, props in admin.namesrv_config().items() for k, v in sorted(props.items())]
    out.table(["Name Server", "Key", "Value"], rows)


@command("updateKvConfig", "Set a KV config item on every name server",
         arg("-s", "--namespace", required=True, help="namespace, e.g. ORDER_TOPIC_CONFIG"),
         arg("-k", "--key", required=True, help="key"), arg("-v", "--value", required=True, help="value"))
def update_kv_config(admin, args, out):
    admin.put_kv_config(args.namespace, args.key, args.value)
    out.message("update kv config in namespace success.")
    out.table(["Namespace", "Key", "Value"], [(args.namespace, args.key, args.value)])


@command("deleteKvConfig", "Delete a KV config item from every name server",
         arg("-s", "--namespace", required=True, help="namespace"), arg("-k", "--key", required=True, help="key"))
def delete_kv_config(admin, args, out):
    if admin.get_kv_config(args.namespace, args.key) is None:
        raise UsageError(f"no KV config item {args.key!r} in namespace {args.namespace!r}")
    admin.delete_kv_config(args.namespace, args.key)
    out.message("delete kv config from namespace success.")
    out.table(["Namespace", "Key"], [(args.namespace, args.key)])


@command("clusterRT", "Send round trip per broker: messages to each broker's own topic, average RT",
         arg("-a", "--amount", type=int, default=100, help="messages per broker (default 100)"),
         arg("-s", "--size", type=int, default=128, help="message size in bytes (default 128)"),
         arg("-c", "--cluster", help="only this cluster"))
def cluster_rt(admin, args, out):
    if args.amount <= 0 or args.size <= 0:
        raise UsageError(f"bad -a {args.amount} / -s {args.size}: both must be > 0")
    masters = [b for b in admin.brokers(args.cluster) if b.broker_id == MixAll.MASTER_ID]
    body = b"x" * args.size
    rows = []
    with out.progress("clusterRT", len(masters) * args.amount) as advance:
        for b in masters:
            ok = fail = 0
            spent = 0.0
            for _ in range(args.amount):
                t0 = time.perf_counter()
                try:
                    # (each broker serves a topic named after itself: brokerTopicEnable)
                    admin.send_message(b.broker_name, body, broker_name=b.broker_name, queue_id=0)
                    ok += 1
                    spent += time.perf_counter() - t0
                except RMQError:
                    fail += 1
                advance()
            rows.append((b.cluster, b.broker_name, round(spent * 1000 / ok, 3) if ok else 0.0, ok, fail))
    out.table(["Cluster Name", "Broker Name", "RT(ms)", "Success Count", "Fail Count"], rows)


@command("statsAll", "Per topic and consumer group: accumulation, TPS in and out, messages in 24 hours",
         arg("-a", "--activeTopic", action="store_true", help="only topics with traffic in the last day"),
         arg("-t", "--topic", help="only this topic"))
def stats_all(admin, args, out):
    topics = [args.topic] if args.topic else [t for t in admin.topic_list()
                                               if not MixAll.is_retry_topic(t) and not MixAll.is_dlq_topic(t)]
    if args.topic:
        admin.topic_route(args.topic)
    rows = []
    for t, brokers in out.each("statsAll", topics, admin.topic_master_addrs):
        in_tps = in_day = 0.0
        for _, addr in brokers:
            d = admin.stats_data(addr, "TOPIC_PUT_NUMS", t)
            if d:
                in_tps += float(d["statsMinute"]["tps"])
                in_day += int(d["statsDay"]["sum"])
        try:
            groups = admin.topic_consumed_by(t)
        except RMQError:  # (a broker that cannot say: the topic's row without its groups)
            groups = []
        if not groups:
            if not args.activeTopic or in_day > 0:
                rows.append((t, "", 0, round(in_tps, 2), 0.0, int(in_day), 0))
        for g in groups:
            out_tps = out_day = 0.0
            for _, addr in brokers:
                d = admin.stats_data(addr, "GROUP_GET_NUMS", f"{t}@{g}")
                if d:
                    out_tps += float(d["statsMinute"]["tps"])
                    out_day += int(d["statsDay"]["sum"])
            try:
                accumulation = admin.consume_stats(g, t).diff_total
            except RMQError:
                accumulation = 0
            if not args.activeTopic or in_day > 0 or out_day > 0:
                rows.append((t, g, accumulation, round(in_tps, 2), round(out_tps, 2), int(in_day), int(out_day)))
    out.table(["Topic", "Consumer Group", "Accumulation", "InTPS", "OutTPS", "InMsg24Hour", "OutMsg24Hour"], rows)



def _write_perm(admin, args, out, wipe: bool):
    name = args.brokerName.strip()
    known = {b.broker_name for b in admin.brokers()}
    if name not in known:
        raise UsageError(f"bad -b {args.brokerName!r}: no broker of that name in the cluster "
                         f"(known: {', '.join(sorted(known)) or 'none'})")
    done = admin.change_write_perm(name, wipe)
    verb = "wipe" if wipe else "add"
    for ns, count in done:
        out.message(f"{verb} write perm of broker[{name}] in name server[{ns}] OK, {count}")
    out.table(["Name Server", "Broker Name", "Wiped Topics" if wipe else "Added Topics"],
              [(ns, name, count) for ns, count in done])


@command("wipeWritePerm", "Make a broker's queues read-only in the name servers' routes: producers move to the "
         "other brokers, consumers drain it (before maintenance)",
         arg("-b", "--brokerName", required=True, help="broker name"))
def wipe_write_perm(admin, args, out):
    _write_perm(admin, args, out, True)


@command("addWritePerm", "Make a broker's queues writable again in the name servers' routes (after wipeWritePerm)",
         arg("-b", "--brokerName", required=True, help="broker name"))
def add_write_perm(admin, args, out):
    _write_perm(admin, args, out, False)


@command("sendMsgStatus", "Send messages to a broker's own topic and show each send's round trip and status",
         arg("-b", "--brokerName", required=True, help="broker name"),
         arg("-s", "--messageSize", type=int, default=128, help="message size in bytes (default 128)"),
         arg("-c", "--count", type=int, default=50, help="how many messages (default 50)"))
def send_msg_status(admin, args, out):
    if args.count <= 0:
        raise UsageError(f"bad -c {args.count}: must be > 0")
    if not 1 <= args.messageSize <= 4 * 1024 * 1024:
        raise UsageError(f"bad -s {args.messageSize}: a message size is 1..4194304 bytes")
    name = args.brokerName.strip()
    known = {b.broker_name for b in admin.brokers()}
    if name not in known:
        raise UsageError(f"bad -b {args.brokerName!r}: no broker of that name (known: {', '.join(sorted(known))})")
    admin.send_rt(name, 1, args.messageSize, by_queue=False)  # warm up (a connection, the route), as mqadmin
    with out.progress("sendMsgStatus", args.count) as advance:
        sends = admin.send_rt(name, args.count, args.messageSize, by_queue=False,
                              on_progress=lambda n: advance(completed=n))
    out.table(["Broker Name", "QID", "RT(ms)", "Send Status"], [(b, q, round(rt, 2), s) for b, q, _, rt, s in sends])


ORDER_CONF_NAMESPACE = "ORDER_TOPIC_CONFIG"


def _check_order_conf(conf: str) -> str:
    """brokerName:queueNums pairs separated by ';' (e.g. broker-a:4;broker-b:4)."""
    for part in conf.split(";"):
        name, _, n = part.partition(":")
        if not name.strip() or not n.strip().isdigit() or int(n) <= 0:
            raise UsageError(f"bad -v {conf!r}: {part!r} is not brokerName:queueNums (e.g. broker-a:4;broker-b:4)")
    return conf


@command("updateOrderConf", "Create, show or delete a topic's order config (brokerName:queueNums;...) on the name servers",
         arg("-t", "--topic", required=True, help="topic"),
         arg("-v", "--orderConf", help="order config, e.g. broker-a:4;broker-b:4 (with -m put)"),
         arg("-m", "--method", default="put", choices=["put", "get", "delete"], help="put | get | delete (default put)"))
def update_order_conf(admin, args, out):
    TopicValidator.check_topic(args.topic)
    if args.method == "put":
        if not args.orderConf:
            raise UsageError("-m put needs the order config: -v brokerName:queueNums;...")
        admin.put_kv_config(ORDER_CONF_NAMESPACE, args.topic, _check_order_conf(args.orderConf.strip()))
        out.message(f"update orderConf success. topic=[{args.topic}], orderConf=[{args.orderConf.strip()}]")
        conf = args.orderConf.strip()
    elif args.method == "get":
        conf = admin.get_kv_config(ORDER_CONF_NAMESPACE, args.topic)
        if conf is None:
            raise UsageError(f"no order config for topic {args.topic!r}")
    else:
        if admin.get_kv_config(ORDER_CONF_NAMESPACE, args.topic) is None:
            raise UsageError(f"no order config for topic {args.topic!r}")
        admin.delete_kv_config(ORDER_CONF_NAMESPACE, args.topic)
        out.message(f"delete orderConf success. topic=[{args.topic}]")
        conf = ""
    out.table(["Topic", "Method", "Order Conf"], [(args.topic, args.method, conf)])


@command("updateNamesrvConfig", "Update a setting on every name server",
         arg("-k", "--key", required=True, help="config key"), arg("-v", "--value", required=True, help="value"))
def update_namesrv_config(admin, args, out):
    admin.update_namesrv_config({args.key.strip(): args.value.strip()})
    out.message(f"update name server config success!{args.key}={args.value}")
    out.table(["Name Server", "Key", "Value"], [(ns, args.key, typed(props.get(args.key.strip(), "")))
                                                for ns, props in admin.namesrv_config().items()])
