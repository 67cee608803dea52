"""The admin calls of dead letters: list a group's DLQ, resend from it, skip a message."""
from __future__ import annotations

from typing import Callable, Iterable

from rmq_core.admin.calls.message import MessageCalls
from rmq_core.admin.values import AdminError, OffsetReset, SendOutcome
from rmq_core.message import MessageQueue, MixAll


class DlqCalls(MessageCalls):
    """Dead letters' calls."""

    # --- dead letters --------------------------------------------------------------------------------------
    def dlq_messages(self, group: str, *, on_progress: Callable[[int, int], None] | None = None) -> list:
        """Every message in the group's dead-letter topic %DLQ%<group>, oldest first."""
        topic = MixAll.get_dlq_topic(group)
        spans = []
        # (asked of the brokers, not the route: a dead-letter topic is made on the fly and reaches
        # the name server only with the broker's next registration)
        for b in self.brokers():
            if b.broker_id != MixAll.MASTER_ID:
                continue
            tc = self.all_topic_config(b.addr).get(topic)
            for qid in range(int(tc.get("readQueueNums", 0)) if tc else 0):
                spans.append((MessageQueue(topic, b.broker_name, qid), self.min_offset(b.addr, topic, qid),
                              self.max_offset(b.addr, topic, qid)))
        if not spans:
            raise AdminError(f"consumer group {group!r} has no dead-letter queue ({topic} does not exist)")
        total = sum(hi - lo for _, lo, hi in spans)
        done, out = 0, []
        for mq, lo, hi in spans:
            for m in self.iter_messages(mq, lo, hi):
                out.append(m)
                done += 1
                if on_progress is not None:
                    on_progress(done, total)
        return out

    def dlq_resend(self, group: str, msg_ids: Iterable[str] | None = None, *,
                   on_progress: Callable[[int, int], None] | None = None) -> list[SendOutcome]:
        """Resend dead letters of a group (those whose id - unique or offset id - is in msg_ids, else
        all) to %RETRY%<group>: only that group consumes them again, with the original topic restored
        (RETRY_TOPIC) and the retry count from 0."""
        wanted = set(msg_ids or ())
        msgs = self.dlq_messages(group)
        if wanted:
            msgs = [m for m in msgs if m.msg_id in wanted or m.offset_msg_id in wanted]
            missing = wanted - {m.msg_id for m in msgs} - {m.offset_msg_id for m in msgs}
            if missing:
                raise AdminError(f"not in the dead-letter queue of group {group!r}: {', '.join(sorted(missing))}")
        retry = MixAll.get_retry_topic(group)
        out = []
        for i, m in enumerate(msgs):
            out.append(self.resend(m, retry, reconsume_times=0, extra_properties={
                "RETRY_TOPIC": m.properties.get("RETRY_TOPIC") or m.topic,
                "ORIGIN_MESSAGE_ID": m.properties.get("ORIGIN_MESSAGE_ID") or m.msg_id}))
            if on_progress is not None:
                on_progress(i + 1, len(msgs))
        return out

    def skip_message(self, group: str, topic: str, broker_name: str, queue_id: int,
                     offset: int | None = None) -> tuple[OffsetReset, SendOutcome | None]:
        """Skip a poison message that stalls an (orderly) queue: copy it to %DLQ%<group> (so it can be
        resent later) and move the group's offset of that queue past it, telling live members.
        offset defaults to the group's committed offset of the queue (the message it is stuck on)."""
        addr = self.broker_addr(broker_name)
        if offset is None:
            offset = self.query_consumer_offset(addr, group, topic, queue_id)
            if offset < 0:
                raise AdminError(f"group {group!r} has no offset on {topic}/{broker_name}/{queue_id}; give -o OFFSET")
        copied = None
        try:
            msg = self.message_by_offset(topic, broker_name, queue_id, offset)
        except AdminError:
            msg = None
        if msg is not None:
            copied = self.resend(msg, MixAll.get_dlq_topic(group), extra_properties={
                "RETRY_TOPIC": topic, "ORIGIN_MESSAGE_ID": msg.msg_id}, broker_name=broker_name)
        return self.reset_queue_offset(group, topic, broker_name, queue_id, offset + 1), copied
