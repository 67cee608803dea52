"""The `reverse` allocate strategy: `averagely`'s contiguous blocks over the queues in reverse
order, so the first consumer id gets the last queues.  Only rmq's public API is used."""
from rmq_core.message import MessageQueue
from rmq_core.plugins import hookimpl


class AllocateReverse:
    name = "reverse"

    def allocate(self, consumer_group: str, current_cid: str, mq_all: list[MessageQueue],
                 cid_all: list[str]) -> list[MessageQueue]:
        if not current_cid or not mq_all or not cid_all:
            raise ValueError(f"reverse: empty input (current_cid={current_cid!r}, "
                             f"{len(mq_all or ())} queues, {len(cid_all or ())} consumers)")
        cids = sorted(set(cid_all))
        if current_cid not in cids:
            return []
        mqs = sorted(set(mq_all), reverse=True)
        index, n = cids.index(current_cid), len(cids)
        per, rem = divmod(len(mqs), n)
        start = index * per + min(index, rem)
        return mqs[start:start + per + (1 if index < rem else 0)]


@hookimpl
def rmq_allocate_strategies():
    return {"reverse": AllocateReverse()}
