"""Message commands: queryMsgById, queryMsgByKey, queryMsgByUniqueKey, queryMsgByOffset, printMsg,
printMsgByQueue, sendMessage, consumeMessage, queryMsgTraceById.  A message's id is the producer's unique id
(UNIQ_KEY) where it has one, else the offset id, as mqadmin prints it."""
from __future__ import annotations

import argparse
import re

from rmq_core.admin.commands import UsageError, arg, command, parse_bool, parse_timestamp
from rmq_core.admin.output import Shown, body_preview, fmt_time
from rmq_core.message import MessageQueue, TopicValidator

_T = arg("-t", "--topic", required=True, help="topic")
LIST_COLUMNS = ["Message ID", "Broker Name", "QID", "Offset", "Store Time", "Tags", "Keys", "Body"]


def message_fields(m, charset: str = "utf-8", body_limit: int | None = 2000) -> list[tuple[str, object]]:
    """A message as mqadmin's printMsg lays it out (with its body, decoded, instead of a file path)."""
    return [("Message ID", m.msg_id), ("OffsetID", m.offset_msg_id), ("Topic", m.topic), ("Tags", m.tags or ""),
            ("Keys", m.keys or ""), ("Broker Name", m.broker_name or ""), ("Queue ID", m.queue_id),
            ("Queue Offset", m.queue_offset), ("CommitLog Offset", m.commit_log_offset),
            ("Reconsume Times", m.reconsume_times), ("Born Timestamp", fmt_time(m.born_timestamp)),
            ("Store Timestamp", fmt_time(m.store_timestamp)), ("Born Host", m.born_host), ("Store Host", m.store_host),
            ("System Flag", m.sys_flag), ("Properties", dict(m.properties)),
            ("Body", body_preview(m.body, charset, body_limit))]


def list_row(m, charset: str = "utf-8", print_body: bool = True) -> tuple:
    return (m.msg_id, m.broker_name or "", m.queue_id, m.queue_offset, fmt_time(m.store_timestamp), m.tags or "",
            m.keys or "", body_preview(m.body, charset) if print_body else "")


def _show(admin, out, msgs, charset="utf-8", track=True):
    for m in msgs:
        out.record(message_fields(m, charset))
        if track and not out.as_json:
            tracks = admin.message_track(m)
            if tracks:
                out.table(["Consumer Group", "Track Type"], tracks)
            else:
                out.message("WARN: No Consumer")


_DIRECT = (arg("-g", "--consumerGroup", help="hand the message to a live consumer of this group for its listener "
                "(CONSUME_MESSAGE_DIRECTLY) and show its ConsumeMessageDirectlyResult"),
           arg("-d", "--clientId", help="with -g: that consumer's client id (consumerConnection lists them; "
                                        "default: the group's first)"))


def _consume_directly(admin, args, out, ids) -> bool:
    """-g [-d]: each message handed to a live consumer of the group (as mqadmin's pushMsg); False
    when not asked."""
    if args.consumerGroup is None:
        if args.clientId is not None:
            raise UsageError(f"-d {args.clientId!r} needs the consumer group (-g)")
        return False
    rows = []
    for i in ids:
        r = admin.consume_message_directly(args.consumerGroup, args.clientId, i, args.topic)
        rows.append((i, args.consumerGroup, r["clientId"], r.get("consumeResult"), r.get("spentTimeMills"),
                     bool(r.get("order")), bool(r.get("autoCommit")), (r.get("remark") or "").strip()))
    out.table(["Message ID", "Consumer Group", "Client ID", "Consume Result", "Spent Time(ms)", "Order",
               "Auto Commit", "Remark"], rows)
    return True


@command("queryMsgById", "Show messages by id: an offset id (store host + commit-log offset) or, with -t, a unique id",
         arg("-i", "--msgId", required=True, help="message id(s), comma separated"),
         arg("-t", "--topic", help="topic (needed to look a unique id up)"),
         arg("-c", "--charset", default="utf-8", help="body charset (default utf-8)"), *_DIRECT)
def query_msg_by_id(admin, args, out):
    ids = [i.strip() for i in args.msgId.split(",") if i.strip()]
    if not ids:
        raise UsageError(f"bad -i {args.msgId!r}: no message id")
    if not _consume_directly(admin, args, out, ids):
        _show(admin, out, [admin.view_message(i, args.topic) for i in ids], args.charset)


@command("queryMsgByUniqueKey", "Show a message by the producer's unique id (UNIQ_KEY); with -g, hand it to a live "
         "consumer of the group", arg("-i", "--msgId", required=True, help="unique id"), _T,
         arg("-c", "--charset", default="utf-8", help="body charset"), *_DIRECT)
def query_msg_by_unique_key(admin, args, out):
    if not _consume_directly(admin, args, out, [args.msgId]):
        _show(admin, out, [admin.query_message_by_unique_key(args.topic, args.msgId)], args.charset)


@command("queryMsgByKey", "Find messages of a topic by key (the index)", _T,
         arg("-k", "--msgKey", required=True, help="message key"),
         arg("-b", "--beginTimestamp", type=parse_timestamp, default=0, help="from (epoch ms / 'now' / yyyy-MM-dd#HH:mm:ss:SSS)"),
         arg("-e", "--endTimestamp", type=parse_timestamp, default=None, help="until (default: now)"),
         arg("-c", "--maxNum", type=int, default=64, help="at most this many (default 64)"))
def query_msg_by_key(admin, args, out):
    admin.topic_route(args.topic)
    msgs = admin.query_messages(args.topic, args.msgKey, args.maxNum, args.beginTimestamp, args.endTimestamp)
    if not msgs:
        raise UsageError(f"no message with key {args.msgKey!r} in topic {args.topic!r}")
    out.table(["Message ID", "Broker Name", "QID", "Offset", "Store Time"],
              [(m.msg_id, m.broker_name or "", m.queue_id, m.queue_offset, fmt_time(m.store_timestamp)) for m in msgs])


@command("queryMsgByOffset", "Show the message at an offset of a queue", _T,
         arg("-b", "--brokerName", required=True, help="broker name"),
         arg("-i", "--queueId", type=int, required=True, help="queue id"),
         arg("-o", "--offset", type=int, required=True, help="queue offset"),
         arg("-c", "--charset", default="utf-8", help="body charset"))
def query_msg_by_offset(admin, args, out):
    admin.broker_addr(args.brokerName)
    _show(admin, out, [admin.message_by_offset(args.topic, args.brokerName, args.queueId, args.offset)], args.charset)


def _print_queues(admin, out, mqs, *, begin_ts, end_ts, sub, charset, print_body, group, limit=None, title="printMsg"):
    """Every message of the queues between two store times (by offset search), with progress."""
    spans = []
    for mq in mqs:
        addr = admin.broker_addr(mq.broker_name)
        lo = admin.search_offset(addr, mq.topic, mq.queue_id, begin_ts) if begin_ts else admin.min_offset(addr, mq.topic, mq.queue_id)
        hi = admin.search_offset(addr, mq.topic, mq.queue_id, end_ts) if end_ts else admin.max_offset(addr, mq.topic, mq.queue_id)
        spans.append((mq, lo, max(lo, hi)))
    total = sum(hi - lo for _, lo, hi in spans)
    if limit is not None:
        total = min(total, limit)
    rows = []
    with out.progress(title, total) as advance:
        for mq, lo, hi in spans:
            for m in admin.iter_messages(mq, lo, hi, sub_expression=sub, group=group):
                if end_ts and m.store_timestamp > end_ts:
                    break
                rows.append(list_row(m, charset, print_body))
                advance()
                if limit is not None and len(rows) >= limit:
                    break
            if limit is not None and len(rows) >= limit:
                break
    out.table(LIST_COLUMNS, rows, footer=["", f"{len(rows)} messages"])


@command("printMsg", "Print the messages of every queue of a topic (optionally between two times)", _T,
         arg("-c", "--charset", default="utf-8", help="body charset"),
         arg("-s", "--subExpression", default="*", help="tag expression (default *)"),
         arg("-b", "--beginTimestamp", type=parse_timestamp, default=None, help="from this store time"),
         arg("-e", "--endTimestamp", type=parse_timestamp, default=None, help="until this store time"),
         arg("-d", "--printBody", type=parse_bool, default=True, help="print bodies (default true)"))
def print_msg(admin, args, out):
    mqs = admin.queues(args.topic)
    _print_queues(admin, out, mqs, begin_ts=args.beginTimestamp, end_ts=args.endTimestamp, sub=args.subExpression,
                  charset=args.charset, print_body=args.printBody, group="TOOLS_CONSUMER")


@command("printMsgByQueue", "Print the messages of one queue", _T,
         arg("-a", "--brokerName", required=True, help="broker name"),
         arg("-i", "--queueId", type=int, required=True, help="queue id"),
         arg("-c", "--charset", default="utf-8", help="body charset"),
         arg("-s", "--subExpression", default="*", help="tag expression"),
         arg("-b", "--beginTimestamp", type=parse_timestamp, default=None, help="from this store time"),
         arg("-e", "--endTimestamp", type=parse_timestamp, default=None, help="until this store time"),
         arg("-p", "--print", dest="printMsg", type=parse_bool, default=True, help="print the messages (default true)"),
         arg("-d", "--printBody", type=parse_bool, default=True, help="print bodies (default true)"),
         arg("-f", "--calculate", type=parse_bool, default=False, help="count messages per tag"))
def print_msg_by_queue(admin, args, out):
    _check_queue(admin, args.topic, args.brokerName, args.queueId)
    mq = MessageQueue(args.topic, args.brokerName, args.queueId)
    if args.calculate:
        addr = admin.broker_addr(args.brokerName)
        lo = admin.search_offset(addr, args.topic, args.queueId, args.beginTimestamp) if args.beginTimestamp \
            else admin.min_offset(addr, args.topic, args.queueId)
        hi = admin.max_offset(addr, args.topic, args.queueId)
        counts = {}
        with out.progress("printMsgByQueue", hi - lo) as advance:
            for m in admin.iter_messages(mq, lo, hi, sub_expression=args.subExpression):
                if args.endTimestamp and m.store_timestamp > args.endTimestamp:
                    break
                counts[m.tags or ""] = counts.get(m.tags or "", 0) + 1
                advance()
        out.table(["Tag", "Count"], sorted(counts.items(), key=lambda kv: -kv[1]))
        return
    _print_queues(admin, out, [mq], begin_ts=args.beginTimestamp, end_ts=args.endTimestamp, sub=args.subExpression,
                  charset=args.charset, print_body=args.printBody, group="TOOLS_CONSUMER", title="printMsgByQueue")


def _check_queue(admin, topic, broker_name, queue_id):
    admin.broker_addr(broker_name)
    if MessageQueue(topic, broker_name, queue_id) not in set(admin.queues(topic)):
        raise UsageError(f"topic {topic!r} has no readable queue {queue_id} on broker {broker_name!r}")


@command("sendMessage", "Send one message", _T, arg("-p", "--body", required=True, help="message body (UTF-8)"),
         arg("-k", "--key", help="keys"), arg("-c", "--tags", help="tags"),
         arg("-b", "--broker", help="broker name (with -i: that queue)"), arg("-i", "--qid", type=int, help="queue id"),
         arg("-m", "--msgTraceEnable", type=parse_bool, default=False, help="(mqadmin compatibility; ignored)"))
def send_message(admin, args, out):
    admin.topic_route(args.topic)
    r = admin.send_message(args.topic, args.body.encode("utf-8"), tags=args.tags, keys=args.key,
                           broker_name=args.broker, queue_id=args.qid)
    out.table(["Broker Name", "QID", "Send Result", "MsgId"], [(r.broker_name, r.queue_id, r.status, r.msg_id)])


def _queue_id(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad queue id {value!r} (consumeMessage's -i is a queue id, as mqadmin's); to hand a message to a live "
            f"consumer: queryMsgByUniqueKey -i MSG_ID -t TOPIC -g GROUP [-d CLIENT_ID]") from None


@command("consumeMessage", "Pull and print messages of a topic (a queue with -b/-i, from -o) as a group would",
         _T, arg("-b", "--brokerName", help="broker name"), arg("-i", "--queueId", type=_queue_id, help="queue id"),
         arg("-o", "--offset", type=int, help="start offset (with -b and -i)"),
         arg("-g", "--consumerGroup", default="TOOLS_CONSUMER", help="group to pull as (default TOOLS_CONSUMER)"),
         arg("-s", "--beginTimestamp", type=parse_timestamp, default=None, help="from this store time"),
         arg("-e", "--endTimestamp", type=parse_timestamp, default=None, help="until this store time"),
         arg("-c", "--MessageNumber", dest="count", type=int, default=128, help="at most this many (default 128)"))
def consume_message(admin, args, out):
    if args.count <= 0:
        raise UsageError(f"bad -c {args.count}: must be > 0")
    if (args.brokerName is None) != (args.queueId is None):
        raise UsageError("give both the broker name (-b) and the queue id (-i), or neither")
    if args.brokerName is not None:
        _check_queue(admin, args.topic, args.brokerName, args.queueId)
        mqs = [MessageQueue(args.topic, args.brokerName, args.queueId)]
    else:
        if args.offset is not None:
            raise UsageError("-o OFFSET needs a queue: give -b BROKER_NAME and -i QUEUE_ID")
        mqs = admin.queues(args.topic)
    if args.offset is not None:
        mq = mqs[0]
        addr = admin.broker_addr(mq.broker_name)
        hi = admin.max_offset(addr, mq.topic, mq.queue_id)
        rows = []
        with out.progress("consumeMessage", min(args.count, max(0, hi - args.offset))) as advance:
            for m in admin.iter_messages(mq, args.offset, hi, group=args.consumerGroup):
                rows.append(list_row(m))
                advance()
                if len(rows) >= args.count:
                    break
        out.table(LIST_COLUMNS, rows, footer=["", f"Consume ok: {len(rows)} messages"])
        return
    _print_queues(admin, out, mqs, begin_ts=args.beginTimestamp, end_ts=args.endTimestamp, sub="*", charset="utf-8",
                  print_body=True, group=args.consumerGroup, limit=args.count, title="consumeMessage")



TRACE_COLUMNS = ["Type", "Group", "Client Host", "Time", "Cost Times", "Status", "Store Host", "Topic", "Tags",
                 "Keys"]


def trace_rows(views) -> list[tuple]:
    return [(v.type, v.group, v.client_host, fmt_time(v.timestamp), Shown(v.cost_time, f"{v.cost_time}ms"), v.status,
             v.store_host if v.type == "Pub" else "", v.topic, v.tags, v.keys) for v in views]


@command("queryMsgTraceById", "Show a message's trace: who sent it, where, when, and which groups consumed it",
         arg("-i", "--msgId", required=True, help="message id (the producer's unique id)"),
         arg("-t", "--traceTopic", default=None, help="trace topic (default RMQ_SYS_TRACE_TOPIC)"))
def query_msg_trace_by_id(admin, args, out):
    msg_id = args.msgId.strip()
    if not re.fullmatch(r"[0-9A-Fa-f]{32,}", msg_id):
        raise UsageError(f"bad -i {args.msgId!r}: a message id is 32 or more hex digits")
    topic = (args.traceTopic or "").strip() or TopicValidator.RMQ_SYS_TRACE_TOPIC
    TopicValidator.check_topic(topic)
    admin.topic_route(topic)  # (names a trace topic the name server does not know)
    views = admin.message_trace(msg_id, topic)
    out.table(TRACE_COLUMNS, trace_rows(views), json_rows=[v.to_json() for v in views])  # RocketMQ's TraceView
    if not views:
        out.message(f"no trace of message {msg_id} in {topic}")


@command("checkMsgSendRT", "Send messages one at a time over a topic's queues and show each send's round trip",
         _T, arg("-a", "--amount", type=int, default=100, help="how many messages (default 100)"),
         arg("-s", "--size", type=int, default=128, help="message size in bytes (default 128)"))
def check_msg_send_rt(admin, args, out):
    if args.amount < 2:
        raise UsageError(f"bad -a {args.amount}: send at least 2 messages (the first one is not averaged)")
    if not 1 <= args.size <= 4 * 1024 * 1024:
        raise UsageError(f"bad -s {args.size}: a message size is 1..4194304 bytes")
    admin.topic_route(args.topic)  # (names a topic the name server does not know)
    with out.progress("checkMsgSendRT", args.amount) as advance:
        sends = admin.send_rt(args.topic, args.amount, args.size, on_progress=lambda n: advance(completed=n))
    # the first send (a connection, a route) is left out of the average, as mqadmin does
    avg = sum(rt for *_, rt, _ in sends[1:]) / (len(sends) - 1)
    out.table(["Topic", "Broker Name", "QID", "Send Result", "RT(ms)"],
              [(args.topic, b, q, ok, round(rt, 2)) for b, q, ok, rt, _ in sends],
              footer=[f"Avg RT: {avg:.2f}"])
