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
    """

    tag_codes: frozenset | None = None
    bloom_bits: tuple | None = None
    needs_commit_log_check: bool = False
    expression_type: str = "TAG"
    expression: str = "*"

    def is_matched_by_consume_queue(self, tags_code: int, bitmap: bytes | None = None) -> bool:
        """Pure-Python twin of the native scan's test (used by tests and slow paths)."""
        if self.tag_codes is not None and tags_code not in self.tag_codes:
            return False
        if self.bloom_bits is not None and bitmap:
            for bit in self.bloom_bits:
                if not bitmap[bit >> 3] & (1 << (bit & 7)):
                    return False
        return True

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return True


MATCH_ALL = MessageFilter()
