"""The TAG expression type: `*` (or empty) for all, `TagA`, or `TagA || TagB`.

The broker tests the consume queue's tag hash code (Java String.hashCode of the tag) against
`tag_codes`; the client re-checks the real tag string with `is_matched_by_tag`, because two tags
can share a hash code ("Aa" and "BB" both hash to 2112).
"""
from __future__ import annotations

import functools
from typing import Mapping

from rmq_core.errors import FilterExpressionError
from rmq_core.filtering import MessageFilter
from rmq_core.message import SUB_ALL, MessageConst, java_string_hash

EXPRESSION_TYPE = "TAG"


class TagMessageFilter(MessageFilter):
    """A compiled tag subscription.  `tags` is empty for "all"."""

    needs_commit_log_check = False
    bloom_bits = None
    expression_type = EXPRESSION_TYPE

    def __init__(self, expression: str | None):
        if expression is not None and not isinstance(expression, str):
            raise FilterExpressionError(repr(expression), 0, "the expression must be a string", EXPRESSION_TYPE)
        if expression is None or not expression.strip() or expression.strip() == SUB_ALL:
            self.expression = SUB_ALL
            self.tags = frozenset()
            self.tag_codes = None
            return
        tags = [t.strip() for t in expression.split("||")]
        tags = [t for t in tags if t]
        if not tags:
            # RocketMQ would accept "||" and then match nothing on the broker while the client
            # expects everything; refuse it instead of silently delivering nothing.
            raise FilterExpressionError(
                expression, 0, "expected '*' or tags separated by '||' (e.g. 'TagA || TagB') but found no tag",
                EXPRESSION_TYPE,
            )
        self.expression = expression
        self.tags = frozenset(tags)
        self.tag_codes = frozenset(java_string_hash(t) for t in tags)

    @property
    def matches_all(self) -> bool:
        return self.tag_codes is None

    def is_matched_by_tag(self, tag: str | None) -> bool:
        """Exact re-check of a pulled message's tag (RocketMQ's PullAPIWrapper.processPullResult)."""
        if self.tag_codes is None:
            return True
        return tag is not None and tag in self.tags

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        # Only reached when a caller asks explicitly (needs_commit_log_check is False): the exact
        # test on the stored TAGS property.
        return self.is_matched_by_tag((properties or {}).get(MessageConst.TAGS))

    def __repr__(self) -> str:
        return f"TagMessageFilter({self.expression!r})"


@functools.lru_cache(maxsize=1024)
def _compile_cached(expression: str) -> TagMessageFilter:
    return TagMessageFilter(expression)


def compile_tag(expression: str | None) -> TagMessageFilter:
    """Factory for the `TAG` expression type."""
    if expression is None or not isinstance(expression, str):
        return TagMessageFilter(expression)
    return _compile_cached(expression)
