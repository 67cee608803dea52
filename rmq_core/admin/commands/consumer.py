"""Consumer group commands: updateSubGroup, deleteSubGroup, consumerProgress, consumerConnection,
producerConnection, consumerStatus, brokerConsumeStats, resetOffsetByTime, cloneGroupOffset, getConsumerStatus,
skipAccumulatedMessage, startMonitoring."""
from __future__ import annotations

import time

from rmq_core.admin.commands import UsageError, arg, broker_targets, command, parse_bool, parse_timestamp
from rmq_core.admin.output import fmt_time
from rmq_core.errors import RMQError
from rmq_core.message import MixAll
from rmq_core.remoting.codes import MQVersion

_G = arg("-g", "--groupName", required=True, help="consumer group")
_B = arg("-b", "--brokerAddr", help="broker address host:port")
_C = arg("-c", "--clusterName", help="cluster name")


@command("updateSubGroup", "Update or create a subscription group on a broker (-b) or a cluster's masters (-c)",
         _B, _C, _G,
         arg("-s", "--consumeEnable", type=parse_bool, default=True, help="consuming allowed (default true)"),
         arg("-m", "--consumeFromMinEnable", type=parse_bool, default=False, help="a new group starts at the min offset"),
         arg("-d", "--consumeBroadcastEnable", type=parse_bool, default=False, help="broadcasting allowed"),
         arg("-q", "--retryQueueNums", type=int, default=1, help="retry queue count (default 1)"),
         arg("-r", "--retryMaxTimes", type=int, default=16, help="retries before the dead-letter queue (default 16)"),
         arg("-i", "--brokerId", type=int, default=0, help="broker id to consume from (default 0, the master)"),
         arg("-w", "--whichBrokerWhenConsumeSlowly", type=int, default=1, help="broker id when consuming slowly"),
         arg("-a", "--notifyConsumerIdsChanged", type=parse_bool, default=True, help="notify members on changes"),
         arg("-o", "--consumeMessageOrderly", type=parse_bool, default=False,
             help="a FIFO group: pop consumption hands out a queue's next message after the previous is acked"))
def update_sub_group(admin, args, out):
    if args.retryQueueNums < 0 or args.retryMaxTimes < 0:
        raise UsageError(f"bad -q {args.retryQueueNums} / -r {args.retryMaxTimes}: must not be negative")
    config = {"groupName": args.groupName, "consumeEnable": args.consumeEnable,
              "consumeFromMinEnable": args.consumeFromMinEnable, "consumeBroadcastEnable": args.consumeBroadcastEnable,
              "retryQueueNums": args.retryQueueNums, "retryMaxTimes": args.retryMaxTimes, "brokerId": args.brokerId,
              "whichBrokerWhenConsumeSlowly": args.whichBrokerWhenConsumeSlowly,
              "notifyConsumerIdsChangedEnable": args.notifyConsumerIdsChanged,
              "consumeMessageOrderly": args.consumeMessageOrderly}
    rows = []
    for addr in broker_targets(admin, args):
        admin.create_or_update_subscription_group(addr, config)
        out.message(f"create subscription group to {addr} success.")
        rows.append((addr, args.groupName, args.consumeEnable, args.consumeBroadcastEnable, args.retryQueueNums,
                     args.retryMaxTimes))
    out.table(["Broker Addr", "Group", "Consume Enable", "Broadcast Enable", "Retry Queues", "Retry Max Times"], rows)


@command("deleteSubGroup", "Delete a subscription group from a broker (-b) or a cluster's masters (-c)", _B, _C, _G,
         arg("-r", "--removeOffset", type=parse_bool, default=False, help="also drop its committed offsets"))
def delete_sub_group(admin, args, out):
    addrs = broker_targets(admin, args)
    if not any(args.groupName in admin.subscription_groups(a) for a in addrs):
        raise UsageError(f"subscription group {args.groupName!r} does not exist on {', '.join(addrs)}")
    rows = []
    for addr in addrs:
        admin.delete_subscription_group(addr, args.groupName, args.removeOffset)
        out.message(f"delete subscription group [{args.groupName}] from broker [{addr}] success.")
        rows.append((addr, args.groupName, args.removeOffset))
    out.table(["Broker Addr", "Group", "Offsets Removed"], rows)


@command("consumerProgress", "A group's lag per queue (-g), or every group's summary (pop groups: in flight too)",
         arg("-g", "--groupName", help="consumer group (all groups when left out)"),
         arg("-s", "--showClientIP", type=parse_bool, default=False, help="show which client holds each queue"))
def consumer_progress(admin, args, out):
    if args.groupName:
        stats = admin.consume_stats(args.groupName)
        owners = {}
        if args.showClientIP:
            owners = _queue_owners(admin, args.groupName)
        cols = ["Topic", "Broker Name", "QID", "Broker Offset", "Consumer Offset"]
        cols += ["Client IP"] if args.showClientIP else []
        cols += ["Diff", "Inflight", "LastTime"]
        rows = []
        for q in stats.queues:
            row = [q.topic, q.broker_name, q.queue_id, q.broker_offset, q.consumer_offset]
            if args.showClientIP:
                row.append(owners.get((q.topic, q.broker_name, q.queue_id), "N/A"))
            rows.append(row + [q.diff, q.inflight, fmt_time(q.last_timestamp)])
        out.table(cols, rows, footer=["", f"Consume TPS: {stats.consume_tps:.2f}", f"Diff Total: {stats.diff_total}",
                                      f"Inflight Total: {stats.inflight_total}"])
        return
    rows = []
    for g, stats in out.each("consumerProgress", admin.consumer_groups(), admin.consume_stats):
        try:
            conn = admin.consumer_connection(g)
            count = len(conn.connections)
            version = _version_desc(max(c.version for c in conn.connections))
            ctype = "PULL" if conn.consume_type == "CONSUME_ACTIVELY" else "PUSH"
            model = conn.message_model
        except RMQError:
            count, version, ctype, model = 0, "OFFLINE", "", ""
        rows.append((g, count, version, ctype, model, round(stats.consume_tps, 2), stats.diff_total,
                     stats.inflight_total))
    out.table(["Group", "Count", "Version", "Type", "Model", "TPS", "Diff Total", "Inflight Total"], rows)


def _queue_owners(admin, group: str) -> dict:
    owners = {}
    try:
        conn = admin.consumer_connection(group)
    except RMQError:
        return owners
    for c in conn.connections:
        try:
            info = admin.consumer_running_info(group, c.client_id)
        except RMQError:
            continue
        for mq in info.get("mqTable") or []:
            owners[(mq["topic"], mq["brokerName"], int(mq["queueId"]))] = c.client_id
    return owners


def _version_desc(version: int) -> str:
    return MQVersion.desc(version)


@command("consumerConnection", "The live members of a consumer group and what they subscribe", _G)
def consumer_connection(admin, args, out):
    conn = admin.consumer_connection(args.groupName)
    out.table(["ClientId", "ClientAddr", "Language", "Version"],
              [(c.client_id, c.client_addr, c.language, _version_desc(c.version)) for c in conn.connections])
    if not out.as_json:
        out.table(["Topic", "SubExpression"], sorted(conn.subscriptions.items()), title="Below is subscription:")
        out.message(f"ConsumeType: {conn.consume_type}")
        out.message(f"MessageModel: {conn.message_model}")
        out.message(f"ConsumeFromWhere: {conn.consume_from_where}")


@command("producerConnection", "The live members of a producer group", arg("-g", "--producerGroup", required=True,
         help="producer group"), arg("-t", "--topic", required=True, help="a topic it sends to"))
def producer_connection(admin, args, out):
    conns = admin.producer_connection(args.producerGroup, args.topic)
    out.table(["ClientId", "ClientAddr", "Language", "Version"],
              [(c.client_id, c.client_addr, c.language, _version_desc(c.version)) for c in conns])


@command("consumerStatus", "Each member's running info (with -i: one member's queues in detail)", _G,
         arg("-i", "--clientId", help="one member's client id"),
         arg("-s", "--jstackEnable", type=parse_bool, default=False, help="(mqadmin compatibility; ignored)"))
def consumer_status(admin, args, out):
    conn = admin.consumer_connection(args.groupName)
    ids = [c.client_id for c in conn.connections]
    if args.clientId:
        if args.clientId not in ids:
            raise UsageError(f"client {args.clientId!r} is not a member of group {args.groupName!r} (members: {', '.join(ids)})")
        info = admin.consumer_running_info(args.groupName, args.clientId)
        out.table(["Topic", "Broker Name", "QID", "Commit Offset", "Cached Msg Count", "Locked"],
                  [(m["topic"], m["brokerName"], int(m["queueId"]), int(m.get("commitOffset", -1)),
                    int(m.get("cachedMsgCount", 0)), bool(m.get("locked", False)))
                   for m in sorted(info.get("mqTable") or [], key=lambda m: (m["topic"], m["brokerName"], m["queueId"]))])
        if not out.as_json:
            out.table(["Key", "Value"], sorted((info.get("properties") or {}).items()), title="Properties:")
        return
    rows, subs = [], set()
    for cid in ids:
        info = admin.consumer_running_info(args.groupName, cid)
        props = info.get("properties") or {}
        sub = tuple(sorted((s.get("topic"), s.get("subString")) for s in info.get("subscriptionSet") or []))
        subs.add(sub)
        rows.append((cid, props.get("consumeType", ""), props.get("messageModel", ""), len(info.get("mqTable") or []),
                     sum(int(m.get("cachedMsgCount", 0)) for m in info.get("mqTable") or [])))
    out.table(["ClientId", "Consume Type", "Message Model", "Queues", "Cached Msgs"], rows,
              footer=["", "Same subscription in the same group of consumer" if len(subs) <= 1
                      else "WARN: Subscription differs in the same group of consumer"])


@command("brokerConsumeStats", "Every group's lag on one broker", arg("-b", "--brokerAddr", required=True, help="broker address"),
         arg("-t", "--timeoutMillis", type=int, default=50000, help="request timeout in ms"),
         arg("-l", "--level", type=int, default=0, help="only groups with at least this diff"),
         arg("-o", "--order", type=parse_bool, default=False, help="only orderly groups"))
def broker_consume_stats(admin, args, out):
    if args.brokerAddr not in {b.addr for b in admin.brokers()}:
        raise UsageError(f"broker {args.brokerAddr} is not registered in the name server")
    d = admin.broker_consume_stats(args.brokerAddr, args.level, args.order, args.timeoutMillis)
    rows = []
    for item in d.get("consumeStatsList") or []:
        for group, stats in sorted(item.items()):
            for s in stats:
                for r in sorted(s.get("offsetTable") or [], key=lambda r: (r["topic"], r["queueId"])):
                    diff = max(0, r["brokerOffset"] - r["consumerOffset"])
                    rows.append((r["topic"], group, r["brokerName"], r["queueId"], r["brokerOffset"],
                                 r["consumerOffset"], diff, fmt_time(r.get("lastTimestamp"))))
    out.table(["Topic", "Group", "Broker Name", "QID", "Broker Offset", "Consumer Offset", "Diff", "LastTime"], rows,
              footer=["", f"Diff Total: {d.get('totalDiff', 0)}"])


def _print_reset(out, resets, title):
    out.message(title)
    out.table(["Topic", "Broker Name", "QID", "Offset"], [(r.topic, r.broker_name, r.queue_id, r.offset) for r in resets])


def _reset(admin, out, topic, group, ts, force):
    brokers = admin.topic_master_addrs(topic)
    with out.progress(f"resetting {group} on {topic}", len(brokers)) as advance:
        resets = admin.reset_offset_by_time(topic, group, ts, force, on_broker=lambda name: advance())
    return resets


@command("resetOffsetByTime", "Move a group's offsets on a topic to a time (live members follow; offline groups too)",
         _G, arg("-t", "--topic", required=True, help="topic"),
         arg("-s", "--timestamp", required=True, type=parse_timestamp,
             help="'now', epoch ms, or yyyy-MM-dd#HH:mm:ss:SSS"),
         arg("-f", "--force", type=parse_bool, default=True, help="also move forward (default true)"),
         arg("-c", "--cplus", type=parse_bool, default=False, help="(mqadmin compatibility; ignored)"))
def reset_offset_by_time(admin, args, out):
    resets = _reset(admin, out, args.topic, args.groupName, args.timestamp, args.force)
    _print_reset(out, resets, f"rollback consumer offset by specified consumerGroup[{args.groupName}], topic[{args.topic}], "
                 f"force[{args.force}], timestamp(string)[{fmt_time(args.timestamp)}], timestamp(long)[{args.timestamp}]")


@command("skipAccumulatedMessage", "Move a group's offsets on a topic to the end (skip the backlog)", _G,
         arg("-t", "--topic", required=True, help="topic"), arg("-c", "--cluster", help="(mqadmin compatibility)"),
         arg("-f", "--force", type=parse_bool, default=True, help="(default true)"))
def skip_accumulated(admin, args, out):
    resets = _reset(admin, out, args.topic, args.groupName, -1, args.force)
    _print_reset(out, resets, f"skip accumulated messages of consumerGroup[{args.groupName}], topic[{args.topic}]")


@command("cloneGroupOffset", "Copy one group's offsets on a topic to another group",
         arg("-s", "--srcGroup", required=True, help="source group"), arg("-d", "--destGroup", required=True, help="destination group"),
         arg("-t", "--topic", required=True, help="topic"),
         arg("-o", "--offline", type=parse_bool, default=False,
             help="the source group is offline: clone even when it is online without a subscription to the topic"))
def clone_group_offset(admin, args, out):
    src = admin.consume_stats(args.srcGroup, args.topic)  # an unknown source group is an error
    if not any(q.topic == args.topic for q in src.queues):
        raise UsageError(f"group {args.srcGroup!r} has no offsets on topic {args.topic!r}")
    addrs = admin.clone_group_offset(args.srcGroup, args.destGroup, args.topic, args.offline)
    out.message(f"clone group offset success. srcGroup[{args.srcGroup}], destGroup=[{args.destGroup}], topic[{args.topic}]")
    dest = admin.consume_stats(args.destGroup, args.topic)
    out.table(["Topic", "Broker Name", "QID", "Consumer Offset"],
              [(q.topic, q.broker_name, q.queue_id, q.consumer_offset) for q in dest.queues if q.topic == args.topic])
    return 0 if addrs else 1



@command("getConsumerStatus", "Each online consumer's own offsets of a topic (what it holds in memory), asked through the broker",
         _G, arg("-t", "--topic", required=True, help="topic"),
         arg("-i", "--originClientId", help="only this client (its client id or address)"))
def get_consumer_status(admin, args, out):
    status = admin.consumer_status(args.topic, args.groupName, args.originClientId)
    out.message(f"get consumer status from client. group={args.groupName}, topic={args.topic}, "
                f"originClientId={args.originClientId or ''}")
    out.table(["Client ID", "Broker Name", "QID", "Offset"],
              [(cid, mq.broker_name, mq.queue_id, off) for cid, table in sorted(status.items())
               for mq, off in sorted(table.items())])


# analyzeSubscription's and analyzeProcessQueue's thresholds (ConsumerRunningInfo): members started
# less than two minutes ago may still be rolling out a new subscription; a queue with cached
# messages not consumed for a minute may be blocked
SETTLE_MS = 120_000
BLOCKED_MS = 60_000


def running_info_findings(infos: dict, now_ms: int, settle_ms: int = SETTLE_MS) -> list[tuple[str, str]]:
    """RocketMQ's ConsumerRunningInfo.analyzeSubscription and analyzeProcessQueue over one group's
    members' running info (client id -> info): [(client id, what is wrong)], nothing when all is well."""
    out = []
    push = [(cid, i) for cid, i in sorted(infos.items())
            if (i.get("properties") or {}).get("PROP_CONSUME_TYPE", i.get("properties", {}).get("consumeType"))
            == "CONSUME_PASSIVELY"]
    settled = [(cid, i) for cid, i in push
               if now_ms - int((i.get("properties") or {}).get("PROP_CONSUMER_START_TIMESTAMP") or now_ms) > settle_ms]
    subs = {cid: frozenset((s.get("topic"), s.get("subString")) for s in i.get("subscriptionSet") or [])
            for cid, i in settled}
    if len(set(subs.values())) > 1:
        for cid, sub in subs.items():
            out.append((cid, "Subscription differs in the same group of consumer: "
                        + ", ".join(f"{t}({e})" for t, e in sorted(sub))))
    out += [(cid, "Subscription empty") for cid, sub in subs.items() if not sub]
    for cid, info in push:
        orderly = (info.get("properties") or {}).get("PROP_CONSUMEORDERLY") == "true"
        for q in sorted(info.get("mqTable") or [], key=lambda q: (q["topic"], q["brokerName"], q["queueId"])):
            where = f"{q['topic']}@{q['brokerName']}:{q['queueId']}"
            if orderly and not q.get("locked"):
                out.append((cid, f"{where} can't lock for a while, {now_ms - int(q.get('lastLockTimestamp') or 0)}ms"))
            elif orderly and q.get("droped") and int(q.get("tryUnlockTimes") or 0) > 0:
                out.append((cid, f"{where} unlock {q['tryUnlockTimes']} times, still failed"))
            elif not orderly and int(q.get("cachedMsgCount") or 0) > 0 and q.get("lastConsumeTimestamp") \
                    and now_ms - int(q["lastConsumeTimestamp"]) > BLOCKED_MS:
                out.append((cid, f"{where} can't consume for a while, maybe blocked, "
                                 f"{now_ms - int(q['lastConsumeTimestamp'])}ms"))
    return out


@command("startMonitoring", "Watch every consumer group round after round as RocketMQ's MonitorService does: "
         "undone messages, failed consumption, each member's throughput and what its running info shows wrong",
         arg("--rounds", type=int, default=0, help="stop after this many rounds (default 0: run until interrupted)"),
         arg("--interval", type=float, default=20.0, help="seconds between rounds (default 20, as MonitorService)"),
         arg("--settle", type=float, default=SETTLE_MS / 1000,
             help="seconds a member must have run before its subscription is compared with the others' (default 120)"))
def start_monitoring(admin, args, out):
    if args.rounds < 0:
        raise UsageError(f"bad --rounds {args.rounds}: must be >= 0")
    if args.interval <= 0:
        raise UsageError(f"bad --interval {args.interval}: must be > 0")
    if args.settle < 0:
        raise UsageError(f"bad --settle {args.settle}: must be >= 0")
    if out.as_json and not args.rounds:
        raise UsageError("--json prints when the rounds end: give --rounds N")

    def report(kind: str, columns: list, rows: list, round_no: int) -> None:
        # (one JSON array holds every report's rows: "report" tells them apart)
        if out.as_json:
            columns, rows = ["Report", *columns], [(kind, *r) for r in rows]
        out.table(columns, rows, title=None if out.as_json else f"[{kind}] round {round_no}")

    done = 0
    while True:
        begin = time.time()
        now = int(begin * 1000)
        undone, failed, throughput, findings = [], [], [], []
        for group in admin.consumer_groups():
            try:
                stats = admin.consume_stats(group)
            except RMQError:  # (a group without offsets yet)
                stats = None
            by_topic: dict[str, list] = {}
            for q in stats.queues if stats is not None else ():
                if not q.topic.startswith(MixAll.RETRY_GROUP_TOPIC_PREFIX):
                    by_topic.setdefault(q.topic, []).append(q)
            for topic, queues in sorted(by_topic.items()):
                behind = [q for q in queues if q.diff > 0]
                oldest = min((q.last_timestamp for q in behind if q.last_timestamp > 0), default=0)
                undone.append((fmt_time(now), group, topic, sum(q.diff for q in queues),
                               max((q.diff for q in queues), default=0), now - oldest if oldest else 0))
            # reportConsumerRunningInfo: each live member's running info (none: the group is offline)
            infos = {}
            try:
                members = admin.consumer_connection(group).connections
            except RMQError:
                members = ()
            for c in members:
                try:
                    infos[c.client_id] = admin.consumer_running_info(group, c.client_id)
                except RMQError:
                    continue
            for cid, info in sorted(infos.items()):
                for topic, st in sorted((info.get("statusTable") or {}).items()):
                    failed.append((group, topic, cid, float(st.get("consumeFailedTPS", 0)),
                                   int(st.get("consumeFailedMsgs", 0))))
                    throughput.append((group, topic, cid, float(st.get("pullTPS", 0)), float(st.get("pullRT", 0)),
                                       float(st.get("consumeOKTPS", 0)), float(st.get("consumeFailedTPS", 0)),
                                       float(st.get("consumeRT", 0))))
            findings += [(group, cid, what) for cid, what in running_info_findings(infos, now, int(args.settle * 1000))]
        round_no = done + 1
        report("UNDONE_MSG", ["Time", "Consumer Group", "Topic", "Undone Msgs", "Undone Single MQ", "Undone Delay(ms)"],
               undone, round_no)
        report("FAILED_MSG", ["Consumer Group", "Topic", "Client Id", "Failed TPS", "Failed Msgs (last hour)"],
               [r for r in failed if r[4] > 0 or r[3] > 0], round_no)
        report("CONSUME_STATS", ["Consumer Group", "Topic", "Client Id", "Pull TPS", "Pull RT(ms)", "OK TPS", "Failed TPS",
                                 "Consume RT(ms)"],
               throughput, round_no)
        report("RUNNING_INFO", ["Consumer Group", "Client Id", "Finding"], findings, round_no)
        done += 1
        if args.rounds and done >= args.rounds:
            return
        time.sleep(max(0.0, args.interval - (time.time() - begin)))
