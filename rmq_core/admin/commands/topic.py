"""Topic commands: updateTopic, deleteTopic, topicList, topicRoute, topicStatus, topicClusterList,
updateTopicPerm, allocateMQ, cleanExpiredCQ, cleanUnusedTopic."""
from __future__ import annotations

from rmq_core.admin.commands import UsageError, arg, broker_targets, command, parse_bool
from rmq_core.admin.output import fmt_time
from rmq_core.broker.message_type import parse_attributes
from rmq_core.errors import IllegalArgumentError, RMQError
from rmq_core.message import MixAll

_T = arg("-t", "--topic", required=True, help="topic name")
_B = arg("-b", "--brokerAddr", help="broker address host:port")
_C = arg("-c", "--clusterName", help="cluster name")


@command("updateTopic", "Update or create a topic on a broker (-b) or on every master of a cluster (-c)",
         _T, _B, _C,
         arg("-r", "--readQueueNums", type=int, default=8, help="read queue count (default 8)"),
         arg("-w", "--writeQueueNums", type=int, default=8, help="write queue count (default 8)"),
         arg("-p", "--perm", type=int, default=6, help="2 write only, 4 read only, 6 read and write (default 6)"),
         arg("-o", "--order", type=parse_bool, default=False, help="ordered topic: true/false"),
         arg("-u", "--unit", type=parse_bool, default=False, help="unit topic (kept for mqadmin compatibility)"),
         arg("-s", "--hasUnitSub", type=parse_bool, default=False, help="has unit subscription (mqadmin compatibility)"),
         arg("-a", "--attributes", help="RocketMQ 5 topic attributes, '+name=value,-name': "
                                        "+message.type=NORMAL|FIFO|DELAY|TRANSACTION|MIXED restricts what it accepts"))
def update_topic(admin, args, out):
    if args.perm not in (2, 4, 6):
        raise UsageError(f"bad perm {args.perm}: 2 (write only), 4 (read only) or 6 (read and write)")
    if args.readQueueNums <= 0 or args.writeQueueNums <= 0:
        raise UsageError(f"bad queue counts -r {args.readQueueNums} -w {args.writeQueueNums}: both must be > 0")
    sys_flag = (1 if args.unit else 0) | (2 if args.hasUnitSub else 0)
    if args.attributes:
        try:
            parse_attributes(args.attributes)  # a bad item is named before any broker is asked
        except IllegalArgumentError as e:
            raise UsageError(str(e)) from None
    addrs = broker_targets(admin, args)
    rows = []
    for addr in addrs:
        admin.create_or_update_topic(addr, args.topic, read_queue_nums=args.readQueueNums,
                                     write_queue_nums=args.writeQueueNums, perm=args.perm, order=args.order,
                                     topic_sys_flag=sys_flag, attributes=args.attributes)
        out.message(f"create topic to {addr} success.")
        rows.append((addr, args.topic, args.readQueueNums, args.writeQueueNums, args.perm, args.order))
    if args.order and args.clusterName:
        # ordered topic over a cluster: the name server keeps "brokerName:queues;..." (as mqadmin does)
        names = sorted({b.broker_name for b in admin.brokers(args.clusterName)})
        conf = ";".join(f"{n}:{args.writeQueueNums}" for n in names)
        admin.put_kv_config("ORDER_TOPIC_CONFIG", args.topic, conf)
        out.message(f"set cluster orderConf. isOrder={args.order}, orderConf=[{conf}]")
    out.table(["Broker Addr", "Topic", "Read Queues", "Write Queues", "Perm", "Order"], rows)


@command("deleteTopic", "Delete a topic from a cluster's brokers and from the name servers", _T,
         arg("-c", "--clusterName", required=True, help="cluster name"))
def delete_topic(admin, args, out):
    admin.topic_route(args.topic)  # an unknown topic is an error, not a silent no-op
    addrs = admin.delete_topic(args.topic, args.clusterName)
    out.message(f"delete topic [{args.topic}] from cluster [{args.clusterName}] success.")
    out.message(f"delete topic [{args.topic}] from NameServer success.")
    out.table(["Cluster Name", "Topic", "Broker Addr"], [(args.clusterName, args.topic, a) for a in addrs])


@command("topicList", "List the topics in the name server (with -c: per cluster, with the groups that consume each)",
         arg("-c", "--clusterModel", action="store_true", help="print cluster and consumer groups too"))
def topic_list(admin, args, out):
    if not args.clusterModel:
        out.table(["Topic"], [(t,) for t in admin.topic_list()])
        return
    rows = []
    for cluster in sorted({b.cluster for b in admin.brokers()}):
        for t in admin.topics_by_cluster(cluster):
            if MixAll.is_retry_topic(t) or MixAll.is_dlq_topic(t):
                continue
            try:
                groups = admin.topic_consumed_by(t)
            except RMQError:
                groups = []
            for g in groups or [""]:
                rows.append((cluster, t, g))
    out.table(["Cluster Name", "Topic", "Consumer Group"], rows)


@command("topicRoute", "Print a topic's route: its brokers and queue counts", _T)
def topic_route(admin, args, out):
    route = admin.topic_route(args.topic)
    by_name = {b.broker_name: b for b in route.broker_datas}
    rows = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        bd = by_name.get(qd.broker_name)
        addrs = ", ".join(f"{i}:{a}" for i, a in sorted(bd.broker_addrs.items())) if bd else ""
        rows.append((bd.cluster if bd else "", qd.broker_name, addrs, qd.read_queue_nums, qd.write_queue_nums, qd.perm))
    out.table(["Cluster Name", "Broker Name", "Broker Addrs", "Read Queue", "Write Queue", "Perm"], rows,
              footer=[f"orderTopicConf: {route.order_topic_conf}"] if route.order_topic_conf else ())


@command("topicStatus", "Each queue of a topic: min and max offsets and when it was last written", _T,
         arg("-c", "--cluster", help="only the brokers of this cluster"))
def topic_status(admin, args, out):
    rows = admin.topic_stats(args.topic)
    if args.cluster:
        names = {b.broker_name for b in admin.brokers(args.cluster)}
        rows = [r for r in rows if r.broker_name in names]
    out.table(["Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"],
              [(r.broker_name, r.queue_id, r.min_offset, r.max_offset, fmt_time(r.last_update_timestamp)) for r in rows])


@command("topicClusterList", "The clusters a topic lives in", _T)
def topic_cluster_list(admin, args, out):
    out.table(["Cluster Name"], [(c,) for c in admin.topic_clusters(args.topic)])


@command("updateTopicPerm", "Change a topic's permission on a broker (-b) or a cluster's brokers (-c)", _T, _B, _C,
         arg("-p", "--perm", type=int, required=True, help="2 write only, 4 read only, 6 read and write"))
def update_topic_perm(admin, args, out):
    if not args.brokerAddr and not args.clusterName:
        raise UsageError("give a broker address (-b HOST:PORT) or a cluster name (-c CLUSTER)")
    changed = admin.update_topic_perm(args.topic, args.perm, addr=args.brokerAddr, cluster=args.clusterName)
    rows = []
    for addr, old in changed:
        out.message(f"update topic perm from {old} to {args.perm} in {addr} success.")
        rows.append((addr, args.topic, old, args.perm))
    out.table(["Broker Addr", "Topic", "Old Perm", "New Perm"], rows)


@command("allocateMQ", "Which queues each client would get (AllocateMessageQueueAveragely)", _T,
         arg("-i", "--ipList", required=True, help="client ids, comma separated (e.g. 10.0.0.1@1,10.0.0.2@1)"),
         arg("--strategy", default="averagely", help="allocate strategy plugin (default averagely)"))
def allocate_mq(admin, args, out):
    cids = [c.strip() for c in args.ipList.split(",") if c.strip()]
    if not cids:
        raise UsageError(f"bad -i {args.ipList!r}: expected comma separated client ids")
    result = admin.allocate(args.topic, cids, args.strategy)
    out.table(["Client ID", "Broker Name", "QID"],
              [(cid, mq.broker_name, mq.queue_id) for cid, mqs in result.items() for mq in mqs])


@command("cleanExpiredCQ", "Destroy consume queues whose messages the commit log no longer holds, on a broker (-b) "
         "or a cluster's masters (-c)",
         _B, _C)
def clean_expired_cq(admin, args, out):
    _clean(admin, args, out, "cleanExpiredCQ", "consume queue(s)", "Queues",
           lambda addr: [f"{t}/{q}" for t, q in admin.clean_expired_consume_queues(addr)])


@command("cleanUnusedTopic", "Delete the consume queues of topics a broker has no config for, on a broker (-b) or a "
         "cluster's masters (-c)",
         _B, _C)
def clean_unused_topic(admin, args, out):
    _clean(admin, args, out, "cleanUnusedTopic", "topic(s)", "Topics", admin.clean_unused_topics)


def _clean(admin, args, out, name: str, what: str, column: str, clean) -> None:
    """A store clean-up on each target broker: clean(addr) -> the names of what it removed."""
    rows = []
    for addr in broker_targets(admin, args):
        removed = clean(addr)
        rows.append((addr, len(removed), ", ".join(removed)))
    out.message(f"{name}: {sum(r[1] for r in rows)} {what} removed")
    out.table(["Broker Addr", "Removed", column], rows)
