"""Dead letters: `dlq list -g G` browses %DLQ%<group>, `dlq resend -g G [-i id ...]` sends dead
letters back to the group (through %RETRY%<group>, so only that group sees them again), and
`dlq skip` unblocks a queue stalled by a poison message (it moves to the dead-letter queue)."""
from __future__ import annotations

from rmq_core.admin.commands import UsageError, arg, command
from rmq_core.admin.output import body_preview, fmt_time

_G = arg("-g", "--groupName", required=True, help="consumer group")


@command("dlq list", "The dead letters of a consumer group", _G,
         arg("-c", "--charset", default="utf-8", help="body charset"))
def dlq_list(admin, args, out):
    with out.progress(f"reading %DLQ%{args.groupName}", None) as advance:
        msgs = admin.dlq_messages(args.groupName, on_progress=lambda done, total: advance(completed=done, total=total))
    out.table(["Message ID", "Original Topic", "Broker Name", "QID", "Offset", "Reconsume Times", "Store Time", "Body"],
              [(m.msg_id, m.properties.get("RETRY_TOPIC", ""), m.broker_name or "", m.queue_id, m.queue_offset,
                m.reconsume_times, fmt_time(m.store_timestamp), body_preview(m.body, args.charset)) for m in msgs],
              footer=["", f"{len(msgs)} dead letters"])


@command("dlq resend", "Send dead letters back to their group (all, or the ids given with -i)", _G,
         arg("-i", "--msgId", nargs="+", default=None, help="message ids (unique or offset ids); all when left out"))
def dlq_resend(admin, args, out):
    ids = [i for a in (args.msgId or []) for i in a.split(",") if i.strip()]
    with out.progress(f"resending %DLQ%{args.groupName}", None) as advance:
        sent = admin.dlq_resend(args.groupName, ids or None,
                                on_progress=lambda done, total: advance(completed=done, total=total))
    out.table(["Message ID", "Topic", "Broker Name", "QID", "Queue Offset", "Send Result"],
              [(s.msg_id, f"%RETRY%{args.groupName}", s.broker_name, s.queue_id, s.queue_offset, s.status) for s in sent],
              footer=["", f"{len(sent)} dead letters resent to group {args.groupName}"])


@command("dlq skip", "Skip a poison message stalling a queue: it moves to the dead-letter queue, the group goes past it",
         _G, arg("-t", "--topic", required=True, help="topic"),
         arg("-b", "--brokerName", required=True, help="broker name"),
         arg("-i", "--queueId", type=int, required=True, help="queue id"),
         arg("-o", "--offset", type=int, default=None, help="the message's offset (default: the group's offset of the queue)"))
def dlq_skip(admin, args, out):
    if args.queueId < 0:
        raise UsageError(f"bad queue id {args.queueId}")
    reset, copied = admin.skip_message(args.groupName, args.topic, args.brokerName, args.queueId, args.offset)
    out.table(["Topic", "Broker Name", "QID", "Skipped Offset", "New Offset", "Message ID", "Dead Letter Offset"],
              [(reset.topic, reset.broker_name, reset.queue_id, reset.offset - 1, reset.offset,
                copied.msg_id if copied else "", copied.queue_offset if copied else "")])
