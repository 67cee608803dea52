"""The contract between subscriptions, the store's consume-queue scan and filter plugins.

A filter plugin compiles an expression into a `MessageFilter`.  The store's native scan asks it
cheap questions first (tag hash codes, bloom bits stored beside the consume-queue entry) and only
for candidates that pass calls `is_matched_by_commit_log` with the record's properties.  RocketMQ
splits the work the same way (MessageFilter.isMatchedByConsumeQueue / isMatchedByCommitLog).
"""
from __future__ import annotations

from typing import Mapping


class MessageFilter:
    """Base: matches everything.  Subclasses override what they can decide.

    tag_codes: frozenset of Java String.hashCode values to accept by the consume-queue tag code,
        or None for "no tag test" (the native scan then passes every entry on to the next test).
    bloom_bits: bit positions (ints) that must all be set in the entry's filter bit map stored in
        the consume-queue ext for the entry to possibly match, or None for "no bloom test".  An
        entry without a bit map (stored before the group subscribed) is a candidate.
    needs_commit_log_check: True when `is_matched_by_commit_log` must be called for candidates.
    bloom_bit_num: the bit-map size (bits) `bloom_bits` belong to; an entry whose bit map has
        another size (written under another bloom configuration) is a candidate.  0 = any size.
    bloom_born_time: store timestamp (ms) from which bit maps include this subscription (RocketMQ's
        ConsumerFilterData.bornTime); an entry stored at or before it is a candidate whatever its
        bit map says, because the map was computed before the subscription was registered.
        -1 = every bit map includes it.  A scan that cannot see the entry's store time must treat
        the entry as a candidate when this is >= 0.
    """

    tag_codes: frozenset | None = None
    bloom_bits: tuple | None = None
    needs_commit_log_check: bool = False
    expression_type: str = "TAG"
    expression: str = "*"
    bloom_bit_num: int = 0
    bloom_born_time: int = -1

    def is_matched_by_consume_queue(
        self, tags_code: int, bitmap: bytes | None = None, store_time: int | None = None
    ) -> bool:
        """Pure-Python twin of the native scan's test (used by tests and slow paths)."""
        if self.tag_codes is not None and tags_code not in self.tag_codes:
            return False
        if self.bloom_bits is not None and bitmap:
            if self.bloom_born_time >= 0 and (store_time is None or store_time <= self.bloom_born_time):
                return True
            if self.bloom_bit_num and len(bitmap) * 8 != self.bloom_bit_num:
                return True
            for bit in self.bloom_bits:
                if not bitmap[bit >> 3] & (1 << (bit & 7)):
                    return False
        return True

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return True


MATCH_ALL = MessageFilter()


class RetryMessageFilter(MessageFilter):
    """filterSupportRetry (RocketMQ's ExpressionForRetryMessageFilter): a pull of a group's
    %RETRY% topic applies the group's expression for each message's original topic (its
    RETRY_TOPIC property) to the message; one whose topic the group filters by tag, or not at all,
    passes (RocketMQ keeps no filter data for tags either)."""

    needs_commit_log_check = True

    def __init__(self, filter_of_topic):
        self._filter_of_topic = filter_of_topic  # original topic -> MessageFilter, or None

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        real = properties.get("RETRY_TOPIC")
        f = self._filter_of_topic(real) if real else None
        return f is None or f.is_matched_by_commit_log(properties)
